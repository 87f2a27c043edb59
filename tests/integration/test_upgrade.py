"""Data directories written by earlier versions open with today's node
(docs/operations.md, Upgrades and downgrades).

Each fixture of tests/fixtures/upgrade/ is a data directory that a node of
an older commit wrote (tests/fixtures/make_upgrade_fixture.py, run by that
commit's code), with a manifest of every message it holds and what getMsg
answered before the stop. Today's node (a real process) opens each, and:
every message is still there, unchanged; what is due now is delivered
exactly once, what is not due is not delivered, what had ended stays
ended; the schedule and the push subscription are still there; a keyed
lookup finds the key's messages. The manifest's times are the wall clock
of the day the fixture was made, so what is due is worked out from the
clock now (a ttl runs out too: the older versions cap it at 30 days).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from harness import wait_until
from serving import Server, free_port, request

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "upgrade"
NAMES = sorted(p.name.removesuffix(".tar.gz") for p in FIXTURES.glob("*.tar.gz"))
# Within this much of a trigger, expiry or ack deadline, a message may be
# delivered or not: the test does not rule on it.
MARGIN_MS = 60_000
ENDED = {4, 5, 6, 7}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def unpack(name: str, into: Path) -> tuple[Path, dict[str, Any]]:
    with tarfile.open(FIXTURES / f"{name}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    for path in (into / "data", *(into / "data").rglob("*")):  # older nodes left group and others in:
        path.chmod(path.stat().st_mode & 0o700)                  # the upgrade's chmod (docs/operations.md)
    manifest: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return into / "data", manifest


def due_now(m: dict[str, Any], at_ms: int, ack_timeout_ms: int) -> bool | None:
    """True: due and deliverable at `at_ms`; False: not (waiting, ended,
    consuming, or expired); None: too near a boundary to say."""
    if m["status"] in ENDED:
        return False
    start = m["triggerTime"]
    if m["status"] == 3:  # consuming: back once its ack deadline passed
        start = m["pulledAt"] + ack_timeout_ms
    if abs(at_ms - start) < MARGIN_MS or abs(at_ms - m["expireTime"]) < MARGIN_MS:
        return None
    return start <= at_ms < m["expireTime"]


def start_today(data: Path, tmp_path: Path, manifest: dict[str, Any], *flags: str) -> Server:
    if manifest["subscription"]:
        flags = (*flags, "--push-allow", "127.0.0.1")
    return Server.start(data, *flags, log_path=tmp_path / "serve.log")


def pull_everything(server: Server, topics: set[str], expected: set[tuple[str, str]],
                    limit_s: float = 30) -> list[dict[str, Any]]:
    """Pull and ack until every expected message came (or `limit_s`), then
    pull each topic again for a second to catch a late duplicate."""
    pulled: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    quiet_until = None
    while True:
        got_any = False
        for topic in sorted(topics):
            _, answer = server.post("pullMsg", topic=topic, batch=100, ackTimeoutMillis=3_600_000)
            assert isinstance(answer, dict) and answer["code"] == 200, answer
            answered_ms = now_ms()
            for m in answer["delayMsgList"]:
                assert m["triggerTime"] <= answered_ms, f"delivered early: {m}"
                pulled.append(m)
                got_any = True
                _, ack = server.post("ackMsg", topic=topic, msgId=m["msgId"])
                assert isinstance(ack, dict) and ack["code"] == 200, ack
        seen = {(m["topic"], m["msgId"]) for m in pulled}
        if quiet_until is None and (expected <= seen or time.monotonic() > deadline):
            quiet_until = time.monotonic() + 1.0
        if quiet_until is not None and time.monotonic() > quiet_until:
            return pulled
        if not got_any:
            time.sleep(0.05)


def check_opened(server: Server, manifest: dict[str, Any]) -> None:
    messages = manifest["messages"]
    ack_timeout_ms = manifest["ackTimeoutMillis"]
    before = {(m["topic"], m["msgId"]): m for m in messages}

    # Every message is there, as it was sent.
    for (topic, msg_id), m in before.items():
        _, answer = server.post("getMsg", topic=topic, msgId=msg_id)
        assert isinstance(answer, dict) and answer["code"] == 200, (msg_id, answer)
        now = answer["delayMsg"]
        for field in ("msg", "triggerTime", "expireTime", "produceTime", "maxRetry", "tag", "key"):
            if field in m:
                assert now[field] == m[field], (msg_id, field, m, now)
        if m["status"] in ENDED:
            assert now["status"] == m["status"], (msg_id, m, now)

    started_ms = now_ms()
    due = {k: due_now(m, started_ms, ack_timeout_ms) for k, m in before.items()}
    expected = {k for k, d in due.items() if d}
    maybe = {k for k, d in due.items() if d is None}
    topics = {m["topic"] for m in messages} | {s["topic"] for s in manifest["schedules"]}
    pulled = pull_everything(server, topics, expected)

    ids = [(m["topic"], m["msgId"]) for m in pulled]
    assert len(ids) == len(set(ids)), f"delivered twice: {sorted(k for k in ids if ids.count(k) > 1)}"
    assert set(ids) - expected - maybe == set(), f"delivered but not due: {sorted(set(ids) - expected - maybe)}"
    assert expected - set(ids) == set(), f"due but never delivered: {sorted(expected - set(ids))}"
    for m in pulled:
        assert m["retry"] == before[(m["topic"], m["msgId"])]["retry"] + 1, m

    # After: the delivered ones acked, the others as they were.
    for key, m in before.items():
        _, answer = server.post("getMsg", topic=key[0], msgId=key[1])
        assert isinstance(answer, dict) and answer["code"] == 200, (key, answer)
        now = answer["delayMsg"]["status"]
        if key in ids:
            assert now == 4, (key, now)
        elif m["status"] in ENDED:
            assert now == m["status"], (key, m["status"], now)
        elif key not in maybe and m["triggerTime"] > started_ms:
            assert now == 1, (key, now)  # still waiting: nothing early

    for schedule in manifest["schedules"]:
        _, answer = server.get("getSchedule", topic=schedule["topic"], scheduleId=schedule["scheduleId"])
        assert isinstance(answer, dict) and answer["code"] == 200, answer
        assert answer["schedule"]["everyMillis"] == schedule["everyMillis"]
        assert answer["schedule"]["startTime"] == schedule["startTime"] and answer["schedule"]["runs"] == 1
        next_fire_ms = answer["schedule"]["nextFireTimes"][0]
        if schedule["startTime"] > now_ms():  # its next run waits as a message
            _, answer = server.get("listMsg", topic=schedule["topic"], status="1,2,3,4,5,6,7")
            assert isinstance(answer, dict) and answer["code"] == 200, answer
            [run] = answer["delayMsgList"]
            assert run["msgId"] == f"{schedule['scheduleId']}@{run['triggerTime']}" and run["status"] == 1
            assert schedule["startTime"] <= run["triggerTime"] == next_fire_ms
    if manifest["subscription"]:
        sub = manifest["subscription"]
        _, answer = server.get("getSubscription", topic=sub["topic"])
        assert isinstance(answer, dict) and answer["code"] == 200, answer
        assert answer["data"]["url"] == sub["url"]

    # The key index (rebuilt where its layout is older) finds a key's messages.
    for key in sorted({m["key"] for m in messages if m.get("key")}):
        _, answer = server.get("listMsg", topic="up", key=key, status="1,2,3,4,5,6,7")
        assert isinstance(answer, dict) and answer["code"] == 200, answer
        assert {m["msgId"] for m in answer["delayMsgList"]} == {
            m["msgId"] for m in messages if m["topic"] == "up" and m.get("key") == key}


@pytest.mark.parametrize("name", NAMES)
def test_an_older_data_directory_opens_with_nothing_lost_early_or_twice(name, tmp_path):
    data, manifest = unpack(name, tmp_path)
    server = start_today(data, tmp_path, manifest, "--shards", "auto")
    try:
        check_opened(server, manifest)
        assert server.stop() == 0
        # And once more after today's node wrote it: nothing comes back.
        server = start_today(data, tmp_path, manifest, "--shards", "auto")
        for m in manifest["messages"]:
            _, answer = server.post("getMsg", topic=m["topic"], msgId=m["msgId"])
            assert isinstance(answer, dict) and answer["code"] == 200, answer
        assert pull_everything(server, {m["topic"] for m in manifest["messages"]}, set(), limit_s=0) == []
    finally:
        server.stop()


def test_the_fixtures_cover_every_older_format():
    """What the fixtures hold, by the formats they were written in (if a
    fixture is remade, this says what it must still cover)."""
    names = set(NAMES)
    assert {"96890dc", "0d5643e", "a5e116e", "a5e116e-kill"} <= names
    layouts = {}
    for name in names:
        with tarfile.open(FIXTURES / f"{name}.tar.gz") as tar:
            layouts[name] = {Path(n).name for n in tar.getnames()}
    assert "secret" not in layouts["96890dc"]  # CRC32 id index, version 1 segments
    assert "keys" in layouts["0d5643e"] and not {"runs", "buckets"} & layouts["0d5643e"]  # first key index
    assert {"runs", "schedules", "push-subscriptions.json"} <= layouts["a5e116e"]  # schedules file version 1


# --- a newer format is refused ------------------------------------------------------

# Every file of a data directory that starts with a magic number and a u16
# format version at byte 4 (STYLE.md: "every file starts with a magic number
# and a version"), by a glob under the directory.
VERSIONED = ["checkpoint", "commitlog/*.log", "delay/*.log", "delay/*.idx", "delay/*.sec", "ids/secret",
             "ids/00.hix", "keys/secret", "keys/00.hix", "tick", "schedules"]


@pytest.fixture(scope="module")
def todays_directory(tmp_path_factory) -> Path:
    """A data directory today's node wrote: messages (keyed too), a
    checkpoint, a schedule, a subscription."""
    root = tmp_path_factory.mktemp("today")
    server = Server.start(root / "data", "--push-allow", "127.0.0.1", log_path=root / "serve.log")
    try:
        for i in range(5):
            assert server.post("sendMsg", topic="t", msgId=f"m{i}", msg="x", delayMillis=3_600_000,
                               key="k" if i % 2 else "")[1]["code"] == 200
        assert server.post("putSchedule", topic="s", scheduleId="daily", everyMillis=86_400_000,
                           msg="run")[1]["code"] == 200
        url = f"http://127.0.0.1:{free_port()}/hook"
        assert server.post("subscribe", topic="p", url=url)[1]["code"] == 200
    finally:
        assert server.stop() == 0
    return root / "data"


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def assert_refused(data: Path, path: Path, found: int, reads: int, start: Any, sentence: str | None = None) -> None:
    """`start()` spawns a node on `data` (a Server): it exits 1 with the
    newer-format sentence naming `path` (or `sentence`), and `data` is
    left as it was."""
    before = tree(data)
    server = start()
    try:
        wait_until(lambda: not server.process.alive() or request(server.base + "/health", timeout=2)[0] == 200,
                   60, "a refusal or /health")
        assert not server.process.alive(), f"a newer {path} was not refused: {server.process.log_tail()}"
    finally:
        server.kill()
    said = server.process.log_tail(4000)
    assert server.proc.returncode == 1, said
    assert (sentence or f"{path}: written by a newer hourglass (format {found}; this one reads {reads})") in said, said
    assert "docs/operations.md" in said and "Traceback" not in said, said
    assert tree(data) == before  # nothing rebuilt, truncated or rewritten


def spawn_standalone(data: Path, tmp_path: Path) -> Any:
    def start() -> Server:
        port = free_port()
        return Server.spawn(data, "--port", str(port), "--push-allow", "127.0.0.1", base=f"http://127.0.0.1:{port}",
                            log_path=tmp_path / "serve.log")
    return start


@pytest.mark.parametrize("pattern", VERSIONED)
def test_a_file_of_a_newer_format_is_refused_with_a_sentence_and_left_as_it_is(pattern, todays_directory, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(todays_directory, data)
    path = sorted(data.glob(pattern))[0]
    raw = bytearray(path.read_bytes())
    version = int.from_bytes(raw[4:6], "little")
    raw[4:6] = (version + 1).to_bytes(2, "little")
    path.write_bytes(raw)
    assert_refused(data, path, version + 1, version, spawn_standalone(data, tmp_path))


def test_a_newer_push_subscriptions_file_is_refused_with_a_sentence_and_left_as_it_is(todays_directory, tmp_path):
    """Format 1 is a JSON list; a later one is an object with its version
    (broker/push/pusher.py, SubscriptionFile)."""
    data = tmp_path / "data"
    shutil.copytree(todays_directory, data)
    path = data / "push-subscriptions.json"
    rows = json.loads(path.read_text())
    assert isinstance(rows, list) and len(rows) == 1, rows
    path.write_text(json.dumps({"version": 2, "subscriptions": rows}))
    assert_refused(data, path, 2, 1, spawn_standalone(data, tmp_path))


def test_a_cluster_nodes_newer_epochs_file_is_refused_with_a_sentence_and_left_as_it_is(tmp_path):
    """A real 3-node cluster's node, stopped, its epochs file (the leader
    epochs its log follows: replication/epochs.py) of a newer version."""
    from cluster import NODE_IDS, Cluster

    cluster = Cluster.start(tmp_path / "cluster")
    try:
        cluster.answer("POST", "sendMsg", topic="t", msgId="m", msg="x", delayMillis=3_600_000)
        leader = cluster.wait_leader()
        node = next(n for n in NODE_IDS if n != leader)
        wait_until(lambda: len(set(cluster.log_ends().values())) == 1, 30, "every node at the same log end")
        assert cluster.terminate(node) == 0
        data = Path(cluster.root) / node
        path = data / "epochs"
        raw = bytearray(path.read_bytes())
        assert raw[:4] == b"HGEP" and int.from_bytes(raw[4:6], "little") == 1
        raw[4:6] = (2).to_bytes(2, "little")
        path.write_bytes(raw)

        def start() -> Server:
            cluster.restart(node, wait=False)
            return cluster.nodes[node]
        assert_refused(data, path, 2, 1, start)
    finally:
        cluster.stop()


def test_a_checkpoint_of_the_engine_only_format_is_refused_with_what_to_do(todays_directory, tmp_path):
    """Version 1, which only the storage engine wrote before the HTTP API
    (storage/checkpoint.py, ENGINE_ONLY): no release reads it."""
    import zlib

    import msgpack

    from storage.checkpoint import HEADER, MAGIC, Checkpoint

    data = tmp_path / "data"
    shutil.copytree(todays_directory, data)
    path = data / "checkpoint"
    today = Checkpoint.load(str(path))
    assert today is not None
    body = msgpack.packb({"commit_offset": today.commit_offset, "written_ms": today.written_ms,
                          "hours": [[h.hour, h.entries, h.log_bytes, h.ended, h.last_end_ms] for h in today.hours]})
    path.write_bytes(HEADER.pack(MAGIC, 1, 0, len(body), zlib.crc32(body)) + body)
    assert_refused(data, path, 1, 2, spawn_standalone(data, tmp_path),
                   f"{path}: format 1, older than this hourglass reads (2): written by the storage engine alone, "
                   f"before hourglass served its API (before commit c353983); no release reads it")


ENGINE_ONLY_COMMIT = "bcdeb7f"  # c353983^: the last commit whose engine wrote checkpoint version 1
ENGINE_ONLY_SCRIPT = """
import sys
from storage.store import NewMessage, Store
now = 1_795_000_000_000
store = Store.open(sys.argv[1], now_ms=now)
store.send([NewMessage("t", f"m{i}", "body", now, now + 3_600_000, 86_400_000, 3) for i in range(5)], now)
store.commit()
store.checkpoint(now)
store.close()
"""


def test_a_directory_the_engine_only_era_wrote_is_refused_and_its_engine_still_reads_it(tmp_path):
    """The storage engine of bcdeb7f (its tree from git history) writes a
    store; today's node refuses it with the sentence, and that engine, as
    the sentence advises, still reads its messages."""
    import os
    import subprocess
    import sys

    from upgrade_drill import has_commit

    if shutil.which("git") is None or not has_commit(ENGINE_ONLY_COMMIT):
        pytest.skip(f"the engine comes from git history: no git, or {ENGINE_ONLY_COMMIT} not in this clone")
    engine = tmp_path / "engine"
    engine.mkdir()
    archive = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), "archive", ENGINE_ONLY_COMMIT,
                              "storage"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(engine)], input=archive, check=True)
    data = tmp_path / "data"
    # the engine's sources first on the path by name: with PYTHONSAFEPATH the working directory is not
    engine_env = {**os.environ, "PYTHONPATH": str(engine)}
    subprocess.run([sys.executable, "-c", ENGINE_ONLY_SCRIPT, str(data)], cwd=engine, check=True, env=engine_env)
    subprocess.run(["chmod", "-R", "go-rwx", str(data)], check=True)  # it was made with the umask
    path = data / "checkpoint"
    assert path.read_bytes()[:6] == b"HGCK\x01\x00"

    assert_refused(data, path, 1, 2, spawn_standalone(data, tmp_path),
                   f"{path}: format 1, older than this hourglass reads (2): written by the storage engine alone")
    read = subprocess.run([sys.executable, "-c", "import sys; from storage.store import Store; "
                           "s = Store.open(sys.argv[1], now_ms=1_795_000_000_000); "
                           "print(sorted(s.get('t', f'm{i}').msg_id for i in range(5)))", str(data)],
                          cwd=engine, capture_output=True, text=True, check=True, env=engine_env)
    assert read.stdout.strip() == "['m0', 'm1', 'm2', 'm3', 'm4']", read
