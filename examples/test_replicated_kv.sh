#!/usr/bin/env bash
# test_replicated_kv.sh - ferry-fuzz finds the planted bug of replicated_kv
# (an acknowledgement sent before the replica has the write) within
# BUG_SEEDS seeds and prints the command that replays it; that command
# fails again, twice, with the same output (the same trace hash); the
# fixed service passes SEEDS seeds.
#
#   bash test_replicated_kv.sh FERRY_FUZZ_RUNNER REPLICATED_KV [SEEDS] [BUG_SEEDS]
#
# Prints what it ran and saw; exits 1 if any of that did not hold.
set -uo pipefail
runner=$1
prog=$2
seeds=${3:-100}
bug_seeds=${4:-300}
status=0
fail() {
    echo "FAIL: $*"
    status=1
}

out=$(python3 "$runner" -n "$bug_seeds" -j 2 -- "$prog" --bug)
rc=$?
echo "$out"
seed=$(sed -n "s|^seed \([0-9]*\) failed (exit status 1) after [0-9]* passed: FERRY_FUZZ=\1 $prog --bug\$|\1|p" <<<"$out")
if [ $rc -ne 1 ] || [ -z "$seed" ]; then
    fail "ferry-fuzz did not report a failing seed of --bug within $bug_seeds seeds (exit $rc)"
else
    if ! grep -Fq "FAILED seed $seed: replay with FERRY_FUZZ=$seed $prog --bug" <<<"$out"; then
        fail "the program did not print the command that replays seed $seed"
    fi
    a=$(FERRY_FUZZ=$seed "$prog" --bug 2>&1)
    ra=$?
    b=$(FERRY_FUZZ=$seed "$prog" --bug 2>&1)
    rb=$?
    echo "replay of seed $seed: exit $ra, then $rb; $(grep -m1 'trace of' <<<"$a")"
    [ $ra -eq 1 ] && [ $rb -eq 1 ] || fail "the replay of seed $seed did not fail ($ra, $rb)"
    [ "$a" = "$b" ] || fail "two replays of seed $seed printed different things"
    grep -q "^lost: \|not on the replica" <<<"$a" || fail "the replay of seed $seed lost no write"
fi

out=$(python3 "$runner" -q -n "$seeds" -j 2 -- "$prog")
rc=$?
echo "fixed: $out"
if [ $rc -ne 0 ] || ! grep -q "^ferry-fuzz: $seeds seeds passed" <<<"$out"; then
    fail "the fixed service failed under ferry-fuzz (exit $rc)"
fi
exit $status
