/* signals.c - POSIX signals for every loop: the process-wide handler, one
 * counter per signal, the table of the loops that listen, and each loop's
 * port (the eventfd the handler writes and the counts the loop has seen).
 *
 * The handler runs on whichever thread the kernel picks.  It saves errno,
 * adds one to the signal's counter and writes the eventfd of every loop
 * listening for that signal; it takes no lock and never waits.  The
 * counters, not the eventfds, carry the deliveries: a loop (woken by its
 * eventfd, or asked by a receive) hands `counter - seen` to its
 * subscriptions (src/signal.c).  So every loop sees every delivery, several
 * deliveries may share one wakeup, and a failed eventfd write loses
 * nothing (the count is there for the next look).
 *
 * The table is an array of slots {fd, mask} reached through an atomic
 * pointer.  A thread changes it only with every signal blocked (so the
 * handler never runs on it in the middle of a change, as libuv does) and
 * under `mu`.  Slots change in place with atomic stores; the array is
 * replaced when it must grow and freed when its last slot empties.
 * `readers` counts the handlers running: after replacing the array, or
 * clearing a slot whose eventfd is about to be closed, the changing thread
 * waits until it is zero.  A handler that started before the change may
 * still use the old array or fd until then; one that starts after sees the
 * change.  So no handler reads a freed array or writes a closed (and maybe
 * reused) descriptor.
 *
 * Dispositions: the first subscription of the process to a signal installs
 * the handler and keeps the old sigaction; the last one puts it back and,
 * if it leaves deliveries nobody received, raises the signal once more so
 * that the old disposition acts on it (ferry/signal.h).
 *
 * Lock order: `mu` is a leaf; nothing else is taken under it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#ifdef __linux__
#include <sys/eventfd.h>
#define FERRY__HAVE_EVENTFD 1
#endif

#include "bridge_int.h"
#include "loop_int.h"
#include "sig_int.h"

/* The handler must not take a lock: 64-bit counters and masks must be
 * lock-free atomics. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 &&
               ATOMIC_INT_LOCK_FREE == 2, "lock-free atomics");

/* One listening loop. */
struct slot {
    _Atomic int      fd;     /* what the handler writes; -1: free */
    _Atomic uint64_t mask;   /* signals the loop listens for */
};

struct table {
    size_t      cap;         /* slots; set before the table is published */
    size_t      used;        /* mu: slots with fd >= 0 */
    struct slot s[];
};

/* ==== any thread ========================================================= */

static _Atomic(struct table *) table;              /* written under mu */
static atomic_uint             readers;            /* handlers running now */
static _Atomic uint64_t        raised[FERRY__NSIG]; /* deliveries per signal, ever */
static pthread_mutex_t         mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned                nloops[FERRY__NSIG]; /* mu: loops listening per signal */
static struct sigaction        old_action[FERRY__NSIG]; /* mu: what the handler replaced */

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
        if (fd >= 0 && (atomic_load(&t->s[i].mask) & bit)) {
#ifdef FERRY__HAVE_EVENTFD
            uint64_t one = 1;
            /* EAGAIN (the counter is full) still leaves it readable. */
            if (write(fd, &one, sizeof one) < 0) {
            }
#else
            char one = 1;
            /* EAGAIN (the pipe is full) still leaves it readable. */
            if (write(fd, &one, 1) < 0) {
            }
#endif
        }
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

/* ==== loop thread ========================================================== */

static void port_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__sigport *port = arg;
#ifdef FERRY__HAVE_EVENTFD
    uint64_t v;

    (void)what;
    if (read(fd, &v, sizeof v) < 0) {
        /* EAGAIN: another look already reset it; the counters tell. */
    }
#else
    char buf[64];

    (void)what;
    while (read(fd, buf, sizeof buf) > 0)
        ;
#endif
    ferry__sig_collect(port->loop);
}

static int port_fds(struct ferry__sigport *port)
{
    if (ferry__fault_point("eventfd"))
        return -ENOMEM;
#ifdef FERRY__HAVE_EVENTFD
    port->rfd = port->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return port->rfd < 0 ? -ENOMEM : 0;
#else
    int p[2];

    if (pipe(p) < 0)
        return -ENOMEM;
    for (int i = 0; i < 2; i++) {
        fcntl(p[i], F_SETFL, fcntl(p[i], F_GETFL) | O_NONBLOCK);
        fcntl(p[i], F_SETFD, FD_CLOEXEC);
    }
    port->rfd = p[0];
    port->wfd = p[1];
    return 0;
#endif
}

static void port_close_fds(struct ferry__sigport *port)
{
    if (port->wfd != port->rfd)
        close(port->wfd);
    close(port->rfd);
}

/* The loop's port, made on first use: eventfd, event (not added yet),
 * slot in the table. */
static int port_get(ferry_loop *loop, struct ferry__sigport **out)
{
    struct ferry__sigport *port = loop->sigport;
    sigset_t old;
    long slot;
    int rc;

    if (port) {
        *out = port;
        return 0;
    }
    port = ferry__calloc(1, sizeof *port);
    if (!port)
        return -ENOMEM;
    port->loop = loop;
    rc = port_fds(port);
    if (rc)
        goto err_free;
    port->ev = event_new(loop->base, port->rfd, EV_READ | EV_PERSIST, port_cb, port);
    if (!port->ev) {
        rc = -ENOMEM;
        goto err_close;
    }
    change_begin(&old);
    slot = slot_take(port->wfd);
    change_end(&old);
    if (slot < 0) {
        rc = (int)slot;
        goto err_event;
    }
    port->slot = (size_t)slot;
    loop->sigport = port;
    *out = port;
    return 0;

err_event:
    event_free(port->ev);
err_close:
    port_close_fds(port);
err_free:
    ferry__free(port);
    return rc;
}

int ferry__sig_add(ferry_loop *loop, int signum)
{
    struct ferry__sigport *port = NULL;
    struct sigaction sa;
    sigset_t old;
    int rc;

    rc = port_get(loop, &port);
    if (rc)
        return rc;
    if (port->refs[signum]) {
        port->refs[signum]++;
        port->total++;
        return 0;
    }
    /* Watch the eventfd only while the loop has a subscription: an
     * application's event_base_dispatch() would never end on an empty
     * base otherwise. */
    if (port->total == 0 && event_add(port->ev, NULL) != 0)
        return -ENOMEM;
    change_begin(&old);
    /* Deliveries from here on are the subscription's: read the counter
     * before the handler can be installed, or before this loop's bit is
     * set (one that comes in between is found by the next collect). */
    port->seen[signum] = atomic_load(&raised[signum]);
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
            if (port->total == 0)
                event_del(port->ev);
            return -EINVAL;
        }
    }
    nloops[signum]++;
    atomic_fetch_or(&atomic_load(&table)->s[port->slot].mask, ferry__sig_bit(signum));
    change_end(&old);
    port->mask |= ferry__sig_bit(signum);
    port->refs[signum] = 1;
    port->total++;
    return 0;
}

void ferry__sig_del(ferry_loop *loop, int signum, bool unread)
{
    struct ferry__sigport *port = loop->sigport;
    bool raise_it = false;
    sigset_t old;

    port->total--;
    if (--port->refs[signum])
        return;
    if (port->total == 0)
        event_del(port->ev);
    port->mask &= ~ferry__sig_bit(signum);
    change_begin(&old);
    atomic_fetch_and(&atomic_load(&table)->s[port->slot].mask, ~ferry__sig_bit(signum));
    if (--nloops[signum] == 0) {
        sigaction(signum, &old_action[signum], NULL);
        /* A handler already running may still count one. */
        wait_readers();
        raise_it = unread || atomic_load(&raised[signum]) != port->seen[signum];
        /* Blocked here: it is delivered to this thread when change_end()
         * restores the mask, under the old disposition. */
        if (raise_it)
            raise(signum);
    }
    change_end(&old);
}

void ferry__sig_collect(ferry_loop *loop)
{
    struct ferry__sigport *port = loop->sigport;

    if (!port)
        return;
    for (uint64_t m = port->mask; m; m &= m - 1) {
        int signum = __builtin_ctzll(m) + 1;
        uint64_t now = atomic_load(&raised[signum]);
        if (now != port->seen[signum]) {
            uint64_t n = now - port->seen[signum];
            port->seen[signum] = now;
            ferry__sig_deliver(loop, signum, n);
        }
    }
}

void ferry__sig_port_free(ferry_loop *loop)
{
    struct ferry__sigport *port = loop->sigport;
    sigset_t old;

    change_begin(&old);
    slot_give(port->slot);
    change_end(&old);
    event_free(port->ev);
    port_close_fds(port);
    ferry__free(port);
    loop->sigport = NULL;
}
