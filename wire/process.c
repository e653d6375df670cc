/* process.c - one-time process setup for crossing threads (libevent's
 * locks, the fork handler), and the event_base of a loop: made with its
 * lock, or checked for one.
 * Any thread.
 *
 * Other threads wake a loop through libevent (event_active() on an
 * attached base, and when an eventfd write fails), which is safe only on a
 * base that has its lock: libevent gives a base one when it is made while
 * lock callbacks are installed.  So ferry installs its own, as early as it
 * can (a constructor, when the program starts), and from then on every
 * base gets a lock; a base made before that, made with
 * EVENT_BASE_FLAG_NOLOCK, or whose lock libevent could not allocate (it
 * goes on without one) would never see those wakeups.  Because the
 * callbacks are ferry's, it can tell such a base: a base operation that
 * takes the base's lock calls ferry's lock function, one on a lockless
 * base calls nothing.  If the application installed callbacks of its own
 * first, ferry's are refused; it cannot look into bases then, and relies
 * on libevent's rule that bases are made after the callbacks.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "loop_new.h" /* ferry__fork_child() */
#include "thread.h"
#include "wire.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static bool own_callbacks;            /* set once: libevent took ferry's lock callbacks */
static pthread_mutexattr_t recursive; /* set once, before the callbacks are installed */

/* Lock function calls on this thread while it probes a base, or -1 when
 * it does not probe (the lock function then only tests the sign). */
static __thread long tls_probe __attribute__((tls_model("initial-exec"))) = -1;
/* Locks and conditions this thread failed to allocate for libevent. */
static __thread unsigned tls_alloc_failed __attribute__((tls_model("initial-exec")));
/* True while this thread installs the callbacks: libevent allocates its
 * global locks then, which the fault hook must not fail (a failure there
 * would leave ferry unable to tell whether its callbacks are installed). */
static __thread bool tls_setup __attribute__((tls_model("initial-exec")));

/* ---- libevent's lock callbacks ------------------------------------------ */

static void *ev_lock_alloc(unsigned locktype)
{
    pthread_mutex_t *mu;

    if (!tls_setup && ferry__fault_point("libevent lock"))
        mu = NULL;
    else
        mu = malloc(sizeof *mu); /* libevent's memory, not ferry's */
    if (mu &&
        pthread_mutex_init(mu, (locktype & EVTHREAD_LOCKTYPE_RECURSIVE) ? &recursive : NULL)) {
        free(mu);
        mu = NULL;
    }
    if (!mu)
        tls_alloc_failed++;
    return mu;
}

static void ev_lock_free(void *lock, unsigned locktype)
{
    (void)locktype;
    pthread_mutex_destroy(lock);
    free(lock);
}

static int ev_lock(unsigned mode, void *lock)
{
    if (__builtin_expect(tls_probe >= 0, 0))
        tls_probe++;
    if (mode & EVTHREAD_TRY)
        return pthread_mutex_trylock(lock);
    return pthread_mutex_lock(lock);
}

static int ev_unlock(unsigned mode, void *lock)
{
    (void)mode;
    return pthread_mutex_unlock(lock);
}

static void *ev_cond_alloc(unsigned condtype)
{
    pthread_cond_t *cv;

    (void)condtype;
    if (!tls_setup && ferry__fault_point("libevent cond"))
        cv = NULL;
    else
        cv = malloc(sizeof *cv);
    if (cv && ferry__cond_init(cv) != 0) {
        free(cv);
        cv = NULL;
    }
    if (!cv)
        tls_alloc_failed++;
    return cv;
}

static void ev_cond_free(void *cond)
{
    pthread_cond_destroy(cond);
    free(cond);
}

static int ev_cond_signal(void *cond, int broadcast)
{
    return (broadcast ? pthread_cond_broadcast(cond) : pthread_cond_signal(cond)) ? -1 : 0;
}

/* Returns 0 (signalled), 1 (timed out) or -1, as libevent wants. */
static int ev_cond_wait(void *cond, void *lock, const struct timeval *tv)
{
    int64_t deadline = FERRY_NEVER;
    int rc;

    if (tv)
        deadline =
            ferry__deadline_real((int64_t)tv->tv_sec * 1000000000 + (int64_t)tv->tv_usec * 1000);
    rc = ferry__cond_wait_until(cond, lock, deadline);
    if (rc == ETIMEDOUT)
        return 1;
    return rc ? -1 : 0;
}

static unsigned long ev_thread_id(void)
{
    return (unsigned long)pthread_self();
}

static void threads_setup(void)
{
    static const struct evthread_lock_callbacks locks = {
        EVTHREAD_LOCK_API_VERSION,
        EVTHREAD_LOCKTYPE_RECURSIVE,
        ev_lock_alloc,
        ev_lock_free,
        ev_lock,
        ev_unlock,
    };
    static const struct evthread_condition_callbacks conds = {
        EVTHREAD_CONDITION_API_VERSION, ev_cond_alloc, ev_cond_free, ev_cond_signal, ev_cond_wait,
    };

    if (pthread_mutexattr_init(&recursive) == 0 &&
        pthread_mutexattr_settype(&recursive, PTHREAD_MUTEX_RECURSIVE) == 0) {
        tls_setup = true;
        /* Refused (libevent says so) when the application installed its
         * own callbacks first: then they serve, unchecked. */
        if (evthread_set_lock_callbacks(&locks) == 0 &&
            evthread_set_condition_callbacks(&conds) == 0) {
            evthread_set_id_callback(ev_thread_id);
            own_callbacks = true;
        }
        tls_setup = false;
    }
    if (!own_callbacks)
        ferry__log(FERRY_LOG_WARN, "libevent's thread callbacks are not ferry's: an "
                                   "event_base made without its lock is not detected");
    /* A task that forks must not go on as a task in the child. */
    if (pthread_atfork(NULL, NULL, ferry__fork_child) != 0)
        ferry__log(FERRY_LOG_ERROR, "pthread_atfork failed: a task that forks keeps "
                                    "running as a task in the child");
}

void ferry__process_init(void)
{
    pthread_once(&threads_once, threads_setup);
}

/* Set up when the program starts (or the library is loaded), so that the
 * bases an application makes before its first ferry call have their lock
 * too: the usual order is to make a base, then attach a loop to it. */
__attribute__((constructor)) static void threads_at_load(void)
{
    ferry__process_init();
}

/* True unless ferry can tell that `base` has no lock.  Thread: any. */
static bool base_locked(struct event_base *base)
{
    long calls;

    if (!own_callbacks)
        return true;
    tls_probe = 0;
    event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED); /* takes the base's lock */
    calls = tls_probe;
    tls_probe = -1;
    return calls > 0;
}

int ferry__base_new(struct event_base **out)
{
    unsigned failed = tls_alloc_failed;
    struct event_base *base;

    ferry__process_init();
    *out = NULL;
    base = event_base_new();
    if (!base)
        return -ENOMEM;
    /* libevent goes on without a lock or a condition it could not
     * allocate; other threads could then not wake this loop safely. */
    if (tls_alloc_failed != failed || !base_locked(base))
        goto err_free;
#ifdef __linux__
    /* libevent silently falls back to poll or select when an allocation
     * of its epoll backend fails: that is the -ENOMEM it is. */
    if (strcmp(event_base_get_method(base), "epoll") != 0)
        goto err_free;
#endif
    *out = base;
    return 0;

err_free:
    event_base_free(base);
    return -ENOMEM;
}

int ferry__base_check(struct event_base *base)
{
    ferry__process_init();
    return base_locked(base) ? 0 : -EINVAL;
}
