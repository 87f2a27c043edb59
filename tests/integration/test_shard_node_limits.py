"""A node of many shards keeps the node's limits (broker.shards.budgets,
docs/configuration.md "--shards"): a cap a flag states for the node is
never passed on a node of 3 shards (3 catches what an even split hides),
and a data directory that lost its shard count is refused with a sentence,
not opened as a new, empty shard."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from serving import ROOT, Server

from storage.entry import Status

pytestmark = pytest.mark.slow


def test_max_schedules_and_schedule_bytes_hold_for_the_node_of_three_shards(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "3", "--max-schedules", "5")
    try:
        answers = [server.post("putSchedule", topic="t", scheduleId=f"s{i}", everyMillis=60_000, msg="m")
                   for i in range(15)]
        made = [a for a in answers if a[0] == 200 and a[1]["code"] == 200]
        refused = [a for a in answers if a[0] == 429 or (a[0] == 200 and a[1]["code"] == 429)]
        assert 1 <= len(made) <= 5 and len(made) + len(refused) == 15, answers
        assert all("--max-schedules" in str(a[1]) for a in refused)
        listed = server.get("listSchedules", topic="t", limit=100)[1]["schedules"]
        assert len(listed) == len(made)
    finally:
        assert server.stop() == 0
    server = Server.start(tmp_path / "bytes", "--shards", "3", "--max-schedule-bytes", "3000")
    try:
        held = 0
        for i in range(12):
            status, body = server.post("putSchedule", topic="t", scheduleId=f"b{i}", everyMillis=60_000, msg="x" * 500)
            if status == 200 and body["code"] == 200:
                held += 500
        assert 500 <= held <= 3000, held
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("flag", ["--max-inflight-total", "--max-inflight"])
def test_an_inflight_cap_holds_for_the_node_of_three_shards(tmp_path, flag):
    server = Server.start(tmp_path / "data", "--shards", "3", flag, "4")
    try:
        for i in range(30):
            assert server.post("sendMsg", topic="t", msgId=f"m{i}", msg="x", delayMillis=0)[1]["code"] == 200
        pulled = 0
        for _ in range(10):
            status, body = server.post("pullMsg", topic="t", batch=30, ackTimeoutMillis=60_000)
            pulled += len(body.get("delayMsgList") or []) if status == 200 else 0
        assert 1 <= pulled <= 4, pulled
    finally:
        assert server.stop() == 0


def test_a_directory_of_shards_that_lost_its_count_is_refused_naming_the_file(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    assert server.post("sendMsg", topic="t", msgId="kept", msg="x", delayMillis=60_000)[1]["code"] == 200
    assert server.stop() == 0
    (tmp_path / "data" / "shards").unlink()
    refused = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "data"),
                              "--port", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 1
    assert "shards is missing, but the data directory holds shard-0/, shard-1/" in refused.stderr
    assert not (tmp_path / "data" / "commitlog").exists()  # no new store beside the shards
    (tmp_path / "data" / "shards").write_text("2\n")  # put back: every message is there
    (tmp_path / "data" / "shards").chmod(0o600)
    again = Server.start(tmp_path / "data", "--shards", "auto")
    try:
        assert again.post("getMsg", topic="t", msgId="kept")[1]["code"] == 200
    finally:
        assert again.stop() == 0


def test_the_python_client_sends_and_acks_on_each_messages_shard_and_falls_back_to_the_node(tmp_path):
    """broker.client reads getShardMap: a send, an ack, a nack and a batch
    ack of a node of 3 shards go to the message's shard (the node forwards
    none of them); a shard port that fails sends the call through the
    node's port, nothing lost."""
    import asyncio

    from broker.client import DelayQueueClient


    server = Server.start(tmp_path / "data", "--shards", "3")

    def forwards() -> int:
        text = server.get("/metrics")[1].decode()
        return int(next(line.split()[-1] for line in text.split("\n")
                        if line.startswith("hourglass_shard_forwards_total")))

    async def body() -> None:
        async with DelayQueueClient(server.base) as client:
            for topic in ("d", "k", "a"):  # the map read, and each shard's admission of a new topic (a fan-out)
                for i in range(12):
                    await client.send(topic, "m", msg_id=f"warm-{i}", delay_ms=60_000)
            before = forwards()
            for i in range(30):
                await client.send("d", "m", msg_id=f"direct-{i}", delay_ms=60_000)
            for i in range(30):
                await client.send("k", "m", msg_id=f"keyed-{i}", key=f"key-{i % 7}", delay_ms=60_000)
            sent_forwards = forwards() - before
            # The two scrapes' own fan-outs only (4 to 6 on 3 shards: whether a scrape counts the calls it
            # makes itself depends on their order); a send forwarded is one more each (53 of these 60 were).
            assert sent_forwards < 12, sent_forwards
            for i in range(6):
                await client.send("a", "m", msg_id=f"ack-{i}")
            pulled = []
            while len(pulled) < 6:
                pulled += await client.pull("a", batch=6, ack_timeout_ms=60_000)
            before = forwards()
            await client.ack("a", pulled[0].msg_id)
            await client.nack("a", pulled[1].msg_id)
            assert set((await client.ack_many("a", [m.msg_id for m in pulled[2:]])).values()) == {Status.ACKED}
            assert forwards() - before < 12, forwards() - before  # the scrapes' only (as above)
            client._shard_map.shards = ["http://127.0.0.1:9"] * 3  # a map whose ports fail: the node's port serves
            await client.send("d", "m", msg_id="after-a-dead-port", delay_ms=60_000)
            assert client._shard_map.shards == []
            assert (await client.get("d", "after-a-dead-port")).msg == "m"

    try:
        asyncio.run(body())
    finally:
        assert server.stop() == 0


def test_a_subscriptions_concurrency_holds_for_the_node_of_three_shards(tmp_path):
    """concurrency=2 on a node of 3 shards: at most 2 POSTs at once at
    the subscriber (each shard pushing its own messages with 2 made 6),
    every message delivered once."""
    import asyncio
    import threading
    import time

    from aiohttp import web

    state = {"now": 0, "most": 0, "ids": []}
    lock = threading.Lock()
    started = threading.Event()
    holder: dict = {}

    async def deliver(request: web.Request) -> web.Response:
        body = await request.json()
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.15)
        with lock:
            state["now"] -= 1
            state["ids"].append(body["msgId"])
        return web.Response(text="ok")

    def serve() -> None:
        async def run() -> None:
            app = web.Application()
            app.router.add_post("/hook", deliver)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            holder["port"] = runner.addresses[0][1]
            holder["stop"] = asyncio.Event()
            holder["loop"] = asyncio.get_running_loop()
            started.set()
            await holder["stop"].wait()
            await runner.cleanup()
        asyncio.run(run())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    server = Server.start(tmp_path / "data", "--shards", "3", "--push-allow", "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{holder['port']}/hook"
        assert server.post("subscribe", topic="p", url=url, concurrency=2)[1]["code"] == 200
        for i in range(24):
            assert server.post("sendMsg", topic="p", msgId=f"m{i}", msg="x", delayMillis=0)[1]["code"] == 200
        deadline = time.monotonic() + 60
        while len(set(state["ids"])) < 24 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(set(state["ids"])) == sorted(f"m{i}" for i in range(24))
        assert state["most"] <= 2, state["most"]
    finally:
        assert server.stop() == 0
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(10)


def _ids_on(shard: int, count: int, prefix: str, n: int) -> list[str]:
    from broker.shards import placement

    found, i = [], 0
    while len(found) < n:
        if placement.owner(f"{prefix}{i}", count) == shard:
            found.append(f"{prefix}{i}")
        i += 1
    return found


def _port_post(port: int, name: str, **params: object) -> dict:
    import http.client
    import json
    import urllib.parse

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/camellia/delayQueue/" + name, urllib.parse.urlencode(params),
                           {"Content-Type": "application/x-www-form-urlencoded"})
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


@pytest.mark.parametrize("count", [2, 3])
def test_a_pull_takes_the_nodes_highest_priority_first_whichever_shard_it_reaches(tmp_path, count):
    """Priorities 5, 5 on other shards and 0, 0, 0 on the one the pull
    reaches: a pull of 2 on each shard's port takes the two of 5; a higher
    message that comes READY on another shard later is taken before the
    0s; one a shard handed over that another outranks is READY again, not
    lost (a pull of 2 reaching an empty shard, with 5 and 0 on one and 3
    on another, takes 5 and 3)."""
    server = Server.start(tmp_path / "data", "--shards", str(count))
    try:
        ports = server.get("/camellia/delayQueue/getShardMap")[1]["ports"]
        for receiver in range(count):
            topic = f"p{receiver}"
            other = (receiver + 1) % count
            for msg_id in _ids_on(receiver, count, "low", 3):
                assert server.post("sendMsg", topic=topic, msgId=msg_id, msg="x", priority=0)[1]["code"] == 200
            for msg_id in _ids_on(other, count, "high", 2):
                assert server.post("sendMsg", topic=topic, msgId=msg_id, msg="x", priority=5)[1]["code"] == 200
            first = _port_post(ports[receiver], "pullMsg", topic=topic, batch=2)["delayMsgList"]
            assert [m["priority"] for m in first] == [5, 5], (receiver, first)
            late = _ids_on(other, count, "later", 1)[0]
            assert server.post("sendMsg", topic=topic, msgId=late, msg="x", priority=7)[1]["code"] == 200
            second = _port_post(ports[receiver], "pullMsg", topic=topic, batch=2)["delayMsgList"]
            assert [m["priority"] for m in second] == [7, 0], (receiver, second)
            rest = _port_post(ports[receiver], "pullMsg", topic=topic, batch=10)["delayMsgList"]
            assert [m["priority"] for m in rest] == [0, 0]
        if count == 3:  # the give-back: 5 and 0 on shard 1, 3 on shard 2, the pull reaching shard 0
            top, low = _ids_on(1, 3, "gtop", 1)[0], _ids_on(1, 3, "glow", 1)[0]
            mid = _ids_on(2, 3, "gmid", 1)[0]
            for msg_id, priority in ((top, 5), (low, 0), (mid, 3)):
                assert server.post("sendMsg", topic="g", msgId=msg_id, msg="x", priority=priority)[1]["code"] == 200
            taken = _port_post(ports[0], "pullMsg", topic="g", batch=2)["delayMsgList"]
            assert [(m["msgId"], m["priority"]) for m in taken] == [(top, 5), (mid, 3)]
            assert server.post("getMsg", topic="g", msgId=low)[1]["delayMsg"]["status"] == Status.READY  # again
            assert [m["msgId"] for m in _port_post(ports[0], "pullMsg", topic="g", batch=2)["delayMsgList"]] == [low]
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("count", [2, 3])
def test_within_a_priority_a_pull_takes_the_nodes_earliest_due_whichever_shard_it_reaches(tmp_path, count):
    """30 due messages of one priority, due a second apart, spread over the
    shards and sent in a shuffled order; one pull of 1 after another on the
    first shard's port (a client that knows one URL) hands them out in
    trigger order: a shard's older messages are not left waiting while the
    shard that took the pulls hands out its own (docs/api.md, "Shards":
    within 100 ms). Then a message due earlier than all comes READY on
    another shard: the next pull takes it."""
    import random
    import time

    server = Server.start(tmp_path / "data", "--shards", str(count))
    try:
        ports = server.get("/camellia/delayQueue/getShardMap")[1]["ports"]
        start = int(time.time() * 1000) - 120_000
        sends = [(f"m{i}", start + 1_000 * (i + 10)) for i in range(30)]
        random.Random(7).shuffle(sends)
        for msg_id, trigger in sends:
            assert server.post("sendMsg", topic="o", msgId=msg_id, msg="x", triggerTime=trigger)[1]["code"] == 200
        assert len({placement_of(msg_id, count) for msg_id, _ in sends}) == count
        time.sleep(0.2)  # (what the link carries between shards, in flight as the last answer came: docs/api.md)
        taken = []
        for _ in range(10):
            taken += _port_post(ports[0], "pullMsg", topic="o", batch=1)["delayMsgList"]
        assert [m["triggerTime"] for m in taken] == sorted(t for _, t in sends)[:10]
        early = _ids_on(count - 1, count, "early", 1)[0]
        assert server.post("sendMsg", topic="o", msgId=early, msg="x", triggerTime=start)[1]["code"] == 200
        time.sleep(0.2)
        assert [m["msgId"] for m in _port_post(ports[0], "pullMsg", topic="o", batch=1)["delayMsgList"]] == [early]
        rest = []
        for _ in range(25):
            rest += _port_post(ports[0], "pullMsg", topic="o", batch=3)["delayMsgList"]
        assert [m["triggerTime"] for m in rest] == sorted(t for _, t in sends)[10:]
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("config", [{"fairness": "fairKey"}, {"maxDueAgeMillis": 60_000}])
def test_a_topic_in_its_own_order_hands_out_the_messages_of_the_shard_a_pull_reaches(tmp_path, config):
    """A fair topic, or one with a due-age cap, is not ordered by priority
    (no head to tell): a pull on a shard's port still takes that shard's
    own READY messages, not only the other shards'."""
    server = Server.start(tmp_path / "data", "--shards", "2")
    try:
        ports = server.get("/camellia/delayQueue/getShardMap")[1]["ports"]
        assert server.post("setTopicConfig", topic="f", **config)[1]["code"] == 200
        mine = _ids_on(0, 2, "own", 3)
        for msg_id in mine:
            assert server.post("sendMsg", topic="f", msgId=msg_id, msg="x", fairKey="g")[1]["code"] == 200
        got = _port_post(ports[0], "pullMsg", topic="f", batch=10)["delayMsgList"]
        assert sorted(m["msgId"] for m in got) == sorted(mine)
    finally:
        assert server.stop() == 0


def placement_of(msg_id: str, count: int) -> int:
    from broker.shards import placement

    return placement.owner(msg_id, count)


def test_metrics_topics_holds_for_the_node_of_two_shards_not_for_each_shard(tmp_path):
    """--metrics-topics 1 on a node of 2 shards: topic a waits with 6
    messages, 3 on each shard; b with 5 on shard 0 alone, c with 5 on
    shard 1 alone. Each shard's own largest (b there, c here) is not the
    node's: /metrics, asked of each shard's own port, shows a alone, its 6
    summed."""
    import urllib.request

    server = Server.start(tmp_path / "data", "--shards", "2", "--metrics-topics", "1")
    try:
        for topic, msg_ids in (("a", _ids_on(0, 2, "a", 3) + _ids_on(1, 2, "a", 3)), ("b", _ids_on(0, 2, "b", 5)),
                               ("c", _ids_on(1, 2, "c", 5))):
            for msg_id in msg_ids:
                assert server.post("sendMsg", topic=topic, msgId=msg_id, msg="x", delayMillis=600_000)[1]["code"] == 200
        for port in server.get("/camellia/delayQueue/getShardMap")[1]["ports"]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
                lines = answer.read().decode().split("\n")
            labelled = {line.partition('topic="')[2].partition('"')[0] for line in lines
                        if 'topic="' in line and not line.startswith("#")}
            assert labelled == {"a"}, (port, labelled)
            assert 'hourglass_waiting_messages{topic="a"} 6' in lines
            assert 'topic_info{topic="a",type="waitingQueueSize"} 6' in lines
            assert "hourglass_topics 3" in lines and "hourglass_topics_shown 1" in lines
            assert "hourglass_node_waiting_messages 16" in lines
    finally:
        assert server.stop() == 0


def test_max_connections_holds_for_the_node_of_three_shards_and_a_closed_one_frees_its_place(tmp_path):
    """Before: each shard took --max-connections of its own, the node up to
    three times the flag's value."""
    server = Server.start(tmp_path / "data", "--shards", "3", "--max-connections", "3")
    host, port = server.base.removeprefix("http://").split(":")
    form = b"topic=idle&longPollingTimeoutMillis=30000"
    poll = (b"POST /camellia/delayQueue/longPollingMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (len(form), form))
    sockets = []
    try:
        held, refused = [], []
        for _ in range(9):  # long polls of a topic nothing is sent to: running, never stalled
            s = socket.create_connection((host, int(port)), timeout=10)
            sockets.append(s)
            s.sendall(poll)
            s.settimeout(1.5)
            try:
                answer = s.recv(65536)
            except TimeoutError:
                held.append(s)
                continue
            assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer, answer
            refused.append(s)
        assert (len(held), len(refused)) == (3, 6)
        held[0].close()  # its shard tells the others: a new connection finds its place, whichever shard takes it
        deadline = time.monotonic() + 10
        while (status := server.post("sendMsg", topic="t", msg="x")[0]) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == 200
    finally:
        for s in sockets:
            s.close()
        assert server.stop() == 0
