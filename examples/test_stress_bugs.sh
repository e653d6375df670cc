#!/usr/bin/env bash
# test_stress_bugs.sh - ferry-fuzz finds each planted bug of stress_bugs
# within 200 seeds, and passes the fixed variants over SEEDS seeds.
#
#   bash test_stress_bugs.sh FERRY_FUZZ_RUNNER STRESS_BUGS [SEEDS]
#
# Prints what the runner said for each; exits 1 if a bug was not found or
# a fixed variant failed.
set -uo pipefail
runner=$1
prog=$2
seeds=${3:-200}
status=0

for bug in cache condvar counter; do
    out=$(python3 "$runner" -q -n 200 -j 2 -- "$prog" "$bug")
    rc=$?
    echo "$bug: $out"
    if [ $rc -ne 1 ] || ! grep -Eq "^seed [0-9]+ failed \(exit status 1\) after [0-9]+ passed: FERRY_FUZZ=[0-9]+ $prog $bug\$" <<<"$out"; then
        echo "FAIL: ferry-fuzz did not report a failing seed of '$bug' within 200 seeds (exit $rc)"
        status=1
    fi
    out=$(python3 "$runner" -q -n "$seeds" -j 2 -- "$prog" "$bug" --fixed)
    rc=$?
    echo "$bug --fixed: $out"
    if [ $rc -ne 0 ] || ! grep -q "^ferry-fuzz: $seeds seeds passed" <<<"$out"; then
        echo "FAIL: the fixed '$bug' failed under ferry-fuzz (exit $rc)"
        status=1
    fi
done
# Without fuzzing every variant passes.
for bug in cache condvar counter; do
    if ! "$prog" "$bug" >/dev/null 2>&1; then
        echo "FAIL: '$bug' failed in a plain run"
        status=1
    fi
done
exit $status
