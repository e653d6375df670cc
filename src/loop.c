/* loop.c - the loop: creation, the scheduler's turns, polling libevent,
 * call_soon/call_later, and freeing with live tasks.
 * Loop thread only.
 *
 * A turn runs what was ready when it began; what becomes ready during it
 * waits for the next turn.  A yield costs no system call: I/O and timers
 * are polled every `io_interval` steps, and whenever the run queue is empty
 * (then blocking until the earliest timer).
 */
#include "loop_only.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <time.h>

#include "dns_int.h"
#include "loop_int.h"
#include "sig_int.h"
#include "stream_int.h"
#include "switch.h"

__thread ferry_loop *ferry__tls_loop __attribute__((tls_model("initial-exec")));
__thread char ferry__tls_token __attribute__((tls_model("initial-exec")));
__thread ferry_task *ferry__tls_task __attribute__((tls_model("initial-exec")));
#define tls_loop  ferry__tls_loop
#define tls_token ferry__tls_token

void ferry__fork_child(void)
{
    ferry__tls_task = NULL;
}

static ferry_log_fn log_fn;     /* set before loops run (documented) */
static void *log_ctx;

int64_t ferry_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

ferry_loop *ferry_loop_current(void)
{
    return tls_loop;
}

bool ferry_loop_is_current(const ferry_loop *loop)
{
    return loop && loop->owner == &tls_token && !ferry__loop_forked(loop);
}

int ferry__loop_check(const ferry_loop *loop)
{
    if (!loop)
        return -EINVAL;
    /* In a forked child the thread token has the same address, so the fork
     * mark tells the copy from the original (docs/fork.md). */
    return loop->owner == &tls_token && !ferry__loop_forked(loop) ? 0 : -EPERM;
}

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

/* Map the loop's fork mark (struct ferry_loop).  Optional: without it
 * (kernel before 4.14, or no memory) a forked child is not detected. */
static void fork_mark_setup(ferry_loop *loop)
{
    size_t pg = ferry__page_size();
    unsigned char *p = ferry__fault_point("fork mark") ? MAP_FAILED :
        mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        return;
    if (madvise(p, pg, MADV_WIPEONFORK) != 0) {
        munmap(p, pg);
        return;
    }
    p[0] = 1;
    loop->fork_mark = p;
}

bool ferry__loop_is_fork_copy(const ferry_loop *loop)
{
    return loop && ferry__loop_forked(loop);
}

static void fork_mark_teardown(ferry_loop *loop)
{
    if (loop->fork_mark)
        munmap((void *)(uintptr_t)loop->fork_mark, ferry__page_size());
    loop->fork_mark = NULL;
}

struct ferry__bridge_hooks *ferry__loop_bridge(ferry_loop *loop)
{
    return &loop->bridge;
}

bool ferry__loop_owns_base(const ferry_loop *loop)
{
    return loop->own_base;
}

/* ---- log --------------------------------------------------------------- */

void ferry_set_log(ferry_log_fn fn, void *ctx)
{
    log_fn = fn;
    log_ctx = ctx;
}

void ferry__log(int level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log_fn)
        log_fn(level, buf, log_ctx);
    else
        fprintf(stderr, "ferry: %s: %s\n", level >= FERRY_LOG_ERROR ? "error" : "warning", buf);
}

/* ---- timers ---------------------------------------------------------- */

struct ferry_timer {
    struct ferry__hnode    node;  /* in loop->timers until it fires */
    struct ferry__cbnode   run;   /* in the run queue once fired */
    ferry_loop            *loop;
};

static void expire_timers(ferry_loop *loop)
{
    struct ferry__hnode *n;
    int64_t now;

    if (!ferry__heap_min(&loop->timers))
        return;
    now = ferry_now();
    while ((n = ferry__heap_min(&loop->timers)) && n->key <= now) {
        ferry__heap_remove(&loop->timers, n);
        n->fire(n);
    }
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
 * and its default clock is the coarse one (4 ms steps here).  An attached
 * base gets a libevent timer, whose precision is the application's choice.
 */
static void arm_tick(ferry_loop *loop)
{
    struct ferry__hnode *n = ferry__heap_min(&loop->timers);
    struct timeval tv;
    int64_t d;

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
    d = n->key - ferry_now();
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

static void kick(ferry_loop *loop)
{
    if (!loop->in_run && !loop->kick_pending) {
        loop->kick_pending = true;
        event_active(loop->kick_ev, EV_READ, 0);
    }
}

void ferry__loop_timers_changed(ferry_loop *loop)
{
    if (!loop->in_run)
        arm_tick(loop);
}

int ferry_call_soon(ferry_loop *loop, ferry_cb cb, void *arg)
{
    struct ferry__cbnode *c;
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    if (!cb)
        return -EINVAL;
    c = ferry__malloc(sizeof *c);
    if (!c)
        return -ENOMEM;
    c->run.kind = FERRY__RUN_CB;
    c->cb = cb;
    c->arg = arg;
    ferry__list_push_back(&loop->runq, &c->run.link);
    kick(loop);
    return 0;
}

int ferry_call_later(ferry_loop *loop, int64_t delay, ferry_cb cb, void *arg,
                     ferry_timer **out)
{
    ferry_timer *tm;
    int rc = ferry__loop_check(loop);

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
    ferry__heap_insert(&loop->timers, &tm->node,
                       delay > INT64_MAX - ferry_now() ? INT64_MAX : ferry_now() + delay);
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

/* ---- turns ------------------------------------------------------------ */

static inline __attribute__((always_inline)) void run_step(ferry_loop *loop, struct ferry__runnable *r)
{
    /* Read once: a step may change the threshold, and `r` may be freed by
     * the time the step ends. */
    int64_t slow = loop->slow_ns;
    int64_t t0 = slow ? ferry_now() : 0;
    bool is_task = r->kind == FERRY__RUN_TASK;
    char name[sizeof ((ferry_task *)0)->name];

    if (is_task) {
        ferry_task *t = ferry__container_of(r, ferry_task, run);
        if (slow)
            memcpy(name, t->name, sizeof name);
        if (__builtin_expect(!t->started, 0)) {
            ferry__task_resume(t);
        } else {
            t->state = FERRY_TASK_RUNNING;
            loop->current = t;
            ferry__switch_to_task(loop, t);
            /* Tasks may have handed over to each other: the last one is back. */
            t = loop->current;
            loop->current = NULL;
            if (t->state == FERRY_TASK_DONE)
                ferry__task_release(t);
        }
    } else {
        struct ferry__cbnode *c = ferry__container_of(r, struct ferry__cbnode, run);
        ferry_cb cb = c->cb;
        void *arg = c->arg;
        if (r->kind == FERRY__RUN_TIMER)
            ferry__free(ferry__container_of(c, ferry_timer, run));
        else
            ferry__free(c);
        cb(arg);
    }
    loop->stats.steps++;
    loop->since_poll++;
    if (slow) {
        int64_t dt = ferry_now() - t0;
        if (dt > slow) {
            loop->stats.slow_steps++;
            if (is_task)
                ferry__log(FERRY_LOG_WARN, "loop blocked for %lld ms by task '%s' (threshold %lld ms)",
                           (long long)(dt / 1000000), name, (long long)(slow / 1000000));
            else
                ferry__log(FERRY_LOG_WARN, "loop blocked for %lld ms by a callback (threshold %lld ms)",
                           (long long)(dt / 1000000), (long long)(slow / 1000000));
        }
    }
}

/* Run what is ready now.  Returns false if nothing was. */
static bool run_turn(ferry_loop *loop)
{
    struct ferry__link local, *l;

    if (ferry__list_empty(&loop->runq))
        return false;
    ferry__list_move(&local, &loop->runq);
    loop->in_turn = true;
    loop->turn = &local;
    loop->stats.turns++;
    while ((l = ferry__list_pop_front(&local))) {
        ferry__prefetch_run(loop, local.next, &local);
        run_step(loop, ferry__container_of(l, struct ferry__runnable, link));
        if (loop->stop && !loop->closing) {
            /* Put back what this turn did not reach, in order. */
            while ((l = ferry__list_pop_front(&local)) != NULL)
                ferry__list_push_back(&loop->runq, l);
            break;
        }
    }
    loop->in_turn = false;
    loop->turn = NULL;
    return true;
}

static void poll_io(ferry_loop *loop, bool block)
{
    int flags = EVLOOP_ONCE;

    expire_timers(loop);
    if (!ferry__list_empty(&loop->runq) || loop->stop)
        block = false;
    ferry__stack_poll(loop, block);
    if (block) {
        arm_tick(loop);
        flags |= EVLOOP_NO_EXIT_ON_EMPTY;
    } else {
        flags |= EVLOOP_NONBLOCK;
    }
    event_base_loop(loop->base, flags);
    loop->stats.polls++;
    loop->since_poll = 0;
    expire_timers(loop);
}

static bool nothing_left(ferry_loop *loop)
{
    if (loop->live || !ferry__list_empty(&loop->runq) || ferry__heap_min(&loop->timers))
        return false;
    if (loop->refs > 0 && !loop->closing)
        return false;
    if (loop->bridge.pending && loop->bridge.pending(loop->bridge.ctx))
        return false;
    return true;
}

static void drive(ferry_loop *loop, int mode)
{
    for (;;) {
        if (run_turn(loop)) {
            if (loop->stop)
                break;
            if (mode == FERRY_RUN_ONCE) {
                poll_io(loop, false);
                break;
            }
            if (loop->since_poll >= loop->io_interval)
                poll_io(loop, false);
            continue;
        }
        if (loop->stop)
            break;
        if (mode == FERRY_RUN_ONCE) {
            poll_io(loop, false);
            run_turn(loop);
            break;
        }
        if (mode == FERRY_RUN_DEFAULT && nothing_left(loop))
            break;
        poll_io(loop, true);
    }
}

int ferry_loop_run(ferry_loop *loop, int mode)
{
    ferry_task *prev_task;
    ferry_loop *prev;
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    if (mode != FERRY_RUN_DEFAULT && mode != FERRY_RUN_FOREVER && mode != FERRY_RUN_ONCE)
        return -EINVAL;
    if (loop->in_run || loop->in_turn)
        return -EPERM;
    prev = tls_loop;
    prev_task = ferry__tls_task;     /* a task of another loop running this one */
    tls_loop = loop;
    ferry__tls_task = NULL;
    loop->in_run = true;
    loop->stop = false;
    ferry__loop_hand_update(loop);
    loop->one_turn = mode == FERRY_RUN_ONCE;
    drive(loop, mode);
    /* What the last turn offloaded goes to the pools now: the callback that
     * hands it over runs in the next turn, and an application that drives
     * the loop one pass at a time may make that pass only once these jobs
     * are done. */
    if (loop->bridge.flush)
        loop->bridge.flush(loop->bridge.ctx);
    loop->one_turn = false;
    loop->in_run = false;
    loop->stop = false;
    ferry__loop_hand_update(loop);
    tls_loop = prev ? prev : loop;
    ferry__tls_task = prev_task;
    /* Someone else's dispatch may drive us from now on. */
    if (!ferry__list_empty(&loop->runq))
        kick(loop);
    ferry__loop_timers_changed(loop);
    return 0;
}

/* Runs turns when the application's own event_base_dispatch drives us. */
static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    ferry_loop *loop = arg;
    ferry_loop *prev = tls_loop;
    ferry_task *prev_task = ferry__tls_task;
    unsigned steps = 0;

    (void)fd; (void)what;
    loop->kick_pending = false;
    if (loop->in_run || loop->in_turn)
        return;
    tls_loop = loop;
    ferry__tls_task = NULL;
    loop->since_poll = 0;
    expire_timers(loop);
    while (steps < loop->io_interval && !ferry__list_empty(&loop->runq)) {
        uint64_t before = loop->stats.steps;
        run_turn(loop);
        steps += (unsigned)(loop->stats.steps - before);
    }
    ferry__stack_poll(loop, ferry__list_empty(&loop->runq));
    tls_loop = prev ? prev : loop;
    ferry__tls_task = prev_task;
    if (!ferry__list_empty(&loop->runq))
        kick(loop);
    arm_tick(loop);
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
        return;           /* poll_io expires timers itself */
    expire_timers(loop);
    if (!ferry__list_empty(&loop->runq))
        kick(loop);
    arm_tick(loop);
}

int ferry_loop_stop(ferry_loop *loop)
{
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    loop->stop = true;
    ferry__loop_hand_update(loop);
    return 0;
}

int ferry_loop_ref(ferry_loop *loop)
{
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    loop->refs++;
    return 0;
}

int ferry_loop_unref(ferry_loop *loop)
{
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    if (loop->refs <= 0)
        return -EINVAL;
    loop->refs--;
    return 0;
}

struct event_base *ferry_loop_base(ferry_loop *loop)
{
    return ferry__loop_check(loop) ? NULL : loop->base;
}

int ferry_loop_set_slow_threshold(ferry_loop *loop, int64_t threshold)
{
    int rc = ferry__loop_check(loop);

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
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    if (!out)
        return -EINVAL;
    *out = loop->stats;
    out->live_tasks = loop->live;
    out->stacks_cached = loop->stack_nfree;
    return 0;
}

/* ---- lifecycle ------------------------------------------------------- */

int ferry_loop_new(ferry_loop **out, const ferry_loop_opts *opts)
{
    ferry_loop_opts o = {0};
    ferry_loop *loop;
    size_t ssz;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (opts)
        o = *opts;
    ssz = o.stack_size ? o.stack_size : FERRY_STACK_DEFAULT;
    if (ssz < FERRY_STACK_MIN || ssz > ((size_t)1 << 30))
        return -EINVAL;
    if (tls_loop && tls_loop->current)
        return -EPERM;    /* not from inside a task */
    ferry__threads_init();
    /* Before anything is made: other threads wake the loop through the
     * base, which needs its lock for that. */
    if (o.base && (rc = ferry__base_check(o.base)) != 0)
        return rc;
    loop = ferry__calloc(1, sizeof *loop);
    if (!loop)
        return -ENOMEM;
    loop->owner = &tls_token;
    ferry__list_init_linked(&loop->runq);   /* for ferry__task_ready() */
    fork_mark_setup(loop);
    loop->stack_size = ferry__stack_map_size(ssz);
    loop->stack_cache = o.stack_cache ? o.stack_cache : 1024;
    loop->io_interval = o.io_interval ? o.io_interval : 128;
    /* FERRY_STACK_GUARD=mprotect|none forces an older kernel's fallbacks
     * (for tests); the default probes MADV_GUARD_INSTALL first. */
    {
        const char *g = getenv("FERRY_STACK_GUARD");
        if (g && strcmp(g, "mprotect") == 0)
            loop->guard_mode = FERRY__GUARD_MPROTECT;
        else if (g && strcmp(g, "none") == 0)
            loop->guard_forced_none = true;
    }
#ifndef NDEBUG
    loop->slow_ns = FERRY_MSEC(100);
#endif
    ferry__loop_hand_update(loop);
    if (o.base) {
        loop->base = o.base;
    } else {
        rc = ferry__base_new(&loop->base);
        if (rc)
            goto err_free_loop;
        loop->own_base = true;
#ifdef __linux__
        /* libevent silently falls back to poll or select when an
         * allocation of its epoll backend fails: treat that as the -ENOMEM
         * it is (found by tests/fault_sites.c). */
        rc = -ENOMEM;
        if (strcmp(event_base_get_method(loop->base), "epoll") != 0)
            goto err_free_base;
#endif
    }
    rc = -ENOMEM;
    loop->kick_ev = event_new(loop->base, -1, 0, kick_cb, loop);
    if (!loop->kick_ev)
        goto err_free_base;
    loop->tfd = -1;
    if (loop->own_base) {
        if (ferry__fault_point("timerfd"))
            goto err_free_kick;
        loop->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (loop->tfd < 0) {
            rc = -errno;     /* -EMFILE, -ENFILE, -ENOMEM */
            goto err_free_kick;
        }
        loop->tick_ev = event_new(loop->base, loop->tfd, EV_READ | EV_PERSIST, tick_cb, loop);
        if (!loop->tick_ev || event_add(loop->tick_ev, NULL) != 0)
            goto err_close_tfd;
    } else {
        loop->tick_ev = evtimer_new(loop->base, tick_cb, loop);
        if (!loop->tick_ev)
            goto err_free_kick;
    }
    loop->altstack = ferry__malloc(FERRY__ALTSTACK_SIZE);
    if (!loop->altstack)
        goto err_free_tick;
    rc = ferry__bridge_attach(loop);
    if (rc)
        goto err_free_altstack;
    ferry__overflow_setup(loop);
    ferry__loops_add(&loop->live_entry, loop);
    if (!tls_loop)
        tls_loop = loop;
    *out = loop;
    return 0;

err_free_altstack:
    ferry__free(loop->altstack);
err_free_tick:
    event_free(loop->tick_ev);
    loop->tick_ev = NULL;
err_close_tfd:
    if (loop->tick_ev)
        event_free(loop->tick_ev);
    if (loop->tfd >= 0)
        close(loop->tfd);
err_free_kick:
    event_free(loop->kick_ev);
err_free_base:
    if (loop->own_base)
        event_base_free(loop->base);
err_free_loop:
    fork_mark_teardown(loop);
    ferry__free(loop);
    return rc;
}

void ferry_loop_free(ferry_loop *loop)
{
    struct ferry__link *l, *tmp;
    struct ferry__hnode *n;
    ferry_task *prev_task;
    ferry_loop *prev;

    if (!loop || ferry__loop_check(loop) || loop->in_run || loop->in_turn)
        return;
    prev = tls_loop;
    prev_task = ferry__tls_task;
    tls_loop = loop;
    ferry__tls_task = NULL;
    loop->closing = true;
    loop->in_run = true;
    /* Cancel every live task and run until all have ended, and until the
     * resolver may go (lookups cancelled by then still have callbacks to
     * come from evdns). */
    while (loop->live || !ferry__list_empty(&loop->runq) || ferry__dns_closing(loop)) {
        ferry__list_foreach_safe(l, tmp, &loop->tasks)
            ferry_task_cancel(ferry__container_of(l, ferry_task, all));
        loop->stop = false;
        ferry__loop_hand_update(loop);
        if (!run_turn(loop))
            poll_io(loop, loop->live != 0);
        else if (loop->since_poll >= loop->io_interval)
            poll_io(loop, false);
    }
    /* Accepted cross-thread posts run now; later ones are refused. */
    if (loop->bridge.close)
        loop->bridge.close(loop->bridge.ctx);
    while (run_turn(loop))
        ;
    /* Streams and listeners left open are closed with their loop. */
    ferry__stream_loop_free(loop);
    /* Subscriptions end here, before the event_base their eventfd is on. */
    ferry__signal_loop_free(loop);
    ferry__dns_loop_free(loop);
    /* Timers that never fired are dropped with their loop. */
    while ((n = ferry__heap_min(&loop->timers))) {
        ferry__heap_remove(&loop->timers, n);
        ferry__free(ferry__container_of(n, ferry_timer, node));
    }
    loop->in_run = false;
    ferry__stack_drain(loop);
    ferry__overflow_teardown(loop);
    ferry__free(loop->altstack);
    event_free(loop->tick_ev);
    if (loop->tfd >= 0)
        close(loop->tfd);
    event_free(loop->kick_ev);
    if (loop->own_base)
        event_base_free(loop->base);
    tls_loop = (prev == loop) ? NULL : prev;
    ferry__tls_task = prev_task;
    fork_mark_teardown(loop);
    ferry__loops_remove(&loop->live_entry);
    ferry__free(loop);
}
