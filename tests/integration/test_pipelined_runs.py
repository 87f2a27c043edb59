"""Pipelined requests run together (docs/internals.md, "Pipelined runs"):
the sendMsg and ackMsg requests a client writes without waiting for
answers run as one batch -- one record, one commit -- and each is answered
as it would have been alone, in order. A real `hourglass serve`, raw
sockets (a client that pipelines, as the peers' raw client and Redis
clients do)."""

from __future__ import annotations

import json
import socket
import urllib.parse
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import PREFIX, Server

pytestmark = pytest.mark.slow

_TOPICS = count()


@pytest.fixture(scope="module", params=[1, 3], ids=["1 shard", "3 shards"])
def node(request, tmp_path_factory):
    server = Server.start(tmp_path_factory.mktemp("pipelined") / "data", "--shards", str(request.param))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    server = Server.start(tmp_path_factory.mktemp("pipelined1") / "data", "--shards", "1")
    yield server
    server.stop()


def connect(server: Server) -> socket.socket:
    host, port = server.base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=20)


def encoded(path: str, **form: object) -> bytes:
    body = urllib.parse.urlencode({k: str(v) for k, v in form.items()}).encode()
    return (f"POST {PREFIX}{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


class Answers:
    """The answers of one connection, read in order off its socket."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.data = b""

    def _fill(self) -> None:
        chunk = self.s.recv(1 << 16)
        if not chunk:
            raise ConnectionError(f"closed, holding {self.data[:200]!r}")
        self.data += chunk

    def next(self) -> tuple[int, dict]:
        while b"\r\n\r\n" not in self.data:
            self._fill()
        head, _, rest = self.data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        while len(rest) < length:
            self._fill()
            head, _, rest = self.data.partition(b"\r\n\r\n")
        self.data = rest[length:]
        return int(lines[0].split(" ")[1]), json.loads(rest[:length])


def pipelined(server: Server, requests: list[bytes]) -> list[tuple[int, dict]]:
    """Write every request at once, then read their answers."""
    with connect(server) as s:
        s.sendall(b"".join(requests))
        answers = Answers(s)
        return [answers.next() for _ in requests]


def one_at_a_time(server: Server, requests: list[bytes]) -> list[tuple[int, dict]]:
    with connect(server) as s:
        answers = Answers(s)
        out = []
        for r in requests:
            s.sendall(r)
            out.append(answers.next())
        return out


def fsyncs(server: Server) -> float:
    status, text = server.get("/metrics")
    assert status == 200
    for line in text.decode().splitlines():  # type: ignore[union-attr]
        if line.startswith("hourglass_fsync_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no hourglass_fsync_seconds_count in /metrics")


def test_a_bad_request_inside_a_pipeline_answers_400_alone(node):
    topic = f"bad{next(_TOPICS)}"
    answers = pipelined(node, [
        encoded("sendMsg", topic=topic, msgId="a", msg="1", delayMillis=3_600_000),
        encoded("sendMsg", topic=topic, msgId="b", msg="2", priority="high"),
        encoded("sendMsg", topic=topic, msgId="c", msg="3", delayMillis=3_600_000),
        encoded("ackMsg", topic=topic, msgId="a"),
        encoded("ackMsg", topic="", msgId="c"),
        encoded("ackMsg", topic=topic, msgId="nobody"),
    ])
    codes = [body["code"] for _, body in answers]
    assert codes == [200, 400, 200, 200, 400, 200], answers
    assert "priority" in answers[1][1]["msg"] and "topic" in answers[4][1]["msg"]
    assert [answers[0][1]["delayMsg"]["msgId"], answers[2][1]["delayMsg"]["msgId"]] == ["a", "c"]
    states = {m: node.post("getMsg", topic=topic, msgId=m)[1] for m in "abc"}
    assert states["a"]["delayMsg"]["status"] == 4  # acked by the pipeline's first ack
    assert states["b"]["code"] == 404  # nothing stored of the bad one
    assert states["c"]["delayMsg"]["status"] == 1  # the bad ack changed nothing


def test_a_pipelined_run_of_acks_is_one_commit(one_shard):
    """Before, 50 pipelined acks ran one after the other, each waiting for
    its own fsync: 50 commits. One run now: one record, one commit."""
    topic = f"acks{next(_TOPICS)}"
    ids = [f"m{i}" for i in range(50)]
    sent = pipelined(one_shard, [encoded("sendMsg", topic=topic, msgId=i, msg="x") for i in ids])
    assert all(body["code"] == 200 for _, body in sent)
    status, pulled = one_shard.post("pullMsg", topic=topic, batch=50, ackTimeoutMillis=600_000)
    assert status == 200 and sorted(m["msgId"] for m in pulled["delayMsgList"]) == sorted(ids)
    before = fsyncs(one_shard)
    acked = pipelined(one_shard, [encoded("ackMsg", topic=topic, msgId=i) for i in ids])
    assert [body["code"] for _, body in acked] == [200] * 50
    assert fsyncs(one_shard) - before <= 5
    assert {one_shard.post("getMsg", topic=topic, msgId=i)[1]["delayMsg"]["status"] for i in ids} == {4}


def test_a_pipeline_longer_than_the_parse_ahead_is_answered_whole_and_in_order(node):
    """300 sends then 300 acks written at once: more than the 128 parsed
    ahead, so the connection parses on as runs end."""
    topic = f"long{next(_TOPICS)}"
    ids = [f"n{i}" for i in range(300)]
    answers = pipelined(node, [encoded("sendMsg", topic=topic, msgId=i, msg=f"m{i}", delayMillis=3_600_000)
                               for i in ids] + [encoded("ackMsg", topic=topic, msgId=i) for i in ids])
    assert [body["delayMsg"]["msgId"] for _, body in answers[:300]] == ids
    assert [body["code"] for _, body in answers[300:]] == [200] * 300
    assert {node.post("getMsg", topic=topic, msgId=i)[1]["delayMsg"]["status"] for i in ids[::37]} == {4}


# -- any pipeline: the answers and the state of the requests one at a time --------------------

_IDS = [f"k{i}" for i in range(6)]
_OPS = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(_IDS), st.sampled_from([0, 0, 3600]), st.integers(0, 2)),
    st.tuples(st.just("ack"), st.sampled_from(_IDS), st.booleans()),
    st.tuples(st.just("pull"), st.integers(1, 3)),
    st.tuples(st.just("bad")),
)


def _request(op: tuple, topic: str) -> bytes:
    if op[0] == "send":
        _, msg_id, delay, priority = op
        return encoded("sendMsg", topic=topic, msgId=msg_id, msg=f"body-{msg_id}", delayMillis=delay * 1000,
                       priority=priority)
    if op[0] == "ack":
        return encoded("ackMsg", topic=topic, msgId=op[1], ack=str(op[2]).lower())
    if op[0] == "pull":
        return encoded("pullMsg", topic=topic, batch=op[1], ackTimeoutMillis=600_000)
    return encoded("sendMsg", topic=topic, msgId="bad", msg="x", priority="high")


def _seen(answer: tuple[int, dict]) -> object:
    """An answer without what depends on the clock or the topic's name."""
    status, body = answer
    if "delayMsg" in body:
        m = body["delayMsg"]
        return status, body["code"], m["msgId"], m["status"], m["msg"], m["priority"]
    if "delayMsgList" in body:
        return status, body["code"], [(m["msgId"], m["status"], m["priority"]) for m in body["delayMsgList"]]
    return status, body["code"]


def _state(server: Server, topic: str) -> dict[str, object]:
    return {m: (body["delayMsg"]["status"] if body["code"] == 200 else body["code"])
            for m in _IDS for body in [server.post("getMsg", topic=topic, msgId=m)[1]]}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_OPS, min_size=1, max_size=24))
def test_a_pipeline_answers_and_stores_as_its_requests_one_at_a_time(one_shard, ops):
    """On one shard, where which of two messages due in the same
    millisecond a pull takes first is the shard's order alone."""
    alone, together = f"alone{next(_TOPICS)}", f"together{next(_TOPICS)}"
    expected = one_at_a_time(one_shard, [_request(op, alone) for op in ops])
    got = pipelined(one_shard, [_request(op, together) for op in ops])
    assert list(map(_seen, got)) == list(map(_seen, expected))
    assert _state(one_shard, together) == _state(one_shard, alone)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.lists(st.tuples(st.sampled_from(["send", "ack", "nack"]), st.integers(0, 4)),
                               min_size=1, max_size=12), min_size=2, max_size=4))
def test_pipelines_on_many_connections_store_what_each_alone_would(node, parts):
    """Each connection its own ids (the order between connections is the
    node's to choose): each connection's answers, and every id's end, as
    when its requests go one at a time."""
    alone, together = f"alone{next(_TOPICS)}", f"together{next(_TOPICS)}"

    def requests(topic: str, conn: int, part: list[tuple[str, int]]) -> list[bytes]:
        return [encoded("sendMsg", topic=topic, msgId=f"c{conn}-{i}", msg="x") if op == "send" else
                encoded("ackMsg", topic=topic, msgId=f"c{conn}-{i}", ack=str(op == "ack").lower())
                for op, i in part]

    expected = [one_at_a_time(node, requests(alone, c, part)) for c, part in enumerate(parts)]
    sockets = [connect(node) for _ in parts]
    try:
        for c, (s, part) in enumerate(zip(sockets, parts)):
            s.sendall(b"".join(requests(together, c, part)))
        readers = [Answers(s) for s in sockets]
        answers = [[reader.next() for _ in part] for reader, part in zip(readers, parts)]
    finally:
        for s in sockets:
            s.close()
    assert [list(map(_seen, a)) for a in answers] == [list(map(_seen, e)) for e in expected]

    def ends(topic: str) -> dict[str, object]:
        return {f"c{c}-{i}": node.post("getMsg", topic=topic, msgId=f"c{c}-{i}")[1].get("delayMsg", {}).get("status")
                for c, part in enumerate(parts) for _, i in part}
    assert ends(together) == ends(alone)


# -- kill -9 in the middle of pipelined runs ------------------------------------------------

def test_every_answered_send_and_ack_of_pipelines_survives_a_kill_9(tmp_path):
    """Four connections pipeline sends (50 a write) then their acks, as
    fast as they are answered; the node is killed with SIGKILL part way.
    After a restart every send answered 200 is stored whole, every ack
    answered 200 holds, and nothing unanswered is half there: each id is
    whole or absent."""
    import threading
    import time

    server = Server.start(tmp_path / "data", "--shards", "1")
    answered_sends: list[str] = []
    answered_acks: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(c: int) -> None:
        try:
            with connect(server) as s:
                reader = Answers(s)
                for round_ in range(10_000):
                    if stop.is_set():
                        return
                    ids = [f"c{c}-{round_}-{i}" for i in range(50)]
                    s.sendall(b"".join(encoded("sendMsg", topic="kill", msgId=i, msg=f"body of {i}") for i in ids))
                    for i in ids:
                        if reader.next()[1]["code"] == 200:
                            with lock:
                                answered_sends.append(i)
                    s.sendall(b"".join(encoded("ackMsg", topic="kill", msgId=i) for i in ids))
                    for i in ids:
                        if reader.next()[1]["code"] == 200:
                            with lock:
                                answered_acks.append(i)
        except OSError:
            return  # the node was killed (a reset, or closed before an answer)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(answered_acks) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.kill()
    stop.set()
    for t in threads:
        t.join(timeout=10)
    with lock:
        sends, acks = list(answered_sends), set(answered_acks)
    assert len(acks) >= 500, f"only {len(acks)} acks answered in 20 s"
    server = Server.start(tmp_path / "data", "--shards", "1")
    try:
        for msg_id in sends:
            status, body = server.post("getMsg", topic="kill", msgId=msg_id)
            assert status == 200 and body["code"] == 200, (msg_id, body)
            m = body["delayMsg"]
            assert m["msg"] == f"body of {msg_id}", m
            if msg_id in acks:
                assert m["status"] == 4, m
        cursor = None
        while True:  # every message stored is whole, answered or not
            status, page = server.post("listMsg", topic="kill", limit=1000,
                                       **({} if cursor is None else {"cursor": cursor}))
            assert status == 200 and page["code"] == 200, page
            assert all(m["msg"] == f"body of {m['msgId']}" for m in page["delayMsgList"])
            cursor = page.get("cursor")
            if not cursor:
                break
    finally:
        server.stop()
