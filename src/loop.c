/* loop.c - the loop object: the thread it belongs to and the checks every
 * loop-side call starts with, its fork mark, the settings and counters the
 * API reads and sets, and what it tells the bridge (port/loop_port.h).
 * Loop thread only.
 *
 * Making and freeing a loop is loop_new.c, its turns sched.c, its timers
 * timer.c.
 */
#include "loop_only.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "rand.h"
#include "loop_int.h"
#include "loop_new.h"

__thread ferry_loop *ferry__tls_loop __attribute__((tls_model("initial-exec")));
__thread char ferry__tls_token __attribute__((tls_model("initial-exec")));
__thread ferry_task *ferry__tls_task __attribute__((tls_model("initial-exec")));

void ferry__fork_child(void)
{
    ferry__tls_task = NULL;
}

ferry_loop *ferry_loop_current(void)
{
    return ferry__tls_loop;
}

bool ferry_loop_is_current(const ferry_loop *loop)
{
    return loop && loop->owner == &ferry__tls_token && !ferry__loop_forked(loop);
}

int ferry__loop_check(const ferry_loop *loop)
{
    if (!loop)
        return -EINVAL;
    /* In a forked child the thread token has the same address, so the fork
     * mark tells the copy from the original (docs/fork.md). */
    return loop->owner == &ferry__tls_token && !ferry__loop_forked(loop) ? 0 : -EPERM;
}

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

/* Map the loop's fork mark (struct ferry_loop).  Optional: without it
 * (kernel before 4.14, or no memory) a forked child is not detected. */
void ferry__fork_mark_setup(ferry_loop *loop)
{
    size_t pg = ferry__page_size();
    unsigned char *p = ferry__fault_point("fork mark") ? MAP_FAILED
                                                       : mmap(NULL, pg, PROT_READ | PROT_WRITE,
                                                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        return;
    if (madvise(p, pg, MADV_WIPEONFORK) != 0) {
        munmap(p, pg);
        return;
    }
    p[0] = 1;
    loop->fork_mark = p;
}

const volatile unsigned char *ferry__loop_fork_mark(const ferry_loop *loop)
{
    return loop->fork_mark;
}

bool ferry__loop_is_fork_copy(const ferry_loop *loop)
{
    return loop && ferry__loop_forked(loop);
}

void ferry__fork_mark_teardown(ferry_loop *loop)
{
    if (loop->fork_mark)
        munmap((void *)(uintptr_t)loop->fork_mark, ferry__page_size());
    loop->fork_mark = NULL;
}

void *ferry__loop_bridge(const ferry_loop *loop)
{
    return loop->hooks.ctx;
}

bool ferry__loop_idle(const ferry_loop *loop, int64_t horizon)
{
    const struct ferry__hnode *t = ferry__heap_min(&loop->timers);

    if (!ferry__list_empty(&loop->runq) || loop->stop)
        return false;
    if (loop->turn && !ferry__list_empty(loop->turn))
        return false;
    return !t || t->key > ferry__loop_now(loop) + horizon;
}

bool ferry__loop_fuzzed(const ferry_loop *loop)
{
    return loop->fuzz;
}

bool ferry__loop_fuzz_hold(ferry_loop *loop)
{
    if (ferry__list_empty(&loop->runq) || loop->stop || loop->closing)
        return false;
    return ferry__rand_below(&loop->deliver_rng, 2) == 0;
}

bool ferry__loop_closing(const ferry_loop *loop)
{
    return loop->closing;
}

int64_t ferry__loop_slow_threshold(const ferry_loop *loop)
{
    return loop->slow_ns;
}

__attribute__((cold, noinline)) void
ferry__loop_report_slow(ferry_loop *loop, int64_t dt, int64_t threshold, const char *task_name)
{
    long long ms = (long long)(dt / 1000000), limit = (long long)(threshold / 1000000);

    loop->stats.slow_steps++;
    if (task_name)
        ferry__log(FERRY_LOG_WARN, "loop blocked for %lld ms by task '%s' (threshold %lld ms)", ms,
                   task_name, limit);
    else
        ferry__log(FERRY_LOG_WARN, "loop blocked for %lld ms by a callback (threshold %lld ms)", ms,
                   limit);
}

int ferry_loop_stop(ferry_loop *loop)
{
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    loop->stop = true;
    ferry__loop_hand_update(loop);
    return 0;
}

int ferry_loop_ref(ferry_loop *loop)
{
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    loop->refs++;
    return 0;
}

int ferry_loop_unref(ferry_loop *loop)
{
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (loop->refs <= 0)
        return -EINVAL;
    loop->refs--;
    return 0;
}

struct event_base *ferry_loop_base(ferry_loop *loop)
{
    return ferry__loop_arg(&loop) ? NULL : loop->base;
}

int ferry_loop_set_slow_threshold(ferry_loop *loop, int64_t threshold)
{
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (threshold < 0)
        return -EINVAL;
    loop->slow_ns = threshold;
    ferry__loop_hand_update(loop);
    return 0;
}

int ferry_loop_stats_get(ferry_loop *loop, ferry_loop_stats *out)
{
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (!out)
        return -EINVAL;
    *out = loop->stats;
    out->live_tasks = loop->live;
    out->stacks_cached = loop->stack_nfree;
    return 0;
}

/* ---- the parts the layers above add ---------------------------------------- */

void ferry__loop_part_add(ferry_loop *loop, struct ferry__loop_part *part,
                          const struct ferry__part_ops *ops)
{
    part->ops = ops;
    part->loop = loop;
    ferry__list_push_back(&loop->parts, &part->link);
}

void ferry__loop_part_del(struct ferry__loop_part *part)
{
    ferry__list_remove(&part->link);
}

struct ferry__loop_part *ferry__loop_part_find(const ferry_loop *loop,
                                               const struct ferry__part_ops *ops)
{
    const struct ferry__link *head = &loop->parts;
    struct ferry__link *l;

    /* A head never linked has next NULL (list.h). */
    for (l = head->next; l && l != head; l = l->next) {
        struct ferry__loop_part *p = ferry__container_of(l, struct ferry__loop_part, link);
        if (p->ops == ops)
            return p;
    }
    return NULL;
}

bool ferry__loop_parts_closing(ferry_loop *loop)
{
    struct ferry__link *l;
    bool busy = false;

    /* Every part is asked: a closing hook also moves its part's shutdown
     * on. */
    ferry__list_foreach(l, &loop->parts) {
        struct ferry__loop_part *p = ferry__container_of(l, struct ferry__loop_part, link);
        if (p->ops->closing && p->ops->closing(p))
            busy = true;
    }
    return busy;
}

void ferry__loop_parts_free(ferry_loop *loop)
{
    while (!ferry__list_empty(&loop->parts)) {
        struct ferry__link *last = loop->parts.prev;
        struct ferry__loop_part *p = ferry__container_of(last, struct ferry__loop_part, link);

        p->ops->free(p);
        /* A hook that left its part in would be called again forever. */
        if (!ferry__list_empty(&loop->parts) && loop->parts.prev == last)
            abort();
    }
}
