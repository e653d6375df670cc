#!/usr/bin/env bash
# test_http_service.sh SERVICE LOAD [valgrind]
#
# Starts examples/http_service on a free loopback port (port 0: the kernel
# picks one, the service prints it), optionally under valgrind memcheck,
# and checks with examples/http_load:
#   1. 200 concurrent requests over 8 keys: all 200 OK with the right body;
#   2. /stats: 200 singleflight calls, fewer queries than calls (collapsed),
#      database peak within the slots, no leftover in flight;
#   3. a query slower than its deadline: 504, answered at the deadline;
#   4. an unknown path: 404;
#   5. SIGTERM during a load of 3,000 requests (long enough that a slow
#      machine cannot finish it before the signal): the service exits 0, every
#      request it accepted was answered (its count equals the answers all
#      clients received), and under valgrind no error and no leak.
# Loopback only; every wait is bounded.
set -u
svc=$1
load=$2
mode=${3:-plain}
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
    if "$@"; then
        echo "ok:   $what"
    else
        echo "FAIL: $what"
        fails=$((fails + 1))
    fi
}

launcher=()
args=()
start_wait=100          # tenths of a second
if [ "$mode" = valgrind ]; then
    launcher=(valgrind -q --leak-check=full --error-exitcode=1 --log-file="$tmp/valgrind.log")
    args=(--timeout-ms 20000)   # memcheck is ~30x slower: keep the normal deadline out of the way
    start_wait=600
fi

"${launcher[@]}" "$svc" 0 "${args[@]}" >"$tmp/service.out" 2>&1 &
pid=$!
port=
for ((i = 0; i < start_wait; i++)); do
    port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/service.out")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "FAIL: the service did not start"
    cat "$tmp/service.out"
    exit 1
fi
echo "service ($mode) listening on port $port"

answers=0               # answers received by every client run
run_load() {            # run_load OUTFILE ARGS...: run the client, add up its answers
    local out=$1
    shift
    "$load" "$port" "$@" >"$out" 2>&1
    local rc=$?
    sed -n '$p' "$out"
    local a
    a=$(sed -n 's/.*answered \([0-9]*\) .*/\1/p' "$out" | tail -1)
    answers=$((answers + ${a:-0}))
    return $rc
}

# 1. 200 concurrent requests.
run_load "$tmp/load1" 200 200 \
    "/rate?currency=USD" "/rate?currency=EUR" "/rate?currency=GBP" "/rate?currency=JPY" \
    "/item?id=1" "/item?id=42" "/item?id=500" "/item?id=1000" --expect 200
check "200 concurrent requests, all 200 OK with the right body" [ $? -eq 0 ]

# 2. The counters.
run_load "$tmp/stats" 1 1 /stats --print-body >/dev/null
stats=$(grep '^{' "$tmp/stats")
echo "stats: $stats"
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$stats" "$1"; }
calls=$(field flight_calls); runs=$(field flight_runs); peak=$(field db_peak)
slots=$(field db_slots); queries=$(field db_queries); ok2=$(field status_2xx)
check "singleflight: 200 calls" [ "$calls" -eq 200 ]
check "singleflight collapsed them: $runs queries for $calls calls" [ "$runs" -lt "$calls" -a "$runs" -ge 8 ]
check "every query ran on the pool: $queries = $runs" [ "$queries" -eq "$runs" ]
check "semaphore: database peak $peak within $slots slots" [ "$peak" -ge 1 -a "$peak" -le "$slots" ]
check "200 answered 2xx before /stats" [ "$ok2" -eq 200 ]

# 3. A query slower than its deadline.
start=$(date +%s%N)
run_load "$tmp/slow" 1 1 "/slow?ms=3000&deadline_ms=300" --expect 504
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
check "a 3 s query under a 300 ms deadline: 504 after $ms ms" [ $rc -eq 0 -a "$ms" -lt 2900 ]

# 4. Not found.
run_load "$tmp/nf" 2 2 "/nope" "/rate?currency=XXX" --expect 404
check "unknown path and unknown currency: 404" [ $? -eq 0 ]

# 5. SIGTERM during load.
n=3000
"$load" "$port" $n 100 \
    "/rate?currency=USD" "/rate?currency=CHF" "/item?id=7" "/item?id=8" "/slow?ms=50" \
    >"$tmp/load5" 2>&1 &
lpid=$!
# Signal once the service is busy: poll /stats (its answers count too).
for ((i = 0; i < 100; i++)); do
    sleep 0.05
    run_load "$tmp/poll" 1 1 /stats --print-body >/dev/null
    busy=$(grep '^{' "$tmp/poll" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["inflight"])' 2>/dev/null)
    [ "${busy:-0}" -gt 10 ] && break
done
echo "sending SIGTERM with ${busy:-?} requests in flight (counting the /stats poll)"
kill -TERM "$pid"
exit_wait=300           # tenths of a second
[ "$mode" = valgrind ] && exit_wait=1200
for ((i = 0; i < exit_wait; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
status=0
if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: the service did not exit within $((exit_wait / 10)) s of SIGTERM"
    kill -KILL "$pid"
    fails=$((fails + 1))
fi
wait "$pid" || status=$?
pid=
wait "$lpid"
sed -n '$p' "$tmp/load5"
a5=$(sed -n 's/.*answered \([0-9]*\) .*/\1/p' "$tmp/load5" | tail -1)
answers=$((answers + ${a5:-0}))
cat "$tmp/service.out"
check "the service exited with status $status after SIGTERM" [ "$status" -eq 0 ]
line=$(grep '^shutdown:' "$tmp/service.out")
accepted=$(sed -n 's/^shutdown: accepted \([0-9]*\),.*/\1/p' <<<"$line")
answered=$(sed -n 's/.*answered \([0-9]*\) .*/\1/p' <<<"$line")
inflight=$(sed -n 's/.*, \([0-9]*\) were in flight.*/\1/p' <<<"$line")
check "the service answered every request it accepted: $answered of ${accepted:-?}" \
    [ -n "$accepted" -a "$accepted" = "$answered" ]
check "the clients received $answers answers, one for each accepted request" \
    [ "$answers" = "${accepted:-x}" ]
check "requests were in flight at the signal (${inflight:-?}) and were finished" \
    [ "${inflight:-0}" -gt 0 ]
check "the load was cut by the shutdown: ${a5:-?} of $n answered" [ "${a5:-0}" -gt 0 -a "${a5:-0}" -lt $n ]
if [ "$mode" = valgrind ]; then
    cat "$tmp/valgrind.log"
    check "valgrind: no error, no leak (log empty)" [ ! -s "$tmp/valgrind.log" ]
fi

echo "$((fails == 0 ? 1 : 0)) passed, $((fails > 0 ? 1 : 0)) failed"
[ "$fails" -eq 0 ]
