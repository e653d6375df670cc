#!/usr/bin/env bash
# gdb_check.sh - the gdb extension (tools/gdb/ferry_gdb.py) against
# tests/gdb_target.c, stopped in gdb_target_stopped() with tasks in every
# state: `ferry loops`, `ferry tasks` (names, states, waits, the stack used
# compared with ferry_loop_dump()'s figures) and `ferry bt` of suspended
# tasks (each names the task's own functions and none of the thread's), then
# the program continued to its normal end.
#
# The extension is not sourced: gdb must load it by itself, from the
# program's .debug_gdb_scripts entry (a program linked with libferry.a) or
# from the -gdb.py file beside libferry.so (one linked with the shared
# library); the check allows auto-loading from the program's and the
# library's directories only.
# Usage: tests/gdb_check.sh [--no-core] PROGRAM [LIBRARY_DIR]
# --no-core leaves out the core file (two gdb runs), which reads the same
# structures as the live program: for a second build of the same program.
# Exit 77 (skipped) when gdb, or its Python, is missing, or when gdb may
# not trace a program on this machine.
set -uo pipefail
core=1
if [ "${1:-}" = --no-core ]; then
    core=0
    shift
fi
target=$1
libdir=${2:-}
if ! command -v gdb >/dev/null 2>&1; then
    echo "gdb_check: SKIP: gdb is not installed"
    exit 77
fi
gdb_base=(timeout 120 gdb -nx -batch -iex "set debuginfod enabled off" -iex "set pagination off")
if ! "${gdb_base[@]}" -ex 'python print("py-ok")' 2>/dev/null | grep py-ok >/dev/null; then
    echo "gdb_check: SKIP: this gdb has no Python"
    exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
safe=(-iex "add-auto-load-safe-path $(dirname "$(realpath "$target")")")
if [ -n "$libdir" ]; then
    safe+=(-iex "add-auto-load-safe-path $(realpath "$libdir")")
fi
"${gdb_base[@]}" "${safe[@]}" \
    -ex "break gdb_target_stopped" -ex run -ex up \
    -ex "echo ==loops\n" -ex "ferry loops" \
    -ex "echo ==tasks\n" -ex "ferry tasks" \
    -ex "echo ==bt-lock\n" -ex "ferry bt waits_on_lock" \
    -ex "echo ==bt-deep\n" -ex "ferry bt deep" \
    -ex "echo ==bt-sleeper\n" -ex "ferry bt sleeper" \
    -ex "echo ==bt-yielder\n" -ex "ferry bt yielder" \
    -ex "echo ==bt-fresh\n" -ex "ferry bt fresh" \
    -ex "echo ==bt-thread2\n" -ex "ferry bt in_thread2" \
    -ex "echo ==bt-main\n" -ex "ferry bt main ferry__tls_loop" \
    -ex "echo ==bt-two\n" -ex "ferry bt main" \
    -ex "echo ==bt-none\n" -ex "ferry bt no_such_task" \
    -ex "echo ==bt-thread\n" -ex "bt" -ex "echo ==frame\n" -ex "frame" \
    -ex "echo ==end\n" -ex continue \
    "$target" >"$work/out" 2>&1
# A core file of the program (gcore), read by a second gdb: the extension
# reads memory only.  gcore cannot read a mapping with guard markers
# (MADV_GUARD_INSTALL, Linux 6.13 and later) and writes it as zeros, so
# this run uses the mprotect guards, each a mapping of its own that gcore
# skips.
if [ "$core" = 1 ]; then
    "${gdb_base[@]}" -ex "set environment FERRY_STACK_GUARD mprotect" \
        -ex "break gdb_target_stopped" -ex run -ex "generate-core-file $work/core" -ex kill \
        "$target" >"$work/gcore.out" 2>&1
    "${gdb_base[@]}" "${safe[@]}" \
        -ex "echo ==core-tasks\n" -ex "ferry tasks" \
        -ex "echo ==core-bt-lock\n" -ex "ferry bt waits_on_lock" \
        -ex "echo ==core-end\n" \
        "$target" "$work/core" >>"$work/out" 2>&1
    # The same with the default guards: where gcore cannot read the task
    # stacks (it warns "Memory read failed"), `ferry tasks` and `ferry bt`
    # must say that the tasks are not in the core and how to get them,
    # not show the zeros as a task.
    "${gdb_base[@]}" -ex "break gdb_target_stopped" -ex run \
        -ex "generate-core-file $work/core2" -ex kill \
        "$target" >"$work/gcore2.out" 2>&1
    "${gdb_base[@]}" "${safe[@]}" \
        -ex "echo ==zcore-tasks\n" -ex "ferry tasks" \
        -ex "echo ==zcore-bt\n" -ex "ferry bt waits_on_lock" \
        -ex "echo ==zcore-end\n" \
        "$target" "$work/core2" >>"$work/out" 2>&1
fi
cat "$work/out"
if grep "ptrace: Operation not permitted" "$work/out" >/dev/null &&
   ! grep "^Breakpoint 1, gdb_target_stopped" "$work/out" >/dev/null; then
    echo "gdb_check: SKIP: gdb cannot run a program here (ptrace not allowed)"
    exit 77
fi

fail=0
check() {    # check SECTION REGEX DESCRIPTION: a line of SECTION matches REGEX
    if ! section "$1" | grep -E -- "$2" >/dev/null; then
        echo "gdb_check: FAIL: $3 (no line of section $1 matches: $2)"
        fail=1
    fi
}
check_not() {    # check_not SECTION REGEX DESCRIPTION
    if section "$1" | grep -E -- "$2" >/dev/null; then
        echo "gdb_check: FAIL: $3 (section $1 matches: $2)"
        fail=1
    fi
}
# The output cut at the ==NAME lines gdb echoed: $work/sec-NAME.
awk -v dir="$work" '/^==[a-z0-9-]+$/ { f = dir "/sec-" substr($0, 3); next }
                    f { print > f }' "$work/out"
section() {
    cat "$work/sec-$1" 2>/dev/null
}
# The task line of NAME in `ferry tasks`.
task_line() {
    section tasks | grep -E "^ +[0-9]+ +'$1' "
}

check loops "^loop 0x[0-9a-f]+  thread 1  9 live task\(s\), running task [0-9]+ 'main'" \
    "ferry loops: the loop, its thread, its live tasks, the running one"
check loops "^loop 0x[0-9a-f]+  thread 2  2 live task\(s\), running no task$" \
    "ferry loops: the second thread's loop"
check tasks "^loop 0x[0-9a-f]+ \(thread 1\): 9 live task\(s\)" "ferry tasks: the loop's header"
check tasks "^loop 0x[0-9a-f]+ \(thread 2\): 2 live task\(s\)" "ferry tasks: the second loop's header"
check tasks "'in_thread2' +waiting +fd read" "the second loop's task waits on the pipe"
check loops "^loop 0x[0-9a-f]+  thread 3  2 live task\(s\), running no task  runtime 0x[0-9a-f]+, loop 0 of 2$" \
    "ferry loops: loop 0 of the runtime, with its runtime and index"
check loops "^loop 0x[0-9a-f]+  thread 4  1 live task\(s\), running no task  runtime 0x[0-9a-f]+, loop 1 of 2$" \
    "ferry loops: loop 1 of the runtime, on a thread of its own"
check tasks "^loop 0x[0-9a-f]+ \(thread 3, runtime 0x[0-9a-f]+, loop 0 of 2\): 2 live task\(s\)" \
    "ferry tasks: the runtime's loop 0"
check tasks "^loop 0x[0-9a-f]+ \(thread 4, runtime 0x[0-9a-f]+, loop 1 of 2\): 1 live task\(s\)" \
    "ferry tasks: the runtime's loop 1"
check tasks "'rt_caller' +waiting +call 0x" "a task of the runtime waits in a call to another loop"
check tasks "'call' +waiting +sleep " "the call's task sleeps on the other loop"
check tasks "'main' +waiting +join 0x" "the second loop's main task waits on a join"
check tasks "'main' +running " "the main task runs"
check tasks "'waits_on_lock' +waiting +lock 0x" "a task waits on the lock"
check tasks "'waits_on_queue' +waiting +queue get 0x" "a task waits on a queue get"
check tasks "'sleeper' +waiting +sleep .*\(timer\)" "a task sleeps, its timer armed"
check tasks "'selector' +waiting +select 0x" "a task waits in a select"
check tasks "'deep' +waiting +event 0x" "the deep task waits on the event"
check tasks "'joiner' +waiting +join 0x" "a task waits on a join"
check tasks "'yielder' +ready " "a task that yielded is ready"
check tasks "'fresh' +ready " "a task not started yet is ready"
check_not tasks "'finished'" "a task that ended is not live"

# What each waiting task waits on, object included: the dump's words.
for name in waits_on_lock waits_on_queue sleeper selector deep joiner; do
    dumped=$(grep -E "^  task #[0-9]+ '$name' " "$work/out" | head -n 1 | sed -E 's/ \(nil\)//' | sed -nE 's/.* waiting on ([a-z ]+( 0x[0-9a-f]+)?)(,|$).*/\1/p')
    if [ -z "$dumped" ] || ! task_line "$name" | grep -F -- " waiting  $dumped " >/dev/null; then
        echo "gdb_check: FAIL: '$name' waits on '${dumped}' in the dump, not so in gdb"
        fail=1
    fi
done
# Stack use: gdb's figure for each suspended task is ferry_loop_dump()'s.
for name in waits_on_lock waits_on_queue sleeper selector deep joiner yielder fresh; do
    dumped=$(grep -E "^  task #[0-9]+ '$name' " "$work/out" | head -n 1 | sed -E 's/.*stack used ([0-9]+ of [0-9]+ KiB).*/\1/')
    seen=$(task_line "$name" | sed -E 's/.* ([0-9]+ of [0-9]+ KiB).*/\1/')
    if [ -z "$dumped" ] || [ "$dumped" != "$seen" ]; then
        echo "gdb_check: FAIL: stack used by '$name': dump '${dumped}', gdb '${seen}'"
        fail=1
    fi
done
# The dump printed after gdb continued the program: the same figures.
for name in waits_on_lock waits_on_queue sleeper selector deep joiner yielder fresh; do
    before=$(grep -E "^  task #[0-9]+ '$name' " "$work/out" | head -n 1 | sed -E 's/.*(stack used .*)/\1/')
    after=$(section end | grep -E "^  task #[0-9]+ '$name' " | sed -E 's/.*(stack used .*)/\1/')
    if [ -z "$before" ] || [ "$before" != "$after" ]; then
        echo "gdb_check: FAIL: '$name': '${before}' before gdb read the stacks, '${after}' after"
        fail=1
    fi
done
deep_kib=$(task_line deep | sed -E 's/.* ([0-9]+) of [0-9]+ KiB.*/\1/')
if [ -z "$deep_kib" ] || [ "$deep_kib" -lt 256 ]; then
    echo "gdb_check: FAIL: the deep task's stack use is ${deep_kib:-?} KiB, not 256 or more"
    fail=1
fi

# Backtraces of suspended tasks: the call that suspended, the task's own
# function, the task entry; never the thread's own frames.
check bt-lock "^task [0-9]+ 'waits_on_lock' \(waiting\)" "ferry bt names the task"
check bt-lock " ferry_lock_acquire " "the lock waiter is in ferry_lock_acquire"
check bt-lock " waits_on_lock " "the lock waiter's backtrace has its body"
check bt-lock " ferry__task_entry " "the backtrace reaches the task entry"
check_not bt-lock "gdb_target_stopped|main_task" "the lock waiter's backtrace is not the thread's"
check bt-deep " ferry_event_wait " "the deep task waits in ferry_event_wait"
if [ "$(section bt-deep | grep -c ' recurse ')" -lt "$((256 + 1))" ]; then
    echo "gdb_check: FAIL: the deep task's backtrace has fewer than 257 recurse frames"
    fail=1
fi
check bt-deep " deep " "the deep task's backtrace has its body"
check bt-sleeper " ferry_sleep(_until)? " "the sleeper is in ferry_sleep"
check bt-sleeper " sleeper " "the sleeper's backtrace has its body"
check bt-yielder " (ferry_yield|yield_switch) " "the yielder is in ferry_yield (or its tail call)"
check bt-yielder " yielder " "the yielder's backtrace has its body"
check bt-fresh "^task [0-9]+ 'fresh' \(ready\)" "a task not started has a backtrace too"
check bt-fresh "has not started: it will begin in fresh\(0x" "a task not started names its body"
check bt-main "'main' \(running\) runs now" "the running task is sent to bt"
check bt-two "ferry: 3 tasks match main" "a name three loops use is ambiguous"
check bt-thread2 " ferry_wait_fd " "the other thread's task waits in ferry_wait_fd"
check bt-thread2 " in_thread2 " "the other thread's task's backtrace has its body"
check_not bt-thread2 "gdb_target_stopped|main_task" "the other thread's task's backtrace is not the thread's"
check bt-none "ferry: no live task no_such_task" "an unknown task is an error"
# After ferry bt, the thread's own backtrace is back.
check bt-thread " gdb_target_stopped " "bt after ferry bt shows the thread's frames"
check bt-thread " main_task " "bt after ferry bt shows the main task's frames"
if [ "$core" = 1 ]; then
    check core-tasks "'waits_on_lock' +waiting +lock 0x" "in a core file, a task waits on the lock"
    check core-tasks "'deep' +waiting +event 0x[0-9a-f]+ +[0-9]{3} of 1023 KiB" \
        "in a core file, the deep task's stack use"
    check core-bt-lock " ferry_lock_acquire " "in a core file, the lock waiter is in ferry_lock_acquire"
    check core-bt-lock " waits_on_lock " "in a core file, the lock waiter's backtrace has its body"
    check_not zcore-tasks "^ +0 +'' +ready" "a task read from zeros is not listed"
    if grep "Memory read failed" "$work/gcore2.out" >/dev/null; then
        check zcore-tasks "are not in this core file .*ulimit -c unlimited.*coredump_filter" \
            "a gcore core without the task stacks says so and how to get them"
        check zcore-bt "are not in this core file" "ferry bt on that core says so too"
    else
        check zcore-tasks "'waits_on_lock' +waiting +lock 0x" \
            "a gcore core with the default guards holds the tasks (no guard markers here)"
    fi
fi
check frame "^#1 .* in main_task " "ferry bt keeps the frame the user selected"
check end "gdb_target: done" "the program ran on to its end"
check end "exited normally" "the program exited 0"

if [ "$fail" -ne 0 ]; then
    exit 1
fi
echo "gdb_check: passed"
