#!/usr/bin/env bash
# test_line_server_all_cores.sh SERVER LOAD [reuseport]
#
# Starts examples/line_server_all_cores with FERRY_LOOPS=4 on a free
# loopback port and checks:
#   1. 100 connections at once, 10 requests each (examples/line_load):
#      every answer right, and a line over the maximum answered "too long";
#   2. "count" answers the requests served so far, kept on loop 0;
#   3. after SIGTERM the server exits 0, every loop served requests, and
#      the counter on loop 0 equals the requests the loops served.
# Every wait is bounded.
set -u
svc=$1
load=$2
mode=${3:-}
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

FERRY_LOOPS=4 "$svc" 0 $mode >"$tmp/server.out" 2>&1 &
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

timeout 120 "$load" "$port" 100 10 >"$tmp/load.out" 2>&1
rc=$?
cat "$tmp/load.out"
check "100 connections x 10 requests: every answer right" test "$rc" -eq 0

# One request on a connection of its own: the counter seen from some loop.
count=
if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
    printf 'count\n' >&3
    IFS= read -r -t 10 count <&3
    exec 3>&-
fi
echo "count answered: $count"
check "count answers the 1000 requests served before it" test "$count" = "count 1000"

kill -TERM "$pid"
for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
wait "$pid"
src=$?
pid=
cat "$tmp/server.out"
check "the server exited 0 after SIGTERM" test "$src" -eq 0
line=$(sed -n 's/^served per loop: \(.*\); \([0-9]*\) requests served, counter on loop 0: \([0-9]*\)$/\1|\2|\3/p' "$tmp/server.out")
per=${line%%|*}
rest=${line#*|}
check "the counter on loop 0 equals the requests served (${rest/|/ = })" test -n "$line" -a "${rest%|*}" = "${rest#*|}" -a "${rest%|*}" = 1001
idle=0
for k in $per; do [ "$k" -gt 0 ] || idle=$((idle + 1)); done
check "every one of the 4 loops served requests ($per)" test -n "$per" -a "$idle" -eq 0
[ "$fails" -eq 0 ] && echo "PASS" || exit 1
