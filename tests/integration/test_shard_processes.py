"""A node of many shards, as real processes (broker.shards): the newcomer's
`hourglass serve` using every core, one shard killed under load and
started again with nothing answered lost, a long poll woken by another
shard's message, a batch split over the shards and answered in order,
and the counts a data directory keeps."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from harness import children, wait_until
from serving import ROOT, Server

from broker.shards import layout, placement

pytestmark = pytest.mark.slow


def shard_pids(server: Server) -> list[int]:
    return children(server.proc.pid)


def test_a_fresh_data_directory_uses_every_core(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "auto")
    try:
        cores = layout.cores()
        assert (tmp_path / "data" / "shards").read_text() == f"{cores}\n"
        status, body = server.get("/health")
        assert status == 200 and body["status"] == "ok"
        if cores > 1:
            assert len(shard_pids(server)) == cores and body["shards"] == cores
            assert sorted(os.listdir(tmp_path / "data")) == sorted(
                ["shards", "links", *(f"shard-{i}" for i in range(cores))])
    finally:
        assert server.stop() == 0


def test_a_kept_count_refuses_another_and_an_older_directory_is_one_shard(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    assert server.stop() == 0
    refused = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "data"),
                              "--shards", "3", "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 1
    assert "keeps 2 shards and --shards 3 was given" in refused.stderr
    again = Server.start(tmp_path / "data", "--shards", "auto")  # auto opens the kept count
    try:
        assert again.get("/health")[1]["shards"] == 2
    finally:
        assert again.stop() == 0


def test_a_cluster_or_redis_node_refuses_many_shards_with_a_sentence(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path),
                              "--backend", "redis://127.0.0.1:1/0", "--shards", "2"], capture_output=True,
                             text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 1 and "runs one process" in refused.stderr


def owned_ids(count: int, shard: int, n: int, prefix: str) -> list[str]:
    found: list[str] = []
    i = 0
    while len(found) < n:
        msg_id = f"{prefix}-{i}"
        if placement.owner(msg_id, count) == shard:
            found.append(msg_id)
        i += 1
    return found


def test_a_batch_is_split_over_the_shards_answered_in_order_and_validated_whole(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        ids = [f"b-{i}" for i in range(40)]
        assert {placement.owner(i, 2) for i in ids} == {0, 1}
        msgs = [{"msgId": i, "msg": i, "delayMillis": 60_000} for i in ids]
        status, body = server.post_json("sendMsgBatch", {"topic": "t", "msgs": msgs})
        assert status == 200 and body["code"] == 200, body
        assert [m["msgId"] for m in body["delayMsgList"]] == ids
        bad: list[dict[str, object]] = [{"msgId": f"c-{i}", "msg": "x", "delayMillis": 0} for i in range(10)]
        bad[7]["delayMillis"] = "soon"
        status, body = server.post_json("sendMsgBatch", {"topic": "t2", "msgs": bad})
        assert body["code"] == 400 and "delayMillis" in body["msg"]
        for m in bad:
            assert server.post("getMsg", topic="t2", msgId=m["msgId"])[1]["code"] == 404  # no shard stored it
        for i in ids:
            status, body = server.post("getMsg", topic="t", msgId=i)
            assert body["code"] == 200 and body["delayMsg"]["msg"] == i
        status, body = server.get("/camellia/delayQueue/getTopicInfo?topic=t")
        assert body["data"]["waitingQueueSize"] == 40
    finally:
        assert server.stop() == 0


def test_a_keyed_message_on_another_shard_than_its_msgid_is_acked_and_nacked(tmp_path):
    """A keyed message lives on its key's shard: an ack (single or batch)
    and a nack reach it there, wherever the msgId alone would point."""
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        ids = [i for i in (f"m{n}" for n in range(40)) if placement.owner(i, 2) != placement.owner("k", 2)][:3]
        for msg_id in ids:
            assert server.post("sendMsg", topic="t", msgId=msg_id, msg="x", key="k", maxRetry=3)[1]["code"] == 200
        [first] = server.post("pullMsg", topic="t", batch=10)[1]["delayMsgList"]  # one of a key at a time
        assert server.post("ackMsg", topic="t", msgId=first["msgId"], ack="false")[1]["code"] == 200
        assert server.post("getMsg", topic="t", msgId=first["msgId"])[1]["delayMsg"]["status"] == 2  # nacked
        for at in range(len(ids)):
            [m] = server.post("pullMsg", topic="t", batch=10)[1]["delayMsgList"]
            if at % 2:
                assert server.post("ackMsg", topic="t", msgId=m["msgId"])[1]["code"] == 200
            else:
                answer = server.post("ackMsg", topic="t", msgIds=f"{m['msgId']},nobody")[1]
                assert answer["results"] == [{"msgId": m["msgId"], "status": 4}, {"msgId": "nobody", "status": None}]
            assert server.post("getMsg", topic="t", msgId=m["msgId"])[1]["delayMsg"]["status"] == 4
        assert server.post("pullMsg", topic="t", batch=10)[1]["delayMsgList"] == []
    finally:
        assert server.stop() == 0


def test_a_long_poll_is_woken_by_a_message_of_another_shard(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        host, port = server.base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("GET", "/health")
        polling_shard = json.loads(connection.getresponse().read())["shard"]
        other = 1 - polling_shard
        got: list[dict] = []

        def poll() -> None:
            body = urllib.parse.urlencode({"topic": "lp", "longPollingTimeout": 30_000, "batch": 1})
            connection.request("POST", "/camellia/delayQueue/longPollingMsg", body,
                               {"Content-Type": "application/x-www-form-urlencoded"})
            got.append(json.loads(connection.getresponse().read()))
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.5)  # the poll is held
        msg_id = owned_ids(2, other, 1, "wake")[0]
        assert server.post("sendMsg", topic="lp", msgId=msg_id, msg="hi")[1]["code"] == 200
        poller.join(timeout=60)
        assert got and got[0]["code"] == 200
        assert [m["msgId"] for m in got[0]["delayMsgList"]] == [msg_id]  # from the other shard, not at the timeout
        connection.close()
    finally:
        assert server.stop() == 0


def test_a_shard_killed_under_load_comes_back_and_nothing_answered_is_lost(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        answered: list[str] = []
        refused = [0]
        stop = threading.Event()

        def send() -> None:
            i = 0
            while not stop.is_set():
                msg_id = f"k-{i}"
                i += 1
                try:
                    status, body = server.post("sendMsg", topic="load", msgId=msg_id, msg=msg_id,
                                               delayMillis=3_600_000)
                except OSError:
                    refused[0] += 1
                    continue
                if status == 200 and body.get("code") == 200:
                    answered.append(msg_id)
                else:
                    refused[0] += 1
        sender = threading.Thread(target=send)
        sender.start()
        wait_until(lambda: len(answered) >= 100, 60, "sends before the kill")
        before = shard_pids(server)
        victim = before[1]
        os.kill(victim, signal.SIGKILL)
        killed_at = len(answered)
        # the other shard goes on: sends it owns are answered while the victim is down or starting
        wait_until(lambda: len(answered) >= killed_at + 50, 60, "sends after the kill")
        wait_until(lambda: len(shard_pids(server)) == 2 and victim not in shard_pids(server), 60,
                   "the killed shard started again")
        wait_until(lambda: server.get("/health")[0] == 200, 60, "the node whole again")
        after_restart = len(answered)
        wait_until(lambda: len(answered) >= after_restart + 100, 60, "sends after the restart")
        stop.set()
        sender.join(timeout=60)
        owners = {placement.owner(i, 2) for i in answered[after_restart:]}
        assert owners == {0, 1}  # both shards store again
        lost = [i for i in answered if server.post("getMsg", topic="load", msgId=i)[1].get("code") != 200]
        assert lost == []
        _, body = server.get("/camellia/delayQueue/getTopicInfo?topic=load")
        assert body["data"]["waitingQueueSize"] >= len(answered)
    finally:
        assert server.stop() == 0


def test_long_polls_on_every_shard_receive_every_message_of_a_burst(tmp_path):
    """A burst due at once over both shards, consumers long-polling on
    connections of their own: every message is delivered (a shard found
    drained is asked again once it says the topic has one READY)."""
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        n = 600
        msgs = [{"msgId": f"burst-{i}", "msg": str(i), "delayMillis": 1500 + i % 500} for i in range(n)]
        for start in range(0, n, 100):
            _, body = server.post_json("sendMsgBatch", {"topic": "burst", "msgs": msgs[start:start + 100]})
            assert body["code"] == 200, body
        received: set[str] = set()
        lock = threading.Lock()
        done = threading.Event()

        def consume() -> None:
            host, port = server.base.removeprefix("http://").split(":")
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            while not done.is_set():
                body = urllib.parse.urlencode({"topic": "burst", "longPollingTimeout": 2000, "batch": 10})
                connection.request("POST", "/camellia/delayQueue/longPollingMsg", body,
                                   {"Content-Type": "application/x-www-form-urlencoded"})
                got = json.loads(connection.getresponse().read())["delayMsgList"]
                for m in got:
                    assert server.post("ackMsg", topic="burst", msgId=m["msgId"])[1]["code"] == 200
                with lock:
                    received.update(m["msgId"] for m in got)
                    if len(received) == n:
                        done.set()
            connection.close()
        consumers = [threading.Thread(target=consume) for _ in range(4)]
        for consumer in consumers:
            consumer.start()
        done.wait(timeout=30)
        done.set()
        for consumer in consumers:
            consumer.join(timeout=30)
        assert len(received) == n, f"{n - len(received)} never delivered"
    finally:
        assert server.stop() == 0


def test_a_client_that_knows_the_shard_map_sends_each_message_to_its_shard_with_no_forward(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        status, body = server.get("/camellia/delayQueue/getShardMap")
        assert status == 200 and body["shards"] == 2 and body["placement"] == "crc32"
        ports = body["ports"]
        shards = []
        for port in ports:
            _, health = _get(port, "/health")
            shards.append(health["shard"])
        assert shards == [0, 1]  # each port is its shard's own

        def forwards() -> int:
            text = server.get("/metrics")[1].decode()
            return int(next(line.split()[-1] for line in text.splitlines()
                            if line.startswith("hourglass_shard_forwards_total")))
        before = forwards()
        for i in range(40):
            msg_id = f"direct-{i}"
            _, sent = _post(ports[placement.owner(msg_id, 2)], "sendMsg", topic="d", msgId=msg_id, msg="m")
            assert sent["code"] == 200
        assert forwards() - before < 10  # the scrapes' and a new topic's own fan-out: no send forwarded
        _, info = server.get("/camellia/delayQueue/getTopicInfo?topic=d")
        assert info["data"]["readyQueueSize"] == 40
    finally:
        assert server.stop() == 0


def _get(port: int, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _post(port: int, name: str, **params: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/camellia/delayQueue/" + name, urllib.parse.urlencode(params),
                           {"Content-Type": "application/x-www-form-urlencoded"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_data_directory_with_a_long_path_serves_its_shards(tmp_path):
    """A Unix socket's path is at most ~108 bytes: the shards' sockets
    under a long data directory are reached through a descriptor of it."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.parent.mkdir(parents=True)
    server = Server.start(deep, "--shards", "2")
    try:
        assert len(str(deep / "links" / "0.sock")) > 108
        ids = [f"long-{i}" for i in range(20)]
        for msg_id in ids:
            assert server.post("sendMsg", topic="l", msgId=msg_id, msg="m")[1]["code"] == 200
        assert all(server.post("getMsg", topic="l", msgId=i)[1]["code"] == 200 for i in ids)
    finally:
        assert server.stop() == 0


def _post_batch(port: int, batch: dict) -> tuple[int, dict]:
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/camellia/delayQueue/sendMsgBatch", json.dumps(batch),
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def test_a_batch_whose_part_was_lost_with_its_shard_is_taken_back_there_once_it_is_back(tmp_path):
    """Shard 1 stopped (SIGSTOP) while a batch split over both shards is
    sent to shard 0, then killed: its part's answer is lost with the link,
    so shard 0 cannot tell whether it was stored. The batch is answered
    503, shard 0's part taken back at once, and shard 1's owed until it is
    connected again; sent again, the batch's ten messages are stored once."""
    log_path = tmp_path / "node.log"
    server = Server.start(tmp_path / "data", "--shards", "2", log_path=log_path)
    try:
        ports = server.get("/camellia/delayQueue/getShardMap")[1]["ports"]
        keys = {placement.owner(f"key{i}", 2): f"key{i}" for i in range(20)}
        batch = {"topic": "lost", "msgs": [{"msg": f"{i}", "key": keys[i % 2], "delayMillis": 600_000}
                                           for i in range(10)]}
        # the topic known first (a new topic's first send asks every shard whether the node has it)
        assert _post_batch(ports[0], {"topic": "lost", "msgs": [{"msg": "first", "delayMillis": 600_000}]})[0] == 200
        victim = shard_pids(server)[1]
        os.kill(victim, signal.SIGSTOP)
        answered: list[tuple[int, dict]] = []
        sender = threading.Thread(target=lambda: answered.append(_post_batch(ports[0], batch)))
        sender.start()
        time.sleep(1.0)  # (the part is with shard 1's link, unanswered)
        assert not answered, answered
        os.kill(victim, signal.SIGKILL)
        sender.join(30)
        assert answered and answered[0][0] == 503, answered
        wait_until(lambda: len(shard_pids(server)) == 2 and victim not in shard_pids(server), 60,
                   "the killed shard started again")
        wait_until(lambda: server.get("/health")[0] == 200, 60, "the node whole again")
        wait_until(lambda: "taking back 5 messages of batches answered 503 from shard 1" in log_path.read_text(),
                   30, "shard 1's part taken back once it was connected again")
        status, body = _post_batch(ports[0], batch)
        assert status == 200 and body["code"] == 200, body
        _, info = server.get("/camellia/delayQueue/getTopicInfo?topic=lost")
        assert info["data"]["waitingQueueSize"] == 11, info
    finally:
        assert server.stop() == 0


def test_a_batch_answered_503_while_a_shard_is_down_is_stored_once_when_sent_again(tmp_path):
    """A sendMsgBatch of keyed messages without msgIds, split over both
    shards, sent to shard 0 right after shard 1 is killed: answered 503,
    then sent again (as a client does) once the node is whole. Each round
    stores the batch's ten messages once, not shard 0's five again."""
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        ports = server.get("/camellia/delayQueue/getShardMap")[1]["ports"]
        keys = {placement.owner(f"key{i}", 2): f"key{i}" for i in range(20)}
        batch = {"topic": "b", "msgs": [{"msg": f"{i}", "key": keys[i % 2], "delayMillis": 600_000}
                                        for i in range(10)]}
        refused = stored = 0
        for _ in range(3):
            victim = shard_pids(server)[1]
            os.kill(victim, signal.SIGKILL)
            status, body = _post_batch(ports[0], batch)
            if status == 200 and body["code"] == 200:
                stored += 1
            else:
                assert status == 503, (status, body)
                refused += 1
            wait_until(lambda gone=victim: len(shard_pids(server)) == 2 and gone not in shard_pids(server), 60,
                       "the killed shard started again")
            wait_until(lambda: server.get("/health")[0] == 200, 60, "the node whole again")
            status, body = _post_batch(ports[0], batch)
            assert status == 200 and body["code"] == 200, body
            stored += 1
        assert refused >= 1
        _, info = server.get("/camellia/delayQueue/getTopicInfo?topic=b")
        assert info["data"]["waitingQueueSize"] == 10 * stored, (info, stored, refused)
    finally:
        assert server.stop() == 0
