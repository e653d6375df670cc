#!/usr/bin/env bash
# scripts/test.sh - configure, build and run ferry's test suite: the plain
# build with real Criterion, run by ctest.  Packages: .ci/setup.
#   bash scripts/test.sh [extra cmake arguments, e.g. -DFERRY_WERROR=ON]
# Environment: FERRY_BUILD_DIR (default: build), JOBS (default: nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
# FERRY_TESTS=ON explicitly: a build directory configured without tests
# would otherwise make ctest pass with "No tests were found".
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_TESTS=ON "$@"
cmake --build "$build" -j"$jobs"
# Two tests at a time per CPU would oversubscribe the sanitizer builds;
# one per CPU keeps the wall time down without changing what a test sees.
ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs"
