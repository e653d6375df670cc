#!/usr/bin/env bash
# test_line_server.sh SERVER LOAD
#
# Starts examples/line_server on a free loopback port and checks with
# examples/line_load:
#   1. 100 connections at once, 10 requests each: every one answered right,
#      and a line over the server's maximum answered "too long";
#   2. 20 connections with a request in flight each, then SIGTERM: every
#      request is answered right or its connection is closed without an
#      answer (the drain refused it, never a wrong or cut answer), and 5
#      idle connections see the end; the server exits 0, finished every
#      request it had in flight at SIGTERM, and has served exactly the
#      answers the clients got.
# Every wait is bounded.
set -u
svc=$1
load=$2
tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
check() {   # check DESCRIPTION CONDITION...
    local what=$1
    shift
    if "$@"; then echo "ok:   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

"$svc" 0 >"$tmp/server.out" 2>&1 &
pid=$!
port=
for ((i = 0; i < 300; i++)); do
    port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/server.out")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "FAIL: the server did not start"
    cat "$tmp/server.out"
    exit 1
fi

answered() { sed -n 's/.*: \([0-9]*\) answered right.*/\1/p' "$1"; }

timeout 120 "$load" "$port" 100 10 >"$tmp/load.out" 2>&1
rc=$?
cat "$tmp/load.out"
check "100 connections x 10 requests: every answer right" test "$rc" -eq 0
check "1000 answers" test "$(answered "$tmp/load.out")" = 1000

timeout 120 "$load" "$port" 20 --drain "$pid" >"$tmp/drain.out" 2>&1
rc=$?
cat "$tmp/drain.out"
check "drain: each request answered right or refused" test "$rc" -eq 0
for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
wait "$pid"
src=$?
pid=
cat "$tmp/server.out"
check "the server exited 0 after SIGTERM" test "$src" -eq 0
inflight=$(sed -n 's/^drained: \([0-9]*\) of \([0-9]*\) requests in flight.*/\1 \2/p' "$tmp/server.out")
check "every request in flight at SIGTERM finished ($inflight)" test -n "$inflight" -a "${inflight% *}" = "${inflight#* }"
served=$(sed -n 's/.* \([0-9]*\) requests served.*/\1/p' "$tmp/server.out")
got=$(( $(answered "$tmp/load.out") + $(answered "$tmp/drain.out") ))
check "the server served what the clients received ($served = $got)" test "${served:-x}" = "$got"
[ "$fails" -eq 0 ] && echo "PASS" || exit 1
