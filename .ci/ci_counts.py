"""Every collected test ran once: the tests `bash .ci/run`'s runs reported
(their JUnit XML files) against what pytest collects in this tree. Prints
the counts, and exits 1 naming what ran twice or not at all.

    .venv/bin/python .ci/ci_counts.py build/ci/compiled-parallel.xml build/ci/compiled-serial.xml build/ci/sources.xml
"""

from __future__ import annotations

import collections
import subprocess
import sys
import xml.etree.ElementTree as ET


def junit_ids(path: str) -> list[str]:
    """The tests a JUnit XML file reports, as `classname::name` (a test
    skipped, failed or passed alike: it was run)."""
    return [f"{case.get('classname')}::{case.get('name')}" for case in ET.parse(path).iter("testcase")]


def collected_ids(*selection: str) -> list[str]:
    """What pytest collects here (the sources' tree), as `classname::name`
    the way JUnit names a test: the module's dotted path, then its classes."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *selection],
                         capture_output=True, text=True, check=False)
    ids = []
    for line in out.stdout.splitlines():
        if "::" not in line:
            continue
        head, bracket, params = line.partition("[")  # (a parameter's id may hold "::" itself)
        path, *parts = head.split("::")
        module = path.removesuffix(".py").replace("/", ".")
        ids.append(f"{'.'.join([module, *parts[:-1]])}::{parts[-1]}{bracket}{params}")
    return ids


def main(paths: list[str]) -> int:
    runs = {path: junit_ids(path) for path in paths}
    ran = collections.Counter(test for ids in runs.values() for test in ids)
    every = collected_ids()
    before = len(every) + len(collected_ids("tests/unit", "tests/property", "tests/conformance"))
    for path, ids in runs.items():
        print(f"  {path}: {len(ids)} tests")
    print(f"  distinct tests run: {len(ran)} of {len(every)} collected; {sum(ran.values())} runs in all "
          f"(the earlier layout: {before} runs, every test on the sources and unit, property, conformance "
          f"again compiled)")
    twice = sorted(test for test, n in ran.items() if n > 1)
    missing = sorted(set(every) - set(ran))
    for test in twice:
        print(f"ran more than once: {test}", file=sys.stderr)
    for test in missing:
        print(f"collected but never run: {test}", file=sys.stderr)
    return 1 if twice or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
