#!/usr/bin/env bash
# check_output.sh PROGRAM [ARG...] -- [REGEX...]
#
# Run an example, show its output, and pass only if it exits 0 and the
# extended regexes match lines of its output in the order given (each one
# on a line after the line the previous one matched).  A regex starting
# with '!' must match no line at all.
set -u
prog=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do prog+=("$1"); shift; done
[ $# -gt 0 ] && shift
out=$("${prog[@]}" 2>&1)
rc=$?
printf '%s\n' "$out"
mapfile -t lines <<<"$out"
fail=0
if [ "$rc" -ne 0 ]; then
    echo "check_output: ${prog[*]} exited with status $rc"
    fail=1
fi
next=0
for re in "$@"; do
    if [ "${re:0:1}" = '!' ]; then
        if printf '%s\n' "$out" | grep -Eq -- "${re:1}"; then
            echo "check_output: unexpected line matching: ${re:1}"
            fail=1
        fi
        continue
    fi
    found=-1
    for ((i = next; i < ${#lines[@]}; i++)); do
        if printf '%s\n' "${lines[i]}" | grep -Eq -- "$re"; then
            found=$i
            break
        fi
    done
    if [ "$found" -lt 0 ]; then
        echo "check_output: no line (after line $next) matches: $re"
        fail=1
    else
        next=$((found + 1))
    fi
done
[ "$fail" -eq 0 ] && echo "check_output: all checks passed"
exit "$fail"
