/* test_runtime.c - a runtime of N loops (ferry/runtime.h): making,
 * running, stopping and freeing it; the cross-loop call (both flavours,
 * inline on the caller's loop, statuses apart from ferry's, the caller's
 * cancellation and deadline reaching the remote task, the cap of calls in
 * flight, a loop stopped under calls); futures of tasks on other loops
 * awaited and selected on; primitives and streams that stay with their
 * loop; on_all, load figures, statistics, dumps.
 *
 * No cr_assert inside task bodies: they record, the test body asserts
 * after the runtime returned.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "clock.h"
#include "ferry/ferry.h"

#define TR(name) Test(runtime, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, \
                      .timeout = 60.)

/* A runtime of n loops, made or the test fails. */
static ferry_runtime *rt_make(unsigned n, unsigned cap)
{
    ferry_runtime_opts o = { .loops = n, .call_cap = cap };
    ferry_runtime *rt = NULL;

    cr_assert_eq(ferry_runtime_new(&rt, &o), 0, "ferry_runtime_new");
    return rt;
}

/* Run main on loop 0 of rt and return its status (the run must succeed). */
static int rt_run(ferry_runtime *rt, ferry_task_fn main, void *arg)
{
    int st = -99999;

    cr_assert_eq(ferry_runtime_run(rt, main, arg, &st), 0, "ferry_runtime_run");
    return st;
}

/* Spin the calling thread (a task's loop stays busy) for ms milliseconds
 * of real time, scaled. */
static void busy_ms(int64_t ms)
{
    int64_t until = ferry__now_real() + tu_ms(ms);

    while (ferry__now_real() < until)
        ;
}

/* ---- making, the loops' places ---------------------------------------- */

static int where_am_i(void *arg, void **result)
{
    pthread_t *threads = arg;
    int i = ferry_runtime_index(NULL, NULL);

    if (i >= 0)
        threads[i] = pthread_self();
    *result = ferry_runtime_current();
    return i;
}

struct places {
    ferry_runtime *rt;
    int            size, index0, cur_ok, loop_ok;
    int            rc[3], st[3];
    void          *res[3];
    pthread_t      threads[3];
    int            rc_all, st_all[3];
};

static int places_main(void *arg)
{
    struct places *p = arg;

    p->size = (int)ferry_runtime_size(NULL);
    p->index0 = ferry_runtime_index(NULL, NULL);
    p->cur_ok = ferry_runtime_current() == p->rt;
    p->loop_ok = ferry_runtime_loop(NULL, 0) == ferry_loop_current() &&
                 ferry_runtime_index(p->rt, ferry_runtime_loop(p->rt, 2)) == 2 &&
                 ferry_runtime_loop(NULL, 3) == NULL;
    for (int i = 0; i < 3; i++)
        p->rc[i] = ferry_runtime_call(NULL, (unsigned)i, where_am_i, p->threads,
                                      i == 2 ? FERRY_CALL_CALLBACK : 0, &p->st[i], &p->res[i]);
    return 5;
}

TR(loops_run_on_their_own_threads_and_know_their_place)
{
    struct places p = {0};

    p.rt = rt_make(3, 0);
    cr_assert_eq(rt_run(p.rt, places_main, &p), 5);
    cr_expect_eq(p.size, 3);
    cr_expect_eq(p.index0, 0);
    cr_expect(p.cur_ok && p.loop_ok);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(p.rc[i], 0, "call to loop %d: %d", i, p.rc[i]);
        cr_expect_eq(p.st[i], i, "loop %d says it is %d", i, p.st[i]);
        cr_expect_eq(p.res[i], p.rt);
    }
    cr_expect(pthread_equal(p.threads[0], pthread_self()));
    cr_expect(!pthread_equal(p.threads[1], pthread_self()));
    cr_expect(!pthread_equal(p.threads[2], pthread_self()));
    cr_expect(!pthread_equal(p.threads[1], p.threads[2]));
    /* Outside any loop of it. */
    cr_expect_eq(ferry_runtime_index(p.rt, NULL), 0, "loop 0 is current on this thread");
    ferry_runtime_free(p.rt);
    cr_expect_eq(ferry_runtime_current(), NULL);
    cr_expect_eq(ferry_runtime_index(NULL, NULL), -ENOENT);
}

static int task_new_rc;
static int new_from_task(void *arg)
{
    ferry_runtime *rt = NULL;

    (void)arg;
    task_new_rc = ferry_runtime_new(&rt, NULL);
    return 0;
}

TR(new_refuses_bad_options_and_tasks)
{
    ferry_runtime_opts o = { .loops = FERRY_RUNTIME_MAX_LOOPS + 1 };
    ferry_runtime *rt = (ferry_runtime *)1;
    struct event_base *b = (struct event_base *)&o;

    cr_expect_eq(ferry_runtime_new(NULL, NULL), -EINVAL);
    cr_expect_eq(ferry_runtime_new(&rt, &o), -EINVAL);
    cr_expect_eq(rt, NULL);
    o.loops = 2;
    o.loop.base = b;
    cr_expect_eq(ferry_runtime_new(&rt, &o), -EINVAL);
    o.loop.base = NULL;
    o.loop.stack_size = 1;
    cr_expect_eq(ferry_runtime_new(&rt, &o), -EINVAL);
    cr_expect_eq(ferry_run_loops(2, NULL, NULL), -EINVAL);
    cr_expect_eq(ferry_runtime_run(NULL, tu_ret0, NULL, NULL), -EINVAL);
    cr_expect_eq(ferry_runtime_stop(NULL), -EINVAL);
    ferry_runtime_free(NULL);

    /* From a task: -EPERM. */
    ferry_loop *loop;
    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_eq(tu_run_on(loop, new_from_task, NULL), 0);
    ferry_loop_free(loop);
    cr_expect_eq(task_new_rc, -EPERM);
}

TR(default_number_of_loops_is_the_affinity_mask_or_FERRY_LOOPS)
{
    cpu_set_t set;
    ferry_runtime *rt;

    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    unsetenv("FERRY_LOOPS");
    cr_assert_eq(ferry_runtime_new(&rt, NULL), 0);
    cr_expect_eq(ferry_runtime_size(rt), (unsigned)CPU_COUNT(&set));
    ferry_runtime_free(rt);
    setenv("FERRY_LOOPS", "3", 1);
    cr_assert_eq(ferry_runtime_new(&rt, NULL), 0);
    cr_expect_eq(ferry_runtime_size(rt), 3);
    ferry_runtime_free(rt);
    unsetenv("FERRY_LOOPS");
}

static int cpu_of_loop(void *arg, void **result)
{
    cpu_set_t set;

    (void)arg;
    (void)result;
    if (pthread_getaffinity_np(pthread_self(), sizeof set, &set))
        return -1;
    if (CPU_COUNT(&set) != 1)
        return -2;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            return c;
    return -3;
}

struct pin { int rc, st[2]; };

static int pin_main(void *arg)
{
    struct pin *p = arg;

    p->rc = ferry_runtime_on_all(NULL, NULL, NULL, NULL);
    for (unsigned i = 0; i < 2; i++)
        if (ferry_runtime_call(NULL, i, cpu_of_loop, NULL, 0, &p->st[i], NULL))
            p->st[i] = -100;
    return 0;
}

TR(pin_puts_loop_i_on_the_ith_allowed_cpu_and_gives_the_mask_back)
{
    ferry_runtime_opts o = { .loops = 2, .pin = true };
    cpu_set_t before, after, set;
    int nth[2], k = 0;
    ferry_runtime *rt;
    struct pin p = {0};

    cr_assert_eq(pthread_getaffinity_np(pthread_self(), sizeof before, &before), 0);
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &set))
            nth[k++] = c;
    if (k == 1)
        nth[1] = nth[0];
    cr_assert_eq(ferry_runtime_new(&rt, &o), 0);
    rt_run(rt, pin_main, &p);
    ferry_runtime_free(rt);
    cr_expect_eq(p.rc, -EINVAL, "on_all without fn");
    cr_expect_eq(p.st[0], nth[0]);
    cr_expect_eq(p.st[1], nth[1]);
    cr_assert_eq(pthread_getaffinity_np(pthread_self(), sizeof after, &after), 0);
    cr_expect(CPU_EQUAL(&before, &after), "loop 0's thread got its mask back");
}

/* ---- the call: flavours, statuses, inline ----------------------------- */

static int status_apart(void *arg, void **result)
{
    *result = arg;
    return -ECANCELED;    /* fn's own status, never the call's */
}

static int who_runs(void *arg, void **result)
{
    *result = ferry_task_current();
    return arg == ferry_task_current() ? 1 : 0;
}

struct flavours {
    int        rc[4], st[4];
    void      *res[4];
    int        inline_rc[2], inline_st[2];
    void      *inline_res[2];
    ferry_runtime_stats s0, s1;
    int        stats_rc;
    int        bad[6];
};

static int flavours_main(void *arg)
{
    struct flavours *f = arg;
    static int marker;
    int st = 12345;

    f->rc[0] = ferry_runtime_call(NULL, 1, status_apart, &marker, 0, &f->st[0], &f->res[0]);
    f->rc[1] = ferry_runtime_call(NULL, 1, status_apart, &marker, FERRY_CALL_CALLBACK,
                                  &f->st[1], &f->res[1]);
    /* On another loop, fn runs in a task of that loop: not the caller. */
    f->rc[2] = ferry_runtime_call(NULL, 1, who_runs, ferry_task_current(), 0, &f->st[2],
                                  &f->res[2]);
    f->rc[3] = ferry_runtime_call(NULL, 1, who_runs, ferry_task_current(),
                                  FERRY_CALL_CALLBACK, &f->st[3], &f->res[3]);
    /* On the caller's own loop: inline, in the calling task. */
    f->inline_rc[0] = ferry_runtime_call(NULL, 0, who_runs, ferry_task_current(), 0,
                                         &f->inline_st[0], &f->inline_res[0]);
    f->inline_rc[1] = ferry_runtime_call(NULL, 0, who_runs, ferry_task_current(),
                                         FERRY_CALL_CALLBACK, &f->inline_st[1], NULL);
    f->stats_rc = ferry_runtime_stats_get(NULL, 0, &f->s0) |
                  ferry_runtime_stats_get(NULL, 1, &f->s1);
    f->bad[0] = ferry_runtime_call(NULL, 2, status_apart, NULL, 0, &st, NULL);
    f->bad[1] = ferry_runtime_call(NULL, 1, NULL, NULL, 0, &st, NULL);
    f->bad[2] = ferry_runtime_call(NULL, 1, status_apart, NULL, 0, NULL, NULL);
    f->bad[3] = ferry_runtime_call(NULL, 1, status_apart, NULL, 0x10, &st, NULL);
    f->bad[4] = ferry_runtime_call((ferry_runtime *)f, 1, status_apart, NULL, 0, &st, NULL);
    f->bad[5] = st;
    return 0;
}

TR(call_returns_fn_status_and_result_apart_in_both_flavours_and_inline)
{
    struct flavours f = {0};
    ferry_runtime *rt = rt_make(2, 0);

    rt_run(rt, flavours_main, &f);
    ferry_runtime_free(rt);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f.rc[i], 0, "flavour %d: %d", i, f.rc[i]);
        cr_expect_eq(f.st[i], -ECANCELED, "fn's own -ECANCELED comes back as its status");
        cr_expect_neq(f.res[i], NULL);
    }
    cr_expect_eq(f.rc[2], 0);
    cr_expect_eq(f.st[2], 0, "a remote task is not the caller");
    cr_expect_neq(f.res[2], NULL, "a task flavour runs in a task");
    cr_expect_eq(f.rc[3], 0);
    cr_expect_eq(f.st[3], 0);
    cr_expect_eq(f.res[3], NULL, "a callback flavour runs outside tasks");
    cr_expect_eq(f.inline_rc[0], 0);
    cr_expect_eq(f.inline_st[0], 1, "inline: fn runs in the calling task");
    cr_expect_eq(f.inline_rc[1], 0);
    cr_expect_eq(f.inline_st[1], 1);
    cr_expect_eq(f.stats_rc, 0);
    cr_expect_eq(f.s0.calls_out, 4);
    cr_expect_eq(f.s0.calls_inline, 2 + 1, "two calls and the stats of loop 0 itself");
    cr_expect_eq(f.s1.calls_in, 4 + 1, "four calls and the stats of loop 1");
    cr_expect_eq(f.bad[0], -EINVAL, "no loop 2");
    cr_expect_eq(f.bad[1], -EINVAL);
    cr_expect_eq(f.bad[2], -EINVAL);
    cr_expect_eq(f.bad[3], -EINVAL);
    cr_expect_eq(f.bad[4], -EPERM, "not the caller's runtime");
    cr_expect_eq(f.bad[5], 12345, "status untouched by failed calls");
}

static int outside_rc[2];
static int call_outside(void *arg)
{
    int st;

    outside_rc[0] = ferry_runtime_call(arg, 0, status_apart, NULL, 0, &st, NULL);
    return 0;
}

static void *call_from_thread(void *arg)
{
    int st;

    outside_rc[1] = ferry_runtime_call(arg, 0, status_apart, NULL, 0, &st, NULL);
    return NULL;
}

TR(call_from_outside_the_runtime_is_eperm)
{
    ferry_runtime *rt = rt_make(2, 0);
    ferry_loop *loop;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    tu_run_on(loop, call_outside, rt);
    ferry_loop_free(loop);
    tu_on_thread(call_from_thread, rt);
    ferry_runtime_free(rt);
    cr_expect_eq(outside_rc[0], -EPERM);
    cr_expect_eq(outside_rc[1], -EPERM);
}

/* ---- suspending only the caller --------------------------------------- */

static int sleep_then_7(void *arg, void **result)
{
    (void)arg;
    (void)result;
    return ferry_sleep(FERRY_MSEC(30)) ? -1 : 7;
}

static atomic_int ticks;
static int ticker(void *arg)
{
    atomic_int *stop = arg;

    while (!atomic_load(stop)) {
        atomic_fetch_add(&ticks, 1);
        if (ferry_sleep(FERRY_MSEC(1)))
            break;
    }
    return 0;
}

struct only_caller { int rc, st, ticks_during; atomic_int stop; };

static int only_caller_main(void *arg)
{
    struct only_caller *o = arg;
    ferry_task *t = tu_spawn(ticker, &o->stop);
    int before = atomic_load(&ticks);

    o->rc = ferry_runtime_call(NULL, 1, sleep_then_7, NULL, 0, &o->st, NULL);
    o->ticks_during = atomic_load(&ticks) - before;
    atomic_store(&o->stop, 1);
    tu_join(t);
    return 0;
}

TR(call_suspends_the_caller_only)
{
    struct only_caller o = {0};
    ferry_runtime *rt = rt_make(2, 0);

    rt_run(rt, only_caller_main, &o);
    ferry_runtime_free(rt);
    cr_expect_eq(o.rc, 0);
    cr_expect_eq(o.st, 7);
    cr_expect_gt(o.ticks_during, 0, "loop 0 ran other tasks while the call waited");
}

/* ---- cancellation and deadlines reach the remote task ------------------ */

struct remote {
    atomic_int started, ended;
    int        sleep_rc;       /* what the remote task's wait returned */
    int        ended_at_return;/* `ended` when the call returned */
    int        rc, st;
};

/* The remote body: wait long, then, whatever the wait said, a shielded
 * pause before ending, so that a caller that returned early would see
 * `ended` still 0. */
static int remote_body(void *arg, void **result)
{
    struct remote *r = arg;
    ferry_scope sc;

    (void)result;
    atomic_store(&r->started, 1);
    r->sleep_rc = ferry_sleep(FERRY_SEC(10));
    ferry_scope_enter(&sc, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    ferry_sleep(FERRY_MSEC(20));
    ferry_scope_exit(&sc);
    atomic_store(&r->ended, 1);
    return 77;
}

static int remote_caller(void *arg)
{
    struct remote *r = arg;

    r->rc = ferry_runtime_call(NULL, 1, remote_body, r, 0, &r->st, NULL);
    r->ended_at_return = atomic_load(&r->ended);
    return 0;
}

static int cancel_main(void *arg)
{
    struct remote *r = arg;
    ferry_task *t = tu_spawn(remote_caller, r);

    while (!atomic_load(&r->started))
        ferry_sleep(FERRY_MSEC(1));
    ferry_task_cancel(t);
    return tu_join(t);
}

TR(caller_cancelled_cancels_the_remote_task_and_waits_for_its_end)
{
    struct remote r = {0};
    ferry_runtime *rt = rt_make(2, 0);

    rt_run(rt, cancel_main, &r);
    ferry_runtime_free(rt);
    cr_expect_eq(r.sleep_rc, -ECANCELED, "the remote task was cancelled on its loop");
    cr_expect_eq(r.rc, 0, "fn ran: the call returns 0");
    cr_expect_eq(r.st, 77, "with fn's status");
    cr_expect_eq(r.ended_at_return, 1, "the call returned only once the remote task ended");
}

/* Loop 0 kept busy past the caller's deadline: only the remote task's own
 * scope can end its wait with -ETIMEDOUT (a cancel from the caller would
 * come too late and say -ECANCELED). */
static int busy_loop0(void *arg)
{
    (void)arg;
    busy_ms(300);
    return 0;
}

static int deadline_caller(void *arg)
{
    struct remote *r = arg;
    ferry_scope sc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(50), 0);
    r->rc = ferry_runtime_call(NULL, 1, remote_body, r, 0, &r->st, NULL);
    ferry_scope_exit(&sc);
    r->ended_at_return = atomic_load(&r->ended);
    return 0;
}

static int deadline_main(void *arg)
{
    struct remote *r = arg;
    ferry_task *t = tu_spawn(deadline_caller, r);

    while (!atomic_load(&r->started))
        ferry_sleep(FERRY_USEC(200));
    busy_loop0(NULL);
    return tu_join(t);
}

TR(caller_deadline_is_the_remote_task_deadline)
{
    struct remote r = {0};
    ferry_runtime *rt = rt_make(2, 0);

    rt_run(rt, deadline_main, &r);
    ferry_runtime_free(rt);
    cr_expect_eq(r.sleep_rc, -ETIMEDOUT, "the remote wait timed out by itself: %d", r.sleep_rc);
    cr_expect_eq(r.rc, 0);
    cr_expect_eq(r.st, 77);
    cr_expect_eq(r.ended_at_return, 1);
}

/* Cancelled before fn started (loop 1 busy): fn never runs. */
struct before_start {
    atomic_int ran, busy, release;
    int rc[2], st[2], after_rc, after_st;
    ferry_future *busy_fut;
};

static int set_ran(void *arg, void **result)
{
    struct before_start *b = arg;

    (void)result;
    atomic_fetch_add(&b->ran, 1);
    return 1;
}

static int busy_until_released(void *arg)
{
    struct before_start *b = arg;

    atomic_store(&b->busy, 1);
    while (!atomic_load(&b->release))
        ;
    return 0;
}

struct bs_caller { struct before_start *b; unsigned flags; int *rc, *st; };

static int bs_call(void *arg)
{
    struct bs_caller *c = arg;

    *c->rc = ferry_runtime_call(NULL, 1, set_ran, c->b, c->flags, c->st, NULL);
    return 0;
}

static int before_start_main(void *arg)
{
    struct before_start *b = arg;
    struct bs_caller c[2] = {
        { b, 0, &b->rc[0], &b->st[0] }, { b, FERRY_CALL_CALLBACK, &b->rc[1], &b->st[1] },
    };
    ferry_task *t[2];
    int st;

    ferry_runtime_spawn(NULL, 1, busy_until_released, b, NULL, &b->busy_fut);
    while (!atomic_load(&b->busy))
        ferry_sleep(FERRY_USEC(200));
    t[0] = tu_spawn(bs_call, &c[0]);
    t[1] = tu_spawn(bs_call, &c[1]);
    tu_settle();
    ferry_task_cancel(t[0]);
    ferry_task_cancel(t[1]);
    /* Both give up while their requests wait behind the busy task; then
     * they wait for loop 1's answer, which comes once it is released. */
    tu_settle();
    atomic_store(&b->release, 1);
    tu_join(t[0]);
    tu_join(t[1]);
    ferry_future_await(b->busy_fut, &st);
    /* A later call reaches loop 1 after the two requests: fn ran neither. */
    b->after_rc = ferry_runtime_call(NULL, 1, set_ran, b, 0, &b->after_st, NULL);
    return 0;
}

TR(caller_cancelled_before_fn_started_means_fn_never_runs)
{
    struct before_start b = {0};
    ferry_runtime *rt = rt_make(2, 0);

    rt_run(rt, before_start_main, &b);
    ferry_runtime_free(rt);
    ferry_future_free(b.busy_fut);
    cr_expect_eq(b.rc[0], -ECANCELED);
    cr_expect_eq(b.rc[1], -ECANCELED);
    cr_expect_eq(b.st[0], 0, "status untouched");
    cr_expect_eq(b.after_rc, 0);
    cr_expect_eq(atomic_load(&b.ran), 1, "only the last call ran fn");
}

/* ---- backpressure ------------------------------------------------------- */

struct bp {
    atomic_int running, max, gate;
    int        rc[6], st[6];
    int        cancelled_rc;
    ferry_runtime_stats s0;
};

static int gated(void *arg, void **result)
{
    struct bp *b = arg;
    int now = atomic_fetch_add(&b->running, 1) + 1, m = atomic_load(&b->max);

    (void)result;
    while (now > m && !atomic_compare_exchange_weak(&b->max, &m, now))
        ;
    while (!atomic_load(&b->gate))
        if (ferry_sleep(FERRY_USEC(500)))
            break;
    atomic_fetch_sub(&b->running, 1);
    return 3;
}

struct bp_caller { struct bp *b; int i; };

static int bp_call(void *arg)
{
    struct bp_caller *c = arg;

    c->b->rc[c->i] = ferry_runtime_call(NULL, 1, gated, c->b, 0, &c->b->st[c->i], NULL);
    return 0;
}

static int bp_main(void *arg)
{
    struct bp *b = arg;
    struct bp_caller c[6];
    ferry_task *t[6];

    for (int i = 0; i < 5; i++) {
        c[i] = (struct bp_caller){ b, i };
        t[i] = tu_spawn(bp_call, &c[i]);
    }
    while (atomic_load(&b->running) < 2)
        ferry_sleep(FERRY_USEC(500));
    ferry_sleep(tu_ms(20));           /* a third would have started by now */
    /* Caller 5 comes when two are in flight and three wait: it waits too,
     * and cancelled there, it took no room. */
    c[5] = (struct bp_caller){ b, 5 };
    t[5] = tu_spawn(bp_call, &c[5]);
    tu_settle();
    ferry_task_cancel(t[5]);
    tu_join(t[5]);
    b->cancelled_rc = b->rc[5];
    atomic_store(&b->gate, 1);
    for (int i = 0; i < 5; i++)
        tu_join(t[i]);
    ferry_runtime_stats_get(NULL, 0, &b->s0);
    return 0;
}

TR(at_most_call_cap_calls_run_from_one_loop_to_another)
{
    struct bp b = {0};
    ferry_runtime *rt = rt_make(2, 2);

    rt_run(rt, bp_main, &b);
    ferry_runtime_free(rt);
    cr_expect_eq(atomic_load(&b.max), 2, "at most call_cap=2 ran at once: %d", atomic_load(&b.max));
    cr_expect_eq(b.cancelled_rc, -ECANCELED, "a waiting caller cancelled took no room");
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(b.rc[i], 0, "caller %d: %d", i, b.rc[i]);
        cr_expect_eq(b.st[i], 3);
    }
    cr_expect_geq(b.s0.call_waits, 4, "callers 2..5 waited for room");
    cr_expect_eq(b.s0.calls_out, 5);
}

/* ---- a loop stopped while calls to it are in flight --------------------- */

/*
 * Two shielded callers on loop 0 post to loop 1 while loop 1 is busy; the
 * runtime is freed meanwhile.  Loop 1 drains both requests and its stop
 * together: the first call's task starts and is cancelled by the loop's
 * end (the call returns 0 with fn's -ECANCELED), the second one's task was
 * spawned but never started (-ESHUTDOWN).  Later calls find the loop
 * closed (-ESHUTDOWN at once).  Nobody hangs.
 */
struct stopped {
    atomic_int busy, closing0, in_flight;
    int rc[2], st[2], last_rc[2], calls[2];
    ferry_future *busy_fut;
};

static int slow_remote(void *arg, void **result)
{
    (void)arg;
    (void)result;
    return ferry_sleep(FERRY_SEC(10));
}

static int busy_until_loop0_closes(void *arg)
{
    struct stopped *s = arg;

    atomic_store(&s->busy, 1);
    while (!atomic_load(&s->closing0))
        ;
    return 0;
}

/* On loop 0: waits until ferry_runtime_free() cancels it, which it does
 * after the stop requests went to the other loops. */
static int watch_close(void *arg)
{
    struct stopped *s = arg;

    while (ferry_sleep(FERRY_SEC(10)) == 0)
        ;
    atomic_store(&s->closing0, 1);
    return 0;
}

struct st_caller { struct stopped *s; int i; };

static int stopped_caller(void *arg)
{
    struct st_caller *c = arg;
    struct stopped *s = c->s;
    ferry_scope sc;
    int st;

    ferry_scope_enter(&sc, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    atomic_fetch_add(&s->in_flight, 1);
    s->rc[c->i] = ferry_runtime_call(NULL, 1, slow_remote, NULL, 0, &s->st[c->i], NULL);
    /* Until the loop is closed: then -ESHUTDOWN at once. */
    do {
        s->calls[c->i]++;
        s->last_rc[c->i] = ferry_runtime_call(NULL, 1, slow_remote, NULL, 0, &st, NULL);
    } while (s->last_rc[c->i] == 0);
    ferry_scope_exit(&sc);
    return 0;
}

static int stopped_main(void *arg)
{
    struct stopped *s = arg;
    static struct st_caller c[2];

    ferry_task_spawn(NULL, NULL, watch_close, s, NULL);
    ferry_runtime_spawn(NULL, 1, busy_until_loop0_closes, s, NULL, &s->busy_fut);
    while (!atomic_load(&s->busy))
        ferry_sleep(FERRY_USEC(200));
    for (int i = 0; i < 2; i++) {
        c[i] = (struct st_caller){ s, i };
        ferry_task_spawn(NULL, NULL, stopped_caller, &c[i], NULL);
    }
    while (atomic_load(&s->in_flight) < 2)
        ferry_sleep(FERRY_USEC(200));
    ferry_yield();   /* both requests posted */
    return 0;
}

TR(loop_stopped_under_calls_answers_every_caller)
{
    struct stopped s = {0};
    ferry_runtime *rt = rt_make(2, 0);

    rt_run(rt, stopped_main, &s);
    ferry_runtime_free(rt);
    ferry_future_free(s.busy_fut);
    /* Which caller posted first is up to the scheduler (fuzzing). */
    int first = s.rc[0] == 0 ? 0 : 1;
    cr_expect_eq(s.rc[first], 0, "the started call: %d %d", s.rc[0], s.rc[1]);
    cr_expect_eq(s.st[first], -ECANCELED, "its task was cancelled by the loop's end");
    cr_expect_eq(s.rc[!first], -ESHUTDOWN, "the call whose task never started: %d",
                 s.rc[!first]);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(s.last_rc[i], -ESHUTDOWN, "caller %d ended with %d", i, s.last_rc[i]);
}

/* ---- futures of tasks on other loops ------------------------------------ */

static int sleep_then_42(void *arg)
{
    atomic_int *gate = arg;

    while (gate && !atomic_load(gate))
        if (ferry_sleep(FERRY_MSEC(1)))
            return -1;
    return 42;
}

struct fut {
    atomic_int    gate;
    ferry_future *f, *g;
    int           rc1, st1, rc_cancelled, done_after_cancel, rc2, st2;
    int           sel_idx, sel_value, sel_result, sel2_idx, rc3, st3;
    int           own_rc, own_st, bad_rc, bad_st;
};

static int fut_awaiter(void *arg)
{
    struct fut *x = arg;
    int st = 0;

    x->rc_cancelled = ferry_future_await(x->g, &st);
    return 0;
}

static int fut_main(void *arg)
{
    struct fut *x = arg;
    ferry_case c[2];
    ferry_future *own;
    ferry_task *t;

    /* Join a task of loop 1. */
    ferry_runtime_spawn(NULL, 1, sleep_then_42, NULL, NULL, &x->f);
    x->rc1 = ferry_future_await(x->f, &x->st1);
    /* An await cancelled leaves the future and its task alone. */
    ferry_runtime_spawn(NULL, 1, sleep_then_42, &x->gate, NULL, &x->g);
    t = tu_spawn(fut_awaiter, x);
    tu_settle();
    ferry_task_cancel(t);
    tu_join(t);
    x->done_after_cancel = ferry_future_done(x->g);
    /* A select whose deadline wins performs nothing on the future... */
    c[0] = FERRY_CASE_FUTURE_INIT(x->g);
    c[1] = FERRY_CASE_DEADLINE_INIT(ferry_now() + FERRY_MSEC(5));
    x->sel2_idx = ferry_select(c, 2, 0);
    /* ...and the future case wins once the task ends. */
    atomic_store(&x->gate, 1);
    c[1] = FERRY_CASE_DEADLINE_INIT(ferry_now() + FERRY_SEC(20));
    x->sel_idx = ferry_select(c, 2, 0);
    x->sel_value = c[0].value;
    x->sel_result = c[0].result;
    x->rc3 = ferry_future_await(x->g, &x->st3);
    /* A future of the caller's own loop. */
    ferry_runtime_spawn(NULL, 0, sleep_then_42, NULL, NULL, &own);
    x->own_rc = ferry_future_await(own, &x->own_st);
    ferry_future_free(own);
    x->bad_rc = ferry_runtime_spawn(NULL, 5, sleep_then_42, NULL, NULL, &own);
    x->bad_st = ferry_future_await(NULL, NULL);
    return 0;
}

TR(tasks_await_and_select_on_futures_of_other_loops)
{
    struct fut x = {0};
    ferry_runtime *rt = rt_make(2, 0);
    int st = 0;

    rt_run(rt, fut_main, &x);
    cr_expect_eq(x.rc1, 0);
    cr_expect_eq(x.st1, 42);
    cr_expect_eq(x.rc_cancelled, -ECANCELED);
    cr_expect_eq(x.done_after_cancel, 0, "a cancelled await did not end the task");
    cr_expect_eq(x.sel2_idx, 1, "the deadline won");
    cr_expect_eq(x.sel_idx, 0, "the future case won");
    cr_expect_eq(x.sel_value, 42);
    cr_expect_eq(x.sel_result, 0);
    cr_expect_eq(x.rc3, 0, "a performed future case took nothing");
    cr_expect_eq(x.st3, 42);
    cr_expect_eq(x.own_rc, 0);
    cr_expect_eq(x.own_st, 42);
    cr_expect_eq(x.bad_rc, -EINVAL);
    cr_expect_eq(x.bad_st, -EINVAL);
    /* A thread waits on the same futures. */
    cr_expect_eq(ferry_future_wait(x.f, 0, &st), 0);
    cr_expect_eq(st, 42);
    ferry_runtime_free(rt);
    ferry_future_free(x.f);
    ferry_future_free(x.g);
}

/* ---- what stays per loop ------------------------------------------------- */

struct per_loop {
    ferry_lock    lock;
    ferry_queue   q;
    ferry_stream *s;
    int           fds[2];
    int           rc[6];
    int           own[3];
    int           call_rc, left, left_rc, end[3];
};

static int use_loop0_objects(void *arg, void **result)
{
    struct per_loop *p = arg;
    char buf[4];
    size_t n;
    int v = 1;

    (void)result;
    p->rc[0] = ferry_lock_acquire(&p->lock);
    p->rc[1] = ferry_lock_release(&p->lock);
    p->rc[2] = ferry_queue_put(&p->q, &v);
    p->rc[3] = ferry_queue_get(&p->q, &v);
    p->rc[4] = ferry_stream_write(p->s, "x", 1, NULL);
    p->rc[5] = ferry_stream_read(p->s, buf, sizeof buf, &n);
    return 0;
}

static int per_loop_main(void *arg)
{
    struct per_loop *p = arg;
    int st, v = 5;

    /* Bound to loop 0 by their first use. */
    p->own[0] = ferry_lock_acquire(&p->lock) | ferry_lock_release(&p->lock);
    p->own[1] = ferry_queue_put(&p->q, &v);
    p->own[2] = ferry_stream_open(&p->s, NULL, p->fds[0], NULL);
    p->call_rc = ferry_runtime_call(NULL, 1, use_loop0_objects, p, 0, &st, NULL);
    p->left_rc = ferry_queue_try_get(&p->q, &p->left);
    p->end[0] = ferry_stream_close(p->s);
    p->end[1] = ferry_queue_destroy(&p->q);
    p->end[2] = ferry_lock_destroy(&p->lock);
    return 0;
}

TR(lock_queue_and_stream_refuse_tasks_of_another_loop)
{
    struct per_loop p = {0};
    ferry_runtime *rt = rt_make(2, 0);

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, p.fds), 0);
    ferry_lock_init(&p.lock);
    ferry_queue_init(&p.q, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL);
    cr_assert_eq(rt_run(rt, per_loop_main, &p), 0);
    ferry_runtime_free(rt);
    close(p.fds[1]);
    cr_expect_eq(p.own[0], 0);
    cr_expect_eq(p.own[1], 0);
    cr_expect_eq(p.own[2], 0);
    cr_expect_eq(p.call_rc, 0);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(p.rc[i], -EPERM, "call %d from loop 1: %d", i, p.rc[i]);
    cr_expect_eq(p.left_rc, 0, "loop 0's item is still there");
    cr_expect_eq(p.left, 5);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(p.end[i], 0);
}

/* ---- on_all, stop ------------------------------------------------------- */

static int whoami(void *arg)
{
    atomic_int *count = arg;

    atomic_fetch_add(count, 1);
    return 100 + ferry_runtime_index(NULL, NULL);
}

static atomic_int forever_ended;
static int forever(void *arg)
{
    (void)arg;
    /* Counted in the loop's load: the stopping thread waits for all. */
    ferry_runtime_load_add(NULL, (unsigned)ferry_runtime_index(NULL, NULL), 1);
    while (ferry_sleep(FERRY_SEC(10)) == 0)
        ;
    atomic_fetch_add(&forever_ended, 1);
    return 0;
}

struct all { atomic_int count; int rc, st[3], rc2, ended_at_return; };

static int all_main(void *arg)
{
    struct all *a = arg;

    a->rc = ferry_runtime_on_all(NULL, whoami, &a->count, a->st);
    /* Until ferry_runtime_stop() cancels main. */
    a->rc2 = ferry_runtime_on_all(NULL, forever, NULL, NULL);
    a->ended_at_return = atomic_load(&forever_ended);
    return 9;
}

static void *stop_later(void *arg)
{
    ferry_runtime *rt = arg;

    while (ferry_runtime_load(rt, 0) + ferry_runtime_load(rt, 1) +
           ferry_runtime_load(rt, 2) != 3 + 10)
        usleep(1000);
    ferry_runtime_stop(rt);
    ferry_runtime_stop(rt);      /* twice counts as once */
    return NULL;
}

static int mark_loaded(void *arg)
{
    (void)arg;
    return 0;
}

TR(on_all_runs_fn_on_every_loop_and_stop_cancels_it_everywhere)
{
    struct all a = {0};
    ferry_runtime *rt = rt_make(3, 0);
    pthread_t th;

    atomic_store(&forever_ended, 0);
    /* From this thread, which runs no task of it. */
    cr_expect_eq(ferry_runtime_load_add(rt, 2, 10), 0);
    cr_expect_eq(ferry_runtime_load_add(rt, 3, 1), -EINVAL);
    /* The thread stops the runtime once every loop's fn is running. */
    th = tu_start_thread(stop_later, rt);
    cr_expect_eq(rt_run(rt, all_main, &a), 9);
    pthread_join(th, NULL);
    cr_expect_eq(a.rc, 0);
    cr_expect_eq(atomic_load(&a.count), 3);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(a.st[i], 100 + i);
    cr_expect_eq(a.rc2, -ECANCELED);
    cr_expect_eq(a.ended_at_return, 3, "every loop's fn ended before on_all returned");
    int st = 0;
    cr_expect_eq(ferry_runtime_run(rt, mark_loaded, NULL, &st), -ESHUTDOWN);
    cr_expect_eq(ferry_runtime_load(rt, 2), 11);
    cr_expect_eq(ferry_runtime_load(rt, 7), 0);
    ferry_runtime_free(rt);
}

/* ---- the default pool is one for every loop ---------------------------- */

static ferry_pool *pools[3];
static atomic_int offloaded;

static int offload_noop(void *arg)
{
    (void)arg;
    atomic_fetch_add(&offloaded, 1);
    return 0;
}

static int offload_on_loop(void *arg)
{
    (void)arg;
    pools[ferry_runtime_index(NULL, NULL)] = ferry_pool_default();
    return ferry_to_thread(NULL, offload_noop, NULL);
}

static int pools_main(void *arg)
{
    int st[3] = { -1, -1, -1 };
    int rc = ferry_runtime_on_all(NULL, offload_on_loop, arg, st);

    return rc ? rc : st[0] | st[1] | st[2];
}

TR(every_loop_offloads_to_the_one_default_pool)
{
    ferry_runtime *rt = rt_make(3, 0);

    cr_expect_eq(rt_run(rt, pools_main, NULL), 0);
    ferry_runtime_free(rt);
    cr_expect_eq(atomic_load(&offloaded), 3);
    cr_expect_neq(pools[0], NULL);
    cr_expect_eq(pools[0], pools[1]);
    cr_expect_eq(pools[0], pools[2]);
    ferry_pool_default_shutdown(0);
}

/* ---- statistics and dumps ----------------------------------------------- */

static atomic_int napping;
static int nap(void *arg)
{
    (void)arg;
    atomic_store(&napping, 1);
    return ferry_sleep(FERRY_SEC(10)) == -ECANCELED ? 0 : 1;
}

struct dump { char *text; size_t len; int n, all_rc; ferry_runtime_stats all; ferry_future *f; };

static int dump_main(void *arg)
{
    struct dump *d = arg;
    FILE *out = open_memstream(&d->text, &d->len);
    int st;

    ferry_runtime_spawn(NULL, 1, nap, NULL, &(ferry_task_opts){ .name = "napper" }, &d->f);
    while (!atomic_load(&napping))
        ferry_sleep(FERRY_USEC(200));
    ferry_runtime_call(NULL, 1, status_apart, NULL, FERRY_CALL_CALLBACK, &st, NULL);
    d->n = ferry_runtime_dump(NULL, FERRY_RUNTIME_ALL, out);
    fclose(out);
    d->all_rc = ferry_runtime_stats_get(NULL, FERRY_RUNTIME_ALL, &d->all);
    return 0;
}

TR(stats_and_dump_cover_every_loop_and_the_whole)
{
    struct dump d = {0};
    ferry_runtime_stats s;
    ferry_runtime *rt = rt_make(2, 0);
    char *text2 = NULL;
    size_t len2 = 0;
    FILE *out;
    int st;

    rt_run(rt, dump_main, &d);
    cr_expect_geq(d.n, 2, "main and the napper: %d", d.n);
    cr_expect(strstr(d.text, "ferry: loop 0 of 2"), "%s", d.text);
    cr_expect(strstr(d.text, "ferry: loop 1 of 2"), "%s", d.text);
    cr_expect(strstr(d.text, "'napper'"), "%s", d.text);
    cr_expect(strstr(d.text, "'main'"), "%s", d.text);
    cr_expect(strstr(d.text, "ferry: runtime of 2 loops"), "%s", d.text);
    cr_expect_eq(d.all_rc, 0);
    cr_expect_geq(d.all.calls_out, 2, "the call and the dump's call to loop 1");
    cr_expect_geq(d.all.loop.live_tasks, 2);
    /* From loop 0's thread outside a task: loop 0 directly, loop 1 by a
     * plain callback. */
    cr_expect_eq(ferry_runtime_stats_get(rt, 1, &s), 0);
    cr_expect_eq(s.loop.live_tasks, 1, "the napper");
    cr_expect_geq(s.calls_in, 3);
    out = open_memstream(&text2, &len2);
    cr_expect_eq(ferry_runtime_dump(rt, 1, out), 1);
    fclose(out);
    cr_expect(strstr(text2, "'napper'"), "%s", text2);
    cr_expect_eq(ferry_runtime_stats_get(rt, 2, &s), -EINVAL);
    cr_expect_eq(ferry_runtime_stats_get(rt, 0, NULL), -EINVAL);
    cr_expect_eq(ferry_runtime_dump(rt, -2, stdout), -EINVAL);
    ferry_future_cancel(d.f);
    cr_expect_eq(ferry_future_wait(d.f, FERRY_NEVER, &st), 0);
    cr_expect_eq(st, 0);
    ferry_future_free(d.f);
    ferry_runtime_free(rt);
    free(d.text);
    free(text2);
}

static int stats_thread_rc;
static void *stats_from_thread(void *arg)
{
    ferry_runtime_stats s;

    stats_thread_rc = ferry_runtime_stats_get(arg, 0, &s);
    return NULL;
}

TR(stats_from_a_foreign_thread_are_eperm)
{
    ferry_runtime *rt = rt_make(2, 0);

    tu_on_thread(stats_from_thread, rt);
    ferry_runtime_free(rt);
    cr_expect_eq(stats_thread_rc, -EPERM);
}

/* ---- ferry_run_loops ---------------------------------------------------- */

static atomic_int left_started;
static int left_behind(void *arg)
{
    (void)arg;
    atomic_store(&left_started, 1);
    return ferry_sleep(FERRY_SEC(60));
}

static int run_loops_main(void *arg)
{
    ferry_future *f;

    (void)arg;
    /* A task left running on loop 1 is named and cancelled at the end.
     * (One that has not started when the loops end never does: its
     * future says -ESHUTDOWN, and there is nothing to name.) */
    if (ferry_runtime_spawn(NULL, 1, left_behind, NULL,
                            &(ferry_task_opts){ .name = "forgotten" }, &f) == 0) {
        ferry_future_free(f);
        while (!atomic_load(&left_started))
            ferry_sleep(FERRY_USEC(200));
    }
    return (int)ferry_runtime_size(NULL) * 10;
}

TR(run_loops_is_ferry_run_for_n_loops)
{
    tu_log_capture_start();
    cr_expect_eq(ferry_run_loops(2, run_loops_main, NULL), 20);
    tu_log_capture_stop();
    cr_expect(strstr(tu_log_text(), "'forgotten'"), "log: [%s]", tu_log_text());
}
