"""kill -9 of a real process: every id it reported committed is there after.

The child (kill9_child.py) commits batches and prints their ids after each
commit. The parent lets it run about a second, SIGKILLs it, reopens the
store on the same directory and checks every reported id, three times over,
so later runs also recover data left by earlier kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from harness import child_env
from kill9_child import CONFIG, TOPIC, body_for

from storage.store import Store

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill9_child.py")
# The child imports the code the parent does (harness.child_env): the tree's,
# or the installed build under PYTHONSAFEPATH (`bash .ci/run`'s compiled runs).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_MS = 490_000 * 3_600_000
RUNS = 3
RUN_SECONDS = 1.2


def _run_and_kill(directory: str, run: int) -> list[str]:
    """Start a child, let it commit for RUN_SECONDS after its first report,
    SIGKILL it; returns the ids of every complete line it printed."""
    child = subprocess.Popen(
        [sys.executable, CHILD, directory, f"r{run}", str(START_MS + run * 10**8)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(),
    )
    lines: list[str] = []
    first = threading.Event()

    def read() -> None:
        for line in child.stdout:
            lines.append(line)
            first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        started = first.wait(timeout=15)
        if started:
            time.sleep(RUN_SECONDS)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        reader.join(timeout=10)
        stderr = child.stderr.read()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL, f"child died on its own ({child.returncode}):\n{stderr}"
    assert started, f"child reported nothing within 15 s:\n{stderr}"
    return [msg_id for line in lines if line.endswith("\n") for msg_id in line.split()]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_committed_ids_survive_sigkill(tmp_path):
    directory = str(tmp_path)
    reported: list[str] = []
    for run in range(RUNS):
        new_ids = _run_and_kill(directory, run)
        assert new_ids, f"run {run} committed nothing"
        reported += new_ids
        store = Store.open(directory, CONFIG)
        try:
            missing = [msg_id for msg_id in reported if store.get(TOPIC, msg_id) is None]
            assert not missing, f"run {run}: {len(missing)} of {len(reported)} committed ids lost, e.g. {missing[:5]}"
            wrong = [msg_id for msg_id in reported if store.get(TOPIC, msg_id).msg != body_for(msg_id)]
            assert not wrong, f"run {run}: bodies differ for {wrong[:5]}"
            stored = sum(entries for _, entries, _ in store.hours())
            assert stored >= len(reported)
        finally:
            store.close()
