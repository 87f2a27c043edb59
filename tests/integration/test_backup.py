"""`hourglass backup` and `hourglass restore` against real nodes: a backup
taken while producers send, restored into a new data directory that a
node then opens; a backup killed with SIGKILL midway; a damaged backup; a
node that takes no backups (Redis).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from harness import hourglass_command
from serving import ROOT, Server, wait_for

pytestmark = pytest.mark.slow


def run(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(hourglass_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, (done.returncode, done.stderr[-3000:])
    return done


def status_of(server: Server, topic: str, msg_id: str) -> int | None:
    code, answer = server.post("getMsg", topic=topic, msgId=msg_id)
    if code == 404 or answer.get("code") == 404:
        return None
    assert code == 200, answer
    return answer["delayMsg"]["status"]


class Producer(threading.Thread):
    """Sends one message at a time until stopped; keeps when each send began and was answered."""

    def __init__(self, server: Server, name: str) -> None:
        super().__init__(daemon=True)
        self.server, self.name_ = server, name
        self.sent: list[tuple[str, float, float]] = []  # (msgId, began, answered 200)
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            msg_id = f"{self.name_}-{i}"
            began = time.monotonic()
            code, answer = self.server.post("sendMsg", topic="live", msgId=msg_id, msg=f"body {msg_id}",
                                            delayMillis=3_600_000)
            if code == 200 and answer["code"] == 200:
                self.sent.append((msg_id, began, time.monotonic()))
            i += 1


@pytest.mark.parametrize("shards", ["1", "2"])
def test_a_backup_taken_while_producers_send_restores_everything_answered_before_it(tmp_path: Path, shards: str):
    node = Server.start(tmp_path / "data", "--shards", shards, log_path=tmp_path / "serve.log")
    restored = None
    try:
        now = int(time.time() * 1000)
        for start in range(0, 3000, 500):
            _, answer = node.post_json("sendMsgBatch", {"topic": "t", "msgs": [
                {"msg": f"m{i} " + "x" * 200, "msgId": f"m{i}", "triggerTime": now + (i % 50) * 3_600_000 - 60_000}
                for i in range(start, start + 500)]})
            assert answer["code"] == 200, answer
        _, pulled = node.post("pullMsg", topic="t", batch=40)
        acked = [row["msgId"] for row in pulled["delayMsgList"][:20]]
        for msg_id in acked:
            node.post("ackMsg", topic="t", msgId=msg_id, ack="true")
        producers = [Producer(node, f"p{i}") for i in range(2)]
        for p in producers:
            p.start()
        time.sleep(0.5)
        began = time.monotonic()
        out = run("backup", "--url", node.base, "--to", str(tmp_path / "backup"))
        ended = time.monotonic()
        time.sleep(0.3)
        for p in producers:
            p.stop.set()
            p.join(30)
        taken = json.loads(out.stdout)
        assert taken["shards"] == int(shards) and len(taken["positions"]) == int(shards)
        assert not (tmp_path / "backup.part").exists()

        node.stop()
        restore = json.loads(run("restore", "--from", str(tmp_path / "backup"), "--data-dir",
                                 str(tmp_path / "restored")).stdout)
        assert restore["shards"] == int(shards)
        restored = Server.start(tmp_path / "restored", "--shards", shards, log_path=tmp_path / "restored.log")
        for i in range(0, 3000, 7):
            want = 4 if f"m{i}" in acked else None
            got = status_of(restored, "t", f"m{i}")
            assert got is not None and (want is None or got == want), (i, got)
        before = [m for p in producers for m, _, answered in p.sent if answered < began]
        after = [m for p in producers for m, started, _ in p.sent if started > ended]
        assert before and after
        assert all(status_of(restored, "live", m) == 1 for m in before)  # answered 200 before: there
        assert all(status_of(restored, "live", m) is None for m in after)  # begun after: not there at all
    finally:
        node.stop()
        if restored is not None:
            restored.stop()


@pytest.mark.parametrize("shards", ["1", "2"])
def test_a_second_backup_to_the_same_place_fetches_only_what_changed(tmp_path: Path, shards: str):
    """The far messages' delay logs, whole in the first backup, are copied
    from it, not sent again; one the first backup holds damaged is sent
    whole; the restore has every message of both rounds."""
    node = Server.start(tmp_path / "data", "--shards", shards, log_path=tmp_path / "serve.log")
    restored = None
    far = 30 * 24 * 3_600_000  # (a span's files)

    def send(first: int, count: int) -> None:
        now = int(time.time() * 1000)
        for start in range(first, first + count, 500):
            _, answer = node.post_json("sendMsgBatch", {"topic": "t", "msgs": [
                {"msg": f"m{i} " + "x" * 3000, "msgId": f"m{i}", "triggerTime": now + far + (i % 97) * 60_000}
                for i in range(start, start + 500)]})
            assert answer["code"] == 200, answer

    try:
        send(0, 4000)
        first = json.loads(run("backup", "--url", node.base, "--to", str(tmp_path / "backup")).stdout)
        assert first["kept"] == 0 and first["received"] > 10_000_000
        send(4000, 500)
        second = json.loads(run("backup", "--url", node.base, "--to", str(tmp_path / "backup")).stdout)
        assert second["kept"] > 10_000_000, second  # the first round's bodies: not sent again
        assert second["received"] < first["received"] / 2, (first, second)
        logs = sorted((tmp_path / "backup").rglob("delay/*.log"), key=lambda p: p.stat().st_size)
        damaged = bytearray(logs[-1].read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        logs[-1].write_bytes(bytes(damaged))
        third = json.loads(run("backup", "--url", node.base, "--to", str(tmp_path / "backup")).stdout)
        assert third["kept"] < second["kept"]  # (the damaged one sent whole)
    finally:
        node.stop()
    try:
        run("restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
        restored = Server.start(tmp_path / "restored", "--shards", shards, log_path=tmp_path / "restored.log")
        assert all(status_of(restored, "t", f"m{i}") == 1 for i in range(0, 4500, 3))
        assert status_of(restored, "t", "m4499") == 1
    finally:
        if restored is not None:
            restored.stop()


def test_a_backup_killed_midway_leaves_nothing_a_restore_takes(tmp_path: Path):
    node = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log")
    try:
        now = int(time.time() * 1000)
        for start in range(0, 20_000, 1000):  # some 100 MB of bodies: the stream takes a while
            _, answer = node.post_json("sendMsgBatch", {"topic": "t", "msgs": [
                {"msg": "y" * 5000, "msgId": f"m{i}", "triggerTime": now + 3_600_000} for i in range(start, start + 1000)]})
            assert answer["code"] == 200, answer
        proc = subprocess.Popen(hourglass_command("backup", "--url", node.base, "--to", str(tmp_path / "backup")), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: any((tmp_path / "backup.part").rglob("*.log")), 60, "the backup's first file")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert not (tmp_path / "backup").exists()
        for source in ("backup", "backup.part"):
            done = run("restore", "--from", str(tmp_path / source), "--data-dir", str(tmp_path / "new"), code=2)
            assert "no whole backup" in done.stderr and not (tmp_path / "new").exists()
        run("backup", "--url", node.base, "--to", str(tmp_path / "backup"))  # the next one is whole, and served
        assert (tmp_path / "backup" / "manifest.json").exists()
    finally:
        node.stop()


def test_a_damaged_or_missing_file_is_refused_by_name_and_nothing_restored(tmp_path: Path):
    node = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log")
    try:
        node.post("sendMsg", topic="t", msgId="a", msg="hello", delayMillis=60_000)
        run("backup", "--url", node.base, "--to", str(tmp_path / "backup"))
    finally:
        node.stop()
    checkpoint = tmp_path / "backup" / "shard-0" / "checkpoint"
    data = bytearray(checkpoint.read_bytes())
    data[-1] ^= 0xFF
    checkpoint.write_bytes(bytes(data))
    done = run("restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "new"), code=2)
    assert "shard-0/checkpoint is damaged" in done.stderr and not (tmp_path / "new").exists()
    checkpoint.unlink()
    done = run("restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "new"), code=2)
    assert "shard-0/checkpoint is missing" in done.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    done = run("restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "full"), code=2)
    assert "is not empty" in done.stderr


def test_a_node_on_redis_answers_that_it_takes_no_backups(own_redis_url, tmp_path: Path):
    redis_url = own_redis_url
    pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
    node = Server.start(tmp_path / "data", "--backend", redis_url, log_path=tmp_path / "serve.log")
    try:
        done = run("backup", "--url", node.base, "--to", str(tmp_path / "backup"), code=1)
        assert "serves no backups" in done.stderr and not (tmp_path / "backup").exists()
    finally:
        node.stop()


def test_a_backup_of_a_cluster_node_is_taken_from_a_follower_while_the_group_serves(tmp_path: Path):
    """From a follower, while the leader takes sends: every message the
    leader answered before the backup began is in it, and a restore opens
    as a standalone node holding them; the group served throughout."""
    from cluster import Cluster  # (bench/cluster.py, on the tests' path)

    cluster = Cluster.start(tmp_path / "cluster")
    restored = None
    try:
        leader = cluster.wait_leader()
        cluster.wait_known(leader)
        node = cluster.nodes[leader]
        follower = next(n for n in cluster.nodes if n != leader)
        now = int(time.time() * 1000)
        for start in range(0, 2000, 500):
            _, answer = node.post_json("sendMsgBatch", {"topic": "t", "msgs": [
                {"msg": f"m{i} " + "x" * 300, "msgId": f"m{i}", "triggerTime": now + 3_600_000 + i * 1000}
                for i in range(start, start + 500)]})
            assert answer["code"] == 200, answer
        deadline = time.monotonic() + 15  # the follower has the leader's log
        while len(set(cluster.log_ends().values())) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        producer = Producer(node, "p")
        producer.start()
        time.sleep(1.5)
        began = time.monotonic()
        taken = json.loads(run("backup", "--url", cluster.url(follower), "--to", str(tmp_path / "backup")).stdout)
        time.sleep(0.3)
        producer.stop.set()
        producer.join(30)
        assert taken["shards"] == 1 and taken["bytes"] > 600_000, taken
        assert cluster.leader() is not None and cluster.leader()[0] == leader  # (no election: the group went on)
        answered = [m for m, _, done in producer.sent if done < began - 0.5]  # (replicated to the follower by then)
        assert len(producer.sent) > 20 and answered
    finally:
        cluster.stop()
    try:
        run("restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
        restored = Server.start(tmp_path / "restored", log_path=tmp_path / "restored.log")
        assert all(status_of(restored, "t", f"m{i}") == 1 for i in range(0, 2000, 7))
        assert all(status_of(restored, "live", m) == 1 for m in answered)
    finally:
        if restored is not None:
            restored.stop()


@pytest.mark.parametrize("shards", ["1", "2"])
def test_a_stopped_nodes_data_directory_is_backed_up_and_a_running_ones_refused(tmp_path: Path, shards: str):
    node = Server.start(tmp_path / "data", "--shards", shards, log_path=tmp_path / "serve.log")
    restored = None
    try:
        now = int(time.time() * 1000)
        _, answer = node.post_json("sendMsgBatch", {"topic": "t", "msgs": [
            {"msg": f"m{i}", "msgId": f"m{i}", "triggerTime": now + 3_600_000 + i} for i in range(300)]})
        assert answer["code"] == 200, answer
        producer = Producer(node, "p")
        producer.start()
        time.sleep(0.3)
        done = run("backup", "--data-dir", str(tmp_path / "data"), "--to", str(tmp_path / "backup"), code=2)
        producer.stop.set()
        producer.join(30)
        assert "a node runs on it" in done.stderr
        assert not (tmp_path / "backup").exists() and not (tmp_path / "backup.part").exists()
    finally:
        node.stop()
    try:
        taken = json.loads(run("backup", "--data-dir", str(tmp_path / "data"), "--to", str(tmp_path / "backup")).stdout)
        assert taken["shards"] == int(shards) and taken["files"] > 0
        run("restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
        restored = Server.start(tmp_path / "restored", "--shards", shards, log_path=tmp_path / "restored.log")
        assert all(status_of(restored, "t", f"m{i}") == 1 for i in range(300))
        assert all(status_of(restored, "live", m) == 1 for m, _, _ in producer.sent)
    finally:
        if restored is not None:
            restored.stop()
    done = run("backup", "--data-dir", str(tmp_path / "nothing"), "--to", str(tmp_path / "b2"), code=2)
    assert "not a directory" in done.stderr
