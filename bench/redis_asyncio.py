#!/usr/bin/env python3
"""redis_asyncio.py - ferry-redis-bench's asyncio row: one process of a
workload done with redis-py's asyncio client (redis.asyncio).

    redis_asyncio.py KIND PORT N IDX [HEADER]

KIND is "queue" or "sem", N the ops of this process, IDX its index among
the workload's processes.  It speaks ferry-redis-bench's child protocol:
it connects and sets up, writes one byte to stdout to say it is ready,
waits until stdin reaches its end (the release), does its N ops on one
connection in one task, and exits 0 if every op ended well, 1 otherwise.
The parent checks the server afterwards as for the other systems.

The semaphore's scripts are read from HEADER (default: the library's
redis/redis_sem_lua.h next to this directory) by joining the C string
literals of acquire_lua and release_lua, so that this program runs the
scripts the library runs and keeps no copy of them.
"""
import asyncio
import os
import re
import sys

import redis.asyncio as aioredis

PAYLOAD = "0123456789abcdef"  # 16 bytes per item, as redis_bench.c's
SEM_KEY = "bsem"
SEM_LIMIT = "4"
SEM_LEASE = "10000"  # ferry's default lease, ms
SEM_WTTL = "1000"  # ferry's default waiter ttl, ms
SEM_KEYS = ["{%s}:%s" % (SEM_KEY, k)
            for k in ("holders", "queue", "alive", "ticket", "fence", "fences")]

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r", "0": "\0"}


_LITERAL = r'"((?:[^"\\]|\\.)*)"'


def _macro(header_text, name):
    """The literals of `#define NAME "..." \\ ...` (continued lines)."""
    m = re.search(r"^#define\s+%s\b((?:.*\\\n)*.*)$" % re.escape(name), header_text, re.M)
    if m is None:
        raise ValueError("no macro %s in the header" % name)
    return "".join(re.findall(_LITERAL, m.group(1)))


def c_string(header_text, name):
    """The value of `static const char NAME[] ... = "..." "...";`, whose
    initializer is string literals and names of macros made of them."""
    m = re.search(r"\b%s\s*\[\s*\][^=]*=(.*?);" % re.escape(name), header_text, re.S)
    if m is None:
        raise ValueError("no string %s in the header" % name)
    raw = ""
    for tok in re.finditer(_LITERAL + r"|\b([A-Za-z_]\w*)\b", m.group(1)):
        raw += tok.group(1) if tok.group(1) is not None else _macro(header_text, tok.group(2))
    if not raw:
        raise ValueError("%s has no string literal" % name)
    return re.sub(r"\\(.)", lambda e: _ESCAPES[e.group(1)], raw)


def ready_and_wait():
    """Say ready on stdout, then wait for the release: stdin reaches its end."""
    os.write(1, b"r")
    while os.read(0, 1):
        pass


async def queue(r, n, idx):
    consumer = "c%d" % idx
    try:
        await r.xgroup_create("bq", "g", id="0", mkstream=True)
    except aioredis.ResponseError as e:
        if not str(e).startswith("BUSYGROUP"):
            raise
    ready_and_wait()
    for _ in range(n):
        await r.xadd("bq", {"d": PAYLOAD})
        reply = await r.xreadgroup("g", consumer, {"bq": ">"}, count=1, block=5000)
        # [[key, [(id, fields)]]]
        if len(reply) != 1 or len(reply[0][1]) != 1:
            return False
        if await r.xack("bq", "g", reply[0][1][0][0]) != 1:
            return False
    return True


async def sem(r, n, acquire_lua, release_lua):
    sha = await r.script_load(acquire_lua)
    rsha = await r.script_load(release_lua)
    pid = os.getpid()
    ready_and_wait()
    prev = None
    for i in range(n):
        # The previous release goes out with this acquire, in one write,
        # and its answer is read with the acquire's.
        token = "%d:%d" % (pid, i)
        pipe = r.pipeline(transaction=False)
        if prev is not None:
            pipe.evalsha(rsha, 6, *SEM_KEYS, prev, SEM_LIMIT)
        pipe.evalsha(sha, 6, *SEM_KEYS, token, SEM_LIMIT, SEM_LEASE, SEM_WTTL)
        replies = await pipe.execute()
        if any(not isinstance(v, int) for v in replies) or replies[-1] <= 0:
            return False
        prev = token
    if prev is not None:
        if not isinstance(await r.evalsha(rsha, 6, *SEM_KEYS, prev, SEM_LIMIT), int):
            return False
    return True


async def main(kind, port, n, idx, header):
    r = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        await r.ping()
        if kind == "queue":
            ok = await queue(r, n, idx)
        elif kind == "sem":
            with open(header, encoding="utf-8") as f:
                text = f.read()
            ok = await sem(r, n, c_string(text, "acquire_lua"), c_string(text, "release_lua"))
        else:
            print("redis_asyncio: no kind %s" % kind, file=sys.stderr)
            ok = False
    finally:
        await r.close()
    return ok


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    here = os.path.dirname(os.path.abspath(__file__))
    hdr = sys.argv[5] if len(sys.argv) == 6 else os.path.join(here, "..", "redis", "redis_sem_lua.h")
    try:
        good = asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), hdr))
    except Exception as e:  # any failure is this process ending badly
        print("redis_asyncio: %r" % (e,), file=sys.stderr)
        good = False
    sys.exit(0 if good else 1)
