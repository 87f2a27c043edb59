"""A real server whose data directory fills up: a tmpfs of a few MiB.

Sends answer 200 until the disk is full, then an error (never a crash: no
SIGBUS from a mapped file grown sparse, no half-stored batch) that does not
name the data directory's path (the log may); the node either keeps
answering or exits by itself with a message. Then the
directory is copied to a bigger disk and served again: every message that
was answered 200 is there.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid

import pytest
from harness import wait_until
from serving import Server

pytestmark = pytest.mark.slow

# (a fresh node's own files take some: the id and end indexes' first
# tables among them, about 1.3 MB each)
TMPFS_BYTES = 16 * 1024 * 1024
BODY = "x" * 3000
BATCH = 40


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_gives_clean_answers_and_loses_nothing_answered_200(small_disk, tmp_path):
    data = small_disk / "data"
    server = Server.start(data, log_path=tmp_path / "full.log")
    topic = "t-" + uuid.uuid4().hex[:8]
    rng = random.Random(7)
    stored: list[str] = []
    refusals = 0
    try:
        for n in range(10_000):
            msgs = [{"msg": BODY, "msgId": f"{n}-{i}",
                     # near, within the day, and days out: mapped and plain hour files
                     "delayMillis": rng.choice([1000, 3_600_000 * rng.randint(1, 30), 86_400_000 * 3])}
                    for i in range(BATCH)]
            try:
                status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
            except OSError:  # the node exited by itself: checked below
                break
            if status == 200:
                assert [m["msgId"] for m in body["delayMsgList"]] == [m["msgId"] for m in msgs]
                stored.extend(m["msgId"] for m in msgs)
                continue
            assert status in (503, 507), (status, body)
            assert isinstance(body, dict) and body.get("msg"), body  # an answer, not a dropped connection
            assert str(small_disk) not in body["msg"], body  # the path is the operator's, not the client's
            refusals += 1
            if refusals >= 20 or server.proc.poll() is not None:
                break
        assert stored, "nothing was stored before the disk filled up"
        assert refusals or server.proc.poll() is not None, "the disk never filled up"
        if server.proc.poll() is None:  # still up: it answers, and stops when asked
            status, body = server.get("/health")
            assert status == 200 and str(small_disk) not in str(body), body
            code = server.stop()
        else:
            code = server.proc.wait()
    finally:
        server.kill()
    with open(tmp_path / "full.log", encoding="utf-8", errors="replace") as f:
        log = f.read()
    assert code in (0, 1), f"exit code {code} (a negative one is a signal, e.g. SIGBUS)\n{log[-3000:]}"

    bigger = tmp_path / "bigger"
    shutil.copytree(data, bigger)
    server = Server.start(bigger, log_path=tmp_path / "bigger.log")
    try:
        for msg_id in stored:
            status, body = server.post("getMsg", topic=topic, msgId=msg_id)
            assert status == 200, (msg_id, status, body)
            assert body["delayMsg"]["msg"] == BODY
        status, _ = server.post_json("sendMsgBatch", {"topic": topic, "msgs": [{"msg": "after", "msgId": "after"}]})
        assert status == 200
    finally:
        assert server.stop() == 0


def test_a_cluster_node_stopped_on_a_full_disk_says_so_and_loses_nothing(tmp_path):
    """A cluster node whose data directory is full when it stops: its last
    checkpoint is refused (ENOSPC), which it logs and exits 1 for, not in
    a traceback (a fault drill's node died with one in its close), and the
    cluster's messages answered 200 are all there afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    from drill_nodes import Nodes

    nodes = Nodes.start(str(tmp_path / "nodes"), cluster=True, small_disk_mb=64)
    try:
        if nodes.small_disk is None:
            pytest.skip(nodes.disk_note)
        full = nodes.small_disk
        leader, _ = nodes.wait_leader()
        sent = []
        for n in range(200):
            status, body = nodes.servers[leader].post("sendMsg", topic="t", msg=BODY, msgId=f"m{n}",
                                                      delayMillis=3_600_000)
            if status == 200:
                sent.append(f"m{n}")
        assert len(sent) == 200
        end = nodes.log_ends()[leader] or 0
        wait_until(lambda: (nodes.log_ends().get(full) or 0) >= end, 10, f"{full} holding the log to {end}",
                   every_s=0.05)
        nodes.fill_disk(full)
        code = nodes.servers[full].stop()
        with open(nodes.servers[full].log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert code in (0, 1), log[-3000:]
        # it stopped through its own path, not in an uncaught traceback out of
        # broker/cli.py (pysyncobj's thread may log its own ENOSPC, and go on)
        assert "hourglass.server: stopped" in log and "broker/cli.py" not in log, log[-3000:]
        if code == 1:
            assert "the last checkpoint failed" in log, log[-3000:]
        nodes.free_disk(full)
        nodes.restart(full)
        try:
            wait_until(lambda: nodes.converged(at_least=0), 60, f"{full} following a leader again", every_s=0.05)
        except RuntimeError as e:  # what each node says, and the restarted node's own account
            healths = {n: nodes.health(n) for n in nodes.ids}
            raise AssertionError(f"{e}; healths: {healths}; {full}'s log: {nodes.servers[full].log_tail(3000)}") from e
        for msg_id in sent:
            status, body = nodes.servers[full].post("getMsg", topic="t", msgId=msg_id)
            assert status == 200 and body["delayMsg"]["msg"] == BODY, (msg_id, status, body)
    finally:
        nodes.stop()
