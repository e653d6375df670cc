#!/usr/bin/env bash
# bench/run-uring.sh - the io_uring backend against the epoll one (issue 26),
# in one command.  Three servers, interleaved, RUNS runs each:
#   ferry-uring  ferry-bench --echo-server with FERRY_IO=uring
#   ferry-epoll  the same with FERRY_IO=epoll
#   echo_epoll   the anchors' hand-written epoll server (one thread)
# and for each, against one server process, with the anchors' shared client
# (echo_client --server-pid, so srv_cpu_ns_per_op is the server's CPU):
#   tcp_echo_1, tcp_echo_100, tcp_echo_300   tcp_echo over 1, 100 and 300
#                                            connections
#   tcp_bulk                                 256 MiB through one connection
# then, against a fresh server process,
#   idle_conns   CONNS connections opened, echoed once and held idle
#                (ferry-idle-conns): the server's RSS growth per connection.
# Each echo workload is run a second time, shorter, with the server's system
# calls counted (perf stat -e raw_syscalls:sys_enter -p PID); the count
# divided by the round trips (per MB for tcp_bulk) is added to the timed
# run's line as srv_syscalls_per_op (srv_syscalls_per_mb), so the counting
# does not slow the timed run.  The count includes the connections' setup.
# Every line of a ferry server gets backend= (what the server said at
# start: io_uring or epoll).  A ferry-uring server that fell back to epoll
# at run time measures nothing of io_uring: its lines are left out, with a
# note giving the reason; a build without the backend keeps them, noted.
# Then the medians, and the ratios of ferry-uring to the two others.
#
#   ANCHORS=DIR bench/run-uring.sh           # 5 runs
#   bench/run-uring.sh -a DIR -n 3           # a trial
#   bench/run-uring.sh -a DIR -o OUT -w      # keep the lines in OUT and
#                                            # write bench/README.md's table
#                                            # (bench/parts.py uring --into)
#
#   -a DIR   the peer programs (anchors) directory: c/echo_client.c and
#            c/echo_epoll.c are built from it into the build directory
#   -n RUNS  runs of every row (RUNS from the environment, or 5)
#   -C N     idle connections (10000); ulimit -n is raised for them
#   -b DIR   a build directory holding bench/ferry-bench and
#            bench/ferry-idle-conns (default: a Release build in
#            build-bench/, made here)
#   -o DIR   where the BENCH lines go (default: a new directory in /tmp)
#   -w       replace the table of bench/README.md's io_uring part with this
#            run's (the committed lines are bench/uring_results.txt: copy
#            OUT's there)
#
# In a build without the backend, FERRY_IO=uring serves with epoll and the two
# ferry rows measure the same code.  Needs perf for the system call counts
# (the column is left out without it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
runs=${RUNS:-5} conns_idle=10000 build="" out="" write=""
ANCHORS=${ANCHORS:-}
while getopts "a:n:C:b:o:wh" opt; do
    case $opt in
        a) ANCHORS=$OPTARG ;;
        n) runs=$OPTARG ;;
        C) conns_idle=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        w) write=1 ;;
        *) sed -n '2,46p' "$0"; exit 2 ;;
    esac
done
log() { printf 'run-uring: %s\n' "$*" >&2; }
if [ -z "$ANCHORS" ] || [ ! -f "$ANCHORS/c/echo_client.c" ] || [ ! -f "$ANCHORS/c/echo_epoll.c" ]; then
    log "the anchors' directory is required (-a DIR or ANCHORS=DIR, with c/echo_client.c)"; exit 2
fi
ANCHORS=$(cd "$ANCHORS" && pwd)
if [ -z "$build" ]; then
    build=$root/build-bench
    log "building ferry-bench and ferry-idle-conns (Release) in $build"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFERRY_TESTS=OFF >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-bench ferry-idle-conns >/dev/null
    cmake --build "$build" -j"${JOBS:-2}" --target ferry-uring-floor >/dev/null 2>&1 ||
        log "no ferry-uring-floor (a build without liburing): its rows left out"
fi
build=$(cd "$build" && pwd)
bench=$build/bench/ferry-bench idle=$build/bench/ferry-idle-conns
for p in "$bench" "$idle"; do [ -x "$p" ] || { log "no $p"; exit 2; }; done
# The anchors' programs, built beside ours: the anchors' directory may be
# read-only and stays untouched.
abuild=$build/anchors
mkdir -p "$abuild"
gcc -O2 -g -Wall -Wextra -o "$abuild/echo_client" "$ANCHORS/c/echo_client.c"
gcc -O2 -g -Wall -Wextra -pthread -o "$abuild/echo_epoll" "$ANCHORS/c/echo_epoll.c"
client=$abuild/echo_client

out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/ferry-uring.XXXXXX")}
mkdir -p "$out"
results=$out/results.txt pending=$out/pending.txt
: >"$results"
: >"$pending"

# The idle connections need a descriptor each, in the client and in the
# server (started from here, so it inherits the limit).
want=$((conns_idle + 64))
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$want" ]; then
    log "ulimit -n cannot reach $want (hard limit $(ulimit -Hn)): idle_conns left out"
    conns_idle=0
else
    ulimit -n "$want"
fi
perf_ok=""
if command -v perf >/dev/null 2>&1 && perf stat -e raw_syscalls:sys_enter -x, true >/dev/null 2>&1; then
    perf_ok=1
else
    log "perf cannot count raw_syscalls:sys_enter here: no system call counts"
fi

srv="" port="" starts=0 srvlog=""
stop_server() {
    [ -n "$srv" ] || return 0
    kill -TERM "$srv" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$srv" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    srv=""
}
trap stop_server EXIT

# start_server SYSTEM 'COMMAND {PORT}': start it on a free port and wait
# until it listens; sets srv and port.
start_server() {
    local sys=$1 tpl=$2 cmd
    for _ in 1 2 3; do
        port=$((20000 + RANDOM % 12000))
        ss -Htan "sport = :$port" | grep -q . && continue
        cmd=${tpl//\{PORT\}/$port}
        starts=$((starts + 1))
        srvlog=$out/server.$sys.$starts.log
        bash -c "exec $cmd" </dev/null >"$srvlog" 2>&1 &
        srv=$!
        for _ in $(seq 1 200); do
            kill -0 "$srv" 2>/dev/null || break
            ss -Hltn "sport = :$port" | grep -q . && return 0
            sleep 0.05
        done
        stop_server
    done
    log "$sys: the server did not start (see $srvlog)"
    return 1
}

# count_syscalls CLIENT-ARGS...: the server's system calls during one more
# client run; prints the count.
count_syscalls() {
    local pf=$out/perf.txt pid
    perf stat -x, -e raw_syscalls:sys_enter -p "$srv" -o "$pf" &
    pid=$!
    # perf attaches before the client has made its connections.
    sleep 0.2
    "$client" --port "$port" --server-pid "$srv" "$@" >/dev/null 2>>"$out/client.err" || true
    kill -INT "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    awk -F, '/raw_syscalls:sys_enter/ { print $1; exit }' "$pf"
}

# echo_run SYSTEM WORKLOAD CONNS N N-COUNT: the timed run (tcp_bulk: N
# bytes on one connection), its line renamed to WORKLOAD, and the count
# run's figure (N-COUNT round trips or bytes) added to it.
echo_run() {
    local sys=$1 w=$2 conns=$3 n=$4 ncount=$5 line calls extra="" args
    if [ "$w" = tcp_bulk ]; then
        args=(--workload tcp_bulk --bytes)
    else
        args=(--workload tcp_echo --conns "$conns" --n)
    fi
    line=$(timeout 120 "$client" --system "$sys" --port "$port" --server-pid "$srv" \
        "${args[@]}" "$n" 2>>"$out/client.err" | grep '^BENCH' || true)
    if [ -z "$line" ]; then
        log "$w $sys: no BENCH line (see $out/client.err)"
        return 0
    fi
    line=$(printf '%s\n' "$line" | sed -E "s/workload=[a-z_]+/workload=$w/")
    if [ -n "$perf_ok" ]; then
        calls=$(count_syscalls "${args[@]}" "$ncount")
        if [ -n "$calls" ] && [ "$w" = tcp_bulk ]; then
            extra=$(awk -v c="$calls" -v b="$ncount" 'BEGIN { printf " srv_syscalls_per_mb=%.1f", c / (b / 1e6) }')
        elif [ -n "$calls" ]; then
            extra=$(awk -v c="$calls" -v n="$ncount" 'BEGIN { printf " srv_syscalls_per_op=%.2f", c / n }')
        fi
    fi
    printf '%s%s\n' "$line" "$extra" >>"$pending"
}

# keep SYSTEM: stop the server and move its lines to the results, each
# with backend= as the server said it (ferry's servers).  A ferry-uring
# server that fell back to epoll does not measure io_uring: its lines are
# kept out of the results and a note says why.
keep() {
    local sys=$1 backend why
    stop_server
    backend=$(sed -n 's/^ferry-bench: io backend \([a-z_]*\).*/\1/p' "$srvlog" | head -n 1)
    why=$(sed -n 's/^ferry-bench: io backend .*, fallback: //p' "$srvlog" | head -n 1)
    if [ "$sys" = ferry-uring ] && [ "$why" = "built without io_uring" ]; then
        grep -q '^# ferry-uring: built without' "$results" ||
            echo "# ferry-uring: built without io_uring: its rows measure epoll" >>"$results"
        sed "s/\$/ backend=$backend/" "$pending" >>"$results"
    elif [ "$sys" = ferry-uring ] && [ "$backend" != io_uring ]; then
        log "ferry-uring served with ${backend:-an unknown backend}: ${why:-no reason given}; its lines left out"
        echo "# ferry-uring, run $r: served with ${backend:-?} (${why:-no reason given}): left out" >>"$results"
    elif [ -n "$backend" ]; then
        sed "s/\$/ backend=$backend/" "$pending" >>"$results"
    else
        cat "$pending" >>"$results"
    fi
    : >"$pending"
}

# measure SYSTEM 'COMMAND {PORT}': every workload against one server, then
# idle_conns against a fresh one.
measure() {
    local sys=$1 tpl=$2
    log "$sys"
    start_server "$sys" "$tpl" || return 0
    echo_run "$sys" tcp_echo_1 1 50000 10000
    echo_run "$sys" tcp_echo_100 100 200000 40000
    echo_run "$sys" tcp_echo_300 300 200000 40000
    if [ "$sys" = uring-floor ]; then
        keep "$sys" # echo only: it queues at most 64 KiB a connection
        return 0
    fi
    echo_run "$sys" tcp_bulk 1 268435456 67108864
    keep "$sys"
    [ "$conns_idle" -gt 0 ] || return 0
    start_server "$sys" "$tpl" || return 0
    "$idle" --port "$port" --server-pid "$srv" --conns "$conns_idle" --system "$sys" \
        2>>"$out/client.err" | grep '^BENCH' >>"$pending" || log "idle_conns $sys failed"
    keep "$sys"
}

systems=(ferry-uring ferry-epoll echo_epoll)
declare -A cmds=(
    [ferry-uring]="env FERRY_IO=uring $bench --echo-server {PORT}"
    [ferry-epoll]="env FERRY_IO=epoll $bench --echo-server {PORT}"
    [echo_epoll]="$abuild/echo_epoll --port {PORT}"
    [uring-floor]="$build/bench/ferry-uring-floor {PORT}"
)
[ -x "$build/bench/ferry-uring-floor" ] && systems+=(uring-floor)
{
    btype=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
    echo "# commit: $(git -C "$root" describe --always --dirty --abbrev=7 2>/dev/null || echo "?"), ${btype:-unknown} build, $(nproc) cpus, $(uname -r)"
    echo "# syscalls: counted by perf stat -e raw_syscalls:sys_enter in a second, shorter run against the same server"
} >>"$results"
for ((r = 1; r <= runs; r++)); do
    echo "# run $r: load average $(cut -d' ' -f1-3 /proc/loadavg)" >>"$results"
    log "run $r of $runs (load $(cut -d' ' -f1 /proc/loadavg))"
    # Odd runs in one order, even runs in the other.
    order=("${systems[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[i]}"); done
    fi
    for s in "${order[@]}"; do
        measure "$s" "${cmds[$s]}"
    done
done

echo "BENCH lines: $results"
python3 "$here/parts.py" uring "$results"
if [ -n "$write" ]; then
    python3 "$here/parts.py" uring --into "$here/README.md" "$results" &&
        echo "run-uring: wrote the table into $here/README.md"
fi
