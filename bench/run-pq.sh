#!/usr/bin/env bash
# run-pq.sh - the PostgreSQL benchmark (bench/pq_bench.c, bench/pq_asyncpg.py)
# against a throwaway cluster (tests/pg_cluster.sh): ferry_pq, libpq's
# blocking API on threads, and asyncpg (Debian's python3-asyncpg), in one
# run, with the machine's load printed beside the figures.  Its output is
# a results file: bench/parts.py pq makes the table of bench/README.md from
# it (bench/pq_results.txt).
# Usage: bench/run-pq.sh BUILD_DIR [-r RUNS] [-n QUERIES] [-b BATCHES]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run-pq.sh BUILD_DIR [options]}
shift
bench=$build/bench/ferry-pq-bench
[ -x "$bench" ] || { echo "run-pq.sh: no $bench (a Release build with the PostgreSQL part)" >&2; exit 1; }
inner() {
    echo "# load before: $(uptime | sed 's/.*load average: //')"
    "$bench" "$@"
    if /usr/bin/python3 -c 'import asyncpg' 2>/dev/null; then
        /usr/bin/python3 "$here/pq_asyncpg.py" "$@"
    else
        echo "run-pq.sh: no asyncpg (python3-asyncpg): its row is left out" >&2
    fi
    echo "# load after: $(uptime | sed 's/.*load average: //')"
}
export -f inner
export bench here
bash "$here/../tests/pg_cluster.sh" bash -c 'inner "$@"' inner "$@"
