#!/usr/bin/env bash
# run-aarch64.sh - cross-build tests/ctx/test_ctx.c for aarch64 with the
# assembly switch (-O0 and -O2) and the ucontext fallback, and run each
# under qemu-aarch64.  Needs the Debian packages gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross and qemu-user.
# Usage: tests/ctx/run-aarch64.sh [BUILD_DIR]   (default: a temporary one)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cc=${AARCH64_CC:-aarch64-linux-gnu-gcc}
sysroot=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}
out=${1:-}
if [ -z "$out" ]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"

flags=(-g -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror
       -D_GNU_SOURCE -I"$root/src/ctx")
asm_src=("$root/src/ctx/switch_aarch64.S" "$root/src/ctx/ctx_asm.c")
uc_src=("$root/src/ctx/switch_ucontext.c")

failed=0
run() {
    local name=$1; shift
    echo "== aarch64 $name"
    "$cc" "${flags[@]}" "$@" "$root/tests/ctx/test_ctx.c" -o "$out/$name"
    if ! qemu-aarch64 -L "$sysroot" "$out/$name"; then
        echo "== aarch64 $name FAILED"
        failed=$((failed + 1))
    fi
}
run test_ctx_asm_O0 -O0 -DFERRY_CTX_ASM=1 "${asm_src[@]}"
run test_ctx_asm_O2 -O2 -DFERRY_CTX_ASM=1 "${asm_src[@]}"
run test_ctx_ucontext_O2 -O2 -DFERRY_CTX_UCONTEXT=1 "${uc_src[@]}"
[ "$failed" -eq 0 ]
