/* test_model_regress.c - every failing sequence the model-based tester
 * (model.h) has found, replayed as a named test.  A regression is stored
 * as the bytes of its sequence, a file tests/reliability/corpus/regress-*
 * (ferry-model --save DIR writes them), never as the seed of a generator
 * that may change; `ferry-model --bytes FILE -v` prints its trace.  The
 * corpus is replayed whole by model_corpus as well.  A test here that
 * fails marks a bug not fixed yet.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "model.h"
#include "testutil.h"

static void check(const uint8_t *buf, size_t n, const char *what)
{
    model_report rep;
    int rc = model_check_bytes(tu_loop, buf, n, NULL, &rep);

    cr_assert_eq(rc, 0, "%s failed at op %d: %s", what, rep.op_index, rep.msg);
    cr_assert_gt(rep.ops_run, 0, "%s ran no operation", what);
    cr_assert_eq(model_stray_callbacks(), 0);
    cr_assert_eq(tu_leaks(), 0, "LeakSanitizer found leaks");
}

static void replay_file(const char *name)
{
    static uint8_t buf[MODEL_MAX_BYTES];
    char path[4096];
    size_t n;
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", FERRY_MODEL_CORPUS, name);
    f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_gt(n, MODEL_HDR_BYTES, "%s is too short", path);
    check(buf, n, name);
}

static void model_setup(void)
{
    cr_assert_eq(model_loop_new(&tu_loop), 0);
}

#define R(name) Test(model_regress, name, .init = model_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* A control: the first sequence of the default run of today's generator. */
R(first_sequence_of_run_1)
{
    uint8_t buf[MODEL_MAX_BYTES];
    size_t n = model_seed_bytes(model_seq_seed(1, 0), buf, sizeof buf);

    check(buf, n, "sequence 0 of run 1");
}

/* Found as seed 0xd314e16c855a57ea of the first generator (format 1): a
 * release by a task that held no permit was accepted because only the free
 * permits were checked against the bound; then a waiter granted the freed
 * permits was cancelled before it ran, gave them back, and the bounded
 * semaphore held 4 of 3.  The permits granted to waiters that have not run
 * count against the bound too (ferry_sem_release_n); without that, op 112
 * fails ("sem_release returned 0, model -75"). */
R(bounded_semaphore_counts_granted_permits)
{
    replay_file("regress-bounded-sem-granted-permits");
}

/* Found by the fuzzer (format 1): the model broke a dead task's locks in
 * the task's own order, ferry in its loop's order of held locks, so the
 * waiters were woken in another order (op 103, "run queue position 0"). */
R(a_dead_task_breaks_its_locks_in_the_loop_order)
{
    replay_file("regress-held-lock-order");
}

/* ---- Bugs found by the reliability program, now fixed --------------- */

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
 * blocking".  The direct task-to-task handover (src/switch.h) used to start
 * new turns inside one FERRY_RUN_ONCE (up to io_interval of them) when the
 * blocked-loop detector was off; it no longer starts a turn in that mode. */
Test(fixed_bugs, run_once_runs_one_turn, .init = tu_loop_setup, .fini = tu_loop_teardown,
     .timeout = 10.)
{
    ferry_task *t;

    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, 0), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, spin_task, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_expect_eq(once_steps, 1, "one FERRY_RUN_ONCE ran %d steps of a yielding task", once_steps);
    cr_assert_eq(tu_cancel_join(t), 0);
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
 * The scheduler's TSan fiber was taken once per loop, so the second run's
 * tasks switched back to the dead task's fiber: a TSan build crashed
 * (SEGV in ThreadSanitizer).  The fiber is now taken at every switch. */
Test(fixed_bugs, a_loop_run_from_a_task_then_from_its_thread, .timeout = 30.)
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
