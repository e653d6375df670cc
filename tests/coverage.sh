#!/usr/bin/env bash
# tests/coverage.sh - build ferry with gcov coverage in its own directory,
# run the test suites, and print line and branch coverage of the library
# (base/, src/, io/, bridge/, wire/; gcovr), with the files that miss the most
# lines.
#
#   bash tests/coverage.sh
#
# Environment:
#   FERRY_COV_BUILD        build directory (default: build-coverage in the work tree)
#   FERRY_COV_LINE_MIN     fail (exit 1) if line coverage is below this percentage
#   FERRY_COV_BRANCH_MIN   fail (exit 1) if branch coverage is below this percentage
#                          (default for both: only print)
#   CTEST_ARGS             extra ctest arguments (e.g. "-E stress_watchdog")
#   JOBS                   build jobs (default 2)
# Branches: gcovr's --exclude-unreachable-branches and
# --exclude-throw-branches; test files are not counted (--filter).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_COV_BUILD:-$root/build-coverage}

# -fprofile-update=atomic: pool threads and producers update the same
# counters; without it racy increments produce negative counts that gcovr
# 5.2 rejects ("UnknownLineType: branch 1 taken -157689").
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DFERRY_COVERAGE=ON \
    -DFERRY_BENCH=OFF -DFERRY_EXAMPLES=OFF -DCMAKE_C_FLAGS=-fprofile-update=atomic >/dev/null
cmake --build "$build" -j"${JOBS:-2}"
# Stale counters from an earlier run would inflate the figures.
find "$build" -name '*.gcda' -delete
status=0
ctest --test-dir "$build" --output-on-failure --no-tests=error ${CTEST_ARGS:-} || status=$?

gcov_args=(--root "$root" --filter "$root/base/" --filter "$root/src/" --filter "$root/io/"
           --filter "$root/bridge/" --filter "$root/wire/"
           --exclude-unreachable-branches --exclude-throw-branches "$build")
echo "== coverage of base/, src/, io/, bridge/ and wire/"
gcovr "${gcov_args[@]}" --txt "$build/coverage-lines.txt" --print-summary | tail -3
# gcovr 5.2 (Debian 12) has no --txt-metric: --branches selects the branch table.
gcovr "${gcov_args[@]}" --branches --txt "$build/coverage-branches.txt" >/dev/null
echo "== files with the most uncovered lines (file, lines, exec, cover, missing)"
awk 'NF >= 4 && $1 ~ /\.(c|h)$/ { miss = $2 - $3; print miss "\t" $0 }' "$build/coverage-lines.txt" |
    sort -rn | head -8 | cut -f2-
echo "(per-file reports: $build/coverage-lines.txt, $build/coverage-branches.txt)"

summary=$(gcovr "${gcov_args[@]}" --print-summary --txt /dev/null 2>/dev/null | tail -3)
line=$(printf '%s\n' "$summary" | awk '/^lines:/ { sub("%", "", $2); print $2 }')
branch=$(printf '%s\n' "$summary" | awk '/^branches:/ { sub("%", "", $2); print $2 }')
echo "coverage: lines ${line}%, branches ${branch}% (base/, src/, io/, bridge/, wire/)"
if [ -n "${FERRY_COV_LINE_MIN:-}" ] && awk -v a="$line" -v b="$FERRY_COV_LINE_MIN" 'BEGIN { exit !(a < b) }'; then
    echo "coverage: lines ${line}% below ${FERRY_COV_LINE_MIN}%"
    status=1
fi
if [ -n "${FERRY_COV_BRANCH_MIN:-}" ] && awk -v a="$branch" -v b="$FERRY_COV_BRANCH_MIN" 'BEGIN { exit !(a < b) }'; then
    echo "coverage: branches ${branch}% below ${FERRY_COV_BRANCH_MIN}%"
    status=1
fi
exit $status
