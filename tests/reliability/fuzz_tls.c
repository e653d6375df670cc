/* fuzz_tls.c - TLS record boundaries as a libFuzzer target: the input
 * chooses how the ciphertext is cut on its way (tls_script.h) and is the
 * plaintext that must arrive intact.  A mismatch aborts, so libFuzzer
 * saves the input as crash-<sha1>.
 *
 * Build (clang only; gcc rejects -fsanitize=fuzzer): see run-fuzz.sh.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tls_script.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[512];

    if (tls_script_run(data, size, why, sizeof why) != 0) {
        fprintf(stderr, "tls script: FAILED: %s\n", why);
        abort();
    }
    return 0;
}
