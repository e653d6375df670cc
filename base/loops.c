/* loops.c - the process-wide set of live loops.
 * Any thread.
 *
 * A primitive remembers the loop it is bound to by pointer only.  Once that
 * loop is freed, the pointer tells nothing (reading through it would read
 * freed memory), yet the primitive's destroy must succeed so that its
 * memory can be given back.  ferry_loop_new() enters each loop here and
 * ferry_loop_free() takes it out just before the memory goes, so a destroy
 * off the bound loop's thread asks this set whether the loop still lives:
 * -EPERM if it does, success if not.  The entries live inside the loops, so
 * entering one allocates nothing and cannot fail.
 *
 * One mutex, a leaf: nothing else is taken while it is held.  It is held
 * across fork() (pthread_atfork), so that a child can still make and free
 * loops even if another thread was in here when the parent forked.
 */
#include <pthread.h>

#include "list.h"
#include "log.h"
#include "loops.h"

static pthread_mutex_t loops_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ferry__link loops; /* of ferry__loop_entry; guarded by loops_mu */
static pthread_once_t loops_once = PTHREAD_ONCE_INIT;

static void loops_prefork(void)
{
    pthread_mutex_lock(&loops_mu);
}

static void loops_postfork(void)
{
    pthread_mutex_unlock(&loops_mu);
}

static void loops_setup(void)
{
    if (pthread_atfork(loops_prefork, loops_postfork, loops_postfork) != 0)
        ferry__log(FERRY_LOG_ERROR, "pthread_atfork failed: a forked child may block "
                                    "making or freeing a loop");
}

void ferry__loops_add(struct ferry__loop_entry *e, const ferry_loop *loop)
{
    pthread_once(&loops_once, loops_setup);
    e->loop = loop;
    pthread_mutex_lock(&loops_mu);
    ferry__list_push_back(&loops, &e->link);
    pthread_mutex_unlock(&loops_mu);
}

void ferry__loops_remove(struct ferry__loop_entry *e)
{
    pthread_mutex_lock(&loops_mu);
    ferry__list_remove(&e->link);
    pthread_mutex_unlock(&loops_mu);
}

bool ferry__loops_live(const ferry_loop *loop)
{
    struct ferry__link *l;
    bool live = false;

    pthread_mutex_lock(&loops_mu);
    ferry__list_foreach(l, &loops) {
        if (ferry__container_of(l, struct ferry__loop_entry, link)->loop == loop) {
            live = true;
            break;
        }
    }
    pthread_mutex_unlock(&loops_mu);
    return live;
}

bool ferry__loops_none(void)
{
    bool none;

    pthread_mutex_lock(&loops_mu);
    none = ferry__list_empty(&loops);
    pthread_mutex_unlock(&loops_mu);
    return none;
}
