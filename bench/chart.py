#!/usr/bin/env python3
"""ferry against its peers, from BENCH lines: an SVG chart or a markdown table.

    python3 bench/chart.py results.txt > results.svg      # the chart
    python3 bench/chart.py -o results.svg results.txt     # the same
    python3 bench/chart.py --table results.txt            # the table
    python3 bench/chart.py --table --into README.md results.txt
    python3 bench/chart.py --check results.svg results.txt
    python3 bench/chart.py --table --check README.md results.txt

Input: BENCH lines in the contract's format (bench/README.md), from any
number of files or from stdin; several lines of one (workload, system) are
runs, and every figure is their median.  Lines of the form `# key: value`
are kept as notes and printed under the chart and the table (run-compare.sh
writes the commit, the versions and each run's load average that way);
every other line is ignored.

--into FILE writes the table between the lines BEGIN and END (below) of a
markdown file instead, and --table --check FILE compares only what stands
between them, so a report can hold the table among other text.

Each workload is drawn against one reference peer (REFERENCE below): a bar is
that system's median time per operation divided by the reference's median,
on one log scale for all workloads, so a bar to the left of 1x is faster
than the reference.  Workloads of very different sizes (nanoseconds for a
switch, milliseconds for a stampede) then read on one axis, and the
absolute median is printed at the end of each bar.  The thin line across a
bar spans its fastest and slowest run.  Only the workloads ferry ran are
drawn; the table lists every workload.  The network workloads are read as
throughput (round trips or MB per second), their bars still as time per
operation over the reference's (the inverse ratio), and tcp_echo's p99
round-trip latency has a panel of its own.

The output depends only on the input: no clock, no locale, no dictionary
order, so the same lines give the same file byte for byte (--check compares
and exits 1 on a difference).  Standard library only.
"""
import argparse
import math
import statistics
import sys
from collections import defaultdict

# The peer each workload is measured against.  Chosen as the closest design
# that runs the workload: a goroutine runtime on one thread for the
# scheduler-bound ones, the default Go runtime where two CPUs may help it,
# libuv for the thread bridge.
REFERENCE = {
    "switch": "go-1p",
    "spawn": "go-1p",
    "idle_tasks": "go",
    "idle_tasks/bytes": "go",
    "lock_contention": "go-1p",
    "queue_pipeline": "go-1p",
    "stampede": "go",
    "threadsafe_post": "libuv",
    "offload_rtt": "libuv",
    "offload_throughput": "libuv",
    "tcp_echo": "libuv",
    "tcp_echo/p99": "libuv",
    "tcp_bulk": "libuv",
}

# The markers of the table's place in a markdown file (--into, --check).
BEGIN = "<!-- BEGIN table: bench/chart.py --table bench/results.txt -->"
END = "<!-- END table -->"

# The project's goals: ferry's median over the reference's at most this
# (strictly below it for a ratio of 1), or an absolute bound in ns.  For the
# network workloads the bound is on throughput, ferry's over the peer's at
# least this ("rate"), and on tcp_echo's p99 latency, at most the peer's.
TARGETS = [
    ("switch", None, 20.0),
    ("spawn", "go-1p", 0.3),
    ("idle_tasks/bytes", "go", 1.6),
    ("lock_contention", "go-1p", 0.2),
    ("queue_pipeline", "go-1p", 0.5),
    ("stampede", "go", 1.0),
    ("threadsafe_post", "libuv", 0.5),
    ("threadsafe_post", "libevent-eventfd", 0.7),
    ("offload_rtt", "libuv", 0.7),
    ("offload_throughput", "libuv", 0.7),
    ("tcp_echo", "libuv", "rate", 1.0),
    ("tcp_echo/p99", "libuv", "le", 1.0),
    ("tcp_bulk", "limit", "rate", 0.9),
]

# What one operation is, per workload (the chart's panel titles).
UNITS = {
    "switch": "ns per yield",
    "spawn": "ns per spawn + join",
    "idle_tasks": "ns per idle task",
    "idle_tasks/bytes": "bytes per idle task",
    "lock_contention": "ns per acquire, yield, release",
    "queue_pipeline": "ns per item through the queue",
    "stampede": "ns per request",
    "threadsafe_post": "ns per callback posted from a thread",
    "offload_rtt": "ns per round trip to the pool",
    "offload_throughput": "ns per pool job, 1,000 in flight",
    "tcp_echo": "64-byte round trips per second, 100 connections",
    "tcp_echo/p99": "p99 round-trip latency",
    "tcp_bulk": "MB per second echoed, one connection",
    "xthread_pingpong_spin": "ns per round trip",
    "xthread_pingpong_eventfd": "ns per round trip",
}

# Drawing order of workloads and systems (the same in every panel, so a
# system keeps its place); anything not listed follows in name order.
WORKLOAD_ORDER = ["switch", "spawn", "idle_tasks", "idle_tasks/bytes", "lock_contention",
                  "queue_pipeline", "stampede", "threadsafe_post", "offload_rtt",
                  "offload_throughput", "tcp_echo", "tcp_echo/p99", "tcp_bulk",
                  "xthread_pingpong_spin", "xthread_pingpong_eventfd"]
SYSTEM_ORDER = ["ferry", "ferry-libevent", "ferry-bev", "limit", "limit-jmp", "ucontext", "libuv", "libevent",
                "libevent-active", "libevent-eventfd", "go-1p", "go", "asyncio-uvloop",
                "asyncio-debpy", "asyncio"]
COLOURS = {
    "ferry": "#d1495b", "ferry-libevent": "#e5989b", "ferry-bev": "#f2c4c6", "limit": "#8d99ae", "limit-jmp": "#adb5bd", "ucontext": "#6c757d",
    "libuv": "#2a9d8f", "libevent": "#52b788", "libevent-active": "#74c69d",
    "libevent-eventfd": "#95d5b2", "go-1p": "#1d4e89", "go": "#4f86c6",
    "asyncio-uvloop": "#e9a03b", "asyncio-debpy": "#f4c26b", "asyncio": "#f7d794",
}
OTHER_COLOUR = "#b0b0b0"
CORE = {"workload", "system", "n", "seconds", "ns_per_op", "ops_per_s", "rss_kb", "check"}


def parse(lines, runs, notes):
    """Collect BENCH lines into runs[(workload, system)] and '# k: v' notes."""
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("BENCH "):
            kv = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)
            if "workload" in kv and "system" in kv and "ns_per_op" in kv:
                runs[(kv["workload"], kv["system"])].append(kv)
        elif line.startswith("# ") and ": " in line:
            notes.append(line[2:])


def series(runs):
    """(workload, system) -> sorted values of the workload's metric.

    The metric is ns_per_op, except for the pseudo-workloads
    'idle_tasks/bytes', idle_tasks' bytes_per_task, and 'tcp_echo/p99',
    tcp_echo's p99_us in ns.
    """
    out = {}
    for (w, s), rows in runs.items():
        out[(w, s)] = sorted(float(r["ns_per_op"]) for r in rows)
        for src, pseudo, scale in (("idle_tasks", "bytes_per_task", 1.0),
                                   ("tcp_echo", "p99_us", 1e3)):
            if w != src:
                continue
            b = sorted(float(r[pseudo]) * scale for r in rows if pseudo in r)
            if b:
                out[(PSEUDO[pseudo], s)] = b
    return out


PSEUDO = {"bytes_per_task": "idle_tasks/bytes", "p99_us": "tcp_echo/p99"}


def order(names, preferred):
    return sorted(names, key=lambda n: (preferred.index(n) if n in preferred else len(preferred), n))


def fmt_num(x):
    """Three significant digits below 100, thousands separators above."""
    if x < 100:
        return f"{x:.3g}"
    return f"{x:,.0f}"


def fmt_value(w, x):
    """A median with its unit, scaled to ns, us or ms (bytes for memory,
    a rate for the network throughputs, whose x is ns per op)."""
    if w == "idle_tasks/bytes":
        return f"{x:,.0f} B"
    if w == "tcp_echo":
        return f"{1e9 / x / 1e3:,.1f} k/s"
    if w == "tcp_bulk":
        return f"{1e3 / x:,.0f} MB/s"
    if x >= 1e6:
        return f"{fmt_num(x / 1e6)} ms"
    if x >= 1e3:
        return f"{fmt_num(x / 1e3)} \u00b5s"
    return f"{fmt_num(x)} ns"


def fmt_range(w, a, b):
    """'17.9-28.5 ns', or '950 ns-1.2 µs' when the unit changes (for a
    rate, the slowest run's first)."""
    if w in ("tcp_echo", "tcp_bulk"):
        a, b = b, a
    fa, fb = fmt_value(w, a), fmt_value(w, b)
    ua, ub = fa.rsplit(" ", 1)[1], fb.rsplit(" ", 1)[1]
    return f"{fa.rsplit(' ', 1)[0]}-{fb}" if ua == ub else f"{fa}-{fb}"


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}" if r < 10 else f"{r:.3g}" if r < 100 else f"{r:,.0f}"


def runs_text(data):
    """How many runs each median is of: "3", or "2-3" when it varies."""
    counts = sorted({len(v) for v in data.values()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


# ---------------------------------------------------------------- table

def target_cells(w, med):
    """'<= 0.3x go-1p: yes' for each of the workload's targets."""
    cells = []
    for tw, peer, *rule in TARGETS:
        if tw != w:
            continue
        f = med.get((w, "ferry"))
        if len(rule) == 2:
            kind, bound = rule
            p = med.get((w, peer))
            if f is None or not p:
                met = "?"
            elif kind == "rate":        # ns per op, so the rate ratio is p / f
                met = "yes" if p / f >= bound else f"**no** ({fmt_ratio(p / f)})"
            else:
                met = "yes" if f / p <= bound else f"**no** ({fmt_ratio(f / p)})"
            cells.append(f"{'>=' if kind == 'rate' else '<='} {bound:g}x {peer}: {met}")
            continue
        bound = rule[0]
        if peer is None:
            met = "?" if f is None else ("yes" if f <= bound else "**no**")
            cells.append(f"<= {bound:g} ns: {met}")
            continue
        p = med.get((w, peer))
        r = f / p if f is not None and p else None
        ok = r is not None and (r < bound if bound == 1.0 else r <= bound)
        met = "?" if r is None else ("yes" if ok else f"**no** ({fmt_ratio(r)})")
        cells.append(f"{'<' if bound == 1.0 else '<='} {bound:g}x {peer}: {met}")
    return "; ".join(cells)


def table(runs, notes):
    """One row per workload: ferry, the reference peer, their ratio, the
    project's target, and every other peer with its ratio to the reference."""
    data = series(runs)
    med = {k: statistics.median(v) for k, v in data.items()}
    workloads = order({w for w, _ in data}, WORKLOAD_ORDER)
    nruns = runs_text(data)

    def cell(w, s):
        v, m = data[(w, s)], med[(w, s)]
        rng = f" ({fmt_range(w, v[0], v[-1])})" if v[0] != v[-1] and s == "ferry" else ""
        return f"{fmt_value(w, m)}{rng}"

    out = [f"Medians of {nruns} run{'' if nruns == '1' else 's'}, ferry's with the range of its "
           "runs; a ratio is a median time per operation (or latency) over the reference peer's "
           "(below 1: faster; for tcp_echo and tcp_bulk the inverse of the throughputs' ratio); "
           "a target's ratio is ferry's over the peer named.", ""]
    out.append("| workload | ferry | reference peer | ferry / ref | target | other peers (/ ref) |")
    out.append("| --- | ---: | --- | ---: | --- | --- |")
    for w in workloads:
        ref = REFERENCE.get(w)
        rmed = med.get((w, ref)) if ref else None
        has_f = (w, "ferry") in data
        f = cell(w, "ferry") if has_f else "-"
        r = f"{ref} {fmt_value(w, rmed)}" if rmed else "-"
        ratio = fmt_ratio(med[(w, "ferry")] / rmed) if has_f and rmed else "-"
        others = []
        for s in order({s for ww, s in data if ww == w}, SYSTEM_ORDER):
            if s in ("ferry", ref):
                continue
            x = f" ({fmt_ratio(med[(w, s)] / rmed)})" if rmed else ""
            others.append(f"{s} {fmt_value(w, med[(w, s)])}{x}")
        label = w.replace("/bytes", " (bytes per task)").replace("/p99", " (p99 latency)")
        out.append(f"| {label} | {f} | {r} | {ratio} | {target_cells(w, med)} | "
                   f"{', '.join(others)} |")
    if notes:
        out.append("")
        out.extend(f"- {n}" for n in notes)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- chart

def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def chart(runs, notes):
    data = series(runs)
    med = {k: statistics.median(v) for k, v in data.items()}
    workloads = [w for w in order({w for w, _ in data}, WORKLOAD_ORDER)
                 if (w, "ferry") in data and (w, REFERENCE.get(w)) in data]
    if not workloads:
        raise SystemExit("chart.py: no workload with both ferry and its reference peer")

    # One log axis for every panel, whole decades around every ratio and run.
    ratios = []
    for w in workloads:
        r = med[(w, REFERENCE[w])]
        for s in {s for ww, s in data if ww == w}:
            ratios += [data[(w, s)][0] / r, data[(w, s)][-1] / r]
    lo = math.floor(math.log10(min(ratios)) + 1e-9)
    hi = math.ceil(math.log10(max(ratios)) - 1e-9)
    lo, hi = min(lo, -1), max(hi, 1)

    W = 980
    x0, x1 = 190, 770            # the axis
    label_x = x0 - 10            # system names end here
    value_x = x1 + 12            # absolute medians start here
    bar_h, gap, title_h, panel_gap = 13, 3, 20, 14

    def xpos(ratio):
        return x0 + (math.log10(ratio) - lo) / (hi - lo) * (x1 - x0)

    # Legend: every system that appears, in drawing order.
    legend = []
    lx, ly = 10, 66
    for s in order({s for _, s in data if any((w, s) in data for w in workloads)}, SYSTEM_ORDER):
        legend.append(f'<rect x="{lx}" y="{ly - 10}" width="11" height="11" '
                      f'fill="{COLOURS.get(s, OTHER_COLOUR)}"/>')
        legend.append(f'<text x="{lx + 15}" y="{ly}" class="legend">{esc(s)}</text>')
        lx += 26 + 6 * len(s)
        if lx > W - 120:
            lx, ly = 10, ly + 16
    top = ly + 34                # the first panel's top tick labels sit above it

    body = []
    panels = []                  # (top, bottom) of each panel's bars
    y = top
    for w in workloads:
        ref = REFERENCE[w]
        rmed = med[(w, ref)]
        systems = order({s for ww, s in data if ww == w}, SYSTEM_ORDER)
        title = (f"{w.replace('/bytes', '').replace('/p99', '')}: {UNITS.get(w, 'ns per op')}, "
                 f"reference {ref} = {fmt_value(w, rmed)}")
        body.append(f'<text x="{x0 - 180}" y="{y + 14}" class="panel">{esc(title)}</text>')
        y += title_h
        panel_top = y - 2
        for s in systems:
            v = data[(w, s)]
            m = med[(w, s)]
            xr, xm = xpos(1.0), xpos(m / rmed)
            left, width = min(xr, xm), max(abs(xm - xr), 1.5)
            colour = COLOURS.get(s, OTHER_COLOUR)
            cls = "sys ferry" if s == "ferry" else "sys"
            name = f"{s} (ref)" if s == ref else s
            body.append(f'<text x="{label_x}" y="{y + bar_h - 2}" text-anchor="end" '
                        f'class="{cls}">{esc(name)}</text>')
            tip = f"{s}, {w}: median {fmt_value(w, m)}, {m / rmed:.3g}x {ref}, {len(v)} runs"
            body.append(f'<rect x="{left:.1f}" y="{y}" width="{width:.1f}" height="{bar_h}" '
                        f'fill="{colour}"><title>{esc(tip)}</title></rect>')
            if len(v) > 1:
                ya = y + bar_h / 2
                body.append(f'<line x1="{xpos(v[0] / rmed):.1f}" y1="{ya}" '
                            f'x2="{xpos(v[-1] / rmed):.1f}" y2="{ya}" class="range"/>')
            ratio = m / rmed
            body.append(f'<text x="{value_x}" y="{y + bar_h - 2}" class="{cls}">'
                        f'{esc(fmt_value(w, m))}  ({fmt_ratio(ratio)}\u00d7)</text>')
            y += bar_h + gap
        panels.append((panel_top, y))
        y += panel_gap
    bottom = y

    # The decade grid under each panel's bars, labelled above the first
    # panel and below the last.
    grid = []
    for d in range(lo, hi + 1):
        x = xpos(10.0 ** d)
        label = f"{10.0 ** d:g}\u00d7"
        for ly in (top - 6, bottom - panel_gap + 14):
            grid.append(f'<text x="{x:.1f}" y="{ly}" class="tick">{label}</text>')
        for pt, pb in panels:
            grid.append(f'<line x1="{x:.1f}" y1="{pt}" x2="{x:.1f}" y2="{pb}" '
                        f'class="{"one" if d == 0 else "grid"}"/>')
            if d < hi:
                for k in range(2, 10):
                    xm = xpos(k * 10.0 ** d)
                    grid.append(f'<line x1="{xm:.1f}" y1="{pt}" x2="{xm:.1f}" y2="{pb}" '
                                f'class="minor"/>')
    grid.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{bottom - panel_gap + 30}" class="tick">'
                f'median / the reference peer\'s median (log scale)</text>')

    nruns = runs_text(data)
    head = [
        f'<text x="10" y="24" class="h1">ferry and its peers: time per operation (or latency) '
        f'relative to each workload\'s reference peer</text>',
        f'<text x="10" y="44" class="h2">log scale; left of 1\u00d7 is faster than the reference, '
        f'right is slower; bar = median of {nruns} run{"" if nruns == "1" else "s"}, thin line = fastest to slowest run; '
        f'figures: median, ratio</text>',
    ]
    foot_y = bottom + 36
    foot = []
    for n in notes:
        foot.append(f'<text x="10" y="{foot_y}" class="note">{esc(n)}</text>')
        foot_y += 15
    H = foot_y + 6

    style = (
        "text{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;fill:#222}"
        ".h1{font-size:16px;font-weight:bold}.h2{font-size:12px;fill:#444}"
        ".panel{font-size:13px;font-weight:bold}"
        ".sys{font-size:11px}.ferry{font-weight:bold}"
        ".tick{font-size:11px;text-anchor:middle;fill:#555}"
        ".legend{font-size:11px}.note{font-size:11px;fill:#555}"
        ".grid{stroke:#bbb;stroke-width:1}.minor{stroke:#eee;stroke-width:1}"
        ".one{stroke:#222;stroke-width:1.5}"
        ".range{stroke:#222;stroke-width:1}"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}">',
        f"<style>{style}</style>",
        f'<rect width="{W}" height="{H}" fill="#fff"/>',
        *head, *legend, *grid, *body, *foot,
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def block(text, name):
    """(what precedes the table, the table, what follows it) in a markdown
    file; the marker lines belong to the first and the last part."""
    b = text.find(BEGIN + "\n")
    e = text.find("\n" + END, b)
    if b < 0 or e < 0:
        raise SystemExit(f"chart.py: {name} has no lines {BEGIN} ... {END}")
    b += len(BEGIN) + 1
    return text[:b], text[b:e + 1], text[e + 1:]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="files of BENCH lines (default: stdin)")
    ap.add_argument("--table", action="store_true", help="print the markdown table instead")
    ap.add_argument("-o", "--output", help="write to this file instead of stdout")
    ap.add_argument("--into", metavar="FILE",
                    help="with --table: write it into FILE, between the lines " + BEGIN + " and " + END)
    ap.add_argument("--check", metavar="FILE",
                    help="exit 1 unless FILE holds exactly what would be written (with --table: "
                         "between the markers, if FILE has them)")
    args = ap.parse_args(argv)

    runs, notes = defaultdict(list), []
    if args.files:
        for p in args.files:
            with open(p, encoding="utf-8") as f:
                parse(f, runs, notes)
    else:
        parse(sys.stdin, runs, notes)
    if not runs:
        raise SystemExit("chart.py: no BENCH lines")
    text = table(runs, notes) if args.table else chart(runs, notes)

    if args.into and not args.table:
        raise SystemExit("chart.py: --into goes with --table")
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            have = f.read()
        if args.table and BEGIN in have:
            have = block(have, args.check)[1]
        if have != text:
                print(f"chart.py: {args.check} differs from what the input gives; "
                      "regenerate it", file=sys.stderr)
                return 1
        return 0
    if args.into:
        with open(args.into, encoding="utf-8") as f:
            head, _, tail = block(f.read(), args.into)
        with open(args.into, "w", encoding="utf-8", newline="\n") as f:
            f.write(head + text + tail)
    elif args.output:
        with open(args.output, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
