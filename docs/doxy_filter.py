#!/usr/bin/env python3
"""doxy_filter.py FILE - feed a ferry header to Doxygen.

ferry's headers are documented in plain C comments (STYLE.md): the comment
above a declaration is its documentation, a comment after a struct field
documents the field.  Doxygen reads only /** ... */ comments, so this
filter, run by Doxygen on each header (INPUT_FILTER), turns:
  - the file's first comment into the file's documentation (@file);
  - a comment starting in column 0 into a /** documentation comment;
  - a trailing field comment "/* ... */" into "/**< ... */";
  - the tags Thread:, Suspends:, Returns:, Owns:, Requires: into bold
    lead-ins on lines of their own.
The header itself is not changed.
"""
import re
import sys

TAGS = re.compile(r'\b(Thread|Suspends|Returns|Owns|Requires|Result|Leader cancelled|Waiter cancelled):')


def main():
    text = open(sys.argv[1]).read()
    out = []
    first = True
    in_comment = False
    for line in text.split('\n'):
        if not in_comment and line.startswith('/*') and not line.startswith('/**'):
            if first:
                line = '/** @file\n *' + line[2:]
                first = False
            else:
                line = '/**' + line[2:]
            in_comment = '*/' not in line
        elif not in_comment and re.search(r'\S.*/\* ', line) and line.rstrip().endswith('*/') \
                and not line.lstrip().startswith('/*'):
            line = re.sub(r'/\* ', '/**< ', line, count=1)
        elif in_comment and '*/' in line:
            in_comment = False
        if in_comment or line.startswith('/**') or line.lstrip().startswith('*'):
            line = TAGS.sub(lambda m: '\n * <b>%s:</b>' % m.group(1), line)
        out.append(line)
    sys.stdout.write('\n'.join(out))


if __name__ == '__main__':
    main()
