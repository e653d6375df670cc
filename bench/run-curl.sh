#!/usr/bin/env bash
# bench/run-curl.sh - HTTP GETs through libcurl, in one command: REQUESTS
# GETs of /hello over CONC concurrent transfers against tests/http_server
# (a process of its own on 127.0.0.1, one thread per connection), for
#   ferry    ferry+curl on one loop (ferry-curl-bench ferry)
#   threads  curl's blocking easy API on CONC threads (ferry-curl-bench threads)
#   go       Go's net/http client on CONC goroutines (bench/curl_go, built
#            here with `go` if it is installed: Debian's golang-go)
# interleaved, RUNS runs each; then the median requests/s and p99 of each.
# Not run in CI.
#
#   bench/run-curl.sh                  # 5 runs, 10,000 requests, 100 at once
#   bench/run-curl.sh -n 3 -r 2000 -c 50 -b DIR   # the build in DIR
#   bench/run-curl.sh -w               # also keep the lines in
#                                      # bench/curl_results.txt and write
#                                      # bench/README.md's table from them
#
# Without -b, the Release build in build-bench/ (made here if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
runs=5 reqs=10000 conc=100 build="" write=""
while getopts "n:r:c:b:wh" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        r) reqs=$OPTARG ;;
        c) conc=$OPTARG ;;
        b) build=$OPTARG ;;
        w) write=1 ;;
        *) sed -n '2,19p' "$0"; exit 2 ;;
    esac
done
if [ -z "$build" ]; then
    build=$root/build-bench
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFERRY_TESTS=ON >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-curl-bench http_server >/dev/null
fi
bench=$build/bench/ferry-curl-bench
server=$build/tests/http_server
[ -x "$bench" ] && [ -x "$server" ] || { echo "run-curl: no $bench or $server" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-curl.XXXXXX")
spid=
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
gobin=""
if command -v go >/dev/null; then
    (cd "$here/curl_go" && GO111MODULE=off GOCACHE=$tmp/gocache go build -o "$tmp/curl_go" main.go) &&
        gobin=$tmp/curl_go
else
    echo "run-curl: no go: the go row is left out" >&2
fi
"$server" >"$tmp/port" &
spid=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
url="http://127.0.0.1:$(cat "$tmp/port")/hello"
echo "uptime: $(uptime)"
results=$tmp/results.txt
{
    echo "# commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), Release build, $(nproc) cpus, $reqs GETs of /hello, $conc concurrent, $runs runs each"
    echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$results"
for i in $(seq "$runs"); do
    "$bench" ferry "$url" "$reqs" "$conc" | tee -a "$tmp/ferry"
    "$bench" threads "$url" "$reqs" "$conc" | tee -a "$tmp/threads"
    [ -n "$gobin" ] && "$gobin" "$url" "$reqs" "$conc" | tee -a "$tmp/go"
done
echo "uptime: $(uptime)"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$results"
# The contract's BENCH lines (bench/README.md), for bench/parts.py curl.
for sys in ferry threads go; do
    [ -s "$tmp/$sys" ] || continue
    awk -v s="$sys" '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        printf "BENCH workload=http_get system=%s ops_per_s=%s p99_us=%s errors=%s check=%s\n",
               s, f["rps"], f["p99_us"], f["errors"], f["errors"] == 0 ? "ok" : "failed"
    }' "$tmp/$sys" >>"$results"
done
if [ -n "$write" ]; then
    cp "$results" "$here/curl_results.txt"
    python3 "$here/parts.py" curl --into "$here/README.md" "$here/curl_results.txt" &&
        echo "run-curl: wrote bench/curl_results.txt and the table into $here/README.md"
fi
echo "== medians of $runs runs: $reqs GETs, $conc concurrent"
for sys in ferry threads go; do
    [ -s "$tmp/$sys" ] || continue
    rps=$(grep -o 'rps=[0-9]*' "$tmp/$sys" | cut -d= -f2 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    p99=$(grep -o 'p99_us=[0-9]*' "$tmp/$sys" | cut -d= -f2 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    err=$(grep -o 'errors=[0-9]*' "$tmp/$sys" | cut -d= -f2 | awk '{s+=$1} END {print s}')
    printf '%-8s %8s req/s   p99 %6s us   errors %s\n' "$sys" "$rps" "$p99" "$err"
done
