#!/usr/bin/env bash
# bench/run-sim.sh - the simulated network's round trip against loopback
# TCP: RUNS runs of ferry-sim-bench (ROUND_TRIPS one-byte round trips each
# way), its lines turned into the contract's BENCH lines, then the table of
# bench/README.md's part 7 (bench/parts.py sim).
#
#   bench/run-sim.sh                 # 5 runs of 200,000 round trips
#   bench/run-sim.sh -n 3 -N 50000 -b DIR
#   bench/run-sim.sh -w              # keep the lines in bench/sim_results.txt
#                                    # and write bench/README.md's table
#
# Without -b, the Release build in build-bench/ (made here if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
runs=5 n=200000 build="" write=""
while getopts "n:N:b:wh" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        N) n=$OPTARG ;;
        b) build=$OPTARG ;;
        w) write=1 ;;
        *) sed -n '2,12p' "$0"; exit 2 ;;
    esac
done
if [ -z "$build" ]; then
    build=$root/build-bench
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-sim-bench >/dev/null
fi
bench=$build/bench/ferry-sim-bench
[ -x "$bench" ] || { echo "run-sim: no $bench" >&2; exit 2; }
results=$(mktemp "${TMPDIR:-/tmp}/ferry-sim.XXXXXX")
trap 'rm -f "$results"' EXIT
{
    echo "# commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cpus, $n round trips a run, $runs runs"
    echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$results"
for _ in $(seq "$runs"); do
    # ferry-sim-bench prints "BENCH <what> round_trips=N ns_per_round_trip=X status=S".
    "$bench" "$n" | awk '$1 == "BENCH" {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        sys = $2 == "sim_round_trip" ? "simulated" : $2 == "tcp_loopback_round_trip" ? "loopback-tcp" : $2
        printf "BENCH workload=round_trip system=%s ns_per_op=%s check=%s\n",
               sys, f["ns_per_round_trip"], f["status"] == "0" ? "ok" : "failed"
    }' | tee -a "$results"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$results"
python3 "$here/parts.py" sim "$results"
if [ -n "$write" ]; then
    cp "$results" "$here/sim_results.txt"
    python3 "$here/parts.py" sim --into "$here/README.md" "$here/sim_results.txt" &&
        echo "run-sim: wrote bench/sim_results.txt and the table into $here/README.md"
fi
