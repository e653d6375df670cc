#!/usr/bin/python3
"""pq_asyncpg.py - asyncpg's row of bench/pq_bench.c's two workloads, for
bench/run-pq.sh: the same queries, the same counts, the same BENCH lines
(one a run).

    pq_asyncpg.py [-r RUNS] [-n QUERIES] [-b BATCHES] [WORKLOAD...]

The server is the one FERRY_PQ_CONNINFO names (key=value pairs).

  pq_select_50      QUERIES `SELECT $1::int + 1` by 50 coroutines through
                    an asyncpg pool of 50 (fetchval).
  pq_pipeline_1000  BATCHES executemany() calls of 1,000 INSERTs on one
                    connection (asyncpg sends them as one pipeline, in one
                    implicit transaction).
"""
import argparse
import asyncio
import os
import sys
import time

import asyncpg


def conn_args():
    kv = dict(p.split("=", 1) for p in os.environ["FERRY_PQ_CONNINFO"].split())
    return dict(host=kv.get("host"), port=int(kv.get("port", 5432)),
                user=kv.get("user"), database=kv.get("dbname"))


def report(workload, n, values, ok):
    for v in values:
        print("BENCH workload=%s system=asyncpg n=%d seconds=%.6f ops_per_s=%.0f check=%s" % (
            workload, n, n / v, v, "ok" if ok else "FAIL"), flush=True)


async def select_50(queries):
    pool = await asyncpg.create_pool(min_size=50, max_size=50, **conn_args())
    left = [queries]
    bad = [0]

    async def worker():
        while left[0] > 0:
            q = left[0]
            left[0] -= 1
            async with pool.acquire() as c:
                if await c.fetchval("SELECT $1::int + 1", q) != q + 1:
                    bad[0] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(50)))
    rate = queries / (time.monotonic() - t0)
    await pool.close()
    return rate, bad[0] == 0


async def pipeline_1000(batches):
    c = await asyncpg.connect(**conn_args())
    await c.execute("DROP TABLE IF EXISTS bench_rows; "
                    "CREATE UNLOGGED TABLE bench_rows (i int, s text)")
    t0 = time.monotonic()
    for b in range(batches):
        rows = [(b * 1000 + i, "row %d" % (b * 1000 + i)) for i in range(1000)]
        await c.executemany("INSERT INTO bench_rows VALUES ($1, $2)", rows)
    rate = batches / (time.monotonic() - t0)
    n = await c.fetchval("SELECT count(*) FROM bench_rows")
    await c.close()
    return rate, n == batches * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("-b", type=int, default=20)
    ap.add_argument("workload", nargs="*")
    a = ap.parse_args()
    print("# asyncpg: %s" % asyncpg.__version__, flush=True)
    for name, fn, arg in (("pq_select_50", select_50, a.n),
                          ("pq_pipeline_1000", pipeline_1000, a.b)):
        if a.workload and name not in a.workload:
            continue
        values, ok = [], True
        for _ in range(a.r):
            v, good = asyncio.run(fn(arg))
            values.append(v)
            ok = ok and good
        report(name, arg, values, ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
