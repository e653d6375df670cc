#!/usr/bin/env bash
# Run ferry-bench and the peer benchmarks ("anchors") N times, interleaved,
# then print the median table of every (workload, system) and ferry's ratio
# to each peer, with the targets of issues 2-4.
#
#   bench/run-compare.sh                    # 3 runs, every peer system
#   bench/run-compare.sh -n 5 libuv go-1p   # 5 runs, only these peers
#   RUNS=3 ANCHORS=/path/to/anchors bench/run-compare.sh
#   bench/run-compare.sh -r DIR             # only re-print the tables of DIR
#
# Options (or environment):
#   -n N     runs (RUNS, default 3)
#   -a DIR   the anchors directory (ANCHORS, default ../shared/anchors from
#            the repository root)
#   -b FILE  the ferry-bench binary (FERRY_BENCH, default
#            build-bench/bench/ferry-bench, built in Release if missing)
#   -o DIR   where the raw BENCH lines go (OUT, default a new directory
#            under ${TMPDIR:-/tmp})
#   -r DIR   do not run anything: print the tables of the runs in DIR
#   -w LIST  ferry workloads, space separated (FERRY_WORKLOADS, default all)
# Remaining arguments are peer systems passed to run-all.sh.
# ANCHORS_NO_INSTALL=1 is passed through to run-all.sh (never apt-get).
#
# stdout: the tables (markdown).  stderr: progress.  Exit status: 0, or 1 if
# a run failed or printed check=FAIL.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
RUNS=${RUNS:-3}
ANCHORS=${ANCHORS:-$root/../shared/anchors}
FERRY_BENCH=${FERRY_BENCH:-$root/build-bench/bench/ferry-bench}
FERRY_WORKLOADS=${FERRY_WORKLOADS:-}
OUT=${OUT:-}
REPORT_ONLY=""

while getopts "n:a:b:o:r:w:h" opt; do
    case $opt in
        n) RUNS=$OPTARG ;;
        a) ANCHORS=$OPTARG ;;
        b) FERRY_BENCH=$OPTARG ;;
        o) OUT=$OPTARG ;;
        r) REPORT_ONLY=$OPTARG ;;
        w) FERRY_WORKLOADS=$OPTARG ;;
        h) sed -n '2,26p' "$0"; exit 0 ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
PEERS=("$@")

log() { printf 'run-compare: %s\n' "$*" >&2; }
status=0

if [ -n "$REPORT_ONLY" ]; then
    OUT=$REPORT_ONLY
else
    if [ ! -x "$ANCHORS/run-all.sh" ]; then
        log "no run-all.sh in '$ANCHORS' (use -a DIR or ANCHORS=DIR)"; exit 2
    fi
    if [ ! -x "$FERRY_BENCH" ]; then
        log "building ferry-bench (Release) in $root/build-bench"
        cmake -S "$root" -B "$root/build-bench" -DCMAKE_BUILD_TYPE=Release >&2 &&
            cmake --build "$root/build-bench" --target ferry-bench -j"$(nproc)" >&2 ||
            { log "build failed"; exit 2; }
    fi
    [ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/ferry-compare.XXXXXX")
    mkdir -p "$OUT"
    log "raw results in $OUT"
    for i in $(seq 1 "$RUNS"); do
        log "run $i/$RUNS: ferry-bench (loadavg $(cut -d' ' -f1-3 /proc/loadavg))"
        # shellcheck disable=SC2086
        "$FERRY_BENCH" $FERRY_WORKLOADS > "$OUT/ferry$i.txt" || status=1
        log "run $i/$RUNS: anchors ${PEERS[*]:-(all)}"
        "$ANCHORS/run-all.sh" "${PEERS[@]}" > "$OUT/anchors$i.txt" 2> "$OUT/anchors$i.err" || status=1
        grep -h 'check=FAIL' "$OUT/ferry$i.txt" "$OUT/anchors$i.txt" >&2 && status=1
    done
fi

shopt -s nullglob
files=("$OUT"/ferry*.txt "$OUT"/anchors*.txt)
if [ ${#files[@]} -eq 0 ]; then
    log "no results in $OUT"; exit 2
fi

echo "# ferry vs peers: medians of $(ls "$OUT"/ferry*.txt | wc -l) run(s)"
if [ -f "$ANCHORS/median.py" ]; then
    python3 "$ANCHORS/median.py" "${files[@]}"
fi

python3 - "${files[@]}" <<'EOF'
"""Ratio of ferry's median to each peer's median, and the targets."""
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)          # (workload, system) -> [fields]
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            if line.startswith("BENCH "):
                kv = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)
                runs[(kv["workload"], kv["system"])].append(kv)

def med(w, s, key="ns_per_op"):
    vals = [float(r[key]) for r in runs.get((w, s), []) if key in r]
    return statistics.median(vals) if vals else None

# workload -> list of (peer, max ratio, metric); peer None: absolute ns.
TARGETS = {
    "switch":             [(None, 20.0, "ns_per_op")],
    "spawn":              [("go-1p", 0.3, "ns_per_op")],
    "idle_tasks":         [("go", 1.6, "bytes_per_task")],
    "lock_contention":    [("go-1p", 0.2, "ns_per_op")],
    "queue_pipeline":     [("go-1p", 0.5, "ns_per_op")],
    "stampede":           [("go", 1.0, "ns_per_op")],
    "threadsafe_post":    [("libuv", 0.5, "ns_per_op"), ("libevent-eventfd", 0.7, "ns_per_op")],
    "offload_rtt":        [("libuv", 0.7, "ns_per_op")],
    "offload_throughput": [("libuv", 0.7, "ns_per_op")],
}

def fmt(x):
    return "-" if x is None else (f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}")

workloads = sorted({w for w, s in runs if s == "ferry"},
                   key=lambda w: (list(TARGETS).index(w) if w in TARGETS else 99, w))

print("\n## ferry / peer (median ns per op; idle_tasks also bytes per task)\n")
print("| workload | ferry | peer | peer median | ferry/peer |")
print("| --- | ---: | --- | ---: | ---: |")
for w in workloads:
    f = med(w, "ferry")
    peers = sorted({s for ww, s in runs if ww == w and s != "ferry"},
                   key=lambda s: med(w, s) or 0)
    for s in peers:
        p = med(w, s)
        print(f"| {w} | {fmt(f)} | {s} | {fmt(p)} | {fmt(f / p) if f and p else '-'} |")
    if w == "idle_tasks":
        fb = med(w, "ferry", "bytes_per_task")
        for s in peers:
            pb = med(w, s, "bytes_per_task")
            if pb:
                print(f"| {w} (bytes/task) | {fmt(fb)} | {s} | {fmt(pb)} | {fmt(fb / pb) if fb else '-'} |")

print("\n## targets\n")
print("| workload | target | ferry | reference | ratio | met |")
print("| --- | --- | ---: | ---: | ---: | --- |")
for w, goals in TARGETS.items():
    for peer, limit, key in goals:
        f = med(w, "ferry", key)
        if peer is None:
            ok = f is not None and f <= limit
            print(f"| {w} | <= {limit:g} ns | {fmt(f)} | - | - | {'yes' if ok else 'NO' if f else '?'} |")
            continue
        p = med(w, peer, key)
        r = f / p if f is not None and p else None
        ok = r is not None and (r < limit if limit == 1.0 else r <= limit)
        rel = "<" if limit == 1.0 else "<="
        print(f"| {w} | {rel} {limit:g}x {peer} ({key}) | {fmt(f)} | {fmt(p)} | "
              f"{fmt(r)} | {'yes' if ok else ('NO' if r is not None else '?')} |")
if any(s.startswith("limit") for _, s in runs):
    print("\nCross-thread numbers are bimodal on this VM: read offload_* and "
          "threadsafe_post next to the limit xthread_pingpong_* probes above.")
EOF
exit $status
