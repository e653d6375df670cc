#!/usr/bin/env bash
# format_check.sh - check the library's sources against .clang-format:
# clang-format --dry-run -Werror over the C files of base/, src/, io/,
# bridge/, wire/, redis/, http/ and pq/ (or over the files named), printing
# each file that differs and how many of its lines would change.
#
#   bash tests/format_check.sh [FILE...]
#
# Environment: CLANG_FORMAT (default clang-format; Debian 12's is 14).
# Exit status: 0 if every file is formatted, 1 if one is not, 77 (a skip
# for ctest) when clang-format is missing.  Run by ctest (format_check) and so by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null; then
    echo "format_check: $cf not found (Debian: apt-get install clang-format)" >&2
    exit 77
fi
if [ $# -gt 0 ]; then
    files=("$@")
else
    mapfile -t files < <(find base src io bridge wire redis http pq -name '*.[ch]' | sort)
fi
bad=0
for f in "${files[@]}"; do
    if ! "$cf" --style="file:$root/.clang-format" --dry-run -Werror "$f" 2>/dev/null; then
        n=$("$cf" --style="file:$root/.clang-format" "$f" | diff "$f" - | grep -c '^[<>]' || true)
        echo "format_check: $f differs ($n lines)"
        bad=$((bad + 1))
    fi
done
if [ "$bad" -gt 0 ]; then
    echo "format_check: $bad of ${#files[@]} files differ from .clang-format"
    exit 1
fi
echo "format_check: ${#files[@]} files formatted"
