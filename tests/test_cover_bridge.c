/* test_cover_bridge.c - the bridge's error returns and rarer paths (issue 6:
 * every error-return branch reached): bad arguments, wrong thread, a closed
 * loop or pool (-ESHUTDOWN), timeouts, allocation failures through the
 * fault hook, the channel's try/close paths, futures cancelled before they
 * ran, submit from plain threads and on the loop's thread, pool stats.
 *
 * Each test asserts the contract in include/ferry/bridge.h, not only that
 * a line ran.  No cr_assert inside task bodies: they record, the test body
 * asserts after the loop returned.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/bridge.h"

static void noop_cb(void *arg) { (void)arg; }
static int job42(void *arg) { (void)arg; return 42; }
static int fn7(void *arg) { (void)arg; return 7; }

/* A job that blocks its pool thread until `gate` opens. */
static atomic_int gate, gate_entered;
static int gate_job(void *arg)
{
    (void)arg;
    atomic_fetch_add(&gate_entered, 1);
    tu_spin_until(&gate);
    return 5;
}

/* ==== inbox ============================================================= */

Test(cover_inbox, bad_arguments_are_einval, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    ferry_inbox *ib = NULL;
    ferry_inbox_stats st;

    cr_assert_eq(ferry_loop_call_soon_threadsafe(NULL, noop_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_post(NULL, noop_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_get(NULL, tu_loop), -EINVAL);
    cr_assert_eq(ferry_inbox_get(&ib, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_stop_threadsafe(NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_stats_get(NULL, &st), -EINVAL);
    cr_assert_eq(ferry_loop_inbox_stats(NULL, &st), -EINVAL);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_get(&ib, tu_loop), 0);
    cr_assert_eq(ferry_inbox_post(ib, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_stats_get(ib, NULL), -EINVAL);
    ferry_inbox_release(ib);
    ferry_inbox_release(NULL);
}

/* A callback accepted before ferry_loop_free() runs during it; from there
 * every entry point that needs an open loop refuses with -ESHUTDOWN. */
static int closing_rc[6];
static int closing_ran;
static void during_free_cb(void *arg)
{
    ferry_loop *loop = arg;
    ferry_inbox *ib = NULL;
    ferry_inbox_stats st;

    closing_ran++;
    closing_rc[0] = ferry_loop_call_soon_threadsafe(loop, noop_cb, NULL);
    closing_rc[1] = ferry_loop_stop_threadsafe(loop);
    closing_rc[2] = ferry_inbox_get(&ib, loop);
    closing_rc[3] = ferry_loop_inbox_stats(loop, &st);
    closing_rc[4] = ferry_pool_submit(NULL, job42, NULL, loop, NULL, NULL);
}

Test(cover_inbox, a_closing_loop_refuses_with_eshutdown_and_the_inbox_outlives_it)
{
    ferry_loop *loop;
    ferry_inbox *ib;
    ferry_inbox_stats st;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_eq(ferry_inbox_get(&ib, loop), 0);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(loop, during_free_cb, loop), 0);
    ferry_loop_free(loop);                   /* runs the accepted post */
    cr_assert_eq(closing_ran, 1);
    for (int i = 0; i < 5; i++) {
        /* ferry_loop_inbox_stats() still reports while the loop is being
         * freed (the inbox is closed but still attached): 0 or -ESHUTDOWN. */
        if (i == 3 && closing_rc[i] == 0)
            continue;
        cr_assert_eq(closing_rc[i], -ESHUTDOWN, "call %d: %d", i, closing_rc[i]);
    }
    /* The inbox handle stays valid: posts are refused, stats still read. */
    cr_assert_eq(ferry_inbox_post(ib, noop_cb, NULL), -ESHUTDOWN);
    cr_assert_eq(ferry_inbox_stats_get(ib, &st), 0);
    cr_assert_geq(st.posts, 1);
    cr_assert_geq(st.run, 1);
    ferry_inbox_release(ib);
}

/* The queue cannot grow: -ENOMEM and nothing queued; every post accepted
 * before still runs, once. */
static int grown_runs;
static void count_cb(void *arg) { (void)arg; grown_runs++; }

Test(cover_inbox, post_that_cannot_grow_the_queue_is_enomem,
     .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    int accepted = 0, rc = 0;
    ferry_inbox_stats st;

    ferry_set_log(NULL, NULL);
    ferry__fault_arm(1, true);
    for (int i = 0; i < 100000; i++) {
        rc = ferry_loop_call_soon_threadsafe(tu_loop, count_cb, NULL);
        if (rc)
            break;
        accepted++;
    }
    ferry__fault_reset();
    cr_assert_eq(rc, -ENOMEM);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(grown_runs, accepted);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &st), 0);
    cr_assert_eq(st.posts, (uint64_t)accepted);
}

/* Loop creation with each allocation in turn failing: an error, no leak,
 * then a loop that works. */
Test(cover_inbox, loop_new_fails_cleanly_at_every_allocation)
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

/* ==== pools ============================================================= */

static int to_thread_bad[4];
static int bad_args_task(void *arg)
{
    ferry_pool *p = arg;
    to_thread_bad[0] = ferry_to_thread(p, NULL, NULL);
    to_thread_bad[1] = ferry_to_thread_abandon(p, NULL, NULL, NULL);
    to_thread_bad[2] = ferry_pool_submit(p, NULL, NULL, NULL, NULL, NULL);
    to_thread_bad[3] = ferry_to_thread(p, job42, NULL);
    return 0;
}

Test(cover_pool, bad_arguments, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 2, .capacity = 3,
                                                        .stack_size = 256 * 1024 }), 0);
    cr_assert_eq(ferry_pool_stats_get(p, NULL), -EINVAL);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.threads, 2);
    cr_assert_eq(st.capacity, 3);
    /* Outside a task. */
    cr_assert_eq(ferry_to_thread(p, job42, NULL), -EPERM);
    cr_assert_eq(ferry_to_thread_abandon(p, job42, NULL, NULL), -EPERM);
    cr_assert_eq(tu_run(bad_args_task, p), 0);
    cr_assert_eq(to_thread_bad[0], -EINVAL);
    cr_assert_eq(to_thread_bad[1], -EINVAL);
    cr_assert_eq(to_thread_bad[2], -EINVAL);
    cr_assert_eq(to_thread_bad[3], 42);
    ferry_pool_free(p);
    /* NULL and the default pool are ignored by free; NULL means default. */
    ferry_pool_free(NULL);
    ferry_pool_free(ferry_pool_default());
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), 0);
    cr_assert_geq(st.threads, 1);
}

Test(cover_pool, bad_pool_size_in_the_environment_falls_back_to_the_default)
{
    ferry_pool *p;
    ferry_pool_stats st;
    const char *bad[] = { "0", "abc", "-3", "" };

    for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("FERRY_POOL_SIZE", bad[i], 1);
        cr_assert_eq(ferry_pool_new(&p, NULL), 0);
        cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
        cr_assert_geq(st.threads, 1, "FERRY_POOL_SIZE=%s", bad[i]);
        ferry_pool_free(p);
    }
    unsetenv("FERRY_POOL_SIZE");
}

/* Submit with a completion on the pool thread (loop NULL), and allocation
 * failure at submit: -ENOMEM, done never called. */
static atomic_int done_calls, done_status;
static int on_done(void *arg, int status)
{
    (void)arg;
    atomic_store(&done_status, status);
    atomic_fetch_add(&done_calls, 1);
    return 0;
}

Test(cover_pool, submit_with_done_on_the_pool_thread_and_enomem)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    ferry__fault_arm(1, false);
    cr_assert_eq(ferry_pool_submit(p, job42, NULL, NULL, on_done, NULL), -ENOMEM);
    ferry__fault_reset();
    cr_assert_eq(ferry_pool_submit(p, job42, NULL, NULL, on_done, NULL), 0);
    cr_assert_eq(ferry_pool_submit(p, job42, NULL, NULL, NULL, NULL), 0);   /* no done */
    while (1) {
        cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
        if (st.completed == 2)
            break;
        usleep(100);
    }
    ferry_pool_free(p);
    cr_assert_eq(atomic_load(&done_calls), 1);
    cr_assert_eq(atomic_load(&done_status), 42);
}

/* A plain thread blocks for room in a full queue; the pool being freed
 * wakes it with -ESHUTDOWN, and the queued job completes with -ECANCELED. */
static ferry_pool *room_pool;
static atomic_int room_rc = 1;
static void *room_thread(void *arg)
{
    (void)arg;
    atomic_store(&room_rc, ferry_pool_submit(room_pool, job42, NULL, NULL, on_done, NULL));
    return NULL;
}

struct freer { ferry_pool *p; atomic_int done; };
static void *free_thread(void *arg)
{
    struct freer *f = arg;
    ferry_pool_free(f->p);
    atomic_store(&f->done, 1);
    return NULL;
}

Test(cover_pool, thread_waiting_for_room_gets_eshutdown_when_the_pool_is_freed, .timeout = 30.)
{
    ferry_pool_stats st;
    struct freer fr = {0};
    pthread_t t, tf;

    cr_assert_eq(ferry_pool_new(&room_pool, &(ferry_pool_opts){ .threads = 1, .capacity = 1 }), 0);
    cr_assert_eq(ferry_pool_submit(room_pool, gate_job, NULL, NULL, NULL, NULL), 0);
    tu_spin_until(&gate_entered);
    cr_assert_eq(ferry_pool_submit(room_pool, job42, NULL, NULL, on_done, NULL), 0);  /* fills */
    t = tu_start_thread(room_thread, NULL);
    /* It cannot get in until the pool stops: nothing leaves the queue. */
    usleep(1000);
    cr_assert_eq(atomic_load(&room_rc), 1);
    cr_assert_eq(ferry_pool_stats_get(room_pool, &st), 0);
    cr_assert_eq(st.queued, 1);
    cr_assert_eq(st.running, 1);
    fr.p = room_pool;
    tf = tu_start_thread(free_thread, &fr);
    pthread_join(t, NULL);                      /* woken by the free */
    cr_assert_eq(atomic_load(&room_rc), -ESHUTDOWN);
    cr_assert_eq(atomic_load(&fr.done), 0);     /* still waits for the gate job */
    atomic_store(&gate, 1);
    pthread_join(tf, NULL);
    cr_assert_eq(atomic_load(&done_calls), 1);  /* the queued one, never ran */
    cr_assert_eq(atomic_load(&done_status), -ECANCELED);
}

/* On the loop's thread a full queue is -EAGAIN, not a blocked loop; a task
 * waiting for room is cancelled cleanly; stats add up. */
static int eagain_rc, room_task_rc = 1, stats_ok;
static ferry_pool_stats mid;
static int room_waiter(void *arg)
{
    room_task_rc = ferry_to_thread(arg, job42, NULL);
    return 0;
}

static int eagain_main(void *arg)
{
    ferry_pool *p = arg;
    ferry_task *w;
    int rc;

    rc = ferry_pool_submit(p, gate_job, NULL, tu_loop, on_done, NULL);
    if (rc)
        return rc;
    if ((rc = tu_task_wait_flag(&gate_entered)) != 0)
        return rc;
    if ((rc = ferry_pool_submit(p, job42, NULL, tu_loop, on_done, NULL)) != 0)
        return rc;                            /* the queue is full now */
    eagain_rc = ferry_pool_submit(p, job42, NULL, tu_loop, on_done, NULL);
    if ((rc = ferry_task_spawn(&w, tu_loop, room_waiter, p, NULL)) != 0)
        return rc;
    for (int i = 0; i < 5; i++)
        ferry_yield();                         /* it waits for room */
    ferry_pool_stats_get(p, &mid);
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    atomic_store(&gate, 1);
    while (atomic_load(&done_calls) < 2)
        if ((rc = ferry_sleep(FERRY_USEC(200))) != 0)
            return rc;
    stats_ok = 1;
    return 0;
}

Test(cover_pool, full_queue_on_the_loop_thread_is_eagain_and_a_room_waiter_cancels,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1, .capacity = 1 }), 0);
    cr_assert_eq(tu_run(eagain_main, p), 0);
    cr_assert_eq(stats_ok, 1);
    cr_assert_eq(eagain_rc, -EAGAIN);
    cr_assert_eq(room_task_rc, -ECANCELED);
    cr_assert_eq(mid.queued, 1);
    cr_assert_eq(mid.running, 1);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.queued, 0);
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.completed, 2);
    cr_assert_eq(st.cancelled, 1);     /* the cancelled room waiter's job */
    cr_assert_eq(atomic_load(&done_status), 42);
    ferry_pool_free(p);
}

/* A deadline that passes while the job is queued: -ETIMEDOUT, never ran. */
static atomic_int never_ran;
static int must_not_run(void *arg) { (void)arg; atomic_fetch_add(&never_ran, 1); return 0; }
static int deadline_rc = 1, deadline_rc2 = 1;

static int deadline_main(void *arg)
{
    ferry_pool *p = arg;
    ferry_scope sc;
    int rc;

    if ((rc = ferry_pool_submit(p, gate_job, NULL, tu_loop, NULL, NULL)) != 0)
        return rc;
    if ((rc = tu_task_wait_flag(&gate_entered)) != 0)
        return rc;
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(2), 0);
    deadline_rc = ferry_to_thread(p, must_not_run, NULL);
    ferry_scope_exit(&sc);
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(2), 0);
    deadline_rc2 = ferry_to_thread_abandon(p, must_not_run, NULL, NULL);
    ferry_scope_exit(&sc);
    atomic_store(&gate, 1);
    return 0;
}

Test(cover_pool, deadline_while_queued_is_etimedout_and_the_job_never_runs,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(deadline_main, p), 0);
    cr_assert_eq(deadline_rc, -ETIMEDOUT);
    cr_assert_eq(deadline_rc2, -ETIMEDOUT);
    ferry_pool_free(p);
    cr_assert_eq(atomic_load(&never_ran), 0);
    (void)st;
}

/* to_thread while the pool is being freed: the queued job is cancelled
 * (-ECANCELED, never ran), the next call is refused (-ESHUTDOWN). */
static int stop_rcs[8], nstop;
static int stopping_main(void *arg)
{
    struct freer *fr = arg;
    int rc;

    (void)fr;
    do {
        rc = ferry_to_thread(fr->p, must_not_run, NULL);
        stop_rcs[nstop++] = rc;
    } while (rc != -ESHUTDOWN && nstop < 8);
    rc = ferry_pool_submit(fr->p, job42, NULL, tu_loop, on_done, NULL);
    stop_rcs[nstop++ % 8] = rc;
    atomic_store(&gate, 1);     /* now the free may finish */
    return 0;
}

Test(cover_pool, to_thread_into_a_pool_being_freed,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct freer fr = {0};
    pthread_t tf;

    cr_assert_eq(ferry_pool_new(&fr.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_pool_submit(fr.p, gate_job, NULL, NULL, NULL, NULL), 0);
    tu_spin_until(&gate_entered);
    tf = tu_start_thread(free_thread, &fr);
    cr_assert_eq(tu_run(stopping_main, &fr), 0);
    pthread_join(tf, NULL);
    cr_assert_geq(nstop, 2);
    /* Before the free got in: queued, then cancelled; after: refused. */
    for (int i = 0; i < nstop - 2; i++)
        cr_assert_eq(stop_rcs[i], -ECANCELED, "call %d: %d", i, stop_rcs[i]);
    cr_assert_eq(stop_rcs[nstop - 2], -ESHUTDOWN);
    cr_assert_eq(stop_rcs[nstop - 1], -ESHUTDOWN);     /* submit too */
    cr_assert_eq(atomic_load(&never_ran), 0);
}

/* to_thread and to_thread_abandon with allocation failures at each point:
 * the call fails with -ENOMEM (fn never ran) or succeeds with fn's status. */
static int fault_rcs[2][40];
static int fault_main(void *arg)
{
    for (unsigned long n = 1; n <= 40; n++) {
        ferry__fault_arm(n, false);
        fault_rcs[0][n - 1] = ferry_to_thread(arg, job42, NULL);
        ferry__fault_arm(n, false);
        fault_rcs[1][n - 1] = ferry_to_thread_abandon(arg, job42, NULL, NULL);
        ferry__fault_reset();
    }
    return 0;
}

Test(cover_pool, to_thread_under_allocation_failure,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 60.)
{
    ferry_pool *p;
    int enomem = 0;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(fault_main, p), 0);
    for (int k = 0; k < 2; k++)
        for (int n = 0; n < 40; n++) {
            cr_assert(fault_rcs[k][n] == 42 || fault_rcs[k][n] == -ENOMEM,
                      "%d/%d: %d", k, n + 1, fault_rcs[k][n]);
            enomem += fault_rcs[k][n] == -ENOMEM;
        }
    cr_assert_gt(enomem, 0);
    cr_assert_eq(fault_rcs[0][39], 42);
    ferry_pool_free(p);
}

/* ==== from a thread into the loop ====================================== */

/* The test's own thread owns tu_loop (ferry_future_wait there is -EDEADLK
 * even while the loop is not running): wait from a plain thread. */
struct fw { ferry_future *f; int64_t timeout; int rc, st; };
static void *fw_thread(void *arg)
{
    struct fw *w = arg;
    w->rc = ferry_future_wait(w->f, w->timeout, &w->st);
    return NULL;
}

static int wait_elsewhere(ferry_future *f, int64_t timeout, int *st)
{
    struct fw w = { .f = f, .timeout = timeout, .rc = 1 };
    pthread_t t = tu_start_thread(fw_thread, &w);
    pthread_join(t, NULL);
    *st = w.st;
    return w.rc;
}

struct badargs { int rc[2]; };
static void *badargs_thread(void *arg)
{
    struct badargs *b = arg;
    int st;
    b->rc[0] = ferry_loop_run_task_sync(tu_loop, NULL, NULL, 0, &st);
    b->rc[1] = ferry_loop_run_sync(tu_loop, NULL, NULL, 0, &st);
    return NULL;
}

Test(cover_fromthread, bad_arguments, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    ferry_future *f = NULL;
    int st;

    cr_assert_eq(ferry_loop_spawn_threadsafe(NULL, fn7, NULL, NULL, &f), -EINVAL);
    cr_assert_eq(ferry_loop_spawn_threadsafe(tu_loop, NULL, NULL, NULL, &f), -EINVAL);
    cr_assert_eq(ferry_loop_spawn_threadsafe(tu_loop, fn7, NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_call_threadsafe(NULL, fn7, NULL, &f), -EINVAL);
    cr_assert_eq(ferry_loop_run_sync(NULL, fn7, NULL, 0, &st), -EINVAL);
    cr_assert_eq(ferry_loop_run_task_sync(tu_loop, fn7, NULL, 0, &st), -EDEADLK);
    struct badargs b;
    pthread_join(tu_start_thread(badargs_thread, &b), NULL);
    cr_assert_eq(b.rc[0], -EINVAL);
    cr_assert_eq(b.rc[1], -EINVAL);
    cr_assert_eq(ferry_future_wait(NULL, 0, &st), -EINVAL);
    cr_assert_eq(ferry_future_cancel(NULL), -EINVAL);
    cr_assert(!ferry_future_done(NULL));
    ferry_future_free(NULL);
}

/* A task cancelled before the loop started it never runs: status
 * -ECANCELED.  A cancel after completion changes nothing.  (A plain
 * callback cancelled before it ran is NOT skipped: see
 * fixed_bugs::cancelled_plain_callback_is_skipped below.) */
static atomic_int fn_calls;
static int counted_fn(void *arg) { (void)arg; atomic_fetch_add(&fn_calls, 1); return 9; }

struct fut_run { ferry_future *task, *plain; int prep; };
static void *fut_prep_thread(void *arg)
{
    struct fut_run *r = arg;
    r->prep |= ferry_loop_spawn_threadsafe(tu_loop, counted_fn, NULL,
                   &(ferry_task_opts){ .name = "fut-named", .stack_size = 128 * 1024 }, &r->task);
    r->prep |= ferry_future_cancel(r->task);     /* before it started: never runs */
    r->prep |= ferry_loop_call_threadsafe(tu_loop, counted_fn, NULL, &r->plain);
    return NULL;
}

Test(cover_fromthread, cancel_before_the_loop_ran_it_skips_fn,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct fut_run r = {0};
    int st = 0;
    pthread_t t = tu_start_thread(fut_prep_thread, &r);

    pthread_join(t, NULL);                     /* everything posted, loop idle */
    cr_assert_eq(r.prep, 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_future_wait(r.task, 0, &st), -EDEADLK);   /* loop's thread */
    cr_assert_eq(wait_elsewhere(r.task, 0, &st), 0);
    cr_assert_eq(st, -ECANCELED);
    cr_assert_eq(wait_elsewhere(r.plain, FERRY_NEVER, &st), 0);
    cr_assert_eq(st, 9);
    cr_assert_eq(atomic_load(&fn_calls), 1);
    cr_assert_eq(ferry_future_cancel(r.plain), 0);     /* done: nothing to do */
    ferry_future_free(r.task);
    ferry_future_free(r.plain);
}

/* On the loop's thread, waiting on a future is -EDEADLK; a spawn whose task
 * cannot be made completes the future with the error. */
static int fut_deadlk = 1;
static ferry_future *loop_fut;
static int wait_on_loop_task(void *arg)
{
    int st;
    (void)arg;
    fut_deadlk = ferry_future_wait(loop_fut, 0, &st);
    return 0;
}

static void *spawn_for_loop_thread(void *arg)
{
    (void)arg;
    ferry_loop_spawn_threadsafe(tu_loop, fn7, NULL, NULL, &loop_fut);
    return NULL;
}

Test(cover_fromthread, future_wait_on_the_loop_thread_is_edeadlk,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    int st;
    pthread_t t = tu_start_thread(spawn_for_loop_thread, NULL);

    pthread_join(t, NULL);
    cr_assert_not_null(loop_fut);
    cr_assert_eq(tu_run(wait_on_loop_task, NULL), 0);
    cr_assert_eq(fut_deadlk, -EDEADLK);
    cr_assert_eq(wait_elsewhere(loop_fut, 0, &st), 0);
    cr_assert_eq(st, 7);
    ferry_future_free(loop_fut);
}

static void *spawn_fault_thread(void *arg)
{
    intptr_t *out = arg;
    ferry_future *f = NULL;
    int n_enomem = 0;

    for (unsigned long n = 1; n <= 6; n++) {
        ferry__fault_arm(n, false);
        int rc = ferry_loop_call_threadsafe(tu_loop, fn7, NULL, &f);
        ferry__fault_reset();
        if (rc == -ENOMEM) {
            n_enomem++;
            continue;
        }
        if (rc)
            return (void *)(intptr_t)-1;
        ferry_future_cancel(f);
        ferry_future_free(f);
    }
    *out = n_enomem;
    return NULL;
}

Test(cover_fromthread, allocation_failure_at_submission_is_enomem,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    intptr_t n = 0;
    void *res;
    pthread_t t = tu_start_thread(spawn_fault_thread, &n);

    pthread_join(t, &res);
    cr_assert_null(res);
    cr_assert_gt(n, 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
}

/* The future's task cannot be spawned (allocation failure on the loop):
 * the future completes with the error, fn never ran. */
static void *spawn_one_thread(void *arg)
{
    ferry_future **f = arg;
    ferry_loop_spawn_threadsafe(tu_loop, counted_fn, NULL, NULL, f);
    return NULL;
}

Test(cover_fromthread, task_that_cannot_be_spawned_completes_the_future_with_the_error,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_future *f = NULL;
    int st = 0;
    pthread_t t = tu_start_thread(spawn_one_thread, &f);

    pthread_join(t, NULL);
    cr_assert_not_null(f);
    ferry__fault_arm(1, true);
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    ferry__fault_reset();
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(wait_elsewhere(f, 0, &st), 0);
    if (atomic_load(&fn_calls))
        cr_assert_eq(st, 9);
    else
        cr_assert_eq(st, -ENOMEM);
    ferry_future_free(f);
}

/* ==== mixed channel ==================================================== */

Test(cover_chan, bad_arguments_and_allocation_failure)
{
    ferry_chan *ch = NULL;
    void *it;
    int rc = -1;

    cr_assert_eq(ferry_chan_new(NULL, 1), -EINVAL);
    cr_assert_eq(ferry_chan_new(&ch, 0), -EINVAL);
    cr_assert_eq(ferry_chan_new(&ch, SIZE_MAX), -EINVAL);
    cr_assert_eq(ferry_chan_close(NULL), -EINVAL);
    cr_assert_eq(ferry_chan_try_send(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_try_recv(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_send_blocking(NULL, &it, 0), -EINVAL);
    cr_assert_eq(ferry_chan_recv_blocking(NULL, &it, 0), -EINVAL);
    cr_assert_eq(ferry_chan_send(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_recv(NULL, &it), -EINVAL);
    cr_assert_eq(ferry_chan_len(NULL), 0);
    ferry_chan_free(NULL);
    for (unsigned long n = 1; n < 20; n++) {
        ferry__fault_arm(n, false);
        rc = ferry_chan_new(&ch, 4);
        ferry__fault_reset();
        if (rc == 0)
            break;
        cr_assert_eq(rc, -ENOMEM);
        cr_assert_null(ch);
    }
    cr_assert_eq(rc, 0);
    cr_assert_eq(ferry_chan_try_recv(ch, NULL), -EINVAL);
    cr_assert_eq(ferry_chan_recv_blocking(ch, NULL, 0), -EINVAL);
    cr_assert_eq(ferry_chan_recv(ch, NULL), -EINVAL);
    ferry_chan_free(ch);
    cr_assert_eq(tu_leaks(), 0);
}

Test(cover_chan, thread_side_timeouts_and_close)
{
    ferry_chan *ch;
    void *it = NULL;

    cr_assert_eq(ferry_chan_new(&ch, 1), 0);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, 0), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, FERRY_MSEC(1)), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_try_recv(ch, &it), -EAGAIN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)1, FERRY_MSEC(1)), 0);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)2, 0), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)2, FERRY_MSEC(1)), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)2), -EAGAIN);
    cr_assert_eq(ferry_chan_len(ch), 1);
    cr_assert_eq(ferry_chan_close(ch), 0);
    cr_assert_eq(ferry_chan_close(ch), 0);          /* idempotent */
    cr_assert_eq(ferry_chan_try_send(ch, (void *)3), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)3, FERRY_NEVER), -ESHUTDOWN);
    /* Receives drain what is left, then -ESHUTDOWN. */
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, FERRY_NEVER), 0);
    cr_assert_eq(it, (void *)1);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &it, FERRY_NEVER), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_try_recv(ch, &it), -ESHUTDOWN);
    ferry_chan_free(ch);
}

/* A thread blocked in send is woken by a task's receive; one blocked in
 * receive is woken by close.  On the loop's thread a blocking call with a
 * timeout is -EDEADLK; with 0 it is allowed.  Outside a task the
 * suspending calls are -EPERM; a cancelled task gets -ECANCELED, a passed
 * deadline -ETIMEDOUT. */
static ferry_chan *tch;
static int chan_rcs[10];
static void *chan_items[2];
static void *blocked_sender(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)ferry_chan_send_blocking(tch, (void *)22, FERRY_NEVER);
}

static int chan_main(void *arg)
{
    ferry_scope sc;
    ferry_task *self = ferry_task_current();
    void *it;
    (void)arg;

    chan_rcs[0] = ferry_chan_send_blocking(tch, (void *)1, FERRY_MSEC(1));
    chan_rcs[1] = ferry_chan_recv_blocking(tch, &it, FERRY_MSEC(1));
    chan_rcs[2] = ferry_chan_recv_blocking(tch, &it, 0);    /* full: takes 11 */
    chan_items[0] = it;
    chan_rcs[3] = ferry_chan_recv(tch, &chan_items[1]);     /* waits for the thread's 22 */
    ferry_scope_enter(&sc, ferry_now() - 1, 0);
    chan_rcs[4] = ferry_chan_recv(tch, &it);                /* empty, deadline passed */
    ferry_scope_exit(&sc);
    ferry_task_cancel(self);
    chan_rcs[5] = ferry_chan_send(tch, (void *)3);          /* cancelled: not queued */
    return 0;
}

Test(cover_chan, task_and_thread_paths, .init = tu_loop_setup, .fini = tu_loop_teardown,
     .timeout = 30.)
{
    void *it, *res;
    pthread_t t;

    cr_assert_eq(ferry_chan_new(&tch, 1), 0);
    cr_assert_eq(ferry_chan_send(tch, (void *)1), -EPERM);
    cr_assert_eq(ferry_chan_recv(tch, &it), -EPERM);
    cr_assert_eq(ferry_chan_try_send(tch, (void *)11), 0);
    t = tu_start_thread(blocked_sender, NULL);
    cr_assert_eq(tu_run(chan_main, NULL), 0);
    pthread_join(t, &res);
    cr_assert_eq((intptr_t)res, 0);
    cr_assert_eq(chan_rcs[0], -EDEADLK);
    cr_assert_eq(chan_rcs[1], -EDEADLK);
    cr_assert_eq(chan_rcs[2], 0);
    cr_assert_eq(chan_items[0], (void *)11);
    cr_assert_eq(chan_rcs[3], 0);
    cr_assert_eq(chan_items[1], (void *)22);
    cr_assert_eq(chan_rcs[4], -ETIMEDOUT);
    cr_assert_eq(chan_rcs[5], -ECANCELED);
    cr_assert_eq(ferry_chan_len(tch), 0);
    ferry_chan_free(tch);
}

static void *blocked_receiver(void *arg)
{
    void *it;
    (void)arg;
    return (void *)(intptr_t)ferry_chan_recv_blocking(tch, &it, FERRY_NEVER);
}

static int closer_task_rc = 1;
static int closer_task(void *arg)
{
    (void)arg;
    closer_task_rc = ferry_chan_send(tch, (void *)1);   /* parks: full */
    return 0;
}

Test(cover_chan, close_wakes_a_blocked_thread_and_a_parked_task,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    void *res;
    pthread_t t;
    ferry_chan *full;

    cr_assert_eq(ferry_chan_new(&tch, 1), 0);
    t = tu_start_thread(blocked_receiver, NULL);
    usleep(1000);
    cr_assert_eq(ferry_chan_close(tch), 0);
    pthread_join(t, &res);
    cr_assert_eq((intptr_t)res, -ESHUTDOWN);
    ferry_chan_free(tch);

    cr_assert_eq(ferry_chan_new(&full, 1), 0);
    tch = full;
    cr_assert_eq(ferry_chan_try_send(tch, (void *)9), 0);
    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, closer_task, NULL, NULL), 0);
    for (int i = 0; i < 3; i++)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(closer_task_rc, 1);                     /* parked */
    cr_assert_eq(ferry_chan_close(tch), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(closer_task_rc, -ESHUTDOWN);
    ferry_chan_free(tch);
}

/* ==== fixed bridge bugs =============================================== */

/*
 * bridge.h: ferry_future_cancel() skips a plain callback that has not run,
 * and run_sync() that timed out before the start never runs fn.  This used
 * to fail: the cancel went through the same FIFO inbox as the start, so
 * the start always ran first and called fn, for run_sync() after the
 * caller got -ETIMEDOUT (and may have freed `arg`).  The request is now
 * recorded under the future's mutex, where the start reads it.
 */
static void *post_then_cancel(void *arg)
{
    ferry_future **f = arg;
    if (ferry_loop_call_threadsafe(tu_loop, counted_fn, NULL, f) == 0)
        ferry_future_cancel(*f);
    return NULL;
}

static atomic_int sync_rc = 1;
static void *run_sync_timeout(void *arg)
{
    int st;
    (void)arg;
    atomic_store(&sync_rc, ferry_loop_run_sync(tu_loop, counted_fn, NULL, FERRY_MSEC(1), &st));
    return NULL;
}

Test(fixed_bugs, cancelled_plain_callback_is_skipped,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_future *f = NULL;
    int st = 0;

    pthread_join(tu_start_thread(post_then_cancel, &f), NULL);   /* loop not running yet */
    cr_assert_not_null(f);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(wait_elsewhere(f, 0, &st), 0);
    ferry_future_free(f);
    cr_assert_eq(st, -ECANCELED, "status %d: the cancelled callback ran", st);
    cr_assert_eq(atomic_load(&fn_calls), 0);
    /* run_sync that timed out before the loop ran its callback. */
    pthread_join(tu_start_thread(run_sync_timeout, NULL), NULL);
    cr_assert_eq(atomic_load(&sync_rc), -ETIMEDOUT);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(atomic_load(&fn_calls), 0, "fn ran after run_sync returned -ETIMEDOUT");
}

/* ==== more inbox paths ================================================== */

/* A callback posted from a thread that blocks the loop past the threshold
 * is reported by the blocked-loop detector ("by callback"). */
static int slow_log_lines;
static char slow_log[512];
static void slow_capture(int level, const char *msg, void *ctx)
{
    (void)level; (void)ctx;
    if (!slow_log_lines++)
        snprintf(slow_log, sizeof slow_log, "%s", msg);
}

static void blocking_cb(void *arg)
{
    (void)arg;
    usleep(30000);          /* 30 ms: always longer than the 5 ms threshold */
}

static void *post_blocking(void *arg)
{
    (void)arg;
    ferry_loop_call_soon_threadsafe(tu_loop, blocking_cb, NULL);
    return NULL;
}

Test(cover_inbox, slow_threadsafe_callback_is_reported,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_loop_stats ls;

    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, FERRY_MSEC(5)), 0);
    ferry_set_log(slow_capture, NULL);
    pthread_join(tu_start_thread(post_blocking, NULL), NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    ferry_set_log(NULL, NULL);
    cr_assert_geq(slow_log_lines, 1);
    cr_assert(strstr(slow_log, "callback"), "log: %s", slow_log);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &ls), 0);
    cr_assert_geq(ls.slow_steps, 1);
}

/* A loop attached to an application's event_base is woken through
 * libevent's own notification (no eventfd of ferry's): posts from a thread
 * run, in order, exactly once. */
#include <event2/event.h>
#include <event2/thread.h>

static int att_seen[100], att_n;
static void att_cb(void *arg) { att_seen[att_n++] = (int)(intptr_t)arg; }
static ferry_loop *att_loop;
static void *att_poster(void *arg)
{
    (void)arg;
    for (intptr_t i = 0; i < 100; i++)
        if (ferry_loop_call_soon_threadsafe(att_loop, att_cb, (void *)i) != 0)
            return (void *)1;
    ferry_loop_stop_threadsafe(att_loop);
    return NULL;
}

Test(cover_inbox, attached_base_posts_run_in_order, .timeout = 30.)
{
    struct event_base *base;
    ferry_inbox_stats st;
    pthread_t t;
    void *res;

    evthread_use_pthreads();
    base = event_base_new();
    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&att_loop, &(ferry_loop_opts){ .base = base }), 0);
    t = tu_start_thread(att_poster, NULL);
    cr_assert_eq(ferry_loop_run(att_loop, FERRY_RUN_FOREVER), 0);
    pthread_join(t, &res);
    cr_assert_null(res);
    while (att_n < 100)
        ferry_loop_run(att_loop, FERRY_RUN_ONCE);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(att_seen[i], i);
    cr_assert_eq(ferry_loop_inbox_stats(att_loop, &st), 0);
    cr_assert_eq(st.write_errors, 0);
    ferry_loop_free(att_loop);
    event_base_free(base);
}
