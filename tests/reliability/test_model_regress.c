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

/* Found by format 4 (seed 0x3d02de7980a86a86, the first 16 operations):
 * a select over a receive from channel 0 and a get from the queue is
 * cancelled, the channel thread's send takes its channel case out and the
 * wake waits in the inbox; the select waits for it while its get is still
 * in the queue's list, a put grants that get, the grant leaves the waiter
 * the select waits on idle, and the wake then wakes nobody (op 15, "actor
 * 0 (select): 0 commands completed, model 1").  The select now takes every
 * case out before it waits. */
R(a_select_waiting_for_its_channel_wake_is_granted_nothing_else)
{
    replay_file("regress-select-chan-wake-on-its-way");
}

/* Found with the one above (seed 0x443b5a7aeb9cb194, the first 63
 * operations): the same window, caught at the grant itself.  The put's
 * element was reserved for the get of the select that was waiting for its
 * channel wake, a select that had already stopped choosing and so could
 * never take it or hand it back (op 62, "queue: count 1 res_get 1 ...
 * pending 1; model 1 0 ... 0"). */
R(a_grant_while_a_select_unwinds_is_not_lost)
{
    replay_file("regress-select-grant-while-unwinding");
}
