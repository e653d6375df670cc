#!/usr/bin/env bash
# layers.sh - the direction check: no object of a layer of the library
# refers to a symbol defined in a layer above it.
#
#   bash tests/layers.sh NM LIST
#
# LIST (written by CMakeLists.txt) has one line per layer, bottom first:
# the layer's OBJECT library name and its object files, separated by ';'.
# The layers are base, loop (src/, the core), io, bridge and wire: base may
# refer to no other layer, the loop only to base, io to base and the loop,
# the bridge to those three, wire to all four (docs/design.md, "Layout").  For each object, NM lists the
# symbols it refers to (nm -u) and the global ones it defines; a reference
# to a symbol that a higher layer defines fails the check, naming both
# objects.  Prints, per layer, how many of its references go to each layer
# below, and exits 1 on a wrong-way reference, 2 on a usage error.
set -euo pipefail

if [ $# -ne 2 ] || [ ! -r "$2" ]; then
    echo "usage: layers.sh NM LIST" >&2
    exit 2
fi
nm=$1
list=$2
table=$(mktemp)
trap 'rm -f "$table"' EXIT

# One line per symbol: LEVEL LAYER OBJECT KIND SYMBOL, KIND U (referred
# to) or D (defined, global).
level=0
while read -r layer objs; do
    [ -n "$layer" ] || continue
    IFS=';' read -r -a files <<<"$objs"
    if [ ${#files[@]} -eq 0 ]; then
        echo "layers: $layer has no objects" >&2
        exit 2
    fi
    for o in "${files[@]}"; do
        if [ ! -r "$o" ]; then
            echo "layers: cannot read $o (build the library first)" >&2
            exit 2
        fi
    done
    # -A: each line starts with its object's path and a colon (GNU nm and
    # llvm-nm differ in what follows); the symbol is last, its type before.
    "$nm" -A -u "${files[@]}" | awk -v l="$level" -v n="$layer" '
        { o = $0; sub(/:.*/, "", o); print l, n, o, "U", $NF }' >>"$table"
    "$nm" -A --defined-only "${files[@]}" | awk -v l="$level" -v n="$layer" '
        $(NF - 1) ~ /^[A-Z]$/ { o = $0; sub(/:.*/, "", o); print l, n, o, "D", $NF }' >>"$table"
    level=$((level + 1))
done <"$list"

awk '
function short(path) { sub(/.*\/CMakeFiles\/[^\/]*\.dir\//, "", path); return path }
$4 == "D" { if (!($5 in deflevel)) { deflevel[$5] = $1; defobj[$5] = $3 } }
$4 == "U" { n++; ul[n] = $1; un[n] = $2; uo[n] = $3; us[n] = $5 }
{ name[$1] = $2; if ($1 > top) top = $1; objs[$1 " " $3] = 1 }
END {
    bad = 0
    for (o in objs) { split(o, p, " "); nobj[p[1]]++ }
    for (i = 1; i <= n; i++) {
        s = us[i]
        if (!(s in deflevel)) continue          # libc, libevent, pthreads
        d = deflevel[s]
        if (d == ul[i]) continue                 # within the layer
        if (d > ul[i]) {
            printf "layers: WRONG WAY: %s (%s) refers to %s, defined in %s (%s)\n",
                   short(uo[i]), un[i], s, short(defobj[s]), name[d]
            bad++
            continue
        }
        key = ul[i] " " d " " s
        if (!(key in seen)) { seen[key] = 1; uses[ul[i] " " d]++ }
    }
    for (l = 0; l <= top; l++) {
        line = sprintf("layers: %-14s %2d objects; uses", name[l], nobj[l])
        any = 0
        for (d = 0; d < l; d++) {
            line = line sprintf("%s %s: %d symbols", any ? "," : "", name[d], uses[l " " d] + 0)
            any = 1
        }
        if (!any) line = line " no other layer"
        print line
    }
    if (bad) {
        printf "layers: FAILED: %d reference(s) run upwards\n", bad
        exit 1
    }
    print "layers: OK: every reference between layers runs downwards"
}' "$table"
