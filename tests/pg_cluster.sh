#!/usr/bin/env bash
# pg_cluster.sh - run a command against a PostgreSQL cluster of its own:
# initdb in a temporary directory, postgres on 127.0.0.1 at a free port
# (its unix socket in that directory too), the command with
# FERRY_PQ_CONNINFO naming the server, then the cluster stopped and
# removed.  PostgreSQL refuses to run as root: as root, the server runs
# as the user `postgres` (or `nobody`).  When the server cannot be made or
# started, the command is not run and the script exits 77, which CTest
# reports as skipped, with the reason on stderr.
# Usage: tests/pg_cluster.sh COMMAND [ARGS...]
# The server's binaries: FERRY_PG_BINDIR, else the newest
# /usr/lib/postgresql/*/bin, else PATH.
set -u

skip() {
    echo "pg_cluster: SKIPPED: $*" >&2
    exit 77
}

bindir=${FERRY_PG_BINDIR:-}
if [ -z "$bindir" ]; then
    bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
fi
if [ -n "$bindir" ]; then
    PATH=$bindir:$PATH
fi
command -v initdb >/dev/null && command -v pg_ctl >/dev/null ||
    skip "no initdb/pg_ctl (install Debian's postgresql, or set FERRY_PG_BINDIR)"

dir=$(mktemp -d /tmp/ferry-pg.XXXXXX) || skip "no temporary directory"
as_server=()
if [ "$(id -u)" -eq 0 ]; then
    for u in postgres nobody; do
        if id "$u" >/dev/null 2>&1; then
            chown "$u" "$dir"
            if command -v runuser >/dev/null; then
                as_server=(runuser -u "$u" --)
            else
                as_server=(setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups)
            fi
            break
        fi
    done
    [ ${#as_server[@]} -gt 0 ] || { rm -rf "$dir"; skip "running as root and no user postgres or nobody"; }
fi
cleanup() {
    "${as_server[@]}" pg_ctl -D "$dir/data" -m immediate stop >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT

if ! "${as_server[@]}" initdb -D "$dir/data" -A trust -U ferry --no-sync -E UTF8 \
        --no-locale >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2
    skip "initdb failed"
fi
started=0
for _ in 1 2 3 4 5; do
    port=$(( 20000 + RANDOM % 40000 ))
    if "${as_server[@]}" pg_ctl -D "$dir/data" -l "$dir/server.log" -w -t 30 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=120" \
            start >/dev/null 2>&1; then
        started=1
        break
    fi
done
if [ "$started" -ne 1 ]; then
    tail -n 20 "$dir/server.log" >&2
    skip "postgres did not start"
fi
export FERRY_PQ_CONNINFO="host=127.0.0.1 port=$port user=ferry dbname=postgres"
"$@"
