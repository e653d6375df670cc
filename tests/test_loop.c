/* test_loop.c - ferry/loop.h: the loop, its callbacks and timers, turns,
 * stop and references, loops inside loops, making and freeing a loop, the
 * dump and the blocked-loop detector; also ferry_run().  A loop attached
 * to an application's event_base: test_attach.c.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry_int.h"
#include "ferry/bridge.h"

#define T(name) Test(loop, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
/* Tests that make their own loops. */
#define TL(name) Test(loop, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* libevent's allocations go through the fault hook too, so that a test can
 * fail them (as tests/fault_sites.c does). */
__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(NULL);
}

/* ---- helpers ------------------------------------------------------------ */

static int order[16], norder;

static void push_order(void *arg)
{
    if (norder < 16)
        order[norder++] = (int)(intptr_t)arg;
}

static void set_flag(void *arg)
{
    *(int *)arg += 1;
}

static void noop_cb(void *arg)
{
    (void)arg;
}

static int sleep_long(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_SEC(100));
}

/* ---- arguments ------------------------------------------------------------ */

/* The headers' version macros agree with each other and with the library
 * the test runs with (the same build, so the same version). */
Test(loop, version_macros_and_ferry_version_agree)
{
    char buf[64];

    snprintf(buf, sizeof buf, "%d.%d.%d", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR,
             FERRY_VERSION_PATCH);
    cr_assert_str_eq(buf, FERRY_VERSION);
    cr_assert_str_eq(ferry_version(), FERRY_VERSION);
    cr_assert_eq(ferry_version_number(), FERRY_VERSION_NUMBER);
    cr_assert_eq(FERRY_VERSION_NUMBER,
                 FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH);
#if FERRY_VERSION_NUMBER < 100 || !defined(FERRY_VERSION_MAJOR)
    cr_assert_fail("FERRY_VERSION_NUMBER is not usable in #if");
#endif
}

T(null_and_out_of_range_arguments_are_einval_and_change_nothing)
{
    ferry_loop_stats st;
    ferry_loop *l2 = (ferry_loop *)&st;

    /* A NULL loop: a_null_loop_... below. */
    cr_assert_eq(ferry_loop_stats_get(tu_loop, NULL), -EINVAL);
    cr_assert_not(ferry_loop_is_current(NULL));
    cr_assert_eq(ferry_call_soon(tu_loop, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_call_later(tu_loop, 0, NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_dump(tu_loop, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_new(&l2, &(ferry_loop_opts){ .stack_size = ((size_t)1 << 30) + 1 }),
                 -EINVAL);
    cr_assert_null(l2);
    ferry_loop_free(NULL);
    /* The loop is as it was: no task, nothing pending, and it still runs
     * a task. */
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        cr_assert_eq(ferry_loop_dump(tu_loop, f), 0);
        fclose(f);
        cr_assert(strstr(buf, "ferry: 0 live task(s)"), "dump was: %s", buf);
        free(buf);
    }
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.live_tasks, 0);
    cr_assert_eq(tu_run(tu_ret0, NULL), 0);
}

/* ---- from another thread ------------------------------------------------- */

/* ---- a NULL loop ---------------------------------------------------------- */

static void stop_current(void *arg)
{
    *(int *)arg += ferry_loop_stop(NULL) == 0;
}

/* The rule of loop.h: every call that takes a loop takes NULL for the
 * calling thread's current loop, and refuses it with -EINVAL on a thread
 * that has none.  On tu_loop's thread, each call given NULL acts on it. */
T(a_null_loop_is_the_calling_threads_loop)
{
    int soon = 0, later = 0, posted = 0, stops = 0;
    FILE *null = fopen("/dev/null", "w");
    ferry_inbox_stats ist;
    ferry_loop_stats st;
    ferry_future *f = NULL;
    ferry_task *t;
    int status = -1;

    cr_assert_not_null(null);
    cr_assert_eq(ferry_loop_current(), tu_loop);
    cr_assert_eq(ferry_loop_ref(NULL), 0);
    cr_assert_eq(ferry_loop_unref(tu_loop), 0, "ferry_loop_ref(NULL) did not count on tu_loop");
    cr_assert_eq(ferry_loop_base(NULL), ferry_loop_base(tu_loop));
    cr_assert_eq(ferry_loop_stats_get(NULL, &st), 0);
    cr_assert_eq(ferry_loop_set_slow_threshold(NULL, 0), 0);
    cr_assert_eq(ferry_loop_dump(NULL, null), 0);
    cr_assert_eq(ferry_loop_advance(NULL, 1), -EINVAL, "tu_loop has no virtual clock");
    cr_assert_eq(ferry_call_soon(NULL, set_flag, &soon), 0);
    cr_assert_eq(ferry_call_later(NULL, 0, set_flag, &later, NULL), 0);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(NULL, set_flag, &posted), 0);
    cr_assert_eq(ferry_task_spawn(&t, NULL, tu_ret42, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(NULL, FERRY_RUN_DEFAULT), 0);
    cr_assert(soon && later && posted, "soon %d, later %d, posted %d", soon, later, posted);
    cr_assert_eq(ferry_task_try_join(t, &status), 0);
    cr_assert_eq(status, 42);
    cr_assert_eq(ferry_loop_inbox_stats(NULL, &ist), 0);
    cr_assert_geq(ist.posts, 1);
    /* The calls that wait for a loop refuse to wait for their own. */
    cr_assert_eq(ferry_loop_call_threadsafe(NULL, tu_ret0, NULL, &f), -EDEADLK);
    cr_assert_eq(ferry_loop_run_sync(NULL, tu_ret0, NULL, 0, &status), -EDEADLK);
    /* A stop from "another thread" aimed at NULL ends a run of tu_loop. */
    cr_assert_eq(ferry_loop_stop_threadsafe(NULL), 0);
    cr_assert_eq(ferry_loop_run(NULL, FERRY_RUN_FOREVER), 0);
    /* And ferry_loop_stop(NULL) from a callback of the run. */
    cr_assert_eq(ferry_call_soon(NULL, stop_current, &stops), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    cr_assert_eq(stops, 1);
    fclose(null);
}

enum { NULL_CALLS = 24 };

struct null_calls {
    int   rc[NULL_CALLS];
    int   n;
    void *base;                  /* ferry_loop_base(NULL) */
    void *current;               /* ferry_loop_current() */
    void *outs[6];               /* the OUT parameters, which must be NULL */
};

static void *null_calls_thread(void *arg)
{
    struct null_calls *c = arg;
    static const int usr1[] = { SIGUSR1 };
    FILE *null = fopen("/dev/null", "w");
    ferry_task *t = (ferry_task *)1;
    ferry_stream *s = (ferry_stream *)1;
    ferry_listener *l1 = (ferry_listener *)1, *l2 = (ferry_listener *)1;
    ferry_sigsub *sub = (ferry_sigsub *)1;
    ferry_future *f = (ferry_future *)1;
    ferry_inbox *ib = (ferry_inbox *)1;
    ferry_inbox_stats ist;
    ferry_loop_stats st;
    int fds[2], i = 0, status;

    c->current = ferry_loop_current();
    c->base = ferry_loop_base(NULL);
    if (pipe(fds) != 0)
        return NULL;
    c->rc[i++] = ferry_loop_run(NULL, FERRY_RUN_ONCE);
    c->rc[i++] = ferry_loop_stop(NULL);
    c->rc[i++] = ferry_loop_ref(NULL);
    c->rc[i++] = ferry_loop_unref(NULL);
    c->rc[i++] = ferry_loop_set_slow_threshold(NULL, 0);
    c->rc[i++] = ferry_loop_stats_get(NULL, &st);
    c->rc[i++] = ferry_loop_advance(NULL, 1);
    c->rc[i++] = ferry_loop_dump(NULL, null);
    c->rc[i++] = ferry_call_soon(NULL, noop_cb, NULL);
    c->rc[i++] = ferry_call_later(NULL, 0, noop_cb, NULL, NULL);
    c->rc[i++] = ferry_task_spawn(&t, NULL, tu_ret0, NULL, NULL);
    c->rc[i++] = ferry_loop_set_resolver(NULL, NULL);
    c->rc[i++] = ferry_stream_open(&s, NULL, fds[0], NULL);
    c->rc[i++] = ferry_tcp_listen(&l1, NULL, "127.0.0.1", 0, NULL);
    c->rc[i++] = ferry_unix_listen(&l2, NULL, "@ferry-test-null-loop", NULL);
    c->rc[i++] = ferry_sigsub_new(&sub, NULL, usr1, 1);
    c->rc[i++] = ferry_loop_call_soon_threadsafe(NULL, noop_cb, NULL);
    c->rc[i++] = ferry_loop_stop_threadsafe(NULL);
    c->rc[i++] = ferry_inbox_get(&ib, NULL);
    c->rc[i++] = ferry_loop_inbox_stats(NULL, &ist);
    c->rc[i++] = ferry_loop_spawn_threadsafe(NULL, tu_ret0, NULL, NULL, &f);
    c->rc[i++] = ferry_loop_call_threadsafe(NULL, tu_ret0, NULL, &f);
    c->rc[i++] = ferry_loop_run_sync(NULL, tu_ret0, NULL, 0, &status);
    c->rc[i++] = ferry_loop_run_task_sync(NULL, tu_ret0, NULL, 0, &status);
    c->n = i;
    c->outs[0] = t;
    c->outs[1] = s;
    c->outs[2] = l1;
    c->outs[3] = l2;
    c->outs[4] = sub;
    c->outs[5] = ib;
    close(fds[0]);
    close(fds[1]);
    fclose(null);
    return NULL;
}

T(a_null_loop_on_a_thread_without_one_is_einval)
{
    struct null_calls c = { .n = -1 };

    tu_on_thread(null_calls_thread, &c);
    cr_assert_eq(c.n, NULL_CALLS);
    cr_assert_null(c.current);
    cr_assert_null(c.base);
    for (int i = 0; i < c.n; i++)
        cr_expect_eq(c.rc[i], -EINVAL, "call %d returned %d", i, c.rc[i]);
    for (int i = 0; i < 6; i++)
        cr_expect_null(c.outs[i], "OUT parameter %d was not set to NULL", i);
}

struct foreign {
    ferry_loop  *loop;
    ferry_task  *task;
    ferry_timer *timer;
    ferry_group *group;
    ferry_sem   *unbound;
    int          rc[20];
    int          nrc;
    void        *p[3];
};

static void *foreign_thread(void *arg)
{
    struct foreign *f = arg;
    ferry_loop_stats st;
    FILE *null = fopen("/dev/null", "w");
    int i = 0;

    f->rc[i++] = ferry_loop_ref(f->loop);
    f->rc[i++] = ferry_loop_unref(f->loop);
    f->rc[i++] = ferry_loop_set_slow_threshold(f->loop, 0);
    f->rc[i++] = ferry_loop_stats_get(f->loop, &st);
    f->rc[i++] = ferry_timer_cancel(f->timer);
    f->rc[i++] = ferry_task_try_join(f->task, NULL);
    f->rc[i++] = ferry_task_detach(f->task);
    f->rc[i++] = ferry_task_cancel(f->task);
    f->rc[i++] = ferry_loop_dump(f->loop, null);
    f->rc[i++] = ferry_task_spawn(NULL, f->loop, tu_ret0, NULL, NULL);
    f->rc[i++] = ferry_group_cancel(f->group);
    f->rc[i++] = ferry_sem_try_acquire(f->unbound);   /* no loop here to bind to */
    f->rc[i++] = ferry_yield();                       /* no loop, no task */
    f->nrc = i;
    f->p[0] = ferry_loop_base(f->loop);
    f->p[1] = ferry_loop_current();
    f->p[2] = ferry_task_current();
    ferry_loop_free(f->loop);     /* not its thread: does nothing */
    fclose(null);
    return NULL;
}

static ferry_group fg;
static ferry_event fg_go;
static int fg_status = 1;

static int foreign_owner(void *arg)
{
    (void)arg;
    ferry_group_init(&fg);
    ferry_group_spawn(&fg, sleep_long, NULL, NULL);
    ferry_event_wait(&fg_go);
    fg_status = ferry_group_wait(&fg);
    return 0;
}

T(calls_from_a_foreign_thread_are_eperm_and_change_nothing)
{
    static ferry_sem unbound;
    struct foreign f = { .loop = tu_loop, .group = &fg, .unbound = &unbound };
    ferry_task *owner;
    int fired = 0, st = 1;

    cr_assert_eq(ferry_call_later(tu_loop, FERRY_SEC(100), set_flag, &fired, &f.timer), 0);
    cr_assert_eq(ferry_task_spawn(&f.task, tu_loop, sleep_long, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&owner, tu_loop, foreign_owner, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);   /* both wait now */
    tu_on_thread(foreign_thread, &f);
    cr_assert_eq(f.nrc, 13);
    for (int i = 0; i < f.nrc; i++)
        cr_assert_eq(f.rc[i], -EPERM, "call %d returned %d", i, f.rc[i]);
    cr_assert_null(f.p[0]);
    cr_assert_null(f.p[1]);
    cr_assert_null(f.p[2]);
    /* Nothing changed: the task still sleeps, uncancelled, with its handle. */
    cr_assert_eq(ferry_task_state(f.task), FERRY_TASK_WAITING);
    cr_assert_not(ferry_task_cancelled(f.task));
    cr_assert_eq(ferry_sem_value(&unbound), 0);
    /* The loop's thread may cancel a group outside any task. */
    cr_assert_eq(ferry_group_cancel(&fg), 0);
    cr_assert_eq(ferry_event_set(&fg_go), 0);
    cr_assert_eq(ferry_timer_cancel(f.timer), 0);
    cr_assert_eq(ferry_task_cancel(f.task), 0);
    cr_assert(ferry_task_cancelled(f.task));
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(f.task, &st), 0);
    cr_assert_eq(st, -ECANCELED);
    cr_assert_eq(ferry_task_try_join(owner, NULL), 0);
    cr_assert_eq(fg_status, 0, "cancelled children are not failures");
    cr_assert_eq(fired, 0);
}

/* ---- callbacks and timers --------------------------------------------- */

static void push_and_schedule(void *arg)
{
    push_order(arg);
    ferry_call_soon(tu_loop, push_order, (void *)(intptr_t)((intptr_t)arg + 10));
}

T(call_soon_runs_in_order_and_later_ones_in_the_next_turn)
{
    ferry_loop_stats st;

    ferry_call_soon(tu_loop, push_and_schedule, (void *)1);
    ferry_call_soon(tu_loop, push_order, (void *)2);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(norder, 2);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 2);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 3);
    cr_assert_eq(order[2], 11);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_geq(st.turns, 2);
}

T(call_later_fires_in_deadline_order_and_cancel_prevents_it)
{
    ferry_timer *t2;
    int64_t t0 = ferry_now();

    ferry_call_later(tu_loop, tu_ms(30), push_order, (void *)3, NULL);
    ferry_call_later(tu_loop, tu_ms(10), push_order, (void *)1, NULL);
    ferry_call_later(tu_loop, tu_ms(20), push_order, (void *)2, &t2);
    ferry_call_later(tu_loop, tu_ms(20), push_order, (void *)4, NULL);
    cr_assert_eq(ferry_timer_cancel(t2), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 3);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 4);
    cr_assert_eq(order[2], 3);
    /* A timer never fires before its delay: the last one waited all of it. */
    cr_assert_geq(ferry_now() - t0, tu_ms(30));
    cr_assert_eq(ferry_timer_cancel(NULL), -EINVAL);
}

T(call_later_clamps_a_negative_delay_and_saturates_a_huge_one)
{
    ferry_timer *far;
    int near = 0, farr = 0;

    cr_assert_eq(ferry_call_later(tu_loop, -FERRY_SEC(5), set_flag, &near, NULL), 0);
    cr_assert_eq(ferry_call_later(tu_loop, INT64_MAX, set_flag, &farr, &far), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(near, 1, "a negative delay fires in the next turn");
    cr_assert_eq(farr, 0);
    cr_assert_eq(ferry_timer_cancel(far), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);   /* nothing left */
    cr_assert_eq(farr, 0);
}

static ferry_loop *cl;
static ferry_timer *pending_tm;
static int tm_ran, canceller_rc = 1;

static void canceller(void *arg)
{
    (void)arg;
    canceller_rc = ferry_timer_cancel(pending_tm);
}

static void arm_and_queue(void *arg)
{
    (void)arg;
    /* Due now: the poll after this turn moves it to the run queue, behind
     * the canceller. */
    ferry_call_later(cl, 0, set_flag, &tm_ran, &pending_tm);
    ferry_call_soon(cl, canceller, NULL);
}

TL(cancel_of_a_fired_timer_whose_callback_has_not_run_yet)
{
    ferry_loop_stats st;

    cr_assert_eq(ferry_loop_new(&cl, &(ferry_loop_opts){ .io_interval = 1 }), 0);
    cr_assert_eq(ferry_call_soon(cl, arm_and_queue, NULL), 0);
    cr_assert_eq(ferry_loop_run(cl, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(canceller_rc, 0);
    cr_assert_eq(tm_ran, 0, "a cancelled timer's callback ran");
    cr_assert_eq(ferry_loop_stats_get(cl, &st), 0);
    cr_assert_eq(st.steps, 2, "only arm_and_queue and the canceller ran");
    ferry_loop_free(cl);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- turns, stop, references -------------------------------------------- */

/* A task that keeps yielding cannot starve timers. */
static int timer_fired;

static int spin_yield(void *arg)
{
    long n = 0;
    while (!timer_fired && n < 50000000) {
        ferry_yield();
        n++;
    }
    return timer_fired ? 0 : -1;
}

T(yielding_task_does_not_starve_timers)
{
    ferry_task *t;
    int st = -5;

    ferry_call_later(tu_loop, tu_ms(5), set_flag, &timer_fired, NULL);
    ferry_task_spawn(&t, tu_loop, spin_yield, NULL, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), 0);
    cr_assert_eq(st, 0);
}

/* A task alone yields without queueing itself (task.c), but each yield is
 * still a turn and a step, a callback posted before it runs before it
 * returns, and a stop requested before it ends the run at the yield. */
static int lone_yielder(void *arg)
{
    ferry_loop_stats a, b;
    int flag = 0;

    (void)arg;
    if (ferry_loop_stats_get(tu_loop, &a))
        return -1;
    for (int i = 0; i < 1000; i++)
        if (ferry_yield())
            return -2;
    if (ferry_loop_stats_get(tu_loop, &b))
        return -3;
    if (b.turns - a.turns < 1000 || b.steps - a.steps < 1000)
        return -4;
    ferry_call_soon(tu_loop, set_flag, &flag);
    if (ferry_yield() || !flag)
        return -5;
    flag = 0;
    ferry_loop_stop(tu_loop);
    if (ferry_yield())
        return -6;
    return 7;               /* reached only in the second run */
}

T(lone_task_yield_is_a_turn)
{
    ferry_task *t;
    int st = 0;

    cr_assert_eq(ferry_task_spawn(&t, tu_loop, lone_yielder, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), -EAGAIN, "the run did not stop at the yield");
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), 0);
    cr_assert_eq(st, 7);
}

static void stopper(void *arg)
{
    push_order(arg);
    ferry_loop_stop(tu_loop);
}

T(stop_inside_a_turn_keeps_the_rest_of_the_turn_in_order)
{
    ferry_call_soon(tu_loop, push_order, (void *)1);
    ferry_call_soon(tu_loop, stopper, (void *)2);
    ferry_call_soon(tu_loop, push_order, (void *)3);
    ferry_call_soon(tu_loop, push_order, (void *)4);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 2);
    ferry_call_soon(tu_loop, push_order, (void *)5);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(order[i], i + 1);
}

static int a_steps, b_steps;

static int stop_then_yield(void *arg)
{
    (void)arg;
    for (int i = 0; i < 5; i++) {
        if (++a_steps == 3)
            ferry_loop_stop(tu_loop);
        ferry_yield();
    }
    return 0;
}

static int count_yields(void *arg)
{
    (void)arg;
    for (int i = 0; i < 5; i++) {
        b_steps++;
        ferry_yield();
    }
    return 0;
}

T(stop_from_a_task_takes_effect_at_its_next_switch_even_with_handover)
{
    ferry_task *a, *b;

    cr_assert_eq(ferry_task_spawn(&a, tu_loop, stop_then_yield, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&b, tu_loop, count_yields, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    /* The yield after the stop went back to the scheduler instead of
     * handing over to b. */
    cr_assert_eq(a_steps, 3);
    cr_assert_eq(b_steps, 2);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(a, NULL), 0);
    cr_assert_eq(ferry_task_try_join(b, NULL), 0);
    cr_assert_eq(a_steps, 5);
    cr_assert_eq(b_steps, 5);
}

/* The hand-over (switch.h): a turn of more tasks than io_interval is
 * handed from task to task all the way through, not only for its first
 * io_interval steps, because the scheduler polls only between turns and
 * has nothing to do in the middle of one.  While the blocked-loop detector
 * times steps, no step skips the scheduler.  The same holds in ASan and TSan builds: the hand-over is
 * annotated for them, not compiled out. */
enum { HAND_N = 300, HAND_ROUNDS = 3 };

static int hand_yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < HAND_ROUNDS; i++)
        if (ferry_yield())
            return -1;
    return 0;
}

static int hand_main(void *arg)
{
    ferry_task *t[HAND_N];
    int rc = 0;

    (void)arg;
    for (int i = 0; i < HAND_N; i++)
        if (ferry_task_spawn(&t[i], NULL, hand_yielder, NULL, NULL))
            return -1;
    for (int i = 0; i < HAND_N; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    return rc;
}

static uint64_t handoffs_of_run(int64_t slow)
{
    ferry_loop_stats st;
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(ferry_loop_set_slow_threshold(l, slow), 0);
    cr_assert_eq(tu_run_on(l, hand_main, NULL), 0);
    cr_assert_eq(ferry_loop_stats_get(l, &st), 0);
    cr_assert_geq(st.steps, (uint64_t)HAND_N * (HAND_ROUNDS + 1));
    ferry_loop_free(l);
    return st.handoffs;
}

TL(a_turn_longer_than_io_interval_is_handed_over_all_the_way)
{
    uint64_t fast = handoffs_of_run(0), timed = handoffs_of_run(FERRY_SEC(10));

    /* A task's first step (which starts it) and its last (after which it
     * ends) go through the scheduler; the HAND_ROUNDS - 1 steps between
     * are handed over, but for the first step of each turn. */
    cr_assert_geq(fast, (uint64_t)(HAND_N - 1) * (HAND_ROUNDS - 1),
                  "%" PRIu64 " of %d steps handed over", fast, HAND_N * (HAND_ROUNDS - 1));
    cr_assert_eq(timed, 0, "%" PRIu64 " steps skipped the detector", timed);
    cr_assert_eq(tu_leaks(), 0);
}

static int once_steps;

static int spin_task(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++) {
        once_steps++;
        if (ferry_yield())
            break;
    }
    return 0;
}

/* loop.h: FERRY_RUN_ONCE is "one turn: run what is ready, poll I/O without
 * blocking".  The direct task-to-task handover (src/switch.h) must not
 * begin new turns inside one FERRY_RUN_ONCE, as it may in the other modes
 * while no poll is due: a yielding task takes one step per call. */
T(run_once_runs_one_turn_of_yielding_tasks)
{
    ferry_task *t;

    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, 0), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, spin_task, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_expect_eq(once_steps, 1, "one FERRY_RUN_ONCE ran %d steps of a yielding task", once_steps);
    cr_assert_eq(tu_cancel_join(t), 0);
}

static void stop_cb(void *arg)
{
    ferry_loop_stop(tu_loop);
}

T(ref_keeps_default_run_alive_until_stopped)
{
    cr_assert_eq(ferry_loop_ref(tu_loop), 0);
    ferry_call_later(tu_loop, tu_ms(5), stop_cb, NULL, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_loop_unref(tu_loop), 0);
    cr_assert_eq(ferry_loop_unref(tu_loop), -EINVAL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
}

static void unref_from_libevent(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what;
    *(int *)arg = ferry_loop_unref(tu_loop) == 0 ? 1 : -1;
}

T(ref_keeps_an_idle_loop_running_until_unref)
{
    struct timeval tv = { 0, 2000 };
    struct event *ev;
    int done = 0;

    cr_assert_eq(ferry_loop_ref(tu_loop), 0);
    /* No task, callback or timer of ferry's: only the reference and an
     * event of the application's in the loop's base. */
    ev = evtimer_new(ferry_loop_base(tu_loop), unref_from_libevent, &done);
    cr_assert_not_null(ev);
    evtimer_add(ev, &tv);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(done, 1);
    event_free(ev);
}

/* ---- loops inside loops, several loops on a thread ---------------------- */

static int reent[6];

static void reenter_cb(void *arg)
{
    (void)arg;
    reent[0] = ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    ferry_loop_free(tu_loop);            /* inside its own turn: ignored */
    reent[1] = ferry_call_soon(tu_loop, push_order, (void *)7);
}

static int reenter_task(void *arg)
{
    ferry_loop *l2 = (ferry_loop *)&reent;

    (void)arg;
    reent[2] = ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    reent[3] = ferry_loop_new(&l2, NULL);
    reent[4] = l2 == NULL;
    reent[5] = ferry_run(tu_ret0, NULL);
    return 0;
}

T(running_making_or_freeing_a_loop_from_inside_it_is_refused)
{
    cr_assert_eq(ferry_call_soon(tu_loop, reenter_cb, NULL), 0);
    cr_assert_eq(tu_run(reenter_task, NULL), 0);
    cr_assert_eq(reent[0], -EPERM);
    cr_assert_eq(reent[1], 0, "the loop was freed from its own callback");
    cr_assert_eq(reent[2], -EPERM);
    cr_assert_eq(reent[3], -EPERM);
    cr_assert_eq(reent[4], 1);
    cr_assert_eq(reent[5], -EPERM);
    cr_assert_eq(norder, 1);
    cr_assert_eq(order[0], 7);
}

static int inner_yields;
static int inner_cb_yield = 1;

static int inner_task(void *arg)
{
    ferry_lock *lk = arg;
    int rc = ferry_lock_acquire(lk);

    if (rc == 0)
        rc = ferry_yield();
    if (rc == 0)
        inner_yields++;
    ferry_lock_release(lk);
    return rc;
}

static int outer_marker;
static int outer_marker_at_spawn = -1, inner_cb_spawn = -1;

static int mark_outer(void *arg)
{
    (void)arg;
    outer_marker = 1;
    return 0;
}

static void inner_cb(void *arg)
{
    ferry_task_opts eager = { .flags = FERRY_SPAWN_EAGER };

    (void)arg;
    /* A callback of the inner loop is not a task, though it runs on the
     * outer task's stack. */
    inner_cb_yield = ferry_yield();
    /* Nor can it make the outer task step aside for an eager spawn: the
     * new task of the outer loop runs later, the usual way. */
    inner_cb_spawn = ferry_task_spawn(NULL, tu_loop, mark_outer, NULL, &eager);
    outer_marker_at_spawn = outer_marker;
}

static int outer_task(void *arg)
{
    ferry_loop *inner = arg;
    ferry_lock lk = FERRY_LOCK_INIT;
    ferry_task *t;
    int rc, st = -1;

    /* The callback first: it runs before any task of the inner loop. */
    if ((rc = ferry_call_soon(inner, inner_cb, NULL)) ||
        (rc = ferry_task_spawn(&t, inner, inner_task, &lk, NULL)) ||
        (rc = ferry_loop_run(inner, FERRY_RUN_DEFAULT)) ||
        (rc = ferry_task_try_join(t, &st)))
        return 2000 + rc;
    if (st != 0)
        return 3000 + st;
    /* Back in the outer task: still a task of the outer loop. */
    if ((rc = ferry_yield()))
        return 4000 + rc;
    return ferry_task_current() ? 0 : -5000;
}

T(a_task_can_run_another_loop_and_is_itself_again_after)
{
    ferry_loop *inner;
    int rc;

    /* Made before the outer loop runs (a task cannot make a loop). */
    cr_assert_eq(ferry_loop_new(&inner, NULL), 0);
    rc = tu_run(outer_task, inner);
    ferry_loop_free(inner);
    cr_assert_eq(rc, 0, "rc %d", rc);
    cr_assert_eq(inner_yields, 1);
    cr_assert_eq(inner_cb_yield, -EPERM);
    cr_assert_eq(inner_cb_spawn, 0);
    cr_assert_eq(outer_marker_at_spawn, 0);
    cr_assert_eq(outer_marker, 1);
}

static ferry_group xg;
static ferry_event xg_go;
static int xg_status = 1;
static ferry_task *xg_task_a;
static int cross_rc[3];

static int owner_on_a(void *arg)
{
    (void)arg;
    ferry_group_init(&xg);
    ferry_event_wait(&xg_go);
    xg_status = ferry_group_wait(&xg);
    return 0;
}

static int task_on_b(void *arg)
{
    (void)arg;
    cross_rc[0] = ferry_group_spawn(&xg, tu_ret0, NULL, NULL);   /* a group of loop a */
    cross_rc[1] = ferry_task_join(xg_task_a, NULL);          /* a task of loop a */
    cross_rc[2] = ferry_event_set(&xg_go);                   /* bound to loop a */
    return 0;
}

TL(two_loops_on_one_thread_keep_their_tasks_and_primitives_apart)
{
    ferry_loop *a, *b;

    cr_assert_eq(ferry_loop_new(&a, NULL), 0);
    cr_assert_eq(ferry_loop_new(&b, NULL), 0);
    cr_assert_eq(ferry_loop_current(), a, "the first loop made on a thread is its current one");
    cr_assert_eq(ferry_task_spawn(&xg_task_a, a, owner_on_a, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(a, FERRY_RUN_ONCE), 0);     /* the owner waits */
    cr_assert_eq(tu_run_on(b, task_on_b, NULL), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(cross_rc[i], -EPERM, "call %d returned %d", i, cross_rc[i]);
    cr_assert_eq(ferry_loop_current(), a);
    cr_assert_eq(ferry_event_set(&xg_go), 0);
    cr_assert_eq(ferry_loop_run(a, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(xg_task_a, NULL), 0);
    cr_assert_eq(xg_status, 0);
    ferry_event_destroy(&xg_go);
    /* Freeing the current loop leaves the thread without one until the
     * other runs. */
    ferry_loop_free(a);
    cr_assert_null(ferry_loop_current());
    cr_assert_eq(tu_run_on(b, tu_ret0, NULL), 0);
    cr_assert_eq(ferry_loop_current(), b);
    ferry_loop_free(b);
    cr_assert_null(ferry_loop_current());
    cr_assert_eq(tu_leaks(), 0);
}

static ferry_loop *nest_b;
static int nest_ticks;

static int nest_yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3; i++) {
        nest_ticks++;
        if (ferry_yield())
            return -1;
    }
    return 0;
}

static int nest_runs_b(void *arg)
{
    (void)arg;
    if (ferry_task_spawn(NULL, nest_b, nest_yielder, NULL, NULL) ||
        ferry_task_spawn(NULL, nest_b, nest_yielder, NULL, NULL))
        return -1;
    return ferry_loop_run(nest_b, FERRY_RUN_DEFAULT);
}

/* src/switch.h: a loop's scheduler need not run on the same stack every
 * time.  Loop b runs first inside a task of loop a, which then ends (its
 * TSan fiber destroyed, its stack gone), then on the thread's own stack.
 * The tasks of the second run must switch back to the scheduler's fiber of
 * that run, taken at every switch, not to one remembered from the first:
 * a TSan build would crash in the dead task's fiber. */
TL(a_loop_run_from_a_task_then_from_its_own_thread_runs_both_times)
{
    ferry_loop *a;
    ferry_task *t;
    int st = -1;

    cr_assert_eq(ferry_loop_new(&a, NULL), 0);
    cr_assert_eq(ferry_loop_new(&nest_b, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&t, a, nest_runs_b, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(a, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), 0);
    cr_assert_eq(st, 0);
    ferry_loop_free(a);
    cr_assert_eq(ferry_task_spawn(NULL, nest_b, nest_yielder, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, nest_b, nest_yielder, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(nest_b, FERRY_RUN_DEFAULT), 0);
    ferry_loop_free(nest_b);
    cr_assert_eq(nest_ticks, 12);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- making a loop, ferry_run() ------------------------------------------- */

/* Loop creation with each allocation in turn failing: an error, no leak,
 * then a loop that works. */
TL(new_fails_cleanly_at_every_allocation)
{
    ferry_loop *loop = NULL;
    int rc = -1;

    for (unsigned long n = 1; n < 200; n++) {
        ferry__fault_arm(n, false);
        rc = ferry_loop_new(&loop, NULL);
        ferry__fault_reset();
        if (rc == 0)
            break;
        cr_assert_lt(rc, 0);
    }
    cr_assert_eq(rc, 0);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(loop, noop_cb, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop, FERRY_RUN_DEFAULT), 0);
    ferry_loop_free(loop);
    cr_assert_eq(tu_leaks(), 0);
}

static int run_main(void *arg)
{
    ferry_sleep(FERRY_MSEC(1));
    return 77;
}

TL(ferry_run_returns_main_status)
{
    cr_assert_eq(ferry_run(run_main, NULL), 77);
    cr_assert_eq(ferry_run(NULL, NULL), -EINVAL);
    cr_assert_eq(tu_leaks(), 0);
}

/* Tasks alive when main returns are named in the log, cancelled and
 * waited for, as asyncio.run() does: a forgotten sleeper and a task that
 * only yields do not hold the exit. */
static int left_rc[2];

static int forgotten_sleeper(void *arg)
{
    left_rc[0] = ferry_sleep(FERRY_NEVER);
    return 0;
}

static int forgotten_yielder(void *arg)
{
    int rc;

    while ((rc = ferry_yield()) == 0)
        ;
    left_rc[1] = rc;
    return 0;
}

static int main_forgets_two(void *arg)
{
    ferry_task_spawn(NULL, NULL, forgotten_sleeper, NULL, &(ferry_task_opts){ .name = "sleeper" });
    ferry_task_spawn(NULL, NULL, forgotten_yielder, NULL, &(ferry_task_opts){ .name = "yielder" });
    ferry_yield();
    return 5;
}

TL(ferry_run_cancels_waits_for_and_names_tasks_left_when_main_returns)
{
    int rc;

    tu_log_capture_start();
    rc = ferry_run(main_forgets_two, NULL);
    tu_log_capture_stop();
    cr_assert_eq(rc, 5);
    cr_assert_eq(left_rc[0], -ECANCELED);
    cr_assert_eq(left_rc[1], -ECANCELED);
    cr_assert_eq(tu_log_lines(), 2, "log: %s", tu_log_text());
    cr_assert_not_null(strstr(tu_log_text(), "'sleeper'"), "log: %s", tu_log_text());
    cr_assert_not_null(strstr(tu_log_text(), "'yielder'"), "log: %s", tu_log_text());
    cr_assert_eq(tu_log_level(0), FERRY_LOG_WARN);
    cr_assert_eq(tu_leaks(), 0);
}

/* The default pool is shut down at the end of ferry_run(): its threads
 * are gone and its memory is given back; the next use starts a new one.
 * The pool joins its threads before it returns; the counts wait for the
 * kernel to reap them (tu_threads_now()). */
static int offload_job(void *arg)
{
    return 31;
}

static int main_offloads(void *arg)
{
    return ferry_to_thread(NULL, offload_job, NULL);
}

TL(ferry_run_shuts_the_default_pool_down_and_a_later_use_starts_a_new_one)
{
    int before = tu_threads_baseline();
    ferry_pool_stats st;
    long live;

    cr_assert_gt(before, 0);
    live = ferry__alloc_live();
    cr_assert_eq(ferry_run(main_offloads, NULL), 31);
    cr_assert_eq(tu_threads_wait(before), before, "the default pool's threads outlived ferry_run");
    cr_assert_eq(ferry__alloc_live(), live);
    /* A later use starts a new default pool, which the call shuts down. */
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), 0);
    cr_assert_gt(tu_threads_now(), before);
    cr_assert_eq(ferry_run(main_offloads, NULL), 31);
    cr_assert_eq(tu_threads_wait(before), before);
    cr_assert_not_null(ferry_pool_default());
    cr_assert_gt(tu_threads_now(), before);
    cr_assert_eq(ferry_pool_default_shutdown(0x80), -EINVAL);
    cr_assert_eq(ferry_pool_default_shutdown(0), 0);
    cr_assert_eq(tu_threads_wait(before), before);
    cr_assert_eq(ferry_pool_default_shutdown(0), 0);   /* none: nothing to do */
    cr_assert_eq(tu_leaks(), 0);
}

/* A job on the default pool abandoned by its task (a stuck lookup) does
 * not hold ferry_run's exit: ferry_run returns while it still blocks, and
 * once released it ends, its cleanup runs and its thread goes away. */
static atomic_int stuck_started, stuck_release, stuck_cleanups;

static int stuck_job(void *arg)
{
    atomic_store(&stuck_started, 1);
    while (!atomic_load(&stuck_release))
        usleep(1000);
    return 0;
}

static void stuck_cleanup(void *arg, int status)
{
    atomic_fetch_add(&stuck_cleanups, 1);
}

/* Gives up on the job only once it runs: a job still queued would be
 * dropped with its cleanup, which is not the case under test. */
static int stuck_canceller(void *arg)
{
    tu_task_wait_flag(&stuck_started);
    return ferry_task_cancel(arg);
}

static int main_abandons(void *arg)
{
    ferry_task *c;
    int rc;

    if (ferry_task_spawn(&c, NULL, stuck_canceller, ferry_task_current(), NULL) ||
        ferry_task_detach(c))
        return 2;
    rc = ferry_to_thread_abandon(NULL, stuck_job, NULL, stuck_cleanup);
    return rc == -ECANCELED ? 0 : 1;
}

TL(ferry_run_does_not_wait_for_an_abandoned_job_of_the_default_pool)
{
    int before = tu_threads_baseline();
    long live = ferry__alloc_live();

    cr_assert_eq(ferry_run(main_abandons, NULL), 0);
    cr_assert_eq(atomic_load(&stuck_cleanups), 0, "ferry_run waited for the abandoned job");
    cr_assert_eq(tu_threads_wait(before + 1), before + 1);
    atomic_store(&stuck_release, 1);
    cr_assert_eq(tu_threads_wait(before), before);
    cr_assert_eq(atomic_load(&stuck_cleanups), 1);
    cr_assert_eq(tu_alloc_settle(live), 0);
}

TL(ferry_run_returns_enomem_when_the_loop_or_the_task_cannot_be_made)
{
    unsigned long n, hits;
    int rc, enomem = 0;

    cr_assert_eq(ferry_run(tu_ret42, NULL), 42);    /* one-time setup done */
    for (n = 1; n < 1000; n++) {
        ferry__fault_arm(n, false);
        rc = ferry_run(tu_ret42, NULL);
        hits = ferry__fault_hits();
        ferry__fault_reset();
        if (hits == 0) {
            cr_assert_eq(rc, 42);
            break;
        }
        cr_assert(rc == -ENOMEM || rc == 42, "point %lu: %d", n, rc);
        enomem += rc == -ENOMEM;
    }
    cr_assert_lt(n, 1000);
    cr_assert_gt(enomem, 2);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- freeing a loop ------------------------------------------------------ */

static int cleanups;

static int cleanup_after_cancel(void *arg)
{
    int rc = ferry_sleep(FERRY_SEC(100));
    if (rc == -ECANCELED)
        cleanups++;
    return rc;
}

TL(free_with_live_tasks_cancels_them_and_runs_cleanup)
{
    ferry_loop *loop;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(ferry_task_spawn(NULL, loop, cleanup_after_cancel, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop, FERRY_RUN_ONCE), 0);
    ferry_loop_free(loop);
    cr_assert_eq(cleanups, 100);
    cr_assert_eq(tu_leaks(), 0);
}

static ferry_loop *fl;
static int free_rc[3] = { 1, 1, 1 }, stubborn_rc = 1, pending_cb_ran, dropped_ran;

static int closing_task(void *arg)
{
    int rc = ferry_sleep(FERRY_SEC(100));    /* cancelled by ferry_loop_free() */

    (void)arg;
    free_rc[0] = rc;
    free_rc[1] = ferry_task_spawn(NULL, NULL, tu_ret0, NULL, NULL);
    free_rc[2] = ferry_loop_stop(fl);         /* does not cut the free short */
    return rc;
}

static int stubborn_task(void *arg)
{
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    stubborn_rc = ferry_sleep(FERRY_MSEC(5));
    ferry_scope_exit(&s);
    return 0;
}

TL(free_waits_for_shielded_tasks_runs_callbacks_refuses_spawns_drops_timers)
{
    cr_assert_eq(ferry_loop_new(&fl, &(ferry_loop_opts){ .io_interval = 1 }), 0);
    cr_assert_eq(ferry_task_spawn(NULL, fl, closing_task, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, fl, stubborn_task, NULL, NULL), 0);
    cr_assert_eq(ferry_call_later(fl, FERRY_SEC(100), set_flag, &dropped_ran, NULL), 0);
    cr_assert_eq(ferry_loop_run(fl, FERRY_RUN_ONCE), 0);     /* both wait */
    cr_assert_eq(ferry_call_soon(fl, set_flag, &pending_cb_ran), 0);
    ferry_loop_free(fl);
    cr_assert_eq(free_rc[0], -ECANCELED);
    cr_assert_eq(free_rc[1], -ESHUTDOWN, "spawn into a closing loop: %d", free_rc[1]);
    cr_assert_eq(free_rc[2], 0);
    cr_assert_eq(stubborn_rc, 0, "the shielded sleep was cut short");
    cr_assert_eq(pending_cb_ran, 1);
    cr_assert_eq(dropped_ran, 0, "a timer fired during free");
    cr_assert_eq(tu_leaks(), 0);
}

static int post_ran, chain_ran;

static void chain_cb(void *arg)
{
    post_ran++;
    ferry_call_soon(arg, set_flag, &chain_ran);
}

TL(free_of_an_idle_loop_runs_accepted_posts_and_what_they_schedule)
{
    ferry_loop *l;
    int dropped = 0, soon = 0;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(l, chain_cb, l), 0);
    cr_assert_eq(ferry_call_later(l, 0, set_flag, &dropped, NULL), 0);
    cr_assert_eq(ferry_call_soon(l, set_flag, &soon), 0);
    ferry_loop_free(l);
    cr_assert_eq(soon, 1, "an accepted callback did not run");
    cr_assert_eq(post_ran, 1);
    cr_assert_eq(chain_ran, 1);
    cr_assert_eq(dropped, 0, "timers that never fired are dropped");
    cr_assert_eq(tu_leaks(), 0);
}

/* The lowest descriptor numbers a process could open next, n of them;
 * returns the highest. */
static int next_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        fds[i] = dup(2);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return fds[n - 1];
}

/*
 * With k more descriptors allowed than libevent needs for a base (fewer
 * make libevent exit the process), a loop with its own base is made or
 * fails with -EMFILE (ferry's timerfd or eventfd), and leaves no
 * descriptor behind.
 */
TL(new_reports_a_descriptor_limit_as_emfile)
{
    struct rlimit old, lim;
    struct event_base *probe;
    int fds[32], first, base_fds, rc, emfile = 0;
    bool made = false;

    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    base_fds = tu_open_fds();
    probe = event_base_new();
    cr_assert_not_null(probe);
    base_fds = tu_open_fds() - base_fds;
    event_base_free(probe);
    cr_assert_lt(base_fds + 8, 32);
    next_fds(fds, 1);
    first = fds[0];
    for (int k = 0; k < 8 && !made; k++) {
        ferry_loop *loop = NULL;

        lim = old;
        lim.rlim_cur = (rlim_t)next_fds(fds, base_fds + k) + 1;
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &lim), 0);
        rc = ferry_loop_new(&loop, NULL);
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
        cr_assert(rc == 0 || rc == -EMFILE, "%d descriptors more than a base needs: %d", k, rc);
        emfile += rc == -EMFILE;
        if (rc == 0) {
            made = true;
            ferry_loop_free(loop);
        } else {
            cr_assert_null(loop);
        }
        next_fds(fds, 1);
        cr_assert_eq(fds[0], first, "%d more descriptors: a descriptor was left open", k);
    }
    cr_assert(made);
    cr_assert_gt(emfile, 0, "no descriptor limit was reported as -EMFILE");
}

/* ---- the dump -------------------------------------------------------------- */

static int dump_sleeper(void *arg)
{
    return ferry_sleep(FERRY_SEC(100));
}

T(dump_lists_live_tasks_with_state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ferry_task *t;

    ferry_task_spawn(&t, tu_loop, dump_sleeper, NULL, &(ferry_task_opts){ .name = "napper" });
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(ferry_loop_dump(tu_loop, f), 1);
    fclose(f);
    cr_assert(strstr(buf, "napper") && strstr(buf, "waiting") && strstr(buf, "sleep"),
              "dump was: %s", buf);
    free(buf);
    cr_assert_eq(tu_cancel_join(t), -ECANCELED);
}

static char *dump_buf;
static size_t dump_len;
static int dump_n, stubborn_sleep_rc = 1;

static int shielded_sleeper(void *arg)
{
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    stubborn_sleep_rc = ferry_sleep(FERRY_MSEC(20));
    ferry_scope_exit(&s);
    return ferry_yield();          /* the held-back cancellation arrives */
}

static int dump_main(void *arg)
{
    ferry_task *fresh, *stubborn;
    ferry_group g;
    FILE *f;
    int st = 1;

    (void)arg;
    ferry_group_init(&g);
    ferry_group_spawn(&g, sleep_long, NULL, &(ferry_task_opts){ .name = "grouped" });
    ferry_task_spawn(&stubborn, NULL, shielded_sleeper, NULL,
                     &(ferry_task_opts){ .name = "stubborn" });
    ferry_yield();                         /* both wait now */
    ferry_task_cancel(stubborn);           /* shielded: still waiting */
    ferry_task_spawn(&fresh, NULL, tu_ret0, NULL, &(ferry_task_opts){ .name = "fresh" });
    f = open_memstream(&dump_buf, &dump_len);
    dump_n = ferry_loop_dump(tu_loop, f);
    fclose(f);
    ferry_group_cancel(&g);
    ferry_group_wait(&g);
    ferry_task_join(fresh, NULL);
    ferry_task_join(stubborn, &st);
    return st;
}

/* The dump's line of the task named `name`, or "" */
static const char *dump_line(const char *name, char *line, size_t size)
{
    const char *p = strstr(dump_buf, name), *s, *e;

    if (!p)
        return "";
    for (s = p; s > dump_buf && s[-1] != '\n'; s--)
        ;
    e = strchr(p, '\n');
    if (!e)
        e = p + strlen(p);
    snprintf(line, size, "%.*s", (int)(e - s), s);
    return line;
}

T(dump_shows_every_state_wait_timer_cancellation_and_group)
{
    char l[256];

    cr_assert_eq(tu_run(dump_main, NULL), -ECANCELED);
    cr_assert_eq(stubborn_sleep_rc, 0, "a shielded sleep was cut short");
    cr_assert_eq(dump_n, 4, "dump: %s", dump_buf);
    cr_assert(strstr(dump_buf, "4 live task(s)"), "%s", dump_buf);
    cr_assert(strstr(dump_line("'main'", l, sizeof l), "running"), "%s", dump_buf);
    cr_assert(strstr(dump_line("'fresh'", l, sizeof l), "ready"), "%s", dump_buf);
    dump_line("'grouped'", l, sizeof l);
    cr_assert(strstr(l, "waiting on sleep") && strstr(l, "wakes in") && strstr(l, "in group"),
              "%s", dump_buf);
    cr_assert_null(strstr(l, "cancelled"), "%s", dump_buf);
    dump_line("'stubborn'", l, sizeof l);
    cr_assert(strstr(l, "waiting on sleep") && strstr(l, ", cancelled"), "%s", dump_buf);
    cr_assert_null(strstr(l, "in group"), "%s", dump_buf);
    free(dump_buf);
}

/* ---- blocked-loop detector ---------------------------------------- */

static int blocker(void *arg)
{
    usleep(200 * 1000);        /* the mistake: a blocking call on the loop */
    return 0;
}

static int polite(void *arg)
{
    for (int i = 0; i < 100; i++)
        ferry_sleep(FERRY_USEC(100));
    return 0;
}

/* The polite task's steps are short, but a loaded machine or a slow build
 * may stop the process in one of them: its threshold is scaled.  The
 * blocker's 200 ms exceed an unscaled 100 ms in any build. */
T(blocked_loop_detector_names_the_task)
{
    tu_log_capture_start();
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, tu_ms(100)), 0);
    ferry_task_spawn(NULL, tu_loop, polite, NULL, &(ferry_task_opts){ .name = "polite" });
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    cr_assert_eq(tu_log_lines(), 0, "false report: %s", tu_log_text());
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, FERRY_MSEC(100)), 0);
    ferry_task_spawn(NULL, tu_loop, blocker, NULL, &(ferry_task_opts){ .name = "sleepy-io" });
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    tu_log_capture_stop();
    cr_assert_eq(tu_log_lines(), 1, "log was: %s", tu_log_text());
    cr_assert(strstr(tu_log_text(), "sleepy-io"), "log was: %s", tu_log_text());
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, -1), -EINVAL);
}


static void slow_cb(void *arg)
{
    (void)arg;
    usleep(2000);
}

T(slow_callback_is_reported_as_a_callback)
{
    ferry_loop_stats st;

    tu_log_capture_start();
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, 1), 0);   /* 1 ns */
    ferry_call_soon(tu_loop, slow_cb, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    tu_log_capture_stop();
    cr_assert_eq(tu_log_lines(), 1, "log was: %s", tu_log_text());
    cr_assert(strstr(tu_log_text(), "by a callback"), "log was: %s", tu_log_text());
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.slow_steps, 1);
}

T(default_log_writes_a_warning_line_on_stderr)
{
    const char *out;

    ferry_set_log(NULL, NULL);
    ferry_loop_set_slow_threshold(tu_loop, 1);
    ferry_call_soon(tu_loop, slow_cb, NULL);
    tu_stderr_capture();
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    out = tu_stderr_release();
    cr_assert(strstr(out, "ferry: warning: loop blocked for"), "stderr was: %s", out);
}

static int noop_job(void *arg)
{
    (void)arg;
    return 0;
}

static int polite_offloader(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++)
        ferry_yield();
    return ferry_to_thread(NULL, noop_job, NULL);
}

/* The threshold is scaled for slow builds: under valgrind all threads
 * share one lock, so a step of a few microseconds can take 100 ms of wall
 * time while the pool's threads run.  The default pool is started before
 * the loop so that its thread creation is not inside a task step. */
T(blocked_loop_detector_reports_nothing_of_tasks_that_yield_and_offload)
{
    cr_assert_not_null(ferry_pool_default());
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, tu_ms(100)), 0);
    tu_log_capture_start();
    for (int i = 0; i < 10; i++)
        cr_assert_eq(ferry_task_spawn(NULL, tu_loop, polite_offloader, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    tu_log_capture_stop();
    cr_assert_eq(tu_log_lines(), 0, "log: %s", tu_log_text());
}

/* ---- the loop's parts (ferry_int.h) ------------------------------------------ */

/* A part as the I/O layer makes one: embedded in its owner's record. */
struct test_part {
    struct ferry__loop_part part;
    int                     id;
};

static int part_freed[4];       /* ids in the order the loop freed them */
static int part_nfreed;
static int part_closing_calls;  /* times the closing hook was asked */
static int part_busy;           /* answers "still closing" this many times */

static bool test_part_closing(struct ferry__loop_part *part)
{
    (void)part;
    part_closing_calls++;
    return part_busy-- > 0;
}

static void test_part_free(struct ferry__loop_part *part)
{
    struct test_part *t = ferry__container_of(part, struct test_part, part);

    /* Still findable while its own free hook runs. */
    if (ferry__loop_part_find(part->loop, part->ops) == part && part_nfreed < 4)
        part_freed[part_nfreed++] = t->id;
    ferry__loop_part_del(part);
}

static const struct ferry__part_ops test_part_a = { "a", test_part_closing, test_part_free };
static const struct ferry__part_ops test_part_b = { "b", NULL, test_part_free };
static const struct ferry__part_ops test_part_none = { "none", NULL, test_part_free };

/* The parts a subsystem adds at its first use are found by their ops,
 * asked while the loop ends until none owes anything (the loop goes on
 * polling meanwhile), and freed newest first when the loop is freed. */
Test(loop, parts_are_found_polled_while_closing_and_freed_newest_first, .timeout = 30.)
{
    struct test_part a = { .id = 1 }, b = { .id = 2 };
    ferry_loop *loop;

    part_nfreed = 0;
    part_closing_calls = 0;
    part_busy = 3;
    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_null(ferry__loop_part_find(loop, &test_part_a));
    ferry__loop_part_add(loop, &a.part, &test_part_a);
    ferry__loop_part_add(loop, &b.part, &test_part_b);
    cr_assert_eq(ferry__loop_part_find(loop, &test_part_a), &a.part);
    cr_assert_eq(ferry__loop_part_find(loop, &test_part_b), &b.part);
    cr_assert_null(ferry__loop_part_find(loop, &test_part_none));
    cr_assert_eq(a.part.loop, loop);
    ferry_loop_free(loop);
    cr_assert_eq(part_closing_calls, 4, "closing asked %d times", part_closing_calls);
    cr_assert_eq(part_nfreed, 2);
    cr_assert_eq(part_freed[0], 2);
    cr_assert_eq(part_freed[1], 1);
}
