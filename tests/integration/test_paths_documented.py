"""docs/internals.md's "Three requests, file by file" is true: the calls a
send, a pull and an ack make from module to module, as bench/calls.py
--paths prints them from a running node of this tree's sources (a
profile hook sees no compiled call, so the sources are put first on the
path), are the lists the section gives, in order."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from harness import ROOT, child_env

SECTION = "### Three requests, file by file\n"
TITLES = {"send": "A send ", "pull": "A pull ", "ack": "An ack "}


def documented() -> dict[str, list[str]]:
    with open(os.path.join(ROOT, "docs", "internals.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ")]
    lists: dict[str, list[str]] = {}
    current = None
    for line in section.splitlines():
        for name, title in TITLES.items():
            if line.startswith(title):
                current = lists[name] = []
        item = re.fullmatch(r"\d+\. `([^`]+)` → `([^`]+)`", line)
        if item and current is not None:
            current.append(f"{item[1]}:{item[2]}")
    return lists


@pytest.mark.sources("bench/calls.py --paths hooks every Python call of a running node: a compiled module's calls "
                     "are C calls no hook sees")
def test_the_documented_paths_are_the_ones_a_running_node_takes():
    env = child_env(os.path.join(ROOT, "bench"))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "calls.py"), "--paths"],
                          capture_output=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    traced = json.loads(done.stdout)
    assert traced["compiled"] == [], "the sources must run for the hook to see each call"
    docs = documented()
    assert set(docs) == set(TITLES)
    for name in TITLES:
        assert docs[name] == traced[name]["entries"], (
            f"docs/internals.md's {name} path is not the one a node takes: regenerate it from "
            f"`PYTHONPATH=. .venv/bin/python bench/calls.py --paths --write-doc docs/internals.md`")
