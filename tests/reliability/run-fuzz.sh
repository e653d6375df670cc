#!/usr/bin/env bash
# run-fuzz.sh - build the libFuzzer target (clang, ASan+UBSan), replay the
# committed corpus, then fuzz for a bounded time.
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
cmake --build "$build" -j"${JOBS:-2}" --target fuzz_model
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
echo "fuzz: 1 passed, 0 failed"
