#!/usr/bin/env bash
# bench/run-rpc.sh - a loop per core, in one command: in the same runs,
#   tcp_rpc   tcp_echo with a CPU cost per request (--work K, the anchors'
#             function): ferry on 1 and 2 loops (ferry-bench --echo-server
#             PORT --loops N --work K), the epoll floor (echo_epoll
#             --threads 1 and 2) and Go with GOMAXPROCS=2 (if go is here);
#   tcp_echo  ferry on 1 and 2 loops, no work (round trips/s and p99);
#   spread    64 long-lived connections over 8 loops, balanced against
#             SO_REUSEPORT (ferry-bench spread_balanced, spread_reuseport);
# RUNS runs of each, interleaved, then the medians.
#
#   ANCHORS=DIR bench/run-rpc.sh            # 5 runs, K = 20000
#   bench/run-rpc.sh -a DIR -n 3 -k 8000 -N 30000
#   bench/run-rpc.sh -a DIR -o OUT -w       # keep the lines in OUT, and
#                                           # write bench/README.md's table
#                                           # (bench/parts.py rpc --into)
#
#   -a DIR   the peer programs (anchors) directory: echo-pair.sh, c/, go/
#            (required; copied to build-bench/anchors when read-only)
#   -n RUNS  runs of every row (5)
#   -k K     rounds of work per request (20000)
#   -N N     round trips per tcp_rpc run (50000; tcp_echo runs 200000)
#   -b DIR   a build directory holding bench/ferry-bench (default: a
#            Release build in build-bench/, made here)
#   -o DIR   where the BENCH lines go (default: a new directory in /tmp)
#   -w       replace the table of bench/README.md's part 4 with this run's
#            (the committed lines are bench/rpc_results.txt: copy OUT's there)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
runs=5 work=20000 nrpc=50000 build="" out="" write=""
ANCHORS=${ANCHORS:-}
while getopts "a:n:k:N:b:o:wh" opt; do
    case $opt in
        a) ANCHORS=$OPTARG ;;
        n) runs=$OPTARG ;;
        k) work=$OPTARG ;;
        N) nrpc=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        w) write=1 ;;
        *) sed -n '2,27p' "$0"; exit 2 ;;
    esac
done
log() { printf 'run-rpc: %s\n' "$*" >&2; }
if [ -z "$ANCHORS" ] || [ ! -x "$ANCHORS/echo-pair.sh" ]; then
    log "the anchors' directory is required (-a DIR or ANCHORS=DIR, with echo-pair.sh)"; exit 2
fi
ANCHORS=$(cd "$ANCHORS" && pwd)
if [ ! -w "$ANCHORS" ]; then
    copy=$root/build-bench/anchors
    log "$ANCHORS is read-only: copying it to $copy"
    mkdir -p "$copy" && cp -R "$ANCHORS"/. "$copy"/ && chmod -R u+w "$copy"
    ANCHORS=$copy
fi
if [ -z "$build" ]; then
    build=$root/build-bench
    log "building ferry-bench (Release) in $build"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFERRY_TESTS=OFF >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-bench >/dev/null
fi
bench=$(cd "$build" && pwd)/bench/ferry-bench
[ -x "$bench" ] || { log "no $bench"; exit 2; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/ferry-rpc.XXXXXX")}
mkdir -p "$out"
results=$out/results.txt
: >"$results"

# The peers, built as the anchors' run-all.sh builds them.
abuild=$ANCHORS/.build
mkdir -p "$abuild"
gcc -O2 -g -Wall -Wextra -pthread -o "$abuild/echo_epoll" "$ANCHORS/c/echo_epoll.c"
gobin=""
if command -v go >/dev/null 2>&1; then
    if (cd "$ANCHORS/go" && env GO111MODULE=on GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOWORK=off \
            GOCACHE="$abuild/gocache" GOPATH="$abuild/gopath" go build -o "$abuild/echo_go" ./echo); then
        gobin=$abuild/echo_go
    else
        log "the Go echo server did not build: Go's row left out"
    fi
else
    log "no go: Go's row left out (golang-go)"
fi

# pair WORKLOAD SYSTEM N 'COMMAND {PORT}': one client run, its line renamed
# to WORKLOAD (the client knows only tcp_echo).
pair() {
    local w=$1 sys=$2 n=$3 cmd=$4
    (cd "$out" && ECHO_WORKLOADS=tcp_echo "$ANCHORS/echo-pair.sh" "$cmd" "$sys" --n "$n") 2>>"$out/pairs.err" |
        grep '^BENCH' | sed "s/workload=tcp_echo/workload=$w/" >>"$results" ||
        log "$w $sys failed: see $out/pairs.err"
}

{
    echo "# commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "?"), Release build, $(nproc) cpus, $(uname -r), work $work"
    [ -n "$gobin" ] && echo "# go: $(go version)"
} >>"$results"
for ((r = 1; r <= runs; r++)); do
    echo "# run $r: load average $(cut -d' ' -f1-3 /proc/loadavg)" >>"$results"
    log "run $r of $runs (load $(cut -d' ' -f1 /proc/loadavg))"
    pair tcp_rpc ferry-1loop "$nrpc" "$bench --echo-server {PORT} --loops 1 --work $work"
    pair tcp_rpc ferry-2loops "$nrpc" "$bench --echo-server {PORT} --loops 2 --work $work"
    pair tcp_rpc epoll-1t "$nrpc" "$abuild/echo_epoll --port {PORT} --threads 1 --work $work"
    pair tcp_rpc epoll-2t "$nrpc" "$abuild/echo_epoll --port {PORT} --threads 2 --work $work"
    [ -n "$gobin" ] && pair tcp_rpc go-2p "$nrpc" "env GOMAXPROCS=2 $gobin -port {PORT} -work $work"
    pair tcp_echo ferry-1loop 200000 "$bench --echo-server {PORT} --loops 1"
    pair tcp_echo ferry-2loops 200000 "$bench --echo-server {PORT} --loops 2"
    "$bench" spread_balanced spread_reuseport | grep '^BENCH' >>"$results"
done

echo "BENCH lines: $results"
python3 - "$results" "$work" "$runs" <<'EOF'
import re, statistics, sys
path, work, runs = sys.argv[1], sys.argv[2], sys.argv[3]
rows, loads = {}, []
for line in open(path):
    if line.startswith("# run"):
        loads.append(line.split("load average ")[1].split()[0])
    if not line.startswith("BENCH "):
        continue
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    if f.get("check") != "ok":
        print("FAILED:", line.strip())
        continue
    rows.setdefault((f["workload"], f["system"]), []).append(f)
med = lambda fs, k: statistics.median(float(x[k]) for x in fs if k in x) if any(k in x for x in fs) else float("nan")
def rate(w, s):
    return med(rows.get((w, s), []), "ops_per_s")
out = ["| workload | system | runs | round trips/s | p99 us | server CPU ns/op |",
       "| --- | --- | --- | --- | --- | --- |"]
for (w, s), fs in sorted(rows.items()):
    if w.startswith("spread"):
        continue
    out.append("| %s | %s | %d | %.0f | %.0f | %.0f |" % (w, s, len(fs), med(fs, "ops_per_s"),
               med(fs, "p99_us"), med(fs, "srv_cpu_ns_per_op")))
ratios = []
f1, f2 = rate("tcp_rpc", "ferry-1loop"), rate("tcp_rpc", "ferry-2loops")
e2, g2 = rate("tcp_rpc", "epoll-2t"), rate("tcp_rpc", "go-2p")
ratios.append("tcp_rpc (K=%s): ferry 2 loops / 1 loop %.2fx (goal 1.7x), / epoll 2 threads %.2fx "
              "(goal 0.95x), / Go GOMAXPROCS=2 %s (goal 1.1x)" % (
              work, f2 / f1, f2 / e2, ("%.2fx" % (f2 / g2)) if g2 == g2 else "n/a"))
t1, t2 = rate("tcp_echo", "ferry-1loop"), rate("tcp_echo", "ferry-2loops")
ratios.append("tcp_echo: ferry 2 loops / 1 loop %.2fx; p99 %.0f us vs %.0f us" % (
              t2 / t1, med(rows.get(("tcp_echo", "ferry-2loops"), []), "p99_us"),
              med(rows.get(("tcp_echo", "ferry-1loop"), []), "p99_us")))
for w in ("spread_balanced", "spread_reuseport"):
    fs = rows.get((w, "ferry"), [])
    if fs:
        ratios.append("%s: 64 connections on 8 loops, max/min per loop %s (each run)" % (
            w, ", ".join("%s/%s" % (x["max_per_loop"], x["min_per_loop"]) for x in fs)))
text = "\n".join(out) + "\n\n" + "\n".join("- " + r for r in ratios) + \
       "\n- load average at each run's start: " + ", ".join(loads) + "\n"
print(text)
EOF
if [ -n "$write" ]; then
    python3 "$here/parts.py" rpc --into "$here/README.md" "$results" &&
        echo "run-rpc: wrote the table into $here/README.md"
fi
