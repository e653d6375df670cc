/* fuzz_model.c - the model-based tester as a libFuzzer target: the input
 * bytes are the operation stream (model.h), decoded, run on a real loop and
 * checked against the reference model exactly as ferry-model does.  A
 * failed check aborts, so libFuzzer saves the input as crash-<sha1>.
 *
 * Build (clang only; gcc rejects -fsanitize=fuzzer): see run-fuzz.sh.
 *
 * It is not a Criterion test, so the shared teardown does not run: each
 * sequence ends by releasing everything it holds (model_driver.c), and the loop is
 * kept from one input to the next because libFuzzer calls the target many
 * times in one process.
 */
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

static ferry_loop *loop;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    model_report rep;

    if (!loop && model_loop_new(&loop) != 0)
        abort();
    if (size > MODEL_HDR_BYTES + MODEL_MAX_OPS * MODEL_OP_BYTES)
        size = MODEL_HDR_BYTES + MODEL_MAX_OPS * MODEL_OP_BYTES;
    if (model_check_bytes(loop, data, size, NULL, &rep) != 0) {
        fprintf(stderr, "model: FAILED at op %d: %s\n", rep.op_index, rep.msg);
        model_check_bytes(loop, data, size, stderr, &rep);   /* the trace */
        abort();
    }
    return 0;
}
