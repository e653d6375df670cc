#!/usr/bin/env python3
"""The tables of bench/README.md's other parts, from BENCH lines.

    python3 bench/parts.py redis bench/redis_results.txt
    python3 bench/parts.py redis --into bench/README.md bench/redis_results.txt
    python3 bench/parts.py redis --check bench/README.md bench/redis_results.txt
    python3 bench/parts.py xloop bench/xloop_results.txt
    python3 bench/parts.py pq bench/pq_results.txt
    python3 bench/parts.py rpc bench/rpc_results.txt
    python3 bench/parts.py curl bench/curl_results.txt
    python3 bench/parts.py sim bench/sim_results.txt
    python3 bench/parts.py uring bench/uring_results.txt

Parts:
  redis  ferry-redis-bench's lines: a row per workload and system, its
         median ops/s, ferry's median over that system's (ferry / system),
         and for the limiter the share of what the limit allows and the
         acquire scripts run per grant.  A limiter measured with other
         parameters (limit=, tasks=, hold_us=) is a workload of its own.
  xloop  bench/run-xloop.sh's lines: a row per workload, the median ns per
         call of each system.
  pq     bench/run-pq.sh's lines: a row per workload and system, its median
         queries or batches a second, and ferry's median over that
         system's (ferry / system).
  rpc    bench/run-rpc.sh's lines: a row per workload and system, its median
         round trips/s, p99 latency and server CPU per round trip; for the
         spread_* rows the most and fewest connections a loop got.
  curl   bench/run-curl.sh's lines: a row per system, its median requests
         a second and p99 latency, and ferry's median over that system's.
  sim    bench/run-sim.sh's lines: the median ns per one-byte round trip
         on the simulated network and over loopback TCP, and their ratio;
         then, for the lines with seeds_per_s, the median seeds a second of
         a whole simulated scenario under ferry-fuzz, and its real time per
         seed.
  uring  bench/run-uring.sh's lines: for each echo workload and server, the
         median round trips/s (MB/s for tcp_bulk), server CPU per round trip
         and the server's system calls per round trip (per MB), with
         ferry-uring's median over that server's: CPU (lower is better) and
         throughput; then the idle connections' RSS growth per connection.

Input: BENCH lines in the contract's format (bench/README.md), from files or
stdin; several lines of one (workload, system) are runs, and a figure is
their median, with the range of the runs beside it when there are several.
Lines `# key: value` are notes, printed under the table; every other line is
ignored.  A line with check other than ok fails the script: a report is not
made of failed measurements.

--into FILE writes the table between the part's BEGIN and END lines (below)
of a markdown file, and --check FILE compares what stands between them with
what the lines give (exit 1 on a difference).  The output depends only on
the input.  Standard library only.
"""
import argparse
import statistics
import sys

BEGIN = "<!-- BEGIN table: bench/parts.py %s bench/%s_results.txt -->"
END = "<!-- END table -->"

# Rows and columns in this order; names not listed follow in input order.
SYSTEMS = {
    "redis": ["ferry", "hiredis-blocking", "asyncio-redispy", "ferry-polling", "no-limiter"],
    "xloop": ["ferry", "eventfd-pingpong", "go"],
    "pq": ["ferry", "libpq-threads", "libpq-blocking", "asyncpg"],
    "curl": ["ferry", "threads", "go"],
    "sim": ["simulated", "loopback-tcp", "jobs-1", "jobs-2"],
    "rpc": ["ferry-1loop", "ferry-2loops", "epoll-1t", "epoll-2t", "go-2p", "ferry"],
    "uring": ["ferry-uring", "ferry-epoll", "echo_epoll", "uring-floor"],
}


def parse(lines):
    """Return ({(workload, system): [fields]}, [workload order], notes)."""
    runs = {}
    order = []
    notes = []
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("# ") and ": " in line:
            notes.append(line[2:])
            continue
        if not line.startswith("BENCH "):
            continue
        f = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        if f.get("check") != "ok":
            raise SystemExit("parts.py: a failed measurement: " + line)
        w = f["workload"]
        if "limit" in f and (f.get("limit"), f.get("tasks"), f.get("hold_us")) != ("32", "64", "2000"):
            w += " (limit %s, %s task%s, hold %s us)" % (
                f["limit"], f["tasks"], "" if f["tasks"] == "1" else "s", f["hold_us"])
        if w not in order:
            order.append(w)
        runs.setdefault((w, f["system"]), []).append(f)
    return runs, order, notes


def systems_of(runs, part):
    seen = []
    for (_, s) in runs:
        if s not in seen:
            seen.append(s)
    known = [s for s in SYSTEMS[part] if s in seen]
    return known + [s for s in seen if s not in known]


def num(x, digits=0):
    return "{:,.{}f}".format(x, digits)


def figure(fs, key, digits=0):
    """The median of a field over the runs, with their range if several."""
    v = [float(f[key]) for f in fs]
    med = statistics.median(v)
    if len(v) == 1 or min(v) == max(v):
        return med, num(med, digits)
    return med, "%s (%s-%s)" % (num(med, digits), num(min(v), digits), num(max(v), digits))


def redis_table(runs, order):
    out = ["| workload | system | ops/s | ferry / system | of what the limit allows | acquire scripts per grant |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
    systems = systems_of(runs, "redis")
    for w in order:
        ferry = runs.get((w, "ferry"))
        fmed = figure(ferry, "ops_per_s")[0] if ferry else None
        for s in systems:
            fs = runs.get((w, s))
            if not fs:
                continue
            med, text = figure(fs, "ops_per_s")
            ratio = "-" if s == "ferry" or fmed is None else "%.2f" % (fmed / med)
            share = polls = "-"
            if "limit" in fs[0] and s != "no-limiter":
                hold = float(fs[0]["hold_us"])
                if hold > 0:
                    share = "%.2f" % (med / (float(fs[0]["limit"]) * 1e6 / hold))
                have = [float(f["polls_per_grant"]) for f in fs if "polls_per_grant" in f]
                if have:
                    polls = "%.2f" % statistics.median(have)
            out.append("| %s | %s | %s | %s | %s | %s |" % (w, s, text, ratio, share, polls))
    return out


def xloop_table(runs, order):
    systems = systems_of(runs, "xloop")
    out = ["| workload | " + " | ".join("%s ns per call" % s for s in systems) + " |",
           "| --- |" + " ---: |" * len(systems)]
    for w in order:
        cells = []
        for s in systems:
            fs = runs.get((w, s))
            cells.append(figure(fs, "ns_per_op")[1] if fs else "")
        out.append("| %s | %s |" % (w, " | ".join(cells)))
    return out


def ratio_rows(runs, order, part, cols):
    """Rows of a part whose first system is ferry: for each workload and
    system, the median of each of `cols` (field names), then ferry's median
    ops_per_s over that system's."""
    out = []
    for w in order:
        ferry = runs.get((w, "ferry"))
        fmed = figure(ferry, "ops_per_s")[0] if ferry else None
        for s in systems_of(runs, part):
            fs = runs.get((w, s))
            if not fs:
                continue
            med = figure(fs, "ops_per_s")[0]
            ratio = "-" if s == "ferry" or fmed is None else "%.2f" % (fmed / med)
            cells = [figure(fs, c)[1] for c in cols]
            out.append("| %s | %s | %s | %s |" % (w, s, " | ".join(cells), ratio))
    return out


def pq_table(runs, order):
    return ["| workload | system | per second | ferry / system |",
            "| --- | --- | ---: | ---: |"] + ratio_rows(runs, order, "pq", ["ops_per_s"])


def rpc_table(runs, order):
    out = ["| workload | system | round trips/s | p99 us | server CPU ns per round trip | max/min connections per loop |",
           "| --- | --- | ---: | ---: | ---: | --- |"]
    systems = systems_of(runs, "rpc")
    for w in order:
        for s in systems:
            fs = runs.get((w, s))
            if not fs:
                continue
            if "max_per_loop" in fs[0]:
                spread = ", ".join("%s/%s" % (f["max_per_loop"], f["min_per_loop"]) for f in fs)
                out.append("| %s | %s | - | - | - | %s |" % (w, s, spread))
                continue
            cells = [figure(fs, "ops_per_s")[1]]
            for key in ("p99_us", "srv_cpu_ns_per_op"):
                cells.append(figure(fs, key)[1] if all(key in f for f in fs) else "-")
            out.append("| %s | %s | %s | - |" % (w, s, " | ".join(cells)))
    return out


def curl_table(runs, order):
    return ["| workload | system | requests/s | p99 us | ferry / system |",
            "| --- | --- | ---: | ---: | ---: |"] + ratio_rows(runs, order, "curl",
                                                          ["ops_per_s", "p99_us"])


def sim_table(runs, order):
    out = ["| workload | system | ns per round trip | / simulated |",
           "| --- | --- | ---: | ---: |"]
    systems = systems_of(runs, "sim")
    seeds = [w for w in order if any("seeds_per_s" in f for s in systems for f in runs.get((w, s), []))]
    for w in order:
        if w in seeds:
            continue
        base = runs.get((w, "simulated"))
        bmed = figure(base, "ns_per_op")[0] if base else None
        for s in systems:
            fs = runs.get((w, s))
            if not fs:
                continue
            med, text = figure(fs, "ns_per_op")
            ratio = "-" if s == "simulated" or bmed is None else "%.1f" % (med / bmed)
            out.append("| %s | %s | %s | %s |" % (w, s, text, ratio))
    if seeds:
        out += ["", "| scenario | runs at a time | seeds a second | ms per seed |",
                "| --- | --- | ---: | ---: |"]
    for w in seeds:
        for s in systems:
            fs = runs.get((w, s))
            if not fs:
                continue
            med, text = figure(fs, "seeds_per_s")
            per = "%.1f" % (1000.0 * int(s.split("-")[-1]) / med) if s.startswith("jobs-") else "-"
            out.append("| %s | %s | %s | %s |" % (w, s, text, per))
    return out


def per_mb(w, fs):
    """tcp_bulk's n counts bytes: its server CPU per op is given per MB
    (10^6 bytes, in ns) so that it reads as a figure, not a fraction."""
    if w != "tcp_bulk" or not fs:
        return fs
    return [dict(f, srv_cpu_ns_per_op=float(f["srv_cpu_ns_per_op"]) * 1e6)
            if "srv_cpu_ns_per_op" in f else f for f in fs]


def uring_table(runs, order):
    """Echo workloads: a row per workload and server; idle_conns: a table
    of its own.  The ratios are ferry-uring's median over the row's."""
    out = ["| workload | server | round trips/s (tcp_bulk: MB/s) | server CPU ns per round trip (tcp_bulk: per MB) | "
           "server syscalls per round trip (tcp_bulk: per MB) | ferry-uring / server: CPU | "
           "ferry-uring / server: per second |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    systems = systems_of(runs, "uring")
    idle = []
    for w in order:
        if w == "idle_conns":
            idle = [s for s in systems if (w, s) in runs]
            continue
        rate = "mb_per_s" if w == "tcp_bulk" else "ops_per_s"
        calls = "srv_syscalls_per_mb" if w == "tcp_bulk" else "srv_syscalls_per_op"
        base = per_mb(w, runs.get((w, "ferry-uring")))
        for s in systems:
            fs = per_mb(w, runs.get((w, s)))
            if not fs:
                continue
            cells = []
            for key, digits in ((rate, 0), ("srv_cpu_ns_per_op", 0), (calls, 2)):
                cells.append(figure(fs, key, digits)[1] if all(key in f for f in fs) else "-")
            ratios = ["-", "-"]
            if base and s != "ferry-uring":
                for i, key in enumerate(("srv_cpu_ns_per_op", rate)):
                    if all(key in f for f in fs + base):
                        mine = figure(fs, key)[0]
                        if mine:
                            ratios[i] = "%.2f" % (figure(base, key)[0] / mine)
            out.append("| %s | %s | %s | %s |" % (w, s, " | ".join(cells), " | ".join(ratios)))
    if idle:
        out += ["", "| idle connections | server | server RSS growth KiB | bytes per connection |",
                "| ---: | --- | ---: | ---: |"]
        for s in idle:
            fs = runs[("idle_conns", s)]
            out.append("| %s | %s | %s | %s |" % (num(float(fs[0]["n"])), s,
                       figure(fs, "rss_growth_kb")[1], figure(fs, "bytes_per_conn")[1]))
    return out


TABLES = {"redis": redis_table, "xloop": xloop_table, "pq": pq_table, "rpc": rpc_table,
          "curl": curl_table, "sim": sim_table, "uring": uring_table}


def render(part, lines):
    runs, order, notes = parse(lines)
    if not runs:
        raise SystemExit("parts.py: no BENCH lines")
    rows = TABLES[part](runs, order)
    text = "\n".join(rows) + "\n"
    if notes:
        text += "\n" + "".join("- %s\n" % n for n in notes)
    return text


def block(text, part, name):
    b = text.find(BEGIN % (part, part) + "\n")
    e = text.find("\n" + END, b)
    if b < 0 or e < 0:
        raise SystemExit("parts.py: %s has no lines %s ... %s" % (name, BEGIN % (part, part), END))
    b += len(BEGIN % (part, part)) + 1
    return b, e + 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=sorted(SYSTEMS))
    ap.add_argument("files", nargs="*", help="files of BENCH lines (default: stdin)")
    ap.add_argument("--into", metavar="FILE", help="write the table into FILE between its markers")
    ap.add_argument("--check", metavar="FILE", help="exit 1 unless FILE holds this table")
    args = ap.parse_intermixed_args(argv[1:])
    lines = []
    if args.files:
        for name in args.files:
            with open(name, encoding="utf-8") as f:
                lines.extend(f)
    else:
        lines = list(sys.stdin)
    table = render(args.part, lines)
    target = args.check or args.into
    if target is None:
        sys.stdout.write(table)
        return 0
    with open(target, encoding="utf-8") as f:
        text = f.read()
    b, e = block(text, args.part, target)
    if args.check:
        if text[b:e] != table:
            print("parts.py: the %s table in %s is not what the lines give; regenerate it with\n"
                  "  python3 bench/parts.py %s --into %s FILES" % (args.part, target, args.part, target))
            return 1
        return 0
    with open(target, "w", encoding="utf-8") as f:
        f.write(text[:b] + table + text[e:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
