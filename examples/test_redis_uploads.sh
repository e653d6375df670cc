#!/usr/bin/env bash
# test_redis_uploads.sh PROGRAM CHECK REGEX...
#
# Starts a redis-server of its own on 127.0.0.1 at a free port (a random
# one, tried until the server answers PING), runs examples/redis_uploads
# against it through check_output.sh (CHECK) with the REGEXes, and stops
# the server.  Without redis-server (or redis-cli) the test is skipped with
# exit status 77, saying so.
set -u
prog=$1
check=$2
shift 2
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "SKIPPED: example_redis_uploads needs redis-server and redis-cli (Debian: redis-server)"
    exit 77
fi
tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
port=
for _ in $(seq 20); do
    p=$((20000 + RANDOM % 40000))
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
        --daemonize no --loglevel warning --logfile "$tmp/redis.log" &
    pid=$!
    for _ in $(seq 100); do
        if redis-cli -p "$p" ping 2>/dev/null | grep -q PONG; then
            port=$p
            break 2
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=
done
if [ -z "$port" ]; then
    echo "test_redis_uploads: could not start redis-server" >&2
    cat "$tmp/redis.log" >&2 2>/dev/null
    exit 1
fi
bash "$check" "$prog" "$port" -- "$@"
