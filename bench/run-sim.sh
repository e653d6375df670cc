#!/usr/bin/env bash
# bench/run-sim.sh - the simulated network's round trip against loopback
# TCP: RUNS runs of ferry-sim-bench (ROUND_TRIPS one-byte round trips each
# way), its lines turned into the contract's BENCH lines; then SEEDS seeds
# of examples/replicated_kv (the fixed service, a whole scenario a seed)
# under bin/ferry-fuzz, one job at a time and two, as seeds a second; then
# the tables of bench/README.md's part 7 (bench/parts.py sim).
#
#   bench/run-sim.sh                 # 5 runs of 200,000 round trips, 1,000 seeds
#   bench/run-sim.sh -n 3 -N 50000 -S 200 -b DIR
#   bench/run-sim.sh -S 0            # no seeds
#   bench/run-sim.sh -w              # keep the lines in bench/sim_results.txt
#                                    # and write bench/README.md's table
#
# Without -b, the Release build in build-bench/ (made here if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
runs=5 n=200000 seeds=1000 build="" write=""
while getopts "n:N:S:b:wh" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        N) n=$OPTARG ;;
        S) seeds=$OPTARG ;;
        b) build=$OPTARG ;;
        w) write=1 ;;
        *) sed -n '2,15p' "$0"; exit 2 ;;
    esac
done
if [ -z "$build" ]; then
    build=$root/build-bench
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-sim-bench ex_replicated_kv >/dev/null
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
kv=$build/examples/replicated_kv
if [ "$seeds" -gt 0 ]; then
    [ -x "$kv" ] || { echo "run-sim: no $kv" >&2; exit 2; }
    echo "# seeds: $seeds seeds of replicated_kv (20 s of simulated time each) a run" >>"$results"
    for jobs in 1 2; do
        # ferry-fuzz ends with "ferry-fuzz: N seeds passed (...) in T s, R seeds a second".
        python3 "$root/bin/ferry-fuzz" -q -n "$seeds" -j "$jobs" -- "$kv" | awk -v j="$jobs" -v n="$seeds" '
            /seeds passed/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "seeds" && $(i + 2) == "a") r = $i }
            END { printf "BENCH workload=replicated_kv_seeds system=jobs-%s seeds_per_s=%s check=%s\n",
                         j, r == "" ? 0 : r, r == "" ? "failed" : "ok" }' | tee -a "$results"
    done
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$results"
python3 "$here/parts.py" sim "$results"
if [ -n "$write" ]; then
    cp "$results" "$here/sim_results.txt"
    python3 "$here/parts.py" sim --into "$here/README.md" "$here/sim_results.txt" &&
        echo "run-sim: wrote bench/sim_results.txt and the table into $here/README.md"
fi
