#!/usr/bin/env bash
# bench/run-xloop.sh - the cross-loop call's round trip, in one command:
# ferry-bench's xloop_* workloads (a runtime of two loops, a task on loop 0
# awaiting a no-op on loop 1 with ferry_runtime_call()), a hand-written
# eventfd ping-pong between two threads (ferry-xloop-pingpong), and Go's
# goroutine + reply channel with GOMAXPROCS=2 (bench/xloop_go, built here
# with `go` if it is installed: Debian's golang-go), interleaved, RUNS runs
# each; then the median ns per call of every workload and system.
#
#   bench/run-xloop.sh                 # 5 runs
#   bench/run-xloop.sh -n 3 -b DIR     # 3 runs, ferry-bench from the build DIR
#   bench/run-xloop.sh -o DIR          # keep the BENCH lines in DIR/results.txt
#   (bench/parts.py xloop makes the report's table of them)
#
# Without -b, the Release build in build-bench/ (made here if missing).
# FERRY_BENCH_PIN=1 pins ferry's two loops to the first two CPUs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
runs=5
build=""
out=""
while getopts "n:b:o:h" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) sed -n '2,16p' "$0"; exit 2 ;;
    esac
done
if [ -z "$build" ]; then
    build=$root/build-bench
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFERRY_TESTS=OFF >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-bench ferry-xloop-pingpong >/dev/null
fi
bench=$build/bench/ferry-bench
pingpong=$build/bench/ferry-xloop-pingpong
[ -x "$bench" ] && [ -x "$pingpong" ] || { echo "run-xloop: no $bench or $pingpong" >&2; exit 2; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/ferry-xloop.XXXXXX")}
mkdir -p "$out"
results=$out/results.txt
: >"$results"

gobin=""
if command -v go >/dev/null 2>&1; then
    gobin=$out/xloop-go
    (cd "$here/xloop_go" && GOCACHE=$out/.gocache GO111MODULE=off go build -o "$gobin" main.go)
else
    echo "run-xloop: no go: Go's row left out (apt-get install golang-go)" >&2
fi

workloads=(xloop_call xloop_call_cb xloop_call_batch xloop_call_batch_task)
{
    echo "# commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cpus, $(uname -r)"
    [ -n "$gobin" ] && echo "# $(go version)"
} >>"$results"
for ((r = 1; r <= runs; r++)); do
    echo "# run $r: load average $(cut -d' ' -f1 /proc/loadavg)" >>"$results"
    # One process per workload (ferry-bench runs itself for each name).
    "$bench" "${workloads[@]}" | grep '^BENCH' >>"$results"
    "$pingpong" | grep '^BENCH' >>"$results"
    if [ -n "$gobin" ]; then
        GOMAXPROCS=2 "$gobin" | grep '^BENCH' >>"$results"
    fi
done

echo "BENCH lines: $results"
echo "the report's table (python3 bench/parts.py xloop --into bench/README.md $results):"
python3 "$here/parts.py" xloop "$results" || true
python3 - "$results" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("BENCH "):
        continue
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    if f.get("check") != "ok":
        print("FAILED:", line.strip())
        continue
    rows.setdefault((f["workload"], f["system"]), []).append(float(f["ns_per_op"]))
print("%-24s %-18s %6s %12s %s" % ("workload", "system", "runs", "median ns", "all"))
for (w, s), v in sorted(rows.items()):
    print("%-24s %-18s %6d %12.1f %s" % (w, s, len(v), statistics.median(v),
                                          " ".join("%.0f" % x for x in v)))
EOF
