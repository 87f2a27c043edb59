"""The group commit killed with SIGKILL at every point of a commit (before
a record's bytes are written, after, before its fsync, after its fsync
and before its answer; docs/internals.md, "How a node works"): a real child
process (commit_crash_child.py) kills itself there, the store is opened
again on its directory, and every id the child was told is stored is
there, body intact; what was appended but not answered may be there or
not, never torn; the reopened store takes new sends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from commit_crash_child import CONFIG, NOW_MS, TOPIC, body_for

from storage.store import NewMessage, Store

pytestmark = pytest.mark.slow

CHILD = os.path.join(os.path.dirname(__file__), "commit_crash_child.py")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["before-write", "after-write", "before-sync", "after-sync"])
def test_answered_sends_survive_a_kill_at_each_point_of_a_commit(tmp_path, point):
    directory = str(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.path.dirname(CHILD)]))
    child = subprocess.run([sys.executable, CHILD, directory, point, "40"], capture_output=True, text=True,
                           timeout=40, env=env)
    assert child.returncode == -signal.SIGKILL, f"the child did not die at {point}:\n{child.stderr}"
    answered = child.stdout.split()
    assert len(answered) >= 30, f"too few answered before the kill: {len(answered)}\n{child.stderr}"
    store = Store.open(directory, CONFIG, now_ms=NOW_MS)
    try:
        missing = [msg_id for msg_id in answered if store.get(TOPIC, msg_id) is None]
        assert not missing, f"{point}: {len(missing)} of {len(answered)} answered sends lost, e.g. {missing[:5]}"
        assert all(store.get(TOPIC, msg_id).msg == body_for(msg_id) for msg_id in answered)
        stored = sum(entries for _, entries, _ in store.hours())
        assert stored >= len(answered)
        store.send([NewMessage(TOPIC, "after", "x", NOW_MS, NOW_MS + 1, 60_000, 1)], NOW_MS)
        store.commit()
        assert store.get(TOPIC, "after") is not None
    finally:
        store.close()
