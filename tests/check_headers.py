#!/usr/bin/env python3
"""check_headers.py - every public function has its API tags.

For each function declared in include/ferry/*.h, find the comment that
documents it: the comment block right above it, or above the run of
declarations it belongs to (several functions may share one comment, as
ferry_sem_acquire_n() and ferry_sem_acquire() do).  That comment must carry
the tags `Thread:` and, unless the function returns void, `Returns:`.

    python3 tests/check_headers.py [INCLUDE_DIR] [--known NAME,NAME...]

Prints one line per function missing a tag and exits 1 if any does;
otherwise prints how many functions were checked and exits 0.  Functions
named with --known are gaps already reported to the header's owner: they
are listed as such and do not fail the check (a known gap that has been
fixed is listed too, so the list can shrink).
"""
import os
import re
import sys

DECL = re.compile(r'^(?P<ret>[A-Za-z_][\w \t\*]*?)\b(?P<name>ferry_\w+)\s*\(')


def declarations(lines):
    """Yield (index of first line, index of last line, name, return type)."""
    i = 0
    depth = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        # Skip struct/enum bodies (not extern "C" {) and preprocessor lines.
        if not stripped.startswith(('#', 'extern', '/*', '*')):
            depth += line.count('{') - line.count('}')
        m = DECL.match(line) if depth == 0 and not line.startswith((' ', '\t', '#')) else None
        if m and 'typedef' not in line and not stripped.startswith(('/*', '*')):
            j = i
            while ';' not in lines[j] and '{' not in lines[j] and j + 1 < len(lines):
                j += 1
            if lines[j].rstrip().endswith(';'):
                yield i, j, m.group('name'), m.group('ret').strip()
            i = j + 1
            continue
        i += 1


def comment_above(lines, first, decl_starts):
    """The comment block documenting the declaration starting at `first`."""
    k = first - 1
    # Walk up through the other declarations of the same run.
    while k >= 0 and lines[k].strip() and not lines[k].rstrip().endswith('*/'):
        if k in decl_starts or lines[k].strip().endswith((',', ');')) or \
                DECL.match(lines[k]) or lines[k].startswith((' ', '\t')):
            k -= 1
            continue
        return ''
    if k < 0 or not lines[k].rstrip().endswith('*/'):
        return ''
    end = k
    while k >= 0 and '/*' not in lines[k]:
        k -= 1
    return '\n'.join(lines[k:end + 1])


def main():
    args = sys.argv[1:]
    known = set()
    if '--known' in args:
        i = args.index('--known')
        known = {n for n in args[i + 1].split(',') if n}
        del args[i:i + 2]
    root = args[0] if args else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..', 'include', 'ferry')
    headers = sorted(f for f in os.listdir(root) if f.endswith('.h'))
    missing = []
    checked = 0
    for h in headers:
        with open(os.path.join(root, h)) as f:
            lines = f.read().split('\n')
        decls = list(declarations(lines))
        starts = {d[0] for d in decls}
        for first, _last, name, ret in decls:
            checked += 1
            comment = comment_above(lines, first, starts)
            need = ['Thread:']
            if not re.fullmatch(r'void', ret):
                need.append('Returns:')
            lacks = [t for t in need if t not in comment]
            if not comment:
                lacks = ['a comment'] + lacks
            if lacks and name in known:
                print('%s:%d: %s lacks %s (known gap)' % (h, first + 1, name, ', '.join(lacks)))
                known.discard(name)
            elif lacks:
                missing.append('%s:%d: %s lacks %s' % (h, first + 1, name, ', '.join(lacks)))
    for m in missing:
        print(m)
    for name in sorted(known):
        print('%s: listed as a known gap but has its tags now: drop it from --known' % name)
    print('check_headers: %d public functions in %d headers, %d missing a tag'
          % (checked, len(headers), len(missing)))
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
