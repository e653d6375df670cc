/* fuzz_stream.c - the line reader as a libFuzzer target: the input is a
 * script of fragments and reads (stream_script.h), run on a real stream and
 * checked against a reference.  A mismatch aborts, so libFuzzer saves the
 * input as crash-<sha1>.
 *
 * Build (clang only; gcc rejects -fsanitize=fuzzer): see run-fuzz.sh.
 */
#include <stdio.h>
#include <stdlib.h>

#include "stream_script.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[512];

    if (stream_script_run(data, size, why, sizeof why) != 0) {
        fprintf(stderr, "stream script: FAILED: %s\n", why);
        abort();
    }
    return 0;
}
