#!/usr/bin/env bash
# size_check.sh - no source file of the library over MAX_LINES lines and
# no function over MAX_FN lines.
#
#   bash tests/size_check.sh [ROOT]
#
# Reads the library's folders under ROOT (the source tree by default):
# base/, src/ (with src/ctx/ and src/port/), io/, bridge/ and wire/, and
# redis/ (the ferry_redis library), their .c and .h files.  A function is what starts with a line
# that is a lone "{" at the left margin (how every function body here
# opens) and ends at its matching brace; the braces are counted with
# comments, strings and character constants taken out.  Prints every
# offender, then a summary line, and exits 1 if there is one, 2 on a usage
# error.
set -euo pipefail

MAX_LINES=800
MAX_FN=100

if [ $# -gt 1 ]; then
    echo "usage: size_check.sh [ROOT]" >&2
    exit 2
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
files=()
for d in base src src/ctx src/port io bridge wire redis; do
    [ -d "$root/$d" ] || continue
    for f in "$root/$d"/*.c "$root/$d"/*.h; do
        [ -f "$f" ] && files+=("$f")
    done
done
if [ ${#files[@]} -eq 0 ]; then
    echo "size_check: no library sources under $root" >&2
    exit 2
fi

awk -v max_lines="$MAX_LINES" -v max_fn="$MAX_FN" -v root="$root/" '
function short(p) { return substr(p, 1, length(root)) == root ? substr(p, length(root) + 1) : p }
function report_file(    n) {
    if (fname == "") return
    if (lines > max_lines) {
        printf "size_check: %s: %d lines (over %d)\n", short(fname), lines, max_lines
        bad++
    }
}
FNR == 1 { report_file(); fname = FILENAME; lines = 0; depth = 0; incomment = 0; start = 0; nfiles++ }
{
    lines++
    raw = $0
    s = $0
    # Comments (possibly spanning lines), then strings and char constants.
    out = ""
    while (length(s)) {
        if (incomment) {
            i = index(s, "*/")
            if (!i) { s = ""; break }
            s = substr(s, i + 2); incomment = 0
            continue
        }
        i = index(s, "/*")
        if (!i) { out = out s; break }
        out = out substr(s, 1, i - 1); s = substr(s, i + 2); incomment = 1
    }
    s = out
    sub(/\/\/.*/, "", s)
    gsub(/\\./, "", s)
    gsub(/"[^"]*"/, "", s)
    gsub(/'\''[^'\'']*'\''/, "", s)
    if (depth == 0 && raw == "{") { start = FNR; name = prev; nfns++ }
    n = gsub(/\{/, "{", s); depth += n
    n = gsub(/\}/, "}", s); depth -= n
    if (start && depth == 0) {
        len = FNR - start + 1
        if (len > max_fn) {
            fn = name; sub(/\(.*/, "", fn); sub(/.*[ *]/, "", fn)
            printf "size_check: %s:%d: %s() is %d lines (over %d)\n", short(fname), start, fn, len, max_fn
            bad++
        }
        start = 0
    }
    if (raw ~ /^[A-Za-z_]/) prev = raw
}
END {
    report_file()
    if (bad) {
        printf "size_check: FAILED: %d over the limits (%d files, %d functions read)\n", bad, nfiles, nfns
        exit 1
    }
    printf "size_check: OK: %d files, %d functions, none over %d lines per file or %d per function\n", nfiles, nfns, max_lines, max_fn
}' "${files[@]}"
