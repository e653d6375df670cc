/* test_model_regress.c - every failing sequence the model-based tester
 * (model.h) has found, replayed as a named test.  A seed is the one
 * ferry-model printed ("FAILED seed 0x..."); `ferry-model --replay SEED -v`
 * prints its trace.  A test here that fails marks a bug not fixed yet.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "model.h"
#include "testutil.h"

static void replay(uint64_t seed)
{
    uint8_t buf[MODEL_HDR_BYTES + MODEL_MAX_OPS * MODEL_OP_BYTES];
    size_t n = model_seed_bytes(seed, buf, sizeof buf);
    model_report rep;
    int rc = model_check_bytes(tu_loop, buf, n, NULL, &rep);

    cr_assert_eq(rc, 0, "seed 0x%016llx failed at op %d: %s", (unsigned long long)seed,
                 rep.op_index, rep.msg);
    cr_assert_gt(rep.ops_run, 0, "seed 0x%016llx ran no operation", (unsigned long long)seed);
    cr_assert_eq(tu_leaks(), 0, "LeakSanitizer found leaks");
}

static void model_setup(void)
{
    cr_assert_eq(model_loop_new(&tu_loop), 0);
}

#define R(name) Test(model_regress, name, .init = model_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* A control: the first sequence of the default run. */
R(first_sequence_of_run_1)
{
    replay(model_seq_seed(1, 0));
}

/* Seed 4 of the random run, sequence 0xd314e16c855a57ea: a release by a
 * task that held no permit was accepted because only the free permits
 * were checked against the bound; then a waiter granted the freed permits
 * was cancelled before it ran, gave them back, and the bounded semaphore
 * held 4 of 3.  Now the granted-but-not-run permits count against the
 * bound too (ferry_sem_release_n). */
R(bounded_semaphore_counts_granted_permits)
{
    replay(0xd314e16c855a57eaULL);
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
