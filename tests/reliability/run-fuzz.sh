#!/usr/bin/env bash
# run-fuzz.sh - build the libFuzzer targets (clang, ASan+UBSan): the
# model-based tester (fuzz_model, corpus/) and the line reader
# (fuzz_stream, corpus-stream/) and, when the TLS part is built, TLS record
# boundaries (fuzz_tls, corpus-tls/); replay each committed corpus, then
# fuzz each for a bounded time.
#
#   bash tests/reliability/run-fuzz.sh [SECONDS]    (default 60 per target)
#
# The whole library is built with -fsanitize=fuzzer-no-link, so libFuzzer
# gets coverage feedback from ferry itself, not only from the harness.
# Environment: FERRY_FUZZ_BUILD (default build-fuzz in the work tree),
# JOBS (default 2).  New interesting inputs go to a scratch corpus in the
# build directory, not to the committed one; a failing input is saved as
# crash-* in the build directory and the script exits 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${1:-60}
build=${FERRY_FUZZ_BUILD:-$root/build-fuzz}
corpus=$root/tests/reliability/corpus

CC=clang cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFERRY_ASAN=ON -DFERRY_FUZZ=ON -DFERRY_BENCH=OFF -DFERRY_EXAMPLES=OFF \
    -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target fuzz_model fuzz_stream
# fuzz_tls exists when the build found OpenSSL (FERRY_TLS).
tls=0
if grep -q '^FERRY_HAVE_TLS:INTERNAL=1' "$build/CMakeCache.txt" 2>/dev/null ||
   grep -q 'define FERRY_HAVE_TLS 1' "$build/include/ferry/features.h"; then
    tls=1
    cmake --build "$build" -j"${JOBS:-2}" --target fuzz_tls
fi
fuzz=$build/tests/reliability/fuzz_model
# Use-after-return detection gives every task a fake stack (an mmap and a
# munmap each): it ran 5 times fewer inputs in the time budget.  The ASan
# build of the tests (tests/CMakeLists.txt) runs the model with it on.
export ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

echo "== fuzz_model: replaying the committed corpus ($(ls "$corpus" | wc -l) inputs)"
"$fuzz" -runs=0 "$corpus"

echo "== fuzz_model: fuzzing for ${secs} s"
scratch=$build/fuzz-corpus
mkdir -p "$scratch"
cd "$build"
"$fuzz" -max_total_time="$secs" -max_len=1203 -timeout=10 -print_final_stats=1 \
    "$scratch" "$corpus"

stream_fuzz=$build/tests/reliability/fuzz_stream
stream_corpus=$root/tests/reliability/corpus-stream
echo "== fuzz_stream: replaying the committed corpus ($(ls "$stream_corpus" | wc -l) inputs)"
"$stream_fuzz" -runs=0 "$stream_corpus"

echo "== fuzz_stream: fuzzing for ${secs} s"
stream_scratch=$build/fuzz-corpus-stream
mkdir -p "$stream_scratch"
"$stream_fuzz" -max_total_time="$secs" -max_len=4096 -timeout=10 -print_final_stats=1 \
    "$stream_scratch" "$stream_corpus"
if [ "$tls" = 1 ]; then
    tls_fuzz=$build/tests/reliability/fuzz_tls
    tls_corpus=$root/tests/reliability/corpus-tls
    echo "== fuzz_tls: replaying the committed corpus ($(ls "$tls_corpus" | wc -l) inputs)"
    "$tls_fuzz" -runs=0 "$tls_corpus"
    echo "== fuzz_tls: fuzzing for ${secs} s"
    tls_scratch=$build/fuzz-corpus-tls
    mkdir -p "$tls_scratch"
    "$tls_fuzz" -max_total_time="$secs" -max_len=8192 -timeout=30 -print_final_stats=1 \
        "$tls_scratch" "$tls_corpus"
    echo "fuzz: 3 passed, 0 failed"
else
    echo "fuzz: 2 passed, 0 failed (no TLS part: fuzz_tls not built)"
fi
