/* test_fuzz.c - schedule fuzzing (ferry_loop_opts.fuzz_seed, FERRY_FUZZ):
 * the order of ready tasks is drawn from the seed and replays with it,
 * callbacks keep their order, free locks and available elements suspend
 * now and then, and without fuzzing the order is FIFO.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"

/* Tests that make their own loops. */
#define TL(suite, name) Test(suite, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* ---- a trace of task steps ------------------------------------------- */

#define NTASKS 8
#define NSTEPS 6
#define TRACE_MAX (NTASKS * NSTEPS + 64)

static int trace[TRACE_MAX];
static int ntrace;
static int body_errors;

static void record(int v)
{
    if (ntrace < TRACE_MAX)
        trace[ntrace++] = v;
}

/* Records its number, then yields, NSTEPS times. */
static int stepper(void *arg)
{
    for (int i = 0; i < NSTEPS; i++) {
        record((int)(intptr_t)arg);
        if (ferry_yield())
            body_errors++;
    }
    return 0;
}

static int spawn_steppers(void *arg)
{
    ferry_task *t[NTASKS];

    (void)arg;
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_spawn(&t[i], NULL, stepper, (void *)(intptr_t)i, NULL))
            body_errors++;
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    return 0;
}

/* Run spawn_steppers on a new loop with these options; the trace is in
 * trace[0..ntrace). */
static void run_traced(const ferry_loop_opts *o)
{
    ferry_loop *loop;

    ntrace = 0;
    body_errors = 0;
    cr_assert_eq(ferry_loop_new(&loop, o), 0);
    cr_assert_eq(tu_run_on(loop, spawn_steppers, NULL), 0);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
    cr_assert_eq(ntrace, NTASKS * NSTEPS);
}

TL(fuzz, off_is_fifo)
{
    run_traced(NULL);
    /* Round after round, every task once, in the order of their spawns. */
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], i % NTASKS, "step %d: task %d ran, FIFO gives %d", i, trace[i],
                     i % NTASKS);
}

TL(fuzz, same_seed_same_order_other_seed_other_order)
{
    ferry_loop_opts o = { .fuzz_seed = 42 };
    int first[TRACE_MAX], differ = 0, unlike_fifo = 0;

    run_traced(&o);
    memcpy(first, trace, sizeof first);
    for (int i = 0; i < ntrace; i++)
        unlike_fifo += trace[i] != i % NTASKS;
    cr_expect_gt(unlike_fifo, 0, "seed 42 ran the tasks in FIFO order");

    /* Replay: the same seed gives the same steps. */
    run_traced(&o);
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], first[i], "replay of seed 42 differs at step %d", i);

    /* Other seeds give other orders (each one could match by chance with
     * a probability far below 1e-30). */
    for (uint64_t seed = 1; seed <= 3; seed++) {
        o.fuzz_seed = seed;
        run_traced(&o);
        differ = 0;
        for (int i = 0; i < ntrace; i++)
            differ += trace[i] != first[i];
        cr_expect_gt(differ, 0, "seed %llu ran the same steps as seed 42",
                     (unsigned long long)seed);
    }
}

/* ---- callbacks keep their order ---------------------------------------- */

static void cb_record(void *arg)
{
    record(100 + (int)(intptr_t)arg);
}

static int spawn_mixed(void *arg)
{
    ferry_task *t[NTASKS];

    (void)arg;
    /* Callbacks and tasks queued in one batch, interleaved. */
    for (int i = 0; i < NTASKS; i++) {
        if (ferry_task_spawn(&t[i], NULL, stepper, (void *)(intptr_t)i, NULL))
            body_errors++;
        if (ferry_call_soon(ferry_loop_current(), cb_record, (void *)(intptr_t)i))
            body_errors++;
    }
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    return 0;
}

TL(fuzz, callbacks_keep_their_order)
{
    ferry_loop_opts o = { .fuzz_seed = 7 };
    ferry_loop *loop;
    int next_cb = 0, tasks_unlike_fifo = 0, task_steps = 0;

    ntrace = 0;
    body_errors = 0;
    cr_assert_eq(ferry_loop_new(&loop, &o), 0);
    cr_assert_eq(tu_run_on(loop, spawn_mixed, NULL), 0);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
    for (int i = 0; i < ntrace; i++) {
        if (trace[i] >= 100) {
            cr_expect_eq(trace[i], 100 + next_cb, "callback %d ran where %d was due",
                         trace[i] - 100, next_cb);
            next_cb++;
        } else {
            tasks_unlike_fifo += trace[i] != task_steps % NTASKS;
            task_steps++;
        }
    }
    cr_expect_eq(next_cb, NTASKS);
    cr_expect_gt(tasks_unlike_fifo, 0, "the tasks ran in FIFO order under fuzzing");
}

/* ---- spurious suspensions -------------------------------------------- */

static ferry_lock free_lock;
static ferry_queue fullq;
static ferry_sem sem;
static ferry_event set_ev;
static bool suspended[4];  /* the task's step ended during each call */

/* The loop's step count: it goes up when the running task suspends and
 * is resumed, and only then. */
static uint64_t steps_now(void)
{
    ferry_loop_stats st;

    if (ferry_loop_stats_get(ferry_loop_current(), &st))
        body_errors++;
    return st.steps;
}

/* Each call below cannot suspend in a plain run: the lock is free, the
 * queue holds an element, the semaphore has a permit, the event is set. */
static int calls_that_need_not_suspend(void *arg)
{
    int item = 1, out, bad = 0;
    uint64_t before;

    (void)arg;
    bad |= ferry_event_set(&set_ev);
    before = steps_now();
    bad |= ferry_lock_acquire(&free_lock);
    suspended[0] = steps_now() != before;
    bad |= ferry_lock_release(&free_lock);

    bad |= ferry_queue_try_put(&fullq, &item);
    before = steps_now();
    bad |= ferry_queue_get(&fullq, &out);
    suspended[1] = steps_now() != before;

    before = steps_now();
    bad |= ferry_sem_acquire(&sem);
    suspended[2] = steps_now() != before;

    before = steps_now();
    bad |= ferry_event_wait(&set_ev);
    suspended[3] = steps_now() != before;
    return bad;
}

static void run_points(const ferry_loop_opts *o)
{
    ferry_loop *loop;

    body_errors = 0;
    memset(suspended, 0, sizeof suspended);
    ferry_lock_init(&free_lock);
    cr_assert_eq(ferry_queue_init(&fullq, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(ferry_sem_init(&sem, 1, 0), 0);
    cr_assert_eq(ferry_event_init(&set_ev), 0);
    cr_assert_eq(ferry_loop_new(&loop, o), 0);
    cr_assert_eq(tu_run_on(loop, calls_that_need_not_suspend, NULL), 0);
    cr_assert_eq(ferry_queue_destroy(&fullq), 0);
    ferry_lock_destroy(&free_lock);
    ferry_sem_destroy(&sem);
    ferry_event_destroy(&set_ev);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
}

TL(fuzz, free_lock_and_available_element_suspend_at_probability_one)
{
    ferry_loop_opts o = { .fuzz_seed = 3, .fuzz_prob = 1.0 };
    const char *what[4] = { "free lock", "queue get", "semaphore", "set event" };

    run_points(&o);
    for (int i = 0; i < 4; i++)
        cr_expect(suspended[i], "%s: the call did not suspend at probability 1", what[i]);
}

TL(fuzz, no_spurious_suspension_when_off)
{
    const char *what[4] = { "free lock", "queue get", "semaphore", "set event" };

    run_points(NULL);
    for (int i = 0; i < 4; i++)
        cr_expect(!suspended[i], "%s: the call suspended without fuzzing", what[i]);
}

/* ---- options and the environment ------------------------------------- */

TL(fuzz, probability_above_one_is_einval)
{
    ferry_loop_opts o = { .fuzz_seed = 1, .fuzz_prob = 1.5 };
    ferry_loop *loop = NULL;

    cr_expect_eq(ferry_loop_new(&loop, &o), -EINVAL);
    cr_expect_null(loop);
}

TL(fuzz, environment_overrides_the_options)
{
    ferry_loop_opts o = { .fuzz_seed = 42 };
    ferry_loop_opts by_env = { .fuzz_seed = 9 };
    int want[TRACE_MAX];

    run_traced(&o);
    memcpy(want, trace, sizeof want);
    /* The process's first loop under FERRY_FUZZ=42 draws as seed 42 does,
     * whatever its options say. */
    setenv("FERRY_FUZZ", "42", 1);
    run_traced(&by_env);
    unsetenv("FERRY_FUZZ");
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], want[i], "FERRY_FUZZ=42 differs from seed 42 at step %d", i);
}
