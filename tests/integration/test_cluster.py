"""A real 3-node cluster on loopback (bench/cluster.py): election, any node
answering, quorum writes, failover drills (SIGKILL, SIGSTOP, SIGTERM of the
leader), and a deposed leader whose unreplicated tail is replaced by a
snapshot. Every process is stopped by PID; each test is bounded in time."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import pytest
from cluster import NODE_IDS, Cluster, drill
from serving import ROOT, PushSubscriber, free_port, request

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    yield c
    c.stop()


def _others(leader: str) -> list[str]:
    return [n for n in NODE_IDS if n != leader]


def _wait(predicate, wait_s: float = 15, what: str = "condition"):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {wait_s} s")


def _status(node, topic: str, msg_id: str) -> int | None:
    """A message's status; None while the node answers 503 (docs/cluster.md: retried)."""
    code, body = node.post("getMsg", topic=topic, msgId=msg_id)
    if code == 503:
        return None
    assert code == 200, (code, body)
    return body["delayMsg"]["status"]


def _pulled(node, topic: str, **params) -> list:
    """One pull's messages; a 503 (no leader yet, or stepping down) is what
    docs/cluster.md tells clients to retry, so it reads as nothing yet; any
    other failure fails the test with its answer."""
    code, body = node.post("pullMsg", topic=topic, batch=5, **params)
    if code == 503:
        return []
    assert code == 200, (code, body)
    return body["delayMsgList"]


def test_one_leader_and_any_node_answers_any_call(cluster):
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    roles = {n: cluster.health(n)["role"] for n in NODE_IDS}
    assert sorted(roles.values()) == ["follower", "follower", "leader"]
    assert {cluster.health(n)["leader"] for n in NODE_IDS} == {leader}
    f1, f2 = _others(leader)
    status, body = cluster.nodes[f1].post("sendMsg", topic="t", msg="via a follower", msgId="m1", delayMillis=0)
    assert status == 200, body
    status, body = cluster.nodes[f2].post("getMsg", topic="t", msgId="m1")
    assert status == 200 and body["delayMsg"]["msg"] == "via a follower"
    # a sendMsg's trace context headers are forwarded with it, and the message keeps them
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    status, raw = request(cluster.nodes[f1].base + "/camellia/delayQueue/sendMsg", data=b"topic=t&msg=x&msgId=m2&delayMillis=600000",
                          headers={"Content-Type": "application/x-www-form-urlencoded", "traceparent": traced,
                                   "tracestate": "congo=t61rcWkgMzE"})
    assert status == 200 and json.loads(raw)["delayMsg"]["traceparent"] == traced, raw
    status, body = cluster.nodes[f2].post("getMsg", topic="t", msgId="m2")
    assert status == 200 and (body["delayMsg"]["traceparent"], body["delayMsg"]["tracestate"]) == (
        traced, "congo=t61rcWkgMzE")
    status, body = _wait(lambda: (lambda r: r if r[1].get("delayMsgList") else None)(
        cluster.nodes[f2].post("pullMsg", topic="t", batch=5)), what="a pull through a follower")
    assert [m["msgId"] for m in body["delayMsgList"]] == ["m1"]
    # the followers hold the same log as the leader (the send, the release, the pull)
    _wait(lambda: len(set(cluster.log_ends().values())) == 1, what="logs converging")


def test_bad_input_through_a_follower_is_the_leaders_400_and_stores_nothing(cluster):
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    follower = _others(leader)[0]
    status, body = cluster.nodes[follower].post("sendMsg", topic="t", msg="x", delayMillis="soon")
    assert status == 400 and "delayMillis" in body["msg"]
    assert cluster.nodes[follower].http_status == 200  # the code is in the body, forwarded as it came
    assert cluster.nodes[leader].get("getTopicInfo", topic="t")[1]["data"]["waitingQueueSize"] == 0


@pytest.mark.parametrize("fault", ["sigkill", "sigstop", "sigterm"])
def test_failover_drill_loses_nothing(cluster, fault):
    # (min_sent: the producer sends on past run_s until 50 were stored, so a
    # loaded machine's slower sends still make a drill of 50 and more)
    result = drill(cluster, fault, rate=80, run_s=3.5, fault_at_s=1.2, freeze_s=4.0, min_sent=50)
    assert result["sent"] >= 50 and result["send_errors"] == 0, result
    assert result["lost"] == 0, result
    assert result["early"] == 0, result
    assert result["double_dispatch_terms"] == [], result
    assert result["rejoined"], result
    assert result["new_leader"] != result["old_leader"]
    causes = result["duplicate_causes"]
    assert causes["redelivered after its ack"] == 0, result  # an ack answered 200 is kept by every next leader
    if fault in ("sigterm", "sigstop"):
        # SIGTERM: the next leader starts where the old one stopped; SIGSTOP:
        # the frozen leader hands nothing out once it resumes. Only an ack
        # that missed its deadline while the lead moved (a loaded machine's
        # failover can outlast the 4 s ack timeout) may bring a message back.
        assert causes["released twice (retry=0)"] == 0, result
    if fault == "sigterm":
        assert result["duplicates"] == causes["redelivered, its ack late or failed (retry>0)"], result


def test_a_deposed_leaders_unreplicated_tail_is_replaced_by_a_snapshot(cluster):
    leader = cluster.wait_leader()
    term = cluster.health(leader)["term"]
    node = cluster.nodes[leader]
    assert node.post("sendMsg", topic="t", msg="kept", msgId="kept", delayMillis=60_000)[0] == 200
    _wait(lambda: len(set(cluster.log_ends().values())) == 1, what="logs converging")
    for n in _others(leader):
        cluster.kill(n)
    # Without followers a quorum write cannot be answered 200 (it waits,
    # then 503); its record stays in the leader's log only.
    status, body = node.post("sendMsg", topic="t", msg="never answered", msgId="lone", delayMillis=60_000)
    assert status == 503, body
    cluster.kill(leader)
    for n in _others(leader):
        cluster.restart(n, wait=False)
    new = cluster.wait_leader(exclude=leader, above_term=term)
    cluster.restart(leader)
    follower_view = lambda: cluster.health(leader)  # noqa: E731
    _wait(lambda: (follower_view() or {}).get("role") == "follower", what="the old leader following")
    _wait(lambda: len(set(cluster.log_ends().values())) == 1, wait_s=20, what="logs converging")
    with open(cluster.nodes[leader].log_path) as f:
        assert "installed a snapshot" in f.read()
    # the old leader now holds the new leader's history: "kept" but not "lone"
    assert cluster.nodes[leader].post("getMsg", topic="t", msgId="kept")[0] == 200
    assert cluster.nodes[new].post("getMsg", topic="t", msgId="lone")[0] == 404


def test_cluster_flags_are_checked(tmp_path):
    def serve(*flags):
        return subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d"), *flags],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    spec = f"n1=127.0.0.1:{free_port()}:{free_port()},n2=127.0.0.1:{free_port()}:{free_port()}"
    r = serve("--node-id", "n9", "--cluster", spec)
    assert r.returncode == 2 and "n9" in r.stderr and "not in --cluster" in r.stderr
    r = serve("--cluster", spec)
    assert r.returncode == 2 and "--node-id" in r.stderr
    r = serve("--node-id", "n1", "--cluster", "n1=127.0.0.1:80")
    assert r.returncode == 2 and "id=host:http_port:replication_port" in r.stderr
    r = serve("--acks", "leader")
    assert r.returncode == 2 and "--acks" in r.stderr
    r = serve("--node-id", "n1", "--cluster", spec, "--acks", "all")
    assert r.returncode == 2 and "--acks" in r.stderr


def test_a_follower_behind_the_retained_log_catches_up_by_snapshot(tmp_path):
    """Small segments and a small retention: while one follower is down the
    leader's checkpoints delete the log it would need."""
    cluster = Cluster.start(tmp_path / "cluster", "--segment-bytes", "65536", "--retain-log-bytes", "65536")
    try:
        leader = cluster.wait_leader()
        behind = _others(leader)[0]
        cluster.kill(behind)
        node = cluster.nodes[leader]
        for i in range(12):  # ~12 x 100 KB of records
            msgs = [{"msgId": f"b{i}-{j}", "msg": "x" * 500, "delayMillis": 3_600_000} for j in range(200)]
            status, body = node.post_json("sendMsgBatch", {"topic": "t", "msgs": msgs})
            assert status == 200, body
        time.sleep(2.5)  # a checkpoint or two: old segments deleted
        cluster.restart(behind)
        _wait(lambda: len(set(cluster.log_ends().values())) == 1, wait_s=30, what="logs converging")
        with open(cluster.nodes[behind].log_path) as f:
            text = f.read()
        assert "behind the retained log" in text and "installed a snapshot" in text
        status, body = cluster.nodes[behind].post("getMsg", topic="t", msgId="b11-199")
        assert status == 200 and body["delayMsg"]["msg"] == "x" * 500
    finally:
        cluster.stop()


def test_a_node_installing_a_snapshot_never_answers_from_the_closed_store(tmp_path):
    """While a follower swapped its store for a snapshot, the old one was
    closed and the new one opening in a thread: /health (and the peers'
    calls) read the closed store's log end and answered 500. Its /health
    is polled through the install: always an answer, never a 500."""
    cluster = Cluster.start(tmp_path / "cluster", "--segment-bytes", "65536", "--retain-log-bytes", "65536")
    answers: list[int] = []
    stop = threading.Event()

    def poll(url: str) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                answers.append(request(url + "/health", timeout=2)[0])

    try:
        leader = cluster.wait_leader()
        behind = _others(leader)[0]
        cluster.kill(behind)
        node = cluster.nodes[leader]
        for i in range(40):  # ~40 x 100 KB of records: a store that takes a while to open
            msgs = [{"msgId": f"b{i}-{j}", "msg": "x" * 500, "delayMillis": 3_600_000} for j in range(200)]
            assert node.post_json("sendMsgBatch", {"topic": "t", "msgs": msgs})[0] == 200
        time.sleep(2.5)  # a checkpoint or two: old segments deleted
        cluster.restart(behind)
        pollers = [threading.Thread(target=poll, args=(cluster.url(behind),)) for _ in range(3)]
        for t in pollers:
            t.start()
        _wait(lambda: len(set(cluster.log_ends().values())) == 1, wait_s=30, what="logs converging")
        stop.set()
        for t in pollers:
            t.join()
        with open(cluster.nodes[behind].log_path) as f:
            text = f.read()
        assert "installed a snapshot" in text and "bug while serving" not in text
        assert answers and 500 not in answers
    finally:
        stop.set()
        cluster.stop()


def test_a_cluster_with_a_token_replicates_and_forwards_with_it(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o600)  # readable by others: refused (--allow-readable-token)
    cluster = Cluster.start(tmp_path / "cluster", "--auth-token-file", str(token_file))
    try:
        leader = cluster.wait_leader()
        cluster.wait_known(leader)
        follower = _others(leader)[0]
        node = cluster.nodes[follower]
        assert node.post("sendMsg", topic="t", msg="x", msgId="a")[0] == 401
        node.token = "s3cret-token-0123456789"
        status, body = node.post("sendMsg", topic="t", msg="x", msgId="a", delayMillis=60_000)
        assert status == 200, body
        _wait(lambda: len(set(cluster.log_ends().values())) == 1 and cluster.log_ends()[follower] > 0,
              what="the send replicated")
        # camellia's health switch needs no token, and is per node
        node.token = None
        assert request(node.base + "/camellia/health/offline", data=b"")[0] in (200, 500)
        assert request(node.base + "/camellia/health/status")[0] == 500
        assert node.get("/health")[0] == 503
        assert request(cluster.nodes[leader].base + "/camellia/health/status")[0] == 200
        assert request(node.base + "/camellia/health/online", data=b"")[0] == 200
        assert node.get("/health")[0] == 200
        cluster.nodes[leader].token = "s3cret-token-0123456789"
        status, text = cluster.nodes[leader].get("/metrics")
        assert status == 200 and b'topic_info{topic="t",type="waitingQueueSize"} 1' in text
    finally:
        cluster.stop()


def test_keys_reschedules_and_far_messages_survive_a_leader_kill(cluster):
    """What the leader decided lives in the replicated log: after SIGKILL of
    the leader, the new one keeps a consuming key busy (its other message
    is not handed out until the first is acked), delivers a rescheduled
    message at its new time (not its old one), and still holds a message
    filed in a span years ahead."""
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    term = cluster.health(leader)["term"]
    node = cluster.nodes[leader]
    for msg_id in ("k1", "k2"):
        assert node.post("sendMsg", topic="keys", msg="x", msgId=msg_id, key="K")[0] == 200
    got = _wait(lambda: _pulled(node, "keys", ackTimeoutMillis=120_000),
                what="a pull of the key")
    assert len(got) == 1
    first = got[0]["msgId"]
    now = int(time.time() * 1000)
    assert node.post("sendMsg", topic="later", msg="x", msgId="r", delayMillis=1_000)[0] == 200
    code, body = node.post("rescheduleMsg", topic="later", msgId="r", triggerTime=now + 8_000)
    assert code == 200, body
    years = now + 3 * 365 * 24 * 3_600_000
    assert node.post("sendMsg", topic="far", msg="x", msgId="f", triggerTime=years)[0] == 200
    _wait(lambda: len(set(cluster.log_ends().values())) == 1, what="logs converging")
    cluster.kill(leader)
    new = cluster.wait_leader(exclude=leader, above_term=term)
    cluster.wait_known(new)
    n = cluster.nodes[new]
    assert n.post("pullMsg", topic="keys", batch=5)[1]["delayMsgList"] == []  # the key is still busy
    assert n.post("ackMsg", topic="keys", msgId=first)[0] == 200
    other = _wait(lambda: _pulled(n, "keys"), what="the key's next")
    assert [m["msgId"] for m in other] == [x for x in ("k1", "k2") if x != first]
    got = _wait(lambda: _pulled(n, "later"), wait_s=20,
                what="the rescheduled message")
    assert [m["msgId"] for m in got] == ["r"] and int(time.time() * 1000) >= now + 8_000
    code, body = n.post("getMsg", topic="far", msgId="f")
    assert code == 200 and body["delayMsg"]["triggerTime"] == years and body["delayMsg"]["status"] == 1


def test_only_the_leader_pushes_and_the_next_one_resumes_after_a_kill(tmp_path):
    """A subscription made through a follower is replicated (Raft): after
    SIGKILL of the leader the new one pushes the rest, every message is
    delivered (a delivery in flight may come twice), none early, and the
    subscription is there on every node, its secret nowhere."""
    subscriber = PushSubscriber(tmp_path)
    c = Cluster.start(tmp_path / "cluster", "--push-allow", "127.0.0.1")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        term = c.health(leader)["term"]
        follower = c.nodes[_others(leader)[0]]
        code, body = follower.post("subscribe", topic="p", url=subscriber.url, secret="s3cret", concurrency=4)
        assert code == 200 and body["code"] == 200, body
        now = int(time.time() * 1000)
        triggers = {f"m{i}": now + 500 + 100 * i for i in range(40)}  # due over 4.5 s
        for msg_id, trigger in triggers.items():
            assert follower.post("sendMsg", topic="p", msg="x", msgId=msg_id, triggerTime=trigger)[0] == 200
        subscriber.wait_received(5, timeout_s=15)
        c.kill(leader)
        new = c.wait_leader(exclude=leader, above_term=term)
        c.wait_known(new)
        got = subscriber.wait_received(40, timeout_s=60)
        _wait(lambda: len({r["headers"]["Hourglass-Msg-Id"] for r in subscriber.received()}) == 40, wait_s=60,
              what="every message pushed")
        received = subscriber.received()
        assert {r["headers"]["Hourglass-Msg-Id"] for r in received} == set(triggers)
        assert all(r["receivedMs"] >= triggers[r["headers"]["Hourglass-Msg-Id"]] for r in received)  # never early
        assert len(got) >= 40
        for node in c.nodes.values():
            if node is c.nodes[leader]:
                continue
            code, body = node.get("getSubscription", topic="p")
            assert code == 200 and body["data"]["url"] == subscriber.url, body
            assert "s3cret" not in json.dumps(body)
        _wait(lambda: all(_status(c.nodes[new], "p", m) == 4 for m in triggers), wait_s=30, what="every message acked")
    finally:
        c.stop()
        subscriber.stop()


def test_calls_that_change_nothing_wait_for_a_quorum_on_the_leader_and_answer(cluster):
    """An ack of an acked message and a delete of a deleted one change
    nothing: the leader answers once what earlier records made is on a
    quorum (GroupCommit.settled, a timed wait), never a 500."""
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    node = cluster.nodes[leader]
    assert node.post("sendMsg", topic="s", msg="x", msgId="m1", delayMillis=0)[0] == 200
    body = _wait(lambda: node.post("pullMsg", topic="s", batch=1)[1]["delayMsgList"], what="m1 ready")
    assert [m["msgId"] for m in body] == ["m1"]
    for call, params in (("ackMsg", {"ack": "true"}), ("deleteMsg", {})):
        for _ in range(2):  # the second changes nothing
            code, answer = node.post(call, topic="s", msgId="m1", **params)
            assert code in (200, 404) and node.http_status == 200, (call, answer)  # never a 500
