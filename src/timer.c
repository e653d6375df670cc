/* timer.c - the loop's timers: ferry_call_later(), the heap every timer
 * and every task's deadline waits in, and the tick that wakes a blocking
 * poll for the earliest of them.
 * Loop thread only.
 */
#include "loop_only.h"

#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "loop_int.h"

void ferry__timers_expire(ferry_loop *loop)
{
    struct ferry__hnode *n;
    int64_t now;

    if (!ferry__heap_min(&loop->timers))
        return;
    now = ferry__loop_now(loop);
    while ((n = ferry__heap_min(&loop->timers)) && n->key <= now) {
        ferry__heap_remove(&loop->timers, n);
        n->fire(n);
    }
}

bool ferry__vclock_jump(ferry_loop *loop)
{
    struct ferry__hnode *n = ferry__heap_min(&loop->timers);

    if (!n || n->key == FERRY_NEVER)
        return false;
    if (n->key > loop->vnow)
        loop->vnow = n->key;
    ferry__timers_expire(loop);
    return true;
}

bool ferry__vclock_source(int64_t *now)
{
    const ferry_loop *loop = ferry__tls_loop;

    if (!loop || !loop->vclock)
        return false;
    *now = loop->vnow;
    return true;
}

int ferry_loop_advance(ferry_loop *loop, int64_t duration)
{
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (!loop->vclock || duration < 0)
        return -EINVAL;
    loop->vnow = duration > INT64_MAX - 1 - loop->vnow ? INT64_MAX - 1 : loop->vnow + duration;
    ferry__timers_expire(loop);
    return 0;
}

static void timer_fire(struct ferry__hnode *n)
{
    ferry_timer *tm = ferry__container_of(n, ferry_timer, node);
    ferry__list_push_back(&tm->loop->runq, &tm->run.run.link);
}

/*
 * Make the next blocking poll wake up for the earliest timer.  An owned base
 * uses the loop's timerfd, set (one system call) only when the earliest
 * deadline changed, so the quick polls between turns cost no extra call;
 * libevent's precise-timer mode would add a timerfd_settime to every poll,
 * and its default clock is the coarse one (milliseconds).  An attached
 * base gets a libevent timer, whose precision is the application's choice.
 */
void ferry__timers_arm(ferry_loop *loop)
{
    struct ferry__hnode *n = ferry__heap_min(&loop->timers);
    struct timeval tv;
    int64_t d;

    /* A virtual clock's timers fire when the loop jumps to them, never by
     * the real clock. */
    if (loop->vclock)
        return;
    if (loop->tfd >= 0) {
        int64_t key = n ? (n->key > 0 ? n->key : 1) : 0;
        struct itimerspec its = { { 0, 0 }, { 0, 0 } };

        if (key == loop->tick_armed)
            return;
        its.it_value.tv_sec = (time_t)(key / 1000000000);
        its.it_value.tv_nsec = (long)(key % 1000000000);
        timerfd_settime(loop->tfd, TFD_TIMER_ABSTIME, &its, NULL);
        loop->tick_armed = key;
        return;
    }
    if (!n) {
        event_del(loop->tick_ev);
        return;
    }
    d = n->key - ferry__loop_now(loop);
    if (d < 0)
        d = 0;
    tv.tv_sec = (time_t)(d / 1000000000);
    tv.tv_usec = (suseconds_t)((d % 1000000000 + 999) / 1000);
    if (tv.tv_usec >= 1000000) {
        tv.tv_sec++;
        tv.tv_usec -= 1000000;
    }
    event_add(loop->tick_ev, &tv);
}

void ferry__loop_timers_changed(ferry_loop *loop)
{
    if (!loop->in_run)
        ferry__timers_arm(loop);
}

int ferry_call_later(ferry_loop *loop, int64_t delay, ferry_cb cb, void *arg, ferry_timer **out)
{
    ferry_timer *tm;
    int64_t now;
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (!cb)
        return -EINVAL;
    tm = ferry__malloc(sizeof *tm);
    if (!tm)
        return -ENOMEM;
    memset(tm, 0, sizeof *tm);
    tm->loop = loop;
    tm->node.fire = timer_fire;
    tm->run.run.kind = FERRY__RUN_TIMER;
    tm->run.cb = cb;
    tm->run.arg = arg;
    if (delay < 0)
        delay = 0;
    now = ferry__loop_now(loop);
    ferry__heap_insert(&loop->timers, &tm->node, delay > INT64_MAX - now ? INT64_MAX : now + delay);
    ferry__loop_timers_changed(loop);
    if (out)
        *out = tm;
    return 0;
}

int ferry_timer_cancel(ferry_timer *tm)
{
    int rc;

    if (!tm)
        return -EINVAL;
    rc = ferry__loop_check(tm->loop);
    if (rc)
        return rc;
    if (tm->node.linked)
        ferry__heap_remove(&tm->loop->timers, &tm->node);
    if (ferry__link_linked(&tm->run.run.link))
        ferry__list_remove(&tm->run.run.link);
    ferry__free(tm);
    return 0;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    ferry_loop *loop = arg;
    uint64_t expirations;

    (void)what;
    if (loop->tfd >= 0) {
        /* One-shot: it is disarmed now.  Reading clears the readiness. */
        if (read(fd, &expirations, sizeof expirations) < 0)
            expirations = 0;
        loop->tick_armed = 0;
    }
    if (loop->in_run)
        return; /* poll_io expires timers itself */
    ferry__timers_expire(loop);
    if (!ferry__list_empty(&loop->runq))
        ferry__loop_kick(loop);
    ferry__timers_arm(loop);
}

/*
 * The timer tick of a loop that owns its base: a timerfd, so that a
 * blocking poll wakes for the earliest timer at the precision of the
 * monotonic clock (see arm_tick()).  Returns: 0; -ENOMEM; -EMFILE,
 * -ENFILE (no descriptor left).
 */
static int tick_timerfd_new(ferry_loop *loop)
{
    if (ferry__fault_point("timerfd"))
        return -ENOMEM;
    loop->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (loop->tfd < 0)
        return -errno; /* -EMFILE, -ENFILE, -ENOMEM */
    loop->tick_ev = event_new(loop->base, loop->tfd, EV_READ | EV_PERSIST, tick_cb, loop);
    if (loop->tick_ev && event_add(loop->tick_ev, NULL) == 0)
        return 0;
    if (loop->tick_ev)
        event_free(loop->tick_ev);
    loop->tick_ev = NULL;
    close(loop->tfd);
    loop->tfd = -1;
    return -ENOMEM;
}

int ferry__timers_init(ferry_loop *loop)
{
    loop->tfd = -1;
    if (loop->own_base)
        return tick_timerfd_new(loop);
    /* An attached base gets a libevent timer, whose precision is the
     * application's choice. */
    loop->tick_ev = evtimer_new(loop->base, tick_cb, loop);
    return loop->tick_ev ? 0 : -ENOMEM;
}

void ferry__timers_fini(ferry_loop *loop)
{
    struct ferry__hnode *n;

    /* Timers that never fired are dropped with their loop. */
    while ((n = ferry__heap_min(&loop->timers))) {
        ferry__heap_remove(&loop->timers, n);
        ferry__free(ferry__container_of(n, ferry_timer, node));
    }
    event_free(loop->tick_ev);
    if (loop->tfd >= 0)
        close(loop->tfd);
}
