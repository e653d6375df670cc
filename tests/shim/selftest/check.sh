#!/usr/bin/env bash
# check.sh BINARY [shim|criterion|valgrind] - run the shim's selftest program and
# compare each test's outcome with what its suite name promises:
#   pass::*  must pass        fail::*  must fail        skip::*  skipped
#   shimonly::*, sanitizer::*  must fail under the shim (Criterion is known
#   to pass them: it ignores .fini failures and exit statuses), are not
#   checked against real Criterion.
#   valgrind::*  skip themselves unless run under valgrind; in mode
#   "valgrind" (BINARY is run under valgrind --error-exitcode=1) they must fail.
# Exits non-zero on any mismatch, or if fewer tests than expected ran.
set -euo pipefail
bin=$1
mode=${2:-shim}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

set +e
if [ "$mode" = valgrind ]; then
    valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite \
        "$bin" --jobs 1 --verbose >"$out" 2>&1
else
    "$bin" --jobs 1 --verbose >"$out" 2>&1
fi
rc=$?
set -e

bad=0
checked=0
declare -A seen=()
while read -r verdict name; do
    suite=${name%%::*}
    seen[$name]=1
    case $suite in
        pass|suitewide) want=PASS ;;
        fail) want=FAIL ;;
        skip) want=SKIP ;;
        shimonly|sanitizer) [ "$mode" != criterion ] || continue; want=FAIL ;;
        valgrind) if [ "$mode" = valgrind ]; then want=FAIL; else want=SKIP; fi ;;
        *) echo "check.sh: unknown suite in $name"; bad=1; continue ;;
    esac
    checked=$((checked + 1))
    if [ "$verdict" != "$want" ]; then
        echo "MISMATCH: $name: got $verdict, want $want"
        bad=1
    fi
done < <(sed -nE 's/^\[(PASS|FAIL|SKIP)\] ([a-z_]+::[a-z_]+).*/\1 \2/p' "$out")

# Criterion prints no verdict line for a test whose .init fails.
if [ "$mode" = criterion ] && [ -z "${seen[fail::init_fails]:-}" ] &&
   grep -q 'fail::init_fails` crashed during its setup' "$out"; then
    checked=$((checked + 1))
fi
# Every test of selftest.c outside the sanitizer suite.
min=31
[ "$mode" != criterion ] || min=30
if [ "$checked" -lt "$min" ]; then
    echo "check.sh: only $checked outcomes checked, expected at least $min"
    bad=1
fi
if [ "$rc" -eq 0 ]; then
    echo "check.sh: the runner exited 0 although tests failed"
    bad=1
fi
if [ "$mode" != criterion ] && ! tail -n 1 "$out" | grep -Eq '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$'; then
    echo "check.sh: the last line is not the 'N passed, N failed' summary"
    bad=1
fi
if [ "$bad" -ne 0 ]; then
    echo "---- output of $bin"
    cat "$out"
    exit 1
fi
echo "shim selftest ($mode): $checked outcomes as expected"
