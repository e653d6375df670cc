/* test_model_regress.c - every failing sequence the model-based tester
 * (model.h) has found, replayed as a named test.  A seed is the one
 * ferry-model printed ("FAILED seed 0x..."); `ferry-model --replay SEED -v`
 * prints its trace.  A test here that fails marks a bug not fixed yet.
 */
#include <errno.h>
#include <stdio.h>

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
