# ferry_gdb.py - gdb commands that see ferry's loops and tasks.
#
#   ferry loops                   every live loop: its thread, its tasks, its
#                                 runtime and index if it is a runtime's
#   ferry tasks [LOOP]            the tasks of LOOP (an expression), or of
#                                 every live loop (each loop of every
#                                 runtime too): id, name, state, what a
#                                 waiting task waits on, the stack it used
#   ferry bt TASK [LOOP]          the backtrace of a suspended task; TASK is
#                                 its id, its name or its address
#
# gdb loads it by itself for a program linked with libferry.a (a
# .debug_gdb_scripts entry of the library) or with the installed
# libferry.so (the auto-load file installed next to gdb's other ones),
# when gdb's auto-load safe-path allows it; `source` loads it by hand.
# docs/debugging.md tells how.
#
# It reads the library's own structures (src/loop_int.h), so it needs the
# library's debug information.  It only reads the program's memory: it
# works on a live process and on a core file alike.  A task's backtrace
# comes from an unwinder that, while `ferry bt` runs, tells gdb that the
# caller of the thread's innermost frame is the task's saved context; no
# register of the thread is written.

import os

import gdb
import gdb.unwinder

_STATES = {0: "ready", 1: "running", 2: "waiting", 3: "done"}


class _FerryError(Exception):
    pass


def _type(name):
    try:
        return gdb.lookup_type(name)
    except gdb.error:
        raise _FerryError(
            "ferry: no debug information for `%s`: the program is not linked "
            "with ferry, or ferry was built without -g (build it as "
            "RelWithDebInfo or Debug)" % name)


def _field_offset(struct_type, name):
    for f in struct_type.strip_typedefs().fields():
        if f.name == name:
            return f.bitpos // 8
    raise _FerryError("ferry: %s has no field %s: this script does not match "
                      "the library" % (struct_type, name))


def _container_of(link, struct_type, field):
    """The struct_type holding the ferry__link at `link` in `field`."""
    addr = int(link) - _field_offset(struct_type, field)
    return gdb.Value(addr).cast(struct_type.pointer())


def _list_links(head_addr):
    """Addresses of the nodes of the list whose head is at head_addr."""
    link_t = _type("struct ferry__link").pointer()
    head = gdb.Value(head_addr).cast(link_t)
    node = head["next"]
    seen = 0
    # A head never used is all zero (lists are set up lazily).
    while int(node) != 0 and int(node) != head_addr:
        yield int(node)
        node = node["next"]
        seen += 1
        if seen > 10000000:
            raise _FerryError("ferry: a list at 0x%x does not end" % head_addr)


def _loop_t():
    return _type("struct ferry_loop")


def _task_t():
    return _type("struct ferry_task")


def _all_loops():
    """Every loop in the process's set of live loops (base/loops.c)."""
    entry_t = _type("struct ferry__loop_entry")
    heads = []
    try:
        syms = gdb.lookup_static_symbols("loops")
    except (gdb.error, AttributeError):
        syms = []
    # Named `loops` in base/loops.c; with link-time optimisation the debug
    # information may hold it twice, once without an address and once
    # under another file's name, so any `loops` of this type with an
    # address will do, each address once.
    for sym in syms:
        if str(sym.type.strip_typedefs()) != "struct ferry__link":
            continue
        try:
            addr = sym.value().address
        except gdb.error:
            continue
        if addr is not None and int(addr) not in heads:
            heads.append(int(addr))
    loops = []
    for head in heads:
        for link in _list_links(head):
            e = _container_of(link, entry_t, "link")
            loops.append(e["loop"].cast(_loop_t().pointer()))
    return loops


def _thread_loop():
    """The loop current on the selected thread, or None."""
    try:
        v = gdb.parse_and_eval("ferry__tls_loop")
    except gdb.error:
        return None
    return v if int(v) != 0 else None


def _loops_or(arg):
    if arg:
        return [gdb.parse_and_eval(arg).cast(_loop_t().pointer())]
    _task_t()
    loops = _all_loops()
    if not loops:
        cur = _thread_loop()
        if cur is not None:
            loops = [cur]
    return loops


def _loop_thread(loop):
    """The gdb thread that owns `loop` (its ferry__tls_token is the
    loop's owner), or None."""
    owner = int(loop["owner"])
    inf = gdb.selected_inferior()
    here = gdb.selected_thread()
    frame = None
    try:
        frame = gdb.selected_frame()
    except gdb.error:
        pass
    found = None
    try:
        for th in inf.threads():
            try:
                th.switch()
                if int(gdb.parse_and_eval("&ferry__tls_token")) == owner:
                    found = th
                    break
            except gdb.error:
                continue
    finally:
        if here is not None and here.is_valid():
            here.switch()
            if frame is not None and frame.is_valid():
                frame.select()
    return found


def _loop_runtime(loop):
    """(runtime address, index, number of loops) of a loop of a runtime
    (ferry/runtime.h), or None.  The loop's place is in its inbox's
    extension room, after the pools' part (bridge/call.c)."""
    try:
        ctx = loop["hooks"]["ctx"]
        if int(ctx) == 0:
            return None
        ib = ctx.cast(_type("struct ferry_inbox").pointer())
        room = gdb.lookup_type("struct loop_jobs").sizeof
        try:
            align = gdb.lookup_type("max_align_t").alignof
        except (gdb.error, AttributeError):
            align = 16
        off = (room + align - 1) // align * align
        place_t = gdb.lookup_type("struct ferry__loop_rt")
        place = gdb.Value(int(ib["ext"].address) + off).cast(place_t.pointer())
        rt = place["rt"]
        if int(rt) == 0:
            return None
        return int(rt), int(place["index"]), int(rt["n"])
    except (gdb.error, _FerryError):
        return None


def _runtime_note(loop, fmt):
    rt = _loop_runtime(loop)
    return fmt % rt if rt is not None else ""


class _TasksMissing(_FerryError):
    pass


# Where the tasks are not in the memory gdb reads: a struct ferry_task
# lives at the top of its task's stack, and gdb's gcore writes a stack
# mapping with guard markers (MADV_GUARD_INSTALL, Linux 6.13 and later) as
# zeros.
_MISSING = (
    "ferry: the tasks of loop 0x%x are not in this core file (their stacks "
    "read as zeros or cannot be read), so neither are the %d live task(s). "
    "gdb's gcore cannot copy task stacks with guard markers (Linux 6.13 and "
    "later). Get a core written by the kernel: `ulimit -c unlimited` in the "
    "program's shell, /proc/PID/coredump_filter with bit 0 (private "
    "anonymous memory) set, as the default 0x33 has, then a fatal signal "
    "(kill -ABRT PID); or start the program with FERRY_STACK_GUARD=mprotect, "
    "whose guards gcore skips (docs/debugging.md, \"Core files\").")


def _tasks(loop):
    """The tasks of `loop`, each checked to be linked back to the one
    before it: memory that a core file does not hold reads as zeros, which
    would otherwise show as a task 0 with no name and no stack."""
    head = int(loop["tasks"].address)
    link_t = _type("struct ferry__link").pointer()
    prev = head
    links = _list_links(head)
    while True:
        try:
            link = next(links, None)
            if link is None:
                return
            back = int(gdb.Value(link).cast(link_t)["prev"])
            t = _container_of(link, _task_t(), "all")
            ok = back == prev and int(t["id"]) != 0 and int(t["hi"]) > int(t["lo"])
        except gdb.MemoryError:
            ok = False
        if not ok:
            raise _TasksMissing(_MISSING % (int(loop), int(loop["live"])))
        prev = link
        yield t


def _task_name(t):
    try:
        return t["name"].string()
    except (gdb.error, UnicodeDecodeError):
        return "?"


def _waits_on(t):
    if int(t["state"]) != 2:
        return ""
    w = t["waiter"]
    if int(w) == 0:
        return ""
    try:
        what = w["what"].string() if int(w["what"]) else "?"
    except (gdb.error, UnicodeDecodeError):
        what = "?"
    obj = int(w["obj"])
    return "%s 0x%x" % (what, obj) if obj else what


def _page_size():
    return os.sysconf("SC_PAGE_SIZE")


def _is_live():
    inf = gdb.selected_inferior()
    if inf.pid <= 0:
        return False
    conn = getattr(inf, "connection", None)
    return conn is not None and conn.type == "native"


def _stack_used(t):
    """Bytes from the top of the task's usable stack down to its lowest
    touched page, in whole pages: ferry_loop_dump()'s figure.  A live
    process: the lowest page present in memory, from /proc/PID/pagemap
    (mincore()'s answer; reading the stack itself would map its untouched
    pages and change the figure).  A core file: the lowest page holding a
    byte that is not zero."""
    lo, hi = int(t["lo"]), int(t["hi"])
    page = _page_size()
    if hi <= lo:
        return 0
    if _is_live():
        n = (hi - lo + page - 1) // page
        try:
            with open("/proc/%d/pagemap" % gdb.selected_inferior().pid, "rb") as f:
                f.seek((lo // page) * 8)
                data = f.read(n * 8)
        except OSError:
            data = b""
        if len(data) == n * 8:
            for i in range(n):
                e = int.from_bytes(data[i * 8:i * 8 + 8], "little")
                if e & (3 << 62):   # present, or swapped out
                    return hi - (lo + i * page)
            return 0
    inf = gdb.selected_inferior()
    p = lo
    while p < hi:
        try:
            mem = bytes(inf.read_memory(p, min(page, hi - p)))
        except gdb.MemoryError:
            mem = b""
        if mem.strip(b"\0"):
            return hi - p
        p += page
    return 0


def _print_tasks(loop):
    th = _loop_thread(loop)
    where = "thread %d" % th.num if th is not None else ""
    where += _runtime_note(loop, (", " if where else "") +
                           "runtime 0x%x, loop %d of %d")
    print("loop 0x%x%s: %d live task(s)" % (
        int(loop), " (%s)" % where if where else "", int(loop["live"])))
    try:
        tasks = list(_tasks(loop))
    except _TasksMissing as e:
        print("  " + str(e))
        return
    print("  %5s  %-24s %-8s %-32s %s" % ("ID", "NAME", "STATE", "WAITS ON", "STACK USED"))
    for t in tasks:
        state = int(t["state"])
        size_kib = (int(t["hi"]) - int(t["lo"])) // 1024
        extra = []
        if bool(t["timer"]["linked"]):
            extra.append("timer")
        if bool(t["cancelled"]):
            extra.append("cancelled")
        print("  %5d  %-24s %-8s %-32s %d of %d KiB%s" % (
            int(t["id"]), "'%s'" % _task_name(t), _STATES.get(state, str(state)),
            _waits_on(t), (_stack_used(t) + 1023) // 1024, size_kib,
            (" (" + ", ".join(extra) + ")") if extra else ""))


class _FerryPrefix(gdb.Command):
    """Commands that see ferry's loops and tasks."""

    def __init__(self):
        super().__init__("ferry", gdb.COMMAND_STACK, gdb.COMPLETE_NONE, True)


class _FerryLoops(gdb.Command):
    """List ferry's live loops.
Usage: ferry loops
For each loop: its address, the gdb thread that owns it, its live tasks
and the task it runs now."""

    def __init__(self):
        super().__init__("ferry loops", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        try:
            loops = _loops_or(None)
            if not loops:
                print("ferry: no live loop")
                return
            mine = _thread_loop()
            for loop in loops:
                th = _loop_thread(loop)
                cur = loop["current"]
                running = ("task %d '%s'" % (int(cur["id"]), _task_name(cur))
                           if int(cur) else "no task")
                print("loop 0x%x  thread %s  %d live task(s), running %s%s%s" % (
                    int(loop), th.num if th is not None else "?", int(loop["live"]),
                    running,
                    "  (this thread's)" if mine is not None and int(mine) == int(loop) else "",
                    _runtime_note(loop, "  runtime 0x%x, loop %d of %d")))
        except _FerryError as e:
            raise gdb.GdbError(str(e))


class _FerryTasks(gdb.Command):
    """List the live tasks of ferry's loops.
Usage: ferry tasks [LOOP]
LOOP is an expression for a ferry_loop pointer; without it, every live
loop.  For each task: id, name, state, what a waiting task waits on (the
kind of wait and the object), and how deep it has used its stack (as
ferry_loop_dump() counts it: whole pages, the deepest point reached)."""

    def __init__(self):
        super().__init__("ferry tasks", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        try:
            loops = _loops_or(arg.strip())
            if not loops:
                print("ferry: no live loop")
                return
            for loop in loops:
                _print_tasks(loop)
        except _FerryError as e:
            raise gdb.GdbError(str(e))


# The task `ferry bt` shows, while it runs: (saved registers by name).
_bt_regs = None


def _saved_registers(t, arch):
    """The registers of suspended task `t` where its switch left them: the
    caller of the switch's frame, as gdb unwinds to it."""
    ctx = t["ctx"]
    fields = [f.name for f in ctx.type.strip_typedefs().fields()]
    inf = gdb.selected_inferior()

    def word(addr):
        return int.from_bytes(bytes(inf.read_memory(addr, 8)), "little")

    if "uc" in fields:
        if "x86-64" not in arch:
            raise _FerryError("ferry: ferry bt with the ucontext switch knows x86_64 only")
        g = ctx["uc"]["uc_mcontext"]["gregs"]
        # glibc's REG_* indices.
        idx = {"r12": 4, "r13": 5, "r14": 6, "r15": 7, "rbp": 10, "rbx": 11,
               "rsp": 15, "rip": 16}
        return {r: int(g[i]) & 0xffffffffffffffff for r, i in idx.items()}
    sp = int(ctx["sp"])
    if "x86-64" in arch:
        # switch_x86_64.S pushed rbp rbx r12 r13 r14 r15, below the return
        # address.
        regs = {r: word(sp + 8 * i) for i, r in
                enumerate(("r15", "r14", "r13", "r12", "rbx", "rbp"))}
        regs["rip"] = word(sp + 48)
        regs["rsp"] = sp + 56
        return regs
    if "aarch64" in arch:
        # switch_aarch64.S: x19..x30 at sp+0..88, d8..d15 above; it returns
        # through x30 with sp + 176.
        regs = {"x%d" % (19 + i): word(sp + 8 * i) for i in range(12)}
        regs["pc"] = regs["x30"]
        regs["sp"] = sp + 176
        return regs
    raise _FerryError("ferry: ferry bt does not know the architecture %s" % arch)


class _FrameId(object):
    def __init__(self, sp, pc):
        self.sp = sp
        self.pc = pc


class _TaskUnwinder(gdb.unwinder.Unwinder):
    """While `ferry bt` runs, the innermost frame of the thread has the
    suspended task's frame as its caller."""

    def __init__(self):
        super().__init__("ferry-task")

    def __call__(self, pending):
        if _bt_regs is None or pending.level() != 0:
            return None
        arch = pending.architecture().name()
        spn, pcn = ("rsp", "rip") if "x86-64" in arch else ("sp", "pc")
        sp0 = pending.read_register(spn)
        pc0 = pending.read_register(pcn)
        info = pending.create_unwind_info(_FrameId(sp0, pc0))
        for name, val in _bt_regs.items():
            info.add_saved_register(name, gdb.Value(val).cast(pending.read_register(name).type))
        return info


def _find_task(spec, loop_arg):
    loops = _loops_or(loop_arg)
    if spec.startswith("0x"):
        addr = int(spec, 16)
        for loop in loops:
            for t in _tasks(loop):
                if int(t) == addr:
                    return t
        return gdb.Value(addr).cast(_task_t().pointer())
    found = []
    for loop in loops:
        for t in _tasks(loop):
            if (spec.isdigit() and int(t["id"]) == int(spec)) or _task_name(t) == spec:
                found.append((loop, t))
    if not found:
        raise _FerryError("ferry: no live task %s" % spec)
    if len(found) > 1:
        raise _FerryError("ferry: %d tasks match %s: give the loop, or the task's "
                          "address (ferry tasks lists them)" % (len(found), spec))
    return found[0][1]


def _frame_line(level, frame):
    name = frame.name() or "??"
    sal = frame.find_sal()
    where = ""
    if sal.symtab is not None:
        where = " at %s:%d" % (sal.symtab.filename, sal.line)
    elif frame.function() is None:
        lib = gdb.solib_name(frame.pc())
        if lib:
            where = " from %s" % lib
    inline = frame.type() == gdb.INLINE_FRAME
    pc = "" if inline and level > 0 else "0x%016x in " % frame.pc()
    return "#%-3d %s%s ()%s" % (level, pc, name, where)


def _select_level(level):
    """Select the thread's frame `level` again (the frame cache was
    flushed), or the innermost one if it is gone."""
    try:
        frame = gdb.newest_frame()
        for _ in range(level):
            older = frame.older()
            if older is None:
                break
            frame = older
        frame.select()
    except gdb.error:
        pass


class _FerryBt(gdb.Command):
    """Print the backtrace of a suspended ferry task.
Usage: ferry bt TASK [LOOP]
TASK is the task's id, its name, or its address (0x...); LOOP, an
expression for its ferry_loop pointer, when ids or names repeat across
loops.  The running task's stack is the thread's: use bt there."""

    def __init__(self):
        super().__init__("ferry bt", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        global _bt_regs
        argv = gdb.string_to_argv(arg)
        if not argv or len(argv) > 2:
            raise gdb.GdbError("usage: ferry bt TASK [LOOP]")
        try:
            t = _find_task(argv[0], argv[1] if len(argv) > 1 else None)
            state = int(t["state"])
            head = "task %d '%s' (%s)" % (int(t["id"]), _task_name(t),
                                          _STATES.get(state, str(state)))
            if state == 1:
                print("%s runs now: its stack is its thread's; use bt there" % head)
                return
            if state == 3:
                print("%s has ended: it has no stack" % head)
                return
            if not bool(t["started"]):
                fn = int(t["fn"])
                block = gdb.block_for_pc(fn)
                name = block.function.name if block is not None and block.function else "0x%x" % fn
                print("%s has not started: it will begin in %s(0x%x)" % (head, name, int(t["arg"])))
                return
            arch = gdb.selected_inferior().architecture().name()
            regs = _saved_registers(t, arch)
        except _FerryError as e:
            raise gdb.GdbError(str(e))
        print(head)
        try:
            selected = gdb.selected_frame().level()
        except gdb.error:
            raise gdb.GdbError("ferry bt: no frame (is the program running?)")
        _bt_regs = regs
        gdb.invalidate_cached_frames()
        try:
            frame = gdb.newest_frame().older()
            level = 0
            while frame is not None:
                print(_frame_line(level, frame))
                level += 1
                try:
                    frame = frame.older()
                except gdb.error as e:
                    print("ferry bt: the unwinding stopped: %s" % e)
                    break
        finally:
            _bt_regs = None
            gdb.invalidate_cached_frames()
            _select_level(selected)


_FerryPrefix()
_FerryLoops()
_FerryTasks()
_FerryBt()
gdb.unwinder.register_unwinder(None, _TaskUnwinder(), replace=True)
