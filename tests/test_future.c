/* test_future.c - calling into a loop from other threads (bridge.h:
 * ferry_loop_spawn_threadsafe, ferry_loop_call_threadsafe and their
 * futures, ferry_loop_run_task_sync, ferry_loop_run_sync): many threads at
 * once, -EDEADLK on the loop's own thread, timeouts that cancel, a cancel
 * that arrives before the loop started the work, a loop freed under a
 * waiting thread, allocation failures, bad arguments.
 *
 * No cr_assert inside task bodies: they record, the test body asserts
 * after the loop returned.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/bridge.h"

/* Tests on tu_loop, and tests that make their own loops. */
#define T(name) Test(future, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
#define TL(name) Test(future, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 30.)

static int fn7(void *arg)
{
    (void)arg;
    return 7;
}

/* ---- many threads, the loop's own thread, timeouts, a loop freed -------- */

static int double_it(void *arg)
{
    intptr_t v = (intptr_t)arg;
    if (ferry_yield())
        return -1;
    return (int)(v * 2);
}

struct rs { atomic_int bad; atomic_int finished; int per; };

static void *rs_thread(void *arg)
{
    struct rs *r = arg;
    for (int i = 0; i < r->per; i++) {
        int st = -1;
        int rc = (i & 1)
            ? ferry_loop_run_task_sync(tu_loop, double_it, (void *)(intptr_t)i, FERRY_NEVER, &st)
            : ferry_loop_run_sync(tu_loop, double_it, (void *)(intptr_t)i, FERRY_NEVER, &st);
        /* run_sync runs a plain callback: ferry_yield() there is -EPERM. */
        if (rc != 0 || st != ((i & 1) ? i * 2 : -1))
            atomic_fetch_add(&r->bad, 1);
    }
    if (atomic_fetch_add(&r->finished, 1) + 1 == 8)
        ferry_loop_stop_threadsafe(tu_loop);
    return NULL;
}

T(run_in_loop_from_eight_threads_at_once)
{
    struct rs r = { .per = 200 };
    pthread_t t[8];

    for (int i = 0; i < 8; i++)
        t[i] = tu_start_thread(rs_thread, &r);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&r.bad), 0);
}

static int deadlk_rc1, deadlk_rc2;
static int deadlk_task(void *arg)
{
    ferry_future *f = NULL;
    (void)arg;
    deadlk_rc1 = ferry_loop_run_task_sync(tu_loop, double_it, NULL, FERRY_NEVER, NULL);
    deadlk_rc2 = ferry_loop_spawn_threadsafe(tu_loop, double_it, NULL, NULL, &f);
    return 0;
}

T(from_the_loop_thread_is_edeadlk)
{
    cr_assert_eq(ferry_loop_run_sync(tu_loop, double_it, NULL, 0, NULL), -EDEADLK);
    cr_assert_eq(tu_run(deadlk_task, NULL), 0);
    cr_assert_eq(deadlk_rc1, -EDEADLK);
    cr_assert_eq(deadlk_rc2, -EDEADLK);
}

static atomic_int sleeper_rc = 1;
static atomic_int sleeper_started;
static int long_sleeper(void *arg)
{
    (void)arg;
    atomic_store(&sleeper_started, 1);
    int rc = ferry_sleep(FERRY_SEC(100));
    atomic_store(&sleeper_rc, rc);
    return rc;
}

static atomic_int timeout_rc = 1;
static void *timeout_thread(void *arg)
{
    (void)arg;
    atomic_store(&timeout_rc, ferry_loop_run_task_sync(tu_loop, long_sleeper, NULL,
                                                      tu_ms(50), NULL));
    return NULL;
}

/* Wait for the thread's call to return, not for the sleeper to end: on a
 * slow build (valgrind) the timeout can pass before the loop started the
 * task, and then the cancel makes sure it never runs at all, so waiting
 * for its sleeper_rc would wait forever.  The cancel was posted before the
 * call returned; tu_run() keeps the loop running until it has been
 * delivered and the sleeper (if it started) ended. */
static int timeout_main(void *arg)
{
    pthread_t t;
    (void)arg;
    pthread_create(&t, NULL, timeout_thread, NULL);
    while (atomic_load(&timeout_rc) == 1)
        ferry_sleep(FERRY_MSEC(1));
    pthread_join(t, NULL);     /* it has returned already */
    return 0;
}

T(timeout_cancels_the_task)
{
    cr_assert_eq(tu_run(timeout_main, NULL), 0);
    cr_assert_eq(atomic_load(&timeout_rc), -ETIMEDOUT);
    if (atomic_load(&sleeper_started))
        cr_assert_eq(atomic_load(&sleeper_rc), -ECANCELED);   /* cancelled while running */
    else
        cr_assert_eq(atomic_load(&sleeper_rc), 1);            /* cancelled before it ran */
}

static atomic_int closed_rc = 1;
static void *closed_thread(void *arg)
{
    atomic_store(&closed_rc, ferry_loop_run_task_sync(arg, double_it, NULL, FERRY_NEVER, NULL));
    return NULL;
}

TL(loop_closing_under_a_waiting_thread_gives_eshutdown)
{
    ferry_loop *loop;
    ferry_inbox_stats st;
    pthread_t t;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    t = tu_start_thread(closed_thread, loop);
    do {
        usleep(200);
        ferry_loop_inbox_stats_get(loop, &st);
    } while (st.posts < 1);                 /* the request is accepted */
    ferry_loop_free(loop);                  /* never ran the loop */
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&closed_rc), -ESHUTDOWN);
}

/*
 * A request whose task the loop spawned but had not started when it was
 * freed: the body never runs, and the waiting thread learns why (-ESHUTDOWN)
 * instead of waiting forever.
 */
struct unstarted {
    ferry_loop  *loop;
    bool         via_future;  /* spawn_threadsafe + future_wait, else run_task_sync */
    atomic_int   done;        /* the thread's wait returned */
    int          rc;          /* its result */
    int          st;          /* the status it got */
};

static atomic_int unstarted_ran;

static int unstarted_body(void *arg)
{
    (void)arg;
    atomic_store(&unstarted_ran, 1);
    return 3;
}

static void *unstarted_thread(void *arg)
{
    struct unstarted *u = arg;
    ferry_future *f;

    if (u->via_future) {
        u->rc = ferry_loop_spawn_threadsafe(u->loop, unstarted_body, NULL, NULL, &f);
        if (u->rc == 0) {
            u->rc = ferry_future_wait(f, FERRY_NEVER, &u->st);
            ferry_future_free(f);
        }
    } else {
        u->rc = ferry_loop_run_task_sync(u->loop, unstarted_body, NULL, FERRY_NEVER, &u->st);
    }
    atomic_store(&u->done, 1);
    return NULL;
}

/* Start the thread and wait until the loop has accepted its request. */
static pthread_t unstarted_start(struct unstarted *u)
{
    ferry_inbox_stats st;
    pthread_t t = tu_start_thread(unstarted_thread, u);

    do {
        usleep(200);
        cr_assert_eq(ferry_loop_inbox_stats_get(u->loop, &st), 0);
    } while (st.posts < 1);
    return t;
}

/* After ferry_loop_free(): the thread's wait returns within a while. */
static void unstarted_check(struct unstarted *u, pthread_t t, int want_rc, int want_st)
{
    int64_t deadline = ferry_now() + tu_ms(5000);

    while (!atomic_load(&u->done) && ferry_now() < deadline)
        usleep(500);
    cr_assert(atomic_load(&u->done), "the thread still waits for a task that never runs");
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&unstarted_ran), 0);
    cr_assert_eq(u->rc, want_rc);
    if (want_rc == 0)
        cr_assert_eq(u->st, want_st);
}

static void noop(void *arg)
{
    (void)arg;
}

/* One pass: a turn (the callback), then a poll that takes the request and
 * spawns its task, which would start in the next turn; then the free. */
static void unstarted_run_once_then_free(struct unstarted *u)
{
    ferry_loop_stats ls;
    pthread_t t;

    cr_assert_eq(ferry_loop_new(&u->loop, NULL), 0);
    t = unstarted_start(u);
    /* The post is counted before the thread writes the loop's wake, so a
     * pass may come between the two: pass again until one has taken it. */
    for (int pass = 0; pass < 1000; pass++) {
        cr_assert_eq(ferry_call_soon(u->loop, noop, NULL), 0);
        cr_assert_eq(ferry_loop_run(u->loop, FERRY_RUN_ONCE), 0);
        cr_assert_eq(ferry_loop_stats_get(u->loop, &ls), 0);
        if (ls.live_tasks)
            break;
        usleep(100);
    }
    cr_assert_eq(ls.live_tasks, 1, "the request's task was not spawned by the pass");
    ferry_loop_free(u->loop);
    if (u->via_future)
        unstarted_check(u, t, 0, -ESHUTDOWN);
    else
        unstarted_check(u, t, -ESHUTDOWN, 0);
}

TL(run_task_sync_for_a_task_spawned_but_not_started_when_the_loop_is_freed)
{
    static struct unstarted u;

    unstarted_run_once_then_free(&u);
}

TL(future_of_a_task_spawned_but_not_started_when_the_loop_is_freed)
{
    static struct unstarted u = { .via_future = true };

    unstarted_run_once_then_free(&u);
}

static void *future_thread(void *arg)
{
    ferry_future *f;
    int st = 0;
    intptr_t bad = 0;

    (void)arg;
    if (ferry_loop_spawn_threadsafe(tu_loop, long_sleeper, NULL,
                                    &(ferry_task_opts){ .name = "fut" }, &f))
        return (void *)1;
    bad |= ferry_future_wait(f, 0, &st) != -ETIMEDOUT;
    bad |= ferry_future_wait(f, FERRY_MSEC(10), &st) != -ETIMEDOUT;
    bad |= ferry_future_done(f);
    /* Cancel a task that is running (sleeping), not one the loop has not
     * started yet: that one would never run and sleeper_rc would stay 1
     * (under valgrind 10 ms can pass before the loop turns). */
    tu_spin_until(&sleeper_started);
    bad |= ferry_future_cancel(f) != 0;
    bad |= ferry_future_wait(f, FERRY_NEVER, &st) != 0;
    bad |= st != -ECANCELED;
    bad |= !ferry_future_done(f);
    ferry_future_free(f);
    ferry_loop_stop_threadsafe(tu_loop);
    return (void *)bad;
}

T(wait_times_out_then_cancel_ends_the_task)
{
    void *bad;
    pthread_t t = tu_start_thread(future_thread, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(atomic_load(&sleeper_rc), -ECANCELED);
}

/* ---- bad arguments -------------------------------------------------------- */

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

T(bad_arguments_are_einval)
{
    ferry_future *f = NULL;
    int st;

    /* A NULL loop is this thread's, the loop the call would wait for
     * (test_loop.c tests the rule on a thread without a loop). */
    cr_assert_eq(ferry_loop_spawn_threadsafe(NULL, fn7, NULL, NULL, &f), -EDEADLK);
    cr_assert_eq(ferry_loop_spawn_threadsafe(tu_loop, NULL, NULL, NULL, &f), -EINVAL);
    cr_assert_eq(ferry_loop_spawn_threadsafe(tu_loop, fn7, NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_call_threadsafe(NULL, fn7, NULL, &f), -EDEADLK);
    cr_assert_eq(ferry_loop_run_sync(NULL, fn7, NULL, 0, &st), -EDEADLK);
    cr_assert_eq(ferry_loop_run_task_sync(tu_loop, fn7, NULL, 0, &st), -EDEADLK);
    struct badargs b;
    tu_on_thread(badargs_thread, &b);
    cr_assert_eq(b.rc[0], -EINVAL);
    cr_assert_eq(b.rc[1], -EINVAL);
    cr_assert_eq(ferry_future_wait(NULL, 0, &st), -EINVAL);
    cr_assert_eq(ferry_future_cancel(NULL), -EINVAL);
    cr_assert(!ferry_future_done(NULL));
    ferry_future_free(NULL);
}

/* ---- cancel or timeout before the start; a wait on the loop's thread ---- */

/* A task cancelled before the loop started it never runs: status
 * -ECANCELED.  A cancel after completion changes nothing. */
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

T(cancel_before_the_loop_started_the_task_skips_fn)
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

T(wait_on_the_loop_thread_is_edeadlk)
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


/*
 * bridge.h: ferry_future_cancel() skips a plain callback that has not run,
 * and run_sync() that timed out before the start never runs fn (the caller
 * got -ETIMEDOUT and may have freed `arg`).  The cancel must not travel
 * behind the start in the inbox's FIFO: the start would always run first
 * and call fn.
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

T(cancelled_plain_callback_and_timed_out_run_sync_never_run_fn)
{
    ferry_future *f = NULL;
    int st = 0;

    tu_on_thread(post_then_cancel, &f);   /* loop not running yet */
    cr_assert_not_null(f);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(wait_elsewhere(f, 0, &st), 0);
    ferry_future_free(f);
    cr_assert_eq(st, -ECANCELED, "status %d: the cancelled callback ran", st);
    cr_assert_eq(atomic_load(&fn_calls), 0);
    /* run_sync that timed out before the loop ran its callback. */
    tu_on_thread(run_sync_timeout, NULL);
    cr_assert_eq(atomic_load(&sync_rc), -ETIMEDOUT);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(atomic_load(&fn_calls), 0, "fn ran after run_sync returned -ETIMEDOUT");
}

/* ---- allocation failures -------------------------------------------------- */

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

T(allocation_failure_at_submission_is_enomem)
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

T(task_that_cannot_be_spawned_completes_the_future_with_the_error)
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


/* A cancel that reaches a task spawned but not yet run (its start and the
 * cancel in one drain of the inbox): the task never calls fn, and the
 * status is -ECANCELED. */
struct sc_run { ferry_future *task, *canceller; int prep; };
static struct sc_run *sc_cur;

static int cancel_the_task_fn(void *arg)
{
    (void)arg;
    /* On the loop's thread, after the task's start: it is spawned, and
     * runs only after this drain. */
    return ferry_future_cancel(sc_cur->task);
}

static void *sc_prep_thread(void *arg)
{
    struct sc_run *r = arg;

    r->prep |= ferry_loop_spawn_threadsafe(tu_loop, counted_fn, NULL, NULL, &r->task);
    r->prep |= ferry_loop_call_threadsafe(tu_loop, cancel_the_task_fn, NULL, &r->canceller);
    return NULL;
}

T(cancel_of_a_task_spawned_but_not_yet_run_skips_fn)
{
    struct sc_run r = {0};
    int st = 1;
    pthread_t t;

    sc_cur = &r;
    atomic_store(&fn_calls, 0);
    t = tu_start_thread(sc_prep_thread, &r);
    pthread_join(t, NULL);                     /* both posted, loop idle */
    cr_assert_eq(r.prep, 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(wait_elsewhere(r.canceller, FERRY_NEVER, &st), 0);
    cr_assert_eq(st, 0);                       /* the cancel call's return */
    cr_assert_eq(wait_elsewhere(r.task, FERRY_NEVER, &st), 0);
    cr_assert_eq(st, -ECANCELED);
    cr_assert_eq(atomic_load(&fn_calls), 0);
    ferry_future_free(r.task);
    ferry_future_free(r.canceller);
}
