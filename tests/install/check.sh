#!/usr/bin/env bash
# check.sh - install ferry into a temporary prefix, then build
# tests/install/main.c (and examples/hello.c) against that install twice: with CMake's
# find_package(ferry) (shared and static targets) and with a pkg-config
# one-liner (shared, and static with --static), and run every program.
# ferry is configured for one prefix and installed with `cmake --install
# --prefix` into another, as packagers and users of a staging directory do:
# the installed files must work from where they are, and nothing may point
# back at the configured prefix, which is never created.
# Usage: tests/install/check.sh [WORK_DIR]   (default: a temporary one)
# Extra CMake arguments for the ferry build: FERRY_INSTALL_CMAKE_ARGS.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-}
if [ -z "$work" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
prefix=$work/prefix
configured=$work/configured-prefix
jobs=${JOBS:-2}
rm -rf "$configured"

echo "== build for $configured, install into $prefix"
# shellcheck disable=SC2086
cmake -S "$root" -B "$work/ferry" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$configured" -DFERRY_TESTS=OFF -DFERRY_EXAMPLES=OFF \
    -DFERRY_BENCH=OFF ${FERRY_INSTALL_CMAKE_ARGS:-} >"$work/ferry-configure.log"
cmake --build "$work/ferry" -j"$jobs" >"$work/ferry-build.log"
cmake --install "$work/ferry" --prefix "$prefix" >"$work/ferry-install.log"
if [ -e "$configured" ]; then
    echo "install check: $configured exists, the install wrote there" >&2
    exit 1
fi
if grep -rl "$configured" "$prefix" >&2; then
    echo "install check: the files above name the configured prefix" >&2
    exit 1
fi

pcdir=$(dirname "$(find "$prefix" -name ferry.pc -print -quit)")
libdir=$(dirname "$pcdir")
test -f "$pcdir/ferry.pc"
test -f "$prefix/include/ferry/ferry.h"
# Name resolution under its own name, and the earlier name kept for
# programs that include it (main.c does).
test -f "$prefix/include/ferry/resolve.h"
test -f "$prefix/include/ferry/net.h"
test -f "$libdir/cmake/ferry/ferryConfig.cmake"
# The schedule fuzzing runner, installed and runnable.
"$prefix/bin/ferry-fuzz" --help >/dev/null
# The gdb extension: where gdb looks for the shared library's (the
# library's absolute path with -gdb.py appended, under gdb's auto-load
# directory), and a copy for `source`.
test -f "$prefix/share/gdb/auto-load$libdir/$(basename "$(realpath "$libdir/libferry.so")")-gdb.py"
test -f "$prefix/share/ferry/gdb/ferry_gdb.py"

echo "== find_package(ferry)"
cmake -S "$root/tests/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    >"$work/consumer-configure.log"
cmake --build "$work/consumer" -j"$jobs"
"$work/consumer/hello_shared"
"$work/consumer/hello_static"
if [ -f "$root/examples/hello.c" ]; then
    "$work/consumer/hello_example"
fi
# The shared program must really use the installed library.
# (ldd's output captured first: grep -q closing the pipe early would make
# ldd die of SIGPIPE, which pipefail turns into a failure.)
deps=$(ldd "$work/consumer/hello_shared")
grep -q "$libdir/libferry.so" <<<"$deps"
# The Redis part, when this build has it (hiredis found).
if [ -f "$pcdir/ferry-redis.pc" ]; then
    test -f "$prefix/include/ferry/redis.h"
    "$work/consumer/redis_shared"
    "$work/consumer/redis_static"
    deps=$(ldd "$work/consumer/redis_shared")
    grep -q "$libdir/libferry_redis.so" <<<"$deps"
elif [ -e "$prefix/include/ferry/redis.h" ]; then
    echo "install check: redis.h installed without the Redis part" >&2
    exit 1
fi

echo "== pkg-config"
export PKG_CONFIG_PATH=$pcdir
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -o "$work/hello_pc" "$root/tests/install/main.c" $(pkg-config --cflags --libs ferry)
LD_LIBRARY_PATH=$libdir "$work/hello_pc"
# Static libferry: the same flags with --static, libferry.a for -lferry.
# shellcheck disable=SC2046
$cc -o "$work/hello_pc_static" "$root/tests/install/main.c" $(pkg-config --cflags ferry) \
    $(pkg-config --static --libs ferry | sed "s#-lferry#$libdir/libferry.a#")
"$work/hello_pc_static"
if [ -f "$pcdir/ferry-redis.pc" ]; then
    # shellcheck disable=SC2046
    $cc -o "$work/redis_pc" "$root/tests/install/redis_main.c" \
        $(pkg-config --cflags --libs ferry-redis)
    LD_LIBRARY_PATH=$libdir "$work/redis_pc"
fi
echo "install check: passed"
