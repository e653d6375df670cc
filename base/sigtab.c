/* sigtab.c - POSIX signals for the whole process: the handler, one
 * counter per signal, the table of the listeners it wakes, and the
 * dispositions it replaces.
 *
 * The handler runs on whichever thread the kernel picks.  It saves errno,
 * adds one to the signal's counter and writes the wake descriptor of every
 * listener of that signal; it takes no lock and never waits.  The
 * counters, not the descriptors, carry the deliveries: a listener (a loop,
 * io/sigport.c) hands `counter - seen` to its subscriptions when it is
 * woken or asked.  So every listener sees every delivery, several
 * deliveries may share one wakeup, and a failed write loses nothing (the
 * count is there for the next look).
 *
 * The table is an array of slots {fd, mask} reached through an atomic
 * pointer.  A thread changes it only with every signal blocked (so the
 * handler never runs on it in the middle of a change, as libuv does) and
 * under `mu`.  Slots change in place with atomic stores; the array is
 * replaced when it must grow and freed when its last slot empties.
 * `readers` counts the handlers running: after replacing the array, or
 * clearing a slot whose descriptor is about to be closed, the changing
 * thread waits until it is zero.  A handler that started before the change
 * may still use the old array or fd until then; one that starts after sees
 * the change.  So no handler reads a freed array or writes a closed (and
 * maybe reused) descriptor.
 *
 * Dispositions: the first listener of the process to a signal installs the
 * handler and keeps the old sigaction; the last one puts it back and, if
 * it leaves deliveries nobody received, raises the signal once more so
 * that the old disposition acts on it (ferry/signal.h).
 *
 * Lock order: `mu` is a leaf; nothing else is taken under it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "alloc.h"
#include "sigtab.h"
#include "wakefd.h"

/* The handler must not take a lock: 64-bit counters and masks must be
 * lock-free atomics. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 &&
                   ATOMIC_INT_LOCK_FREE == 2,
               "lock-free atomics");

/* One listener. */
struct slot {
    _Atomic int fd;        /* what the handler writes; -1: free */
    _Atomic uint64_t mask; /* signals it listens for */
};

struct table {
    size_t cap;  /* slots; set before the table is published */
    size_t used; /* mu: slots with fd >= 0 */
    struct slot s[];
};

static _Atomic(struct table *) table;        /* written under mu */
static atomic_uint readers;                  /* handlers running now */
static _Atomic uint64_t raised[FERRY__NSIG]; /* deliveries per signal, ever */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned nloops[FERRY__NSIG];             /* mu: listeners per signal */
static struct sigaction old_action[FERRY__NSIG]; /* mu: what the handler replaced */

static void on_signal(int signum)
{
    int saved_errno = errno;
    uint64_t bit = ferry__sig_bit(signum);
    struct table *t;

    atomic_fetch_add(&readers, 1);
    atomic_fetch_add(&raised[signum], 1);
    t = atomic_load(&table);
    for (size_t i = 0; t && i < t->cap; i++) {
        int fd = atomic_load(&t->s[i].fd);
        if (fd >= 0 && (atomic_load(&t->s[i].mask) & bit))
            ferry__wakefd_write(fd); /* a failure loses nothing: the count is in */
    }
    atomic_fetch_sub(&readers, 1);
    errno = saved_errno;
}

/* Wait until no handler started before now is still running. */
static void wait_readers(void)
{
    while (atomic_load(&readers))
        sched_yield();
}

/* Block every signal on this thread (the handler must not run here while
 * the table or a disposition changes) and take mu. */
static void change_begin(sigset_t *old)
{
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
    pthread_mutex_lock(&mu);
}

static void change_end(const sigset_t *old)
{
    pthread_mutex_unlock(&mu);
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* A free slot holding `fd`, the array grown if none is free.  Requires mu.
 * Returns: the slot's index; -ENOMEM. */
static long slot_take(int fd)
{
    struct table *t = atomic_load(&table), *nt;
    size_t i, cap;

    for (i = 0; t && i < t->cap; i++)
        if (atomic_load(&t->s[i].fd) < 0)
            goto found;
    cap = t ? t->cap * 2 : 4;
    nt = ferry__malloc(sizeof *nt + cap * sizeof nt->s[0]);
    if (!nt)
        return -ENOMEM;
    nt->cap = cap;
    nt->used = t ? t->used : 0;
    for (i = 0; i < cap; i++) {
        bool old = t && i < t->cap;
        atomic_init(&nt->s[i].fd, old ? atomic_load(&t->s[i].fd) : -1);
        atomic_init(&nt->s[i].mask, old ? atomic_load(&t->s[i].mask) : 0);
    }
    i = t ? t->cap : 0;
    atomic_store(&table, nt);
    if (t) {
        wait_readers();
        ferry__free(t);
    }
    t = nt;
found:
    atomic_store(&t->s[i].mask, 0);
    atomic_store(&t->s[i].fd, fd);
    t->used++;
    return (long)i;
}

/* Empty slot `i`; free the array if it was the last.  Requires mu.  On
 * return no handler can still write the slot's old fd. */
static void slot_give(size_t i)
{
    struct table *t = atomic_load(&table);

    atomic_store(&t->s[i].mask, 0);
    atomic_store(&t->s[i].fd, -1);
    if (--t->used == 0)
        atomic_store(&table, NULL);
    wait_readers();
    if (!t->used)
        ferry__free(t);
}

long ferry__sigtab_join(int wfd)
{
    sigset_t old;
    long slot;

    change_begin(&old);
    slot = slot_take(wfd);
    change_end(&old);
    return slot;
}

void ferry__sigtab_leave(size_t slot)
{
    sigset_t old;

    change_begin(&old);
    slot_give(slot);
    change_end(&old);
}

int ferry__sigtab_listen(size_t slot, int signum, uint64_t *seen)
{
    struct sigaction sa;
    sigset_t old;

    change_begin(&old);
    /* Deliveries from here on are the listener's: read the counter
     * before the handler can be installed, or before this slot's bit is
     * set (one that comes in between is found by the next look). */
    *seen = atomic_load(&raised[signum]);
    if (nloops[signum] == 0) {
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        /* No SA_ONSTACK: the handler needs little stack, and the
         * alternate stack of a loop's thread belongs to the stack-overflow
         * reporter (valgrind also flags a handler's writes there as
         * invalid). */
        sa.sa_flags = SA_RESTART;
        sigfillset(&sa.sa_mask);
        if (sigaction(signum, &sa, &old_action[signum]) != 0) {
            change_end(&old);
            return -EINVAL;
        }
    }
    nloops[signum]++;
    atomic_fetch_or(&atomic_load(&table)->s[slot].mask, ferry__sig_bit(signum));
    change_end(&old);
    return 0;
}

void ferry__sigtab_unlisten(size_t slot, int signum, uint64_t seen, bool unread)
{
    sigset_t old;

    change_begin(&old);
    atomic_fetch_and(&atomic_load(&table)->s[slot].mask, ~ferry__sig_bit(signum));
    if (--nloops[signum] == 0) {
        sigaction(signum, &old_action[signum], NULL);
        /* A handler already running may still count one. */
        wait_readers();
        /* Blocked here: it is delivered to this thread when change_end()
         * restores the mask, under the old disposition. */
        if (unread || atomic_load(&raised[signum]) != seen)
            raise(signum);
    }
    change_end(&old);
}

uint64_t ferry__sigtab_count(int signum)
{
    return atomic_load(&raised[signum]);
}
