"""Real `hourglass serve --backend redis://` processes sharing one real
redis-server (the session's):

- serial keys across two nodes: consumers pull from both, ack or nack,
  and a checker over the delivery history finds no key held by two
  consumers at once, each key's messages acked in their pull order, every
  message acked;
- push recovery: a node killed with SIGKILL while five deliveries hang
  at a slow subscriber; after the restart they are delivered again once
  their push timeout has passed and the dead node's lease has lapsed,
  long before their ack deadline (timeoutMillis + 60 s).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid

import pytest
from push import Subscriber
from serving import Server, status, wait_for

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

pytestmark = pytest.mark.slow

ACKED, CONSUMING = 4, 3




KEYS, PER_KEY, CONSUMERS = 40, 8, 6


def test_two_nodes_on_one_redis_never_hand_a_key_to_two_consumers(redis_url, tmp_path):
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", redis_url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    topic = "keys-" + uuid.uuid4().hex[:8]
    try:
        msgs = [{"msgId": f"k{k:02d}-{n:02d}", "msg": "x", "key": f"key-{k:02d}"}
                for n in range(PER_KEY) for k in range(KEYS)]
        for start in range(0, len(msgs), 100):
            code, body = nodes[start // 100 % 2].post_json("sendMsgBatch", {"topic": topic,
                                                                           "msgs": msgs[start:start + 100]})
            assert code == 200 and body["code"] == 200, body
        held: dict[str, list[tuple[float, float, str]]] = {}  # key -> (pulled, ack sent, msgId) of each delivery
        acked: list[str] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        def consume(seed: int) -> None:
            rng = random.Random(seed)
            try:
                while True:
                    node = nodes[rng.randrange(2)]
                    code, body = node.post("pullMsg", topic=topic, batch=rng.randint(1, 4), ackTimeoutMillis=60_000)
                    pulled_at = time.monotonic()
                    assert code == 200 and body["code"] == 200, body
                    got = body["delayMsgList"]
                    if not got:
                        with lock:
                            if len(acked) == len(msgs):
                                return
                        time.sleep(0.01)
                        continue
                    for m in got:
                        ack = rng.random() < 0.8
                        node = nodes[rng.randrange(2)]  # acked through either node
                        sent_at = time.monotonic()
                        with lock:
                            held.setdefault(m["key"], []).append((pulled_at, sent_at, m["msgId"]))
                            if ack:
                                acked.append(m["msgId"])
                        code, body = node.post("ackMsg", topic=topic, msgId=m["msgId"], ack=str(ack).lower())
                        assert code == 200 and body["code"] == 200, body
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        threads = [threading.Thread(target=consume, args=(seed,)) for seed in range(CONSUMERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not errors, errors[0]
        assert not any(t.is_alive() for t in threads)
        assert sorted(acked) == sorted(m["msgId"] for m in msgs)  # each acked once
        deliveries = 0
        for key, spans in held.items():
            spans.sort()
            deliveries += len(spans)
            for (_, sent, first), (pulled, _, second) in itertools.pairwise(spans):
                # a delivery's pull answered before the previous one's ack was even sent: held twice
                assert pulled > sent, f"key {key}: {second} handed out while {first} was consuming"
        for k in range(KEYS):  # a key's messages (one priority, one trigger time) acked in msgId order
            of_key = [msg_id for msg_id in acked if msg_id.startswith(f"k{k:02d}-")]
            assert of_key == sorted(of_key), of_key
        assert deliveries > len(msgs)  # some were nacked and delivered again
    finally:
        for node in nodes:
            assert node.stop() == 0, node.process.log_tail(4000)  # (None: it outlived SIGTERM and was killed)


def test_push_deliveries_in_flight_at_sigkill_come_back_after_their_push_timeout(redis_url, tmp_path):
    flags = ("--backend", redis_url, "--push-allow", "127.0.0.1")
    server = Server.start(tmp_path / "data", *flags, log_path=tmp_path / "serve.log")
    sub = Subscriber(str(tmp_path), "hang")
    topic = "push-kill-" + uuid.uuid4().hex[:8]
    ids = [f"m{i}" for i in range(5)]
    try:
        assert server.post("subscribe", topic=topic, url=sub.url, timeoutMillis=3_000)[0] == 200
        for msg_id in ids:
            server.post("sendMsg", topic=topic, msg="once", msgId=msg_id)
        wait_for(lambda: len(sub.received()) >= 5, 20, "five deliveries")  # in flight: never answered
        delivered_at = time.monotonic()
        server.kill()
        sub.mode("ok")
        server = Server.start(tmp_path / "data", *flags, log_path=tmp_path / "serve.log")
        assert {status(server, topic, i) for i in ids} == {CONSUMING}
        # their ack deadline is 63 s after the delivery; the push timeout 3 s and the lease 10 s
        wait_for(lambda: all(status(server, topic, i) == ACKED for i in ids), 40, "redelivery after the restart")
        assert time.monotonic() - delivered_at < 63
        received = sorted(r["headers"]["Hourglass-Msg-Id"] for r in sub.received())
        assert received == sorted(ids * 2)  # at least once: again after the crash, then acked
    finally:
        sub.stop()
        server.kill()
