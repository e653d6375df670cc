#!/usr/bin/env bash
# bench/run-compare.sh - run ferry-bench and the peer benchmark programs
# N times, interleaved, collect every BENCH line in one file (the input of
# bench/chart.py) and print the median table.
#
#   ANCHORS=DIR bench/run-compare.sh                   # 3 runs, every peer
#   bench/run-compare.sh -a DIR -n 5 libuv go-1p       # 5 runs, only these peers
#   bench/run-compare.sh -a DIR -e -s bench/results.txt -c bench/results.svg \
#       -t bench/README.md             # refresh the committed report
#   bench/run-compare.sh -a DIR -E -n 5 -V "ferry ferry-bev" libuv limit
#                                      # network only, two ferry servers
#   bench/run-compare.sh -r DIR -c chart.svg   # run nothing: report on DIR
#
# Options (or environment):
#   -a DIR   the peer programs' directory (ANCHORS; required unless -r): it
#            holds run-all.sh, echo-pair.sh and median.py.  If it is not
#            writable it is copied to build-bench/anchors, since run-all.sh
#            builds inside it
#   -n N     runs (RUNS, default 3)
#   -b FILE  the ferry-bench binary (FERRY_BENCH); by default
#            build-bench/bench/ferry-bench, configured as Release and brought
#            up to date first
#   -o DIR   where the lines go (OUT, default a new directory under
#            ${TMPDIR:-/tmp}): ferryI.txt and anchorsI.txt per run, run-all's
#            stderr in anchorsI.err, everything with notes in results.txt
#   -r DIR   run nothing: report on the results.txt of DIR
#   -w LIST  ferry workloads, space separated (FERRY_WORKLOADS, default all)
#   -s FILE  copy results.txt to FILE as well
#   -c FILE  draw the chart of results.txt into FILE (SVG, bench/chart.py)
#   -t FILE  write the table into the markdown FILE, between chart.py's
#            marker lines (bench/README.md holds them)
#   -e       the network workloads too (tcp_echo, tcp_bulk): ferry's echo
#            server and the peers', each under the shared client
#            (echo-pair.sh), in the same runs
#   -E       the network workloads only (implies -e)
#   -V LIST  ferry's echo servers to measure with -e/-E (FERRY_VARIANTS,
#            default "ferry"): ferry (streams), ferry-libevent (streams whose
#            descriptors are registered through libevent,
#            FERRY_BENCH_IO=libevent), ferry-bev (tasks over libevent
#            bufferevents, --echo-server-bev)
#   -q LOAD  before each program, wait until the 1-minute load average is at
#            most LOAD (QUIET; checked every 10 s, for at most 15 minutes,
#            then it runs anyway): on a shared machine, measure when it is quiet
# Remaining arguments are peer systems for run-all.sh (default: all).
# ANCHORS_NO_INSTALL=1 is passed through to run-all.sh (never apt-get).
#
# Odd runs start with ferry, even runs with the peers, so a load that rises
# or falls during the session does not favour one side.  The 1-minute load
# average at the start of every program is in results.txt.
#
# stdout: the tables (markdown).  stderr: progress.  Exit status: 0, 1 if a
# run failed or printed check=FAIL, 2 on bad usage or a failed build.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
RUNS=${RUNS:-3}
ANCHORS=${ANCHORS:-}
FERRY_VARIANTS=${FERRY_VARIANTS:-ferry}
FERRY_BENCH=${FERRY_BENCH:-}
FERRY_WORKLOADS=${FERRY_WORKLOADS:-}
OUT=${OUT:-}
QUIET=${QUIET:-}
REPORT_ONLY="" SAVE="" CHART="" TABLE="" NET=0 LOCAL=1

while getopts "n:a:b:o:r:w:s:c:t:eEV:q:h" opt; do
    case $opt in
        n) RUNS=$OPTARG ;;
        a) ANCHORS=$OPTARG ;;
        b) FERRY_BENCH=$OPTARG ;;
        o) OUT=$OPTARG ;;
        r) REPORT_ONLY=$OPTARG ;;
        w) FERRY_WORKLOADS=$OPTARG ;;
        s) SAVE=$OPTARG ;;
        c) CHART=$OPTARG ;;
        t) TABLE=$OPTARG ;;
        e) NET=1 ;;
        E) NET=1 LOCAL=0 ;;
        V) FERRY_VARIANTS=$OPTARG ;;
        q) QUIET=$OPTARG ;;
        h) sed -n '2,52p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run-compare: -h lists the options" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
PEERS=("$@")
case $RUNS in ''|*[!0-9]*|0) echo "run-compare: -n needs a positive number" >&2; exit 2 ;; esac
for v in $FERRY_VARIANTS; do
    case $v in ferry|ferry-libevent|ferry-bev) ;;
        *) echo "run-compare: -V: unknown ferry echo server '$v' (ferry, ferry-libevent, ferry-bev)" >&2
           exit 2 ;;
    esac
done
if [ -n "$QUIET" ] && ! awk -v q="$QUIET" 'BEGIN { exit !(q + 0 > 0) }'; then
    echo "run-compare: -q needs a positive load average" >&2; exit 2
fi

log() { printf 'run-compare: %s\n' "$*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
# wait_quiet: with -q LOAD, wait until the 1-minute load average is at most
# LOAD, for at most 15 minutes.
wait_quiet() {
    [ -n "$QUIET" ] || return 0
    local waited=0
    while awk -v l="$(load1)" -v q="$QUIET" 'BEGIN { exit !(l > q) }'; do
        if [ $waited -ge 900 ]; then log "load still $(load1) after 15 minutes: running"; return 0; fi
        [ $waited -gt 0 ] || log "waiting for the load average ($(load1)) to fall to $QUIET"
        sleep 10; waited=$((waited + 10))
    done
}
status=0

if [ -n "$REPORT_ONLY" ]; then
    OUT=$REPORT_ONLY
    if [ ! -f "$OUT/results.txt" ]; then log "no results.txt in $OUT"; exit 2; fi
else
    if [ -z "$ANCHORS" ]; then
        log "usage: the peer programs' directory is required: -a DIR or ANCHORS=DIR" \
            "(the directory of run-all.sh; -h lists the options)"
        exit 2
    fi
    if [ ! -x "$ANCHORS/run-all.sh" ] || [ ! -x "$ANCHORS/echo-pair.sh" ]; then
        log "usage: no run-all.sh and echo-pair.sh in '$ANCHORS' (-a DIR or ANCHORS=DIR)"; exit 2
    fi
    ANCHORS=$(cd "$ANCHORS" && pwd)
    if [ ! -w "$ANCHORS" ]; then
        copy=$root/build-bench/anchors
        log "$ANCHORS is read-only: copying it to $copy"
        mkdir -p "$copy" && cp -R "$ANCHORS"/. "$copy"/ && chmod -R u+w "$copy" ||
            { log "copy failed"; exit 2; }
        ANCHORS=$copy
    fi
    if [ -z "$FERRY_BENCH" ]; then
        FERRY_BENCH=$root/build-bench/bench/ferry-bench
        log "building ferry-bench (Release) in $root/build-bench"
        { cmake -S "$root" -B "$root/build-bench" -DCMAKE_BUILD_TYPE=Release -DFERRY_BENCH=ON &&
            cmake --build "$root/build-bench" --target ferry-bench -j"$(nproc)"; } > /dev/null ||
            { log "build failed (run the two cmake commands above to see why)"; exit 2; }
        # The commit that last changed what ferry-bench is built from, which
        # may be older than a checkout whose newer commits touch only scripts.
        code=(base src bridge wire include cmake CMakeLists.txt bench/ferry_bench.c bench/CMakeLists.txt)
        head=$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
        commit=$(git -C "$root" log -1 --first-parent --format=%h --abbrev=7 -- "${code[@]}" \
            2>/dev/null || echo unknown)
        [ "$commit" = "$head" ] || commit="$commit (checked out: $head)"
        if [ -n "$(git -C "$root" status --porcelain -- "${code[@]}" 2>/dev/null)" ]; then
            commit="$commit with uncommitted changes"
        fi
        ferry_note="ferry: library and ferry-bench of commit $commit, Release build"
    else
        ferry_note="ferry: $FERRY_BENCH (given with -b)"
    fi
    if [ ! -x "$FERRY_BENCH" ]; then log "no ferry-bench at '$FERRY_BENCH'"; exit 2; fi
    FERRY_BENCH=$(cd "$(dirname "$FERRY_BENCH")" && pwd)/$(basename "$FERRY_BENCH")
    [ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/ferry-compare.XXXXXX")
    mkdir -p "$OUT" || exit 2
    log "raw results in $OUT"

    # echo_cmd VARIANT: the server command echo-pair.sh starts.
    echo_cmd() {
        case $1 in
            ferry) echo "$FERRY_BENCH --echo-server {PORT}" ;;
            ferry-libevent) echo "env FERRY_BENCH_IO=libevent $FERRY_BENCH --echo-server {PORT}" ;;
            ferry-bev) echo "$FERRY_BENCH --echo-server-bev {PORT}" ;;
        esac
    }
    run_ferry() { # RUN-INDEX
        local f=$OUT/ferry$1.txt v
        : > "$f"
        : > "$OUT/ferry$1.load"
        if [ "$LOCAL" = 1 ]; then
            wait_quiet
            echo "ferry-bench $(load1)" >> "$OUT/ferry$1.load"
            # shellcheck disable=SC2086
            "$FERRY_BENCH" $FERRY_WORKLOADS >> "$f" || status=1
        fi
        if [ "$NET" = 1 ]; then
            for v in $FERRY_VARIANTS; do
                wait_quiet
                echo "$v-echo $(load1)" >> "$OUT/ferry$1.load"
                "$ANCHORS/echo-pair.sh" "$(echo_cmd "$v")" "$v" >> "$f" 2>> "$OUT/ferry$1.err" ||
                    { status=1; log "echo-pair.sh $v failed: see $OUT/ferry$1.err"; }
            done
        fi
    }
    run_peers() { # RUN-INDEX
        wait_quiet
        local net=$NET
        [ "$LOCAL" = 1 ] || net=only
        ANCHORS_NET=$net "$ANCHORS/run-all.sh" "${PEERS[@]}" > "$OUT/anchors$1.txt" \
            2> "$OUT/anchors$1.err" || { status=1; log "run-all.sh failed: see $OUT/anchors$1.err"; }
    }
    for i in $(seq 1 "$RUNS"); do
        if [ $((i % 2)) = 1 ]; then
            log "run $i/$RUNS: ferry (load $(load1))"; run_ferry "$i"
            log "run $i/$RUNS: peers ${PEERS[*]:-(all)} (load $(load1))"; run_peers "$i"
        else
            log "run $i/$RUNS: peers ${PEERS[*]:-(all)} (load $(load1))"; run_peers "$i"
            log "run $i/$RUNS: ferry (load $(load1))"; run_ferry "$i"
        fi
        grep -h 'check=FAIL' "$OUT/ferry$i.txt" "$OUT/anchors$i.txt" >&2 && status=1
    done

    # results.txt: notes ("# key: value"), then each run's lines.
    {
        echo "# $ferry_note"
        echo "# date: $(date -u +%Y-%m-%d)"
        err=$OUT/anchors1.err
        v() { sed -n "s/^run-all: $1/\\1/p" "$err" | head -n1; }
        echo "# host: $(v 'host: \(.*\)'), gcc $(v 'gcc: \(.*\)')"
        echo "# peers: libuv $(v 'libuv: \([^ ]*\).*'), libevent $(v 'libuv: .*libevent: \(.*\)')," \
            "$(v 'go version \(go[^ ]*\).*'), asyncio on $(v 'asyncio: \(Python [^ ]*\).*')," \
            "uvloop $(v 'debpy: .*uvloop \(.*\)') on Debian's $(v 'debpy: \(Python [^,]*\),.*')"
        for i in $(seq 1 "$RUNS"); do
            loads=$(sed -n 's/.*running .* (loadavg \([0-9.]*\) .*/\1/p' "$OUT/anchors$i.err" |
                sort -n | sed -n '1p;$p' | paste -sd'-' -)
            fl=$(awk '$1 == "ferry-bench" { printf "%s%s at ferry-bench'"'"'s start", sep, $2; sep = ", " }
                      $1 ~ /-echo$/ { sub(/-echo$/, "", $1)
                                      printf "%s%s at %s'"'"'s echo server", sep, $2, $1; sep = ", " }' \
                "$OUT/ferry$i.load")
            echo "# run $i: load average $fl, ${loads:-?} over the peers"
        done
        for i in $(seq 1 "$RUNS"); do
            cat "$OUT/ferry$i.txt" "$OUT/anchors$i.txt"
        done
    } > "$OUT/results.txt"
fi

echo "# ferry vs peers: $OUT/results.txt"
echo
python3 "$here/chart.py" --table "$OUT/results.txt" || status=1
if [ -n "$ANCHORS" ] && [ -f "$ANCHORS/median.py" ]; then
    echo
    echo "# details: every (workload, system), median.py"
    python3 "$ANCHORS/median.py" "$OUT/results.txt"
fi
if [ -n "$SAVE" ]; then
    if cp "$OUT/results.txt" "$SAVE"; then log "lines copied to $SAVE"; else status=1; fi
fi
if [ -n "$CHART" ]; then
    if python3 "$here/chart.py" -o "$CHART" "$OUT/results.txt"; then
        log "chart written to $CHART"
    else
        status=1
    fi
fi
if [ -n "$TABLE" ]; then
    if python3 "$here/chart.py" --table --into "$TABLE" "$OUT/results.txt"; then
        log "table written into $TABLE"
    else
        status=1
    fi
fi
exit $status
