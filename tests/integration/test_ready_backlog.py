"""The ready window, the in-flight caps and batch acks on a real `hourglass
serve`: a backlog far beyond --ready-window survives SIGKILL and is all
delivered (each message once, the in-flight ones only after their own ack
deadline, acked ones never again); a pull at --max-inflight takes only what
the cap leaves, and a long poll held back by it is answered by the ack that
makes room; ackMsg's msgIds answers a status per id (known, unknown,
repeated, WAITING; form and JSON) and refuses what it cannot take."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from serving import Server

pytestmark = pytest.mark.slow

READY, CONSUMING, ACKED = 2, 3, 4
BACKLOG = 3_000
WINDOW, WINDOW_TOTAL = 50, 100
PULLED_BEFORE_KILL = 20
SHORT_ACK_TIMEOUT_MS = 3_000
LONG_ACK_TIMEOUT_MS = 10 * 60 * 1000


def pull(server: Server, topic: str, batch: int, ack_timeout_ms: int = LONG_ACK_TIMEOUT_MS) -> list[dict]:
    status, body = server.post("pullMsg", topic=topic, batch=batch, ackTimeoutMillis=ack_timeout_ms)
    assert status == 200, body
    return body["delayMsgList"]


def long_poll(server: Server, topic: str, batch: int, timeout_ms: int,
              ack_timeout_ms: int = LONG_ACK_TIMEOUT_MS) -> list[dict]:
    status, body = server.post("longPollingMsg", topic=topic, batch=batch, ackTimeoutMillis=ack_timeout_ms,
                               longPollingTimeoutMillis=timeout_ms)
    assert status == 200, body
    return body["delayMsgList"]


def ack_many(server: Server, topic: str, msg_ids: list[str], ack: bool = True) -> list[int | None]:
    """ackMsg with msgIds as a form's comma list: the status of each id after."""
    status, body = server.post("ackMsg", topic=topic, msgIds=",".join(msg_ids), ack=str(ack).lower())
    assert status == 200, body
    assert [r["msgId"] for r in body["results"]] == msg_ids
    return [r["status"] for r in body["results"]]


def send_due_now(server: Server, topic: str, msg_ids: list[str], **extra) -> None:
    for start in range(0, len(msg_ids), 1000):
        chunk = msg_ids[start:start + 1000]
        status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": [
            {"msgId": msg_id, "msg": f"body of {msg_id}", **extra} for msg_id in chunk]})
        assert status == 200, body
        assert [m["msgId"] for m in body["delayMsgList"]] == chunk
        assert {m["status"] for m in body["delayMsgList"]} == {READY}


def get_status(server: Server, topic: str, msg_id: str) -> int:
    status, body = server.post("getMsg", topic=topic, msgId=msg_id)
    assert status == 200, body
    return body["delayMsg"]["status"]


def test_a_backlog_beyond_the_window_is_delivered_once_across_kill9(tmp_path):
    """3,000 due messages against a window of 50 (100 over all topics): 20
    pulled with a 3 s ack timeout, then SIGKILL. After the restart every
    message sent is delivered and acked in batches; the 20 come back once,
    never before their own ack deadline (the restart kept it), the rest
    once each. After another SIGKILL nothing acked is delivered again."""
    data = tmp_path / "data"
    flags = ("--ready-window", str(WINDOW), "--ready-window-total", str(WINDOW_TOTAL))
    topic = "backlog"
    sent = [f"m{i:05d}" for i in range(BACKLOG)]
    server = Server.start(data, *flags, log_path=tmp_path / "serve.log")
    try:
        send_due_now(server, topic, sent)
        pulled_at_s = time.time()
        early = pull(server, topic, PULLED_BEFORE_KILL, SHORT_ACK_TIMEOUT_MS)
        assert len(early) == PULLED_BEFORE_KILL
        assert [m["msgId"] for m in early] == sent[:PULLED_BEFORE_KILL]  # same rank: filing order
        # the first pull was answered before its fsync: SIGKILL must not lose it
        server.kill()
        server = Server.start(data, *flags, log_path=tmp_path / "serve.log")

        early_ids = {m["msgId"] for m in early}
        not_before_ms = pulled_at_s * 1000 + SHORT_ACK_TIMEOUT_MS - 1  # ms rounding
        delivered: dict[str, int] = {}
        deadline = time.monotonic() + 120
        while len(delivered) < BACKLOG and time.monotonic() < deadline:
            got = long_poll(server, topic, 100, 1_000)
            received_ms = time.time() * 1000
            for m in got:
                msg_id = m["msgId"]
                assert msg_id not in delivered, f"{msg_id} delivered twice"
                if msg_id in early_ids:
                    assert received_ms >= not_before_ms, f"{msg_id} redelivered before its ack deadline"
                    assert m["retry"] == 2, m
                else:
                    assert m["retry"] == 1, m
                assert m["msg"] == f"body of {msg_id}"
                delivered[msg_id] = m["retry"]
            if got:
                assert ack_many(server, topic, [m["msgId"] for m in got]) == [ACKED] * len(got)
        assert sorted(delivered) == sent, f"{BACKLOG - len(delivered)} messages were never delivered"
        assert pull(server, topic, 100) == []

        server.kill()
        server = Server.start(data, *flags, log_path=tmp_path / "serve.log")
        assert long_poll(server, topic, 100, 1_000) == []
        for msg_id in (sent[0], sent[PULLED_BEFORE_KILL], sent[BACKLOG // 2], sent[-1]):
            assert get_status(server, topic, msg_id) == ACKED
        status, body = server.get("getTopicInfo", topic=topic)
        assert status == 200, body
        assert (body["data"]["readyQueueSize"], body["data"]["ackQueueSize"]) == (0, 0)
    finally:
        server.stop()


def test_a_pull_at_the_inflight_cap_takes_only_what_acks_free(tmp_path):
    """--max-inflight 5: a pull of 10 gets 5, then none; an ack frees one
    place for one more. A long poll held back by the cap is answered with a
    message as soon as an ack makes room, long before its own timeout."""
    server = Server.start(tmp_path / "data", "--max-inflight", "5", log_path=tmp_path / "serve.log")
    topic = "capped"
    try:
        send_due_now(server, topic, [f"c{i}" for i in range(20)])
        first = pull(server, topic, 10)
        assert len(first) == 5
        assert pull(server, topic, 10) == []
        assert ack_many(server, topic, [first[0]["msgId"]]) == [ACKED]
        one_more = pull(server, topic, 10)
        assert len(one_more) == 1
        assert pull(server, topic, 10) == []

        answered: list = []
        poll_timeout_ms = 25_000
        poller = threading.Thread(target=lambda: answered.append(long_poll(server, topic, 10, poll_timeout_ms)))
        poller.start()
        poller.join(0.5)
        assert poller.is_alive(), f"a long poll at the cap was answered at once: {answered}"
        assert server.post("ackMsg", topic=topic, msgId=first[1]["msgId"])[0] == 200
        poller.join(poll_timeout_ms / 1000 / 2)  # well before the poll's own timeout
        assert not poller.is_alive(), "the ack that made room did not answer the long poll"
        assert len(answered[0]) == 1
        taken = {m["msgId"] for m in first + one_more + answered[0]}
        assert len(taken) == 7  # none twice
    finally:
        server.stop()


def test_the_total_inflight_cap_is_shared_by_topics(tmp_path):
    """--max-inflight-total 6: one topic holding 5 leaves one for the other;
    an ack in the first topic makes room in the second."""
    server = Server.start(tmp_path / "data", "--max-inflight", "5", "--max-inflight-total", "6",
                          log_path=tmp_path / "serve.log")
    try:
        send_due_now(server, "x", [f"x{i}" for i in range(10)])
        send_due_now(server, "y", [f"y{i}" for i in range(10)])
        xs = pull(server, "x", 10)
        assert len(xs) == 5
        assert len(pull(server, "y", 10)) == 1
        assert pull(server, "y", 10) == [] and pull(server, "x", 10) == []
        assert ack_many(server, "x", [xs[0]["msgId"], xs[1]["msgId"]]) == [ACKED, ACKED]
        assert len(pull(server, "y", 10)) == 2
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("batch-ack")
    server = Server.start(directory / "data", log_path=directory / "serve.log")
    yield server
    assert server.stop() == 0


@pytest.fixture
def topic():
    return "t-" + uuid.uuid4().hex[:12]


def test_batch_ack_answers_a_status_per_id(server, topic):
    """Two consuming, one unknown, one repeated, one WAITING (acked all the
    same) and one READY never pulled: each answered with its status after,
    once; the acked ones are never delivered again."""
    send_due_now(server, topic, ["c1", "c2"], priority=1)
    send_due_now(server, topic, ["r1"])
    status, body = server.post("sendMsg", topic=topic, msgId="w1", msg="later", delayMillis=60_000)
    assert status == 200 and body["delayMsg"]["status"] == 1
    assert [m["msgId"] for m in pull(server, topic, 2)] == ["c1", "c2"]
    status, body = server.post("ackMsg", topic=topic, msgIds="c1,nope,c1,w1,r1,c2")
    assert (status, body) == (200, {"code": 200, "msg": "success", "results": [
        {"msgId": "c1", "status": ACKED}, {"msgId": "nope", "status": None}, {"msgId": "c1", "status": ACKED},
        {"msgId": "w1", "status": ACKED}, {"msgId": "r1", "status": ACKED}, {"msgId": "c2", "status": ACKED}]})
    for msg_id in ("c1", "c2", "w1", "r1"):
        assert get_status(server, topic, msg_id) == ACKED
    assert pull(server, topic, 10) == []
    # acking them again changes nothing and says so
    assert ack_many(server, topic, ["c2", "w1"]) == [ACKED, ACKED]


def test_batch_nack_makes_consuming_ones_ready_again(server, topic):
    send_due_now(server, topic, ["n1", "n2", "n3"])
    pulled = [m["msgId"] for m in pull(server, topic, 2)]
    assert pulled == ["n1", "n2"]
    assert ack_many(server, topic, ["n1", "n3", "zz", "n2"], ack=False) == [READY, READY, None, READY]
    again = pull(server, topic, 10)
    assert sorted((m["msgId"], m["retry"]) for m in again) == [("n1", 2), ("n2", 2), ("n3", 1)]


def test_batch_ack_as_a_json_list(server, topic):
    """A JSON body carries msgIds as a list, so an id may hold a comma."""
    send_due_now(server, topic, ["j,1", "j2"])
    assert [m["msgId"] for m in pull(server, topic, 1)] == ["j,1"]
    status, body = server.post_json("ackMsg", {"topic": topic, "msgIds": ["j,1", "j2", "gone", "j2"]})
    assert status == 200, body
    assert body["results"] == [{"msgId": "j,1", "status": ACKED}, {"msgId": "j2", "status": ACKED},
                               {"msgId": "gone", "status": None}, {"msgId": "j2", "status": ACKED}]
    assert pull(server, topic, 10) == []


@pytest.mark.parametrize("form", [
    {"msgId": "a", "msgIds": "a,b"},  # one or the other
    {"msgIds": ",".join(f"id{i}" for i in range(1001))},  # more than 1000
    {"msgIds": "a,,b"},  # an empty id
])
def test_bad_msg_ids_are_refused_naming_them(server, topic, form):
    send_due_now(server, topic, ["a", "b"])
    status, body = server.post("ackMsg", topic=topic, **form)
    assert status == 400, body
    assert "msgIds" in body["msg"]
    assert len(pull(server, topic, 10)) == 2  # nothing was acked


@pytest.mark.parametrize("msg_ids", [[], 7, ["a", 7], [f"id{i}" for i in range(1001)]])
def test_bad_json_msg_ids_are_refused_naming_them(server, topic, msg_ids):
    status, body = server.post_json("ackMsg", {"topic": topic, "msgIds": msg_ids})
    assert status == 400, body
    assert "msgIds" in body["msg"]
