"""`hourglass import --from-camellia`, `hourglass export` and `hourglass
import --from` against real processes: a real redis-server holding
camellia-delay-queue's layout (bench/camellia_layout.py, which follows
camellia's server code), real `hourglass serve` nodes, and the import run
as a user runs it, killed with SIGKILL midway and run again.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from camellia_layout import populate
from harness import every_message, hourglass_command
from serving import ROOT, Server, wait_for

redis = pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

pytestmark = pytest.mark.slow

N = 20_000
LIVE_AND_DEAD = "1,2,3,4,5,6,7"


def run(*args: str, check: bool = True) -> dict[str, object]:
    done = subprocess.run(hourglass_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}


def every_of(server: Server) -> dict[tuple[str, str], dict[str, Any]]:
    """Every message the node keeps; one listed twice fails."""
    found, twice = every_message(server)
    assert twice == 0, f"{twice} listed twice"
    return found


def digest(r: redis.Redis) -> str:
    """Every key of camellia's layout and its whole value, hashed: the same before and after means the
    import wrote nothing there."""
    h = hashlib.sha256()
    for key in sorted(r.scan_iter(match="camellia_delay_queue_*", count=1000)):
        kind = r.type(key)
        value = {b"string": lambda k: r.get(k), b"zset": lambda k: r.zrange(k, 0, -1, withscores=True),
                 b"list": lambda k: r.lrange(k, 0, -1)}[kind](key)
        h.update(repr((key, kind, value)).encode())
    return h.hexdigest()


def test_from_camellia_every_pending_message_once_across_a_kill9(own_redis_url, tmp_path: Path):
    redis_url = own_redis_url
    r = redis.Redis.from_url(redis_url)
    now = int(time.time() * 1000)
    populated = populate(r, "prod", N, now)
    before = digest(r)
    node = Server.start(tmp_path / "data", "--shards", "2", log_path=tmp_path / "serve.log")
    state = tmp_path / "import.state"
    try:
        args = ("import", "--url", node.base, "--from-camellia", redis_url, "--namespace", "prod",
                "--state", str(state))
        dry = run(*args[:-2], "--dry-run")
        assert dry["skipped"] == {**populated.left, "another namespace": 10, "would send": len(populated.expected)}
        assert every_of(node) == {}

        first = subprocess.Popen(hourglass_command(*args, "--rate", "3000", "--batch", "200"), cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: state.exists() and json.loads(state.read_text())["place"] != 0, 60,
                     "the import's first saved place")
            time.sleep(0.3)  # well inside a page: some of it sent, the rest not
            first.send_signal(signal.SIGKILL)
        finally:
            first.wait(10)
        kept = json.loads(state.read_text())
        assert not kept["done"] and 0 < kept["counts"]["sent"] < len(populated.expected)

        second = run(*args)
        assert second["done"] is True and second["refused"] == 0
        assert second["skipped"] == {**populated.left, "another namespace": 10}
        assert run(*args)["done"] is True  # a third run: finished, nothing sent

        stored = every_of(node)
        assert {key: row["triggerTime"] for key, row in stored.items()} == populated.expected
        assert all(row["status"] in (1, 2) for row in stored.values())
        consuming = [row for row in stored.values() if row["triggerTime"] == now - 100 + 30_000]
        assert consuming and all((row["maxRetry"], row["retry"]) == (3, 1) for row in consuming)  # (camellia's kept)
        assert digest(r) == before  # read only
    finally:
        node.stop()


def test_export_then_import_keeps_each_message_and_stores_nothing_twice(own_redis_url, tmp_path: Path):
    redis_url = own_redis_url
    old = Server.start(tmp_path / "old", log_path=tmp_path / "old.log")
    new_disk = Server.start(tmp_path / "new", "--shards", "2", log_path=tmp_path / "new.log")
    new_redis = Server.start(tmp_path / "new-redis", "--backend", redis_url, log_path=tmp_path / "new-redis.log")
    try:
        now = int(time.time() * 1000)
        msgs = [{"msg": f"body {i} \u00e9\n\"q\"", "msgId": f"m{i}", "triggerTime": now + 3_600_000 + i * 1000,
                 "ttlMillis": 7_200_000, "maxRetry": 5, "priority": i % 4,
                 **({"tag": f"tag{i % 3}"} if i % 2 else {}), **({"key": f"k{i % 5}"} if i % 7 == 0 else {})}
                for i in range(300)]
        status, answer = old.post_json("sendMsgBatch", {"topic": "orders", "msgs": msgs})
        assert status == 200 and answer["code"] == 200, answer
        status, answer = old.post_json("sendMsgBatch", {"topic": "due", "msgs": [
            {"msg": f"d{i}", "msgId": f"d{i}", "delayMillis": 0, "maxRetry": 3} for i in range(20)]})
        assert answer["code"] == 200, answer
        status, pulled = old.post("pullMsg", topic="due", batch=10)  # 10 consuming, retry 1
        assert len(pulled["delayMsgList"]) == 10
        for row in pulled["delayMsgList"][:4]:
            old.post("ackMsg", topic="due", msgId=row["msgId"], ack="true")
        status, answer = old.post_json("sendMsgBatch", {"topic": "dead", "msgs": [  # two expired, two ended
            {"msg": f"x{i}", "msgId": f"x{i}", "delayMillis": 0, "ttlMillis": 1 if i < 2 else 600_000, "maxRetry": 0}
            for i in range(4)]})
        assert answer["code"] == 200, answer
        time.sleep(0.1)
        status, pulled = old.post("pullMsg", topic="dead", batch=10)
        for row in pulled["delayMsgList"]:
            old.post("ackMsg", topic="dead", msgId=row["msgId"], ack="false")  # (no delivery left: ended, 6)
        before = every_of(old)
        assert sorted(row["status"] for k, row in before.items() if k[0] == "dead") == [5, 5, 6, 6]

        out = tmp_path / "export.jsonl"
        written = run("export", "--url", old.base, "--out", str(out))
        assert written["written"] == 320 and not (tmp_path / "export.jsonl.part").exists()
        for new in (new_disk, new_redis):
            for _ in range(2):  # the second stores nothing twice
                outcome = run("import", "--url", new.base, "--from", str(out))
                assert outcome["sent"] == 320 and outcome["refused"] == 0 and outcome["skipped"] == {}
            after = every_of(new)
            assert after.keys() == {k for k, row in before.items() if row["status"] != 4}
            for key, row in after.items():
                was = before[key]
                for field in ("msg", "triggerTime", "expireTime", "priority", "tag", "key", "maxRetry", "retry"):
                    assert row[field] == was[field], (key, field, new.base)
                # the dead dead (listDeadMsg shows them), a consuming one pending again (due at once)
                assert row["status"] == was["status"] if was["status"] in (5, 6) else row["status"] in (1, 2)
            code, dead = new.get("listDeadMsg", topic="dead")
            assert code == 200 and sorted(m["msgId"] for m in dead["delayMsgList"]) == ["x0", "x1", "x2", "x3"]
            for cursor in ("99999999999999999999", "s9.1", "x"):  # a cursor no page answered: 400, never a 500
                code, bad = new.get("exportMsg", topic="orders", cursor=cursor)
                assert code == 400 and "cursor" in bad["msg"], (new.base, cursor, bad)
        imported = every_of(new_redis)
        for source in (new_redis, new_disk):  # and back: from Redis (HSCAN's walk), from a node of shards
            back = tmp_path / f"back-{source.base.rsplit(':', 1)[1]}.jsonl"
            assert run("export", "--url", source.base, "--out", str(back))["written"] == len(imported)
            lines = [json.loads(line) for line in back.read_text().splitlines()]
            assert sorted((row["topic"], row["msgId"]) for row in lines) == sorted(imported)  # each once
            third = Server.start(tmp_path / f"third-{len(lines)}-{back.name}", log_path=tmp_path / "third.log")
            try:
                assert run("import", "--url", third.base, "--from", str(back))["sent"] == len(imported)
                again = every_of(third)
                assert again.keys() == imported.keys()
                assert all(again[k][f] == imported[k][f] for k in again for f in
                           ("msg", "triggerTime", "expireTime", "priority", "tag", "key", "maxRetry"))
            finally:
                third.stop()
    finally:
        for server in (old, new_disk, new_redis):
            server.stop()


def test_a_message_the_node_refuses_is_set_aside_and_the_rest_of_its_batch_stored(tmp_path: Path):
    node = Server.start(tmp_path / "data", "--max-msg-bytes", "100", log_path=tmp_path / "serve.log")
    try:
        now = int(time.time() * 1000)
        lines = [{"topic": "t", "msgId": f"m{i}", "msg": "y" * (200 if i == 3 else 10), "produceTime": now,
                  "triggerTime": now + 60_000, "expireTime": now + 120_000, "maxRetry": 2, "retry": 0, "status": 1}
                 for i in range(8)]
        lines.append({**lines[0], "msgId": "acked", "status": 4})
        source = tmp_path / "in.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json\n")
        rejects = tmp_path / "rejects.jsonl"
        outcome = run("import", "--url", node.base, "--from", str(source), "--rejects", str(rejects))
        assert outcome["sent"] == 7 and outcome["refused"] == 1
        assert outcome["skipped"] == {"acked": 1, "unreadable": 1}
        refused = [json.loads(line) for line in rejects.read_text().splitlines()]
        assert [(r["topic"], r["msgId"]) for r in refused] == [("t", "m3")] and "413" in refused[0]["reason"]
        assert sorted(k[1] for k in every_of(node)) == [f"m{i}" for i in range(8) if i != 3]
    finally:
        node.stop()


def test_bad_flags_answer_a_sentence(tmp_path: Path):
    for args, words in ((("--batch", "0"), "--batch must be in 1..1000"),
                        (("--namespace", "x"), "--namespace goes with --from-camellia")):
        done = subprocess.run(hourglass_command("import", "--url", "http://127.0.0.1:1", "--from", "nothing", *args),
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr
    done = subprocess.run(hourglass_command("import", "--url", "http://127.0.0.1:1", "--from", str(tmp_path / "none")),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot read" in done.stderr, done.stderr
