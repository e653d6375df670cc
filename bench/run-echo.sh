#!/usr/bin/env bash
# bench/run-echo.sh - the network workloads only (tcp_echo, tcp_bulk):
# ferry's echo servers against a few peers' in the same runs.  A shorthand
# for `bench/run-compare.sh -E` with other defaults (5 runs, peers libuv and
# limit); every option of run-compare.sh works here too (-h lists them).
#
#   ANCHORS=DIR bench/run-echo.sh                     # ferry, libuv, limit
#   bench/run-echo.sh -a DIR -n 3 libuv limit libevent
#   FERRY_VARIANTS="ferry ferry-libevent ferry-bev" bench/run-echo.sh -a DIR
#
# The peer programs' directory (-a DIR or ANCHORS=DIR) is required.
here=$(cd "$(dirname "$0")" && pwd)
RUNS=${RUNS:-5}
export RUNS
# Peers given after the options replace the default pair.
args=() peers=()
while [ $# -gt 0 ]; do
    case $1 in
        -[nabowsqVcrt]) args+=("$1" "${2:-}"); shift 2 ;;
        -*) args+=("$1"); shift ;;
        *) peers+=("$1"); shift ;;
    esac
done
[ ${#peers[@]} -gt 0 ] || peers=(libuv limit)
exec "$here/run-compare.sh" -E "${args[@]}" "${peers[@]}"
