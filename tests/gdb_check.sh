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
# Usage: tests/gdb_check.sh PROGRAM [LIBRARY_DIR]
# Exit 77 (skipped) when gdb, or its Python, is missing, or when gdb cannot
# run a program on this machine (no ptrace).
set -uo pipefail
target=$1
libdir=${2:-}
if ! command -v gdb >/dev/null 2>&1; then
    echo "gdb_check: SKIP: gdb is not installed"
    exit 77
fi
gdb_base=(gdb -nx -batch -iex "set debuginfod enabled off" -iex "set pagination off")
if ! "${gdb_base[@]}" -ex 'python print("py-ok")' 2>/dev/null | grep py-ok >/dev/null; then
    echo "gdb_check: SKIP: this gdb has no Python"
    exit 77
fi
if ! "${gdb_base[@]}" -ex run /bin/true 2>&1 | grep "exited normally" >/dev/null; then
    echo "gdb_check: SKIP: gdb cannot run a program here (ptrace not allowed?)"
    exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
safe=(-iex "add-auto-load-safe-path $(dirname "$(realpath "$target")")")
if [ -n "$libdir" ]; then
    safe+=(-iex "add-auto-load-safe-path $(realpath "$libdir")")
fi
"${gdb_base[@]}" "${safe[@]}" \
    -ex "break gdb_target_stopped" -ex run \
    -ex "echo ==loops\n" -ex "ferry loops" \
    -ex "echo ==tasks\n" -ex "ferry tasks" \
    -ex "echo ==bt-lock\n" -ex "ferry bt waits_on_lock" \
    -ex "echo ==bt-deep\n" -ex "ferry bt deep" \
    -ex "echo ==bt-sleeper\n" -ex "ferry bt sleeper" \
    -ex "echo ==bt-yielder\n" -ex "ferry bt yielder" \
    -ex "echo ==bt-fresh\n" -ex "ferry bt fresh" \
    -ex "echo ==bt-main\n" -ex "ferry bt main" \
    -ex "echo ==bt-none\n" -ex "ferry bt no_such_task" \
    -ex "echo ==bt-thread\n" -ex "bt" \
    -ex "echo ==end\n" -ex continue \
    "$target" >"$work/out" 2>&1
cat "$work/out"

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
section() {
    awk -v s="==$1" '$0 == s { on = 1; next } /^==/ { on = 0 } on' "$work/out"
}
# The task line of NAME in `ferry tasks`.
task_line() {
    section tasks | grep -E "^ +[0-9]+ +'$1' "
}

check loops "^loop 0x[0-9a-f]+  thread 1  9 live task\(s\), running task [0-9]+ 'main'" \
    "ferry loops: the loop, its thread, its live tasks, the running one"
check tasks "^loop 0x[0-9a-f]+ \(thread 1\): 9 live task\(s\)" "ferry tasks: the loop's header"
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
    dumped=$(grep -E "^  task #[0-9]+ '$name' " "$work/out" | sed -E 's/ \(nil\)//' | sed -nE 's/.* waiting on ([a-z ]+( 0x[0-9a-f]+)?)(,|$).*/\1/p')
    if [ -z "$dumped" ] || ! task_line "$name" | grep -F -- " waiting  $dumped " >/dev/null; then
        echo "gdb_check: FAIL: '$name' waits on '${dumped}' in the dump, not so in gdb"
        fail=1
    fi
done
# Stack use: gdb's figure for each suspended task is ferry_loop_dump()'s.
for name in waits_on_lock waits_on_queue sleeper selector deep joiner yielder fresh; do
    dumped=$(grep -E "^  task #[0-9]+ '$name' " "$work/out" | sed -E 's/.*stack used ([0-9]+ of [0-9]+ KiB).*/\1/')
    seen=$(task_line "$name" | sed -E 's/.* ([0-9]+ of [0-9]+ KiB).*/\1/')
    if [ -z "$dumped" ] || [ "$dumped" != "$seen" ]; then
        echo "gdb_check: FAIL: stack used by '$name': dump '${dumped}', gdb '${seen}'"
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
check bt-none "ferry: no live task no_such_task" "an unknown task is an error"
# After ferry bt, the thread's own backtrace is back.
check bt-thread " gdb_target_stopped " "bt after ferry bt shows the thread's frames"
check bt-thread " main_task " "bt after ferry bt shows the main task's frames"
check end "gdb_target: done" "the program ran on to its end"
check end "exited normally" "the program exited 0"

if [ "$fail" -ne 0 ]; then
    exit 1
fi
echo "gdb_check: passed"
