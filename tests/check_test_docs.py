#!/usr/bin/env python3
"""check_test_docs.py - every test the build registers is in docs/testing.md.

Asks ctest which tests the build directory holds (`ctest --show-only=json-v1`)
and keeps those registered by the top-level CMakeLists.txt (the layers test)
or by a CMakeLists.txt under tests/; the examples and the benchmark checks
are documented with the examples and in bench/README.md.  For each of them,
the test's name and the name of every program of the build that its command
runs must appear in the inventory, written as code: `name` or `name.c`
(`name.sh`, `name.py`).

    python3 tests/check_test_docs.py BUILD_DIR DOC [CTEST]

Prints one line per missing name and exits 1 if any is missing; otherwise
prints how many names it found and exits 0.  Exits 2 on a usage error or
when ctest lists no test at all, so that a broken listing cannot pass.
"""
import json
import os
import re
import subprocess
import sys


def source_dir(build):
    """The source directory the build directory was configured from."""
    with open(os.path.join(build, 'CMakeCache.txt'), encoding='utf-8') as f:
        for line in f:
            if line.startswith('CMAKE_HOME_DIRECTORY:'):
                return os.path.realpath(line.split('=', 1)[1].strip())
    raise SystemExit(f'check_test_docs: no CMAKE_HOME_DIRECTORY in {build}/CMakeCache.txt')


def registered(build, ctest):
    """Return [(test name, [program names])] for the tests under tests/."""
    out = subprocess.run([ctest, '--show-only=json-v1'], cwd=build,
                         check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    graph = data['backtraceGraph']
    files = graph['files']
    nodes = graph['nodes']
    build_tests = os.path.join(os.path.realpath(build), 'tests') + os.sep
    source = source_dir(build)
    top = os.path.join(source, 'CMakeLists.txt')
    under = os.path.join(source, 'tests') + os.sep
    found = []
    for test in data['tests']:
        node = nodes[test['backtrace']]
        where = os.path.realpath(files[node['file']])
        if where != top and not where.startswith(under):
            continue
        programs = []
        for arg in test.get('command', []):
            path = os.path.realpath(arg) if os.path.isabs(arg) else ''
            if path.startswith(build_tests) and os.access(path, os.X_OK):
                programs.append(os.path.basename(path))
        found.append((test['name'], programs))
    return found


def main(argv):
    if len(argv) not in (3, 4):
        print('usage: check_test_docs.py BUILD_DIR DOC [CTEST]', file=sys.stderr)
        return 2
    build, doc = argv[1], argv[2]
    ctest = argv[3] if len(argv) == 4 else 'ctest'
    try:
        with open(doc, encoding='utf-8') as f:
            text = f.read()
    except OSError as e:
        print(f'check_test_docs: {doc}: {e.strerror}', file=sys.stderr)
        return 2
    tests = registered(build, ctest)
    if not tests:
        print(f'check_test_docs: ctest lists no test in {build}', file=sys.stderr)
        return 2
    names = set()
    for name, programs in tests:
        names.add(name)
        names.update(programs)
    missing = []
    for name in sorted(names):
        pattern = r'`' + re.escape(name) + r'(\.c|\.sh|\.py)?`'
        if not re.search(pattern, text):
            missing.append(name)
    for name in missing:
        print(f'check_test_docs: `{name}` is registered in CMake but not in {doc}')
    if missing:
        return 1
    print(f'check_test_docs: {len(names)} tests and programs, all in {os.path.basename(doc)}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
