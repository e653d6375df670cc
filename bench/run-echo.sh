#!/usr/bin/env bash
# Run the network workloads (tcp_echo, tcp_bulk) N times, interleaved, for
# ferry's echo servers and the peers' (anchors/run-all.sh with
# ANCHORS_NET=only), then print the medians of every system and ferry's
# ratios to the peers of the same runs.
#
#   bench/run-echo.sh                       # 5 runs: ferry, libuv, limit
#   bench/run-echo.sh -n 3 libuv limit libevent
#   FERRY_VARIANTS="ferry ferry-libevent ferry-bev" bench/run-echo.sh
#
# Options (or environment):
#   -n N     runs (RUNS, default 5)
#   -a DIR   the anchors directory (ANCHORS, default ../shared/anchors from
#            the repository root)
#   -b FILE  the ferry-bench binary (FERRY_BENCH, default
#            build-rel/bench/ferry-bench)
#   -o DIR   where the raw BENCH lines go (OUT, default a new directory
#            under ${TMPDIR:-/tmp})
# FERRY_VARIANTS: ferry (streams), ferry-libevent (streams registered
# through libevent: FERRY_BENCH_IO=libevent), ferry-bev (tasks over
# bufferevents: --echo-server-bev); default "ferry".
# Remaining arguments are the peer systems (default: libuv limit).
#
# stdout: the table (markdown).  stderr: progress, the load average of each
# run.  Exit status: 0, or 1 if a run failed or printed check=FAIL.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
RUNS=${RUNS:-5}
ANCHORS=${ANCHORS:-$root/../shared/anchors}
FERRY_BENCH=${FERRY_BENCH:-$root/build-rel/bench/ferry-bench}
FERRY_VARIANTS=${FERRY_VARIANTS:-ferry}
OUT=${OUT:-}

while getopts "n:a:b:o:h" opt; do
    case $opt in
        n) RUNS=$OPTARG ;;
        a) ANCHORS=$OPTARG ;;
        b) FERRY_BENCH=$OPTARG ;;
        o) OUT=$OPTARG ;;
        *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
peers=${*:-libuv limit}
FERRY_BENCH=$(cd "$(dirname "$FERRY_BENCH")" && pwd)/$(basename "$FERRY_BENCH")
[ -x "$FERRY_BENCH" ] || { echo "run-echo: no $FERRY_BENCH (build it in Release)" >&2; exit 2; }
[ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/ferry-echo.XXXXXX")
mkdir -p "$OUT"
status=0

for i in $(seq 1 "$RUNS"); do
    f=$OUT/run$i.txt
    : > "$f"
    for v in $FERRY_VARIANTS; do
        case $v in
            ferry) cmd="$FERRY_BENCH --echo-server {PORT}" ;;
            ferry-libevent) cmd="env FERRY_BENCH_IO=libevent $FERRY_BENCH --echo-server {PORT}" ;;
            ferry-bev) cmd="$FERRY_BENCH --echo-server-bev {PORT}" ;;
            *) echo "run-echo: unknown variant $v" >&2; exit 2 ;;
        esac
        echo "run-echo: run $i, $v (loadavg $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        "$ANCHORS/echo-pair.sh" "$cmd" "$v" >> "$f" || status=1
    done
    echo "run-echo: run $i, peers $peers (loadavg $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    # shellcheck disable=SC2086
    ANCHORS_NET=only "$ANCHORS/run-all.sh" $peers >> "$f" || status=1
done
grep -q 'check=FAIL' "$OUT"/run*.txt && status=1

python3 - "$OUT" <<'EOF'
import glob, statistics, sys
from collections import defaultdict
vals = defaultdict(lambda: defaultdict(list))
for path in sorted(glob.glob(sys.argv[1] + "/run*.txt")):
    for line in open(path):
        if not line.startswith("BENCH "):
            continue
        kv = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)
        for k in ("ops_per_s", "p50_us", "p99_us", "mb_per_s", "srv_cpu_ns_per_op"):
            if k in kv:
                vals[(kv["workload"], kv["system"])][k].append(float(kv[k]))
med = {key: {k: statistics.median(v) for k, v in d.items()} for key, d in vals.items()}
print(f"runs in {sys.argv[1]}\n")
print("| workload | system | runs | median ops/s | min..max | p50 us | p99 us | MB/s | srv cpu ns/op |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (w, s), d in sorted(vals.items()):
    m = med[(w, s)]
    ops = d["ops_per_s"]
    print(f"| {w} | {s} | {len(ops)} | {m['ops_per_s']:,.0f} | {min(ops):,.0f}..{max(ops):,.0f} | "
          f"{m.get('p50_us', float('nan')):.0f} | {m.get('p99_us', float('nan')):.0f} | "
          f"{m.get('mb_per_s', float('nan')):.0f} | {m.get('srv_cpu_ns_per_op', float('nan')):.2f} |")
print()
for w in sorted({w for w, _ in med}):
    systems = [s for x, s in med if x == w]
    for f in [s for s in systems if s.startswith("ferry")]:
        for p in [s for s in systems if not s.startswith("ferry")]:
            r = med[(w, f)]["ops_per_s"] / med[(w, p)]["ops_per_s"]
            extra = ""
            if "p99_us" in med[(w, f)] and "p99_us" in med[(w, p)]:
                extra = f", p99 {med[(w, f)]['p99_us']:.0f} vs {med[(w, p)]['p99_us']:.0f} us"
            print(f"{w}: {f} / {p} = {r:.2f}{extra}")
EOF
exit $status
