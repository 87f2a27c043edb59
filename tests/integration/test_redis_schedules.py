"""Recurring schedules on Redis with real `hourglass serve --backend
redis://` processes sharing one real redis-server (the session's):

- two nodes, an every-second schedule (misfire=once, 60 s grace), a
  consumer long-polling both; the node holding the schedules lease is
  SIGKILLed and restarted twice, the other taking the lease once it
  lapses. Every nominal second from the first run to the last is
  delivered (no run lost), each run's message was made once (one
  produceTime per msgId, the drill checker's rule: bench/drill_history.py),
  and none before its nominal time;
- the holder SIGKILLed and a new node started: every node answers the
  schedule calls at once (never 503, the dead node's lease still
  running), each seeing the others' changes, and the dead node's
  schedules fire again within the lease time;
- a run held back by its topic's pause, the holder SIGKILLed during the
  pause and the topic resumed through the other node: the run stays held
  (waiting, no run made behind it) across the kill, and once the lease
  lapsed it is judged by its misfire rule (once: delivered once, missed;
  the next run the first nominal time after the resume);
- two runs acked: getSchedule's lastRuns lists both, on every node, at once;
- a purge through the node that does not hold the lease deletes the
  pending runs and the schedules go on; that node refuses a send under a
  run's msgId, asking Redis.

The API's schedule calls are covered on Redis by the conformance suite
(tests/conformance/test_conformance_schedules.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from drill_history import Delivery, History, check
from serving import Server, wait_for

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
pytestmark = pytest.mark.slow

HOLDER_WAIT_S = 25  # a killed holder's lease (10 s) lapses, and the next renewal round (3.3 s) takes it


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({e})"


def holds_lease(node: Server) -> bool:
    """Whether the node makes the schedules' runs (/metrics' hourglass_schedules_lease)."""
    code, text = node.get("/metrics")
    assert code == 200 and isinstance(text, bytes), text
    return b"\nhourglass_schedules_lease 1" in text


def holder(nodes: list[Server], wait_s: float = HOLDER_WAIT_S) -> int:
    """The index of the node holding the schedules lease."""
    deadline = time.monotonic() + wait_s
    while True:
        for i, node in enumerate(nodes):
            try:
                if holds_lease(node):
                    return i
            except OSError:
                pass
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {node.log_path} (end)\n{_tail(node.log_path)}" for node in nodes)
            raise AssertionError(f"no node took the schedules lease within {wait_s} s{logs}")
        time.sleep(0.1)


# The Redis database this file's nodes use, flushed first: database 0 of the
# session's server may hold another test's node, and with it the schedules
# lease (the conformance suite's shared node), which these nodes would wait on.
OWN_DB = 14


def own_database(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + f"/{OWN_DB}"
    import redis
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return url


@dataclass
class TwoNodes:
    topic: str  # a fresh one
    redis_url: str  # this file's own database (OWN_DB), flushed first
    nodes: list[Server]  # killed when the test ends, and whatever the test put in their place


@pytest.fixture
def two_nodes(redis_url: str, tmp_path) -> Iterator[TwoNodes]:
    """Two `hourglass serve --backend redis://` nodes sharing the session's
    redis-server (node0 and node1 in tmp_path, with their logs)."""
    url = own_database(redis_url)
    nodes: list[Server] = []
    try:
        for i in range(2):
            nodes.append(Server.start(tmp_path / f"node{i}", "--backend", url, log_path=tmp_path / f"node{i}.log"))
        yield TwoNodes("sched-" + uuid.uuid4().hex[:8], url, nodes)
    finally:
        for node in nodes:
            node.kill()


def test_kill_9_of_the_lease_holder_loses_no_run_and_makes_none_twice(two_nodes, tmp_path):
    topic, redis_url, nodes = two_nodes.topic, two_nodes.redis_url, two_nodes.nodes
    history = History()
    stop = threading.Event()

    def consume(which: int) -> None:
        while not stop.is_set():
            node = nodes[which]
            try:
                start = int(time.time() * 1000)
                code, answer = node.post("longPollingMsg", topic=topic, batch=50, longPollingTimeoutMillis=500,
                                         ackTimeoutMillis=30_000)
                if code != 200:
                    time.sleep(0.05)
                    continue
                end = int(time.time() * 1000)
                batch = answer["delayMsgList"]
                for m in batch:
                    history.deliveries.append(Delivery(topic, m["msgId"], start, end, m["retry"], m["triggerTime"],
                                                       None, 30_000, m["produceTime"], m["scheduledTime"]))
                if batch:
                    node.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in batch))
            except OSError:
                time.sleep(0.05)

    consumers = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(2)]
    try:
        first = holder(nodes)
        code, answer = nodes[first].post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="run")
        assert code == 200, answer
        code, answer = nodes[1 - first].get("getSchedule", topic=topic, scheduleId="s")  # any node serves them
        assert code == 200 and answer["schedule"]["version"] == 1, answer
        for c in consumers:
            c.start()
        for _ in range(2):
            time.sleep(2.5)
            held = holder(nodes)
            port = int(nodes[held].base.rsplit(":", 1)[1])
            nodes[held].kill()
            took = holder([nodes[1 - held]])  # the survivor, once the dead node's lease lapsed
            assert took == 0
            nodes[held] = Server.start(tmp_path / f"node{held}", "--backend", redis_url, port=port,
                                       log_path=tmp_path / f"node{held}.log")
        time.sleep(4)
        stop.set()
        for c in consumers:
            c.join(timeout=10)
        nominal = sorted({d.scheduled_ms for d in history.deliveries})
        deadline = time.monotonic() + 5
        while True:  # the holder sees a release a moment after it (its watch): the last one delivered too
            now = nodes[holder(nodes)]
            pending = now.get("getSchedule", topic=topic, scheduleId="s")[1]["schedule"]["nextFireTimes"][0]
            if pending > nominal[-1] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # runs released since the last poll wait READY (2), not lost; the pending one waits (1)
        since = [now.post("getMsg", topic=topic, msgId=f"s@{t}")[1]["delayMsg"]["status"]
                 for t in range(nominal[-1] + 1000, pending + 1000, 1000)]
    finally:
        stop.set()
    assert len(nominal) >= 20
    assert nominal == list(range(nominal[0], nominal[-1] + 1000, 1000)), "a run was lost"
    assert all(s == 2 for s in since[:-1]) and since[-1] in (1, 2), since
    found = check(history)
    assert found.runs_twice == 0 and found.runs_early == 0 and found.failed == [], found.as_dict()


LEASE_MS = 10_000  # RedisConfig.lease_ms: a killed holder's lease runs this long after its last renewal
CALLS = ("putSchedule", "pauseSchedule", "resumeSchedule", "getSchedule", "listSchedules", "deleteSchedule")


def schedule_calls(node: Server, topic: str, schedule_id: str) -> dict[str, int]:
    """Each schedule call once on `node`, in CALLS' order: the HTTP code of each."""
    codes = {}
    for call in CALLS:
        params = {"topic": topic, "scheduleId": schedule_id}
        if call == "putSchedule":
            params |= {"everyMillis": 60_000, "msg": "x"}
        answer = (node.get if call in ("getSchedule", "listSchedules") else node.post)(call, **params)
        codes[call] = answer[0]
    return codes


def test_every_node_serves_the_schedule_calls_while_a_killed_holders_lease_runs(two_nodes, tmp_path):
    topic, redis_url, nodes = two_nodes.topic, two_nodes.redis_url, two_nodes.nodes
    held = holder(nodes)
    schedule = nodes[held].post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="run")[1]
    first = schedule["schedule"]["nextFireTimes"][0]
    survivor = nodes[1 - held]
    got = pull_until(survivor, topic, 1, timeout_s=10, ackTimeoutMillis=60_000)
    assert [m["scheduledTime"] for m in got] == [first]
    nodes[held].kill()
    killed_ms = int(time.time() * 1000)
    nodes[held] = Server.start(tmp_path / "node-new", "--backend", redis_url, log_path=tmp_path / "new.log")
    new = nodes[held]
    # the dead node's lease runs for up to LEASE_MS more: every node answers every call meanwhile, at once
    codes = {name: schedule_calls(node, topic, f"api-{name}") for name, node in (("new", new),
                                                                                  ("survivor", survivor))}
    assert codes == {name: dict.fromkeys(CALLS, 200) for name in codes}, codes
    assert not holds_lease(new) and not holds_lease(survivor)  # (all of it before the lease lapsed)
    # each node's change seen by the other
    put = new.post("putSchedule", topic=topic, scheduleId="x", everyMillis=3_600_000, msg="x")[1]["schedule"]
    assert put["version"] == 1
    paused = survivor.post("pauseSchedule", topic=topic, scheduleId="x")[1]["schedule"]
    assert paused["version"] == 2 and paused["paused"] is True
    assert message(survivor, topic, f"x@{put['nextFireTimes'][0]}") == 404  # its pending run deleted
    resumed = new.post("resumeSchedule", topic=topic, scheduleId="x")[1]["schedule"]
    assert resumed["version"] == 3 and resumed["paused"] is False
    code, refused = survivor.post("putSchedule", topic=topic, scheduleId="x", everyMillis=1000, msg="y",
                                  version=2)
    assert code == 409 and "version 3" in refused["msg"], refused
    listed = survivor.get("listSchedules", topic=topic)[1]["schedules"]
    assert [(s["scheduleId"], s["version"]) for s in listed] == [("s", 1), ("x", 3)]
    assert new.post("deleteSchedule", topic=topic, scheduleId="x")[0] == 200
    assert survivor.get("getSchedule", topic=topic, scheduleId="x")[0] == 404
    assert elapsed_ms(killed_ms) < LEASE_MS, "the calls took longer than the dead node's lease"
    # the dead node's schedule fires again once its lease lapsed: its runs made by a live node
    later = pull_until(survivor, topic, 2, timeout_s=LEASE_MS / 1000 + 8, ackTimeoutMillis=60_000)
    made = [m for m in later if m["produceTime"] > killed_ms]
    assert made, [(m["msgId"], m["produceTime"]) for m in later]
    assert made[0]["produceTime"] - killed_ms <= LEASE_MS + 5_000, (made[0], killed_ms)
    assert holds_lease(new) or holds_lease(survivor)


def test_a_run_held_by_a_pause_survives_the_holders_kill_9(two_nodes):
    topic, nodes = two_nodes.topic, two_nodes.nodes
    held = holder(nodes)
    survivor = nodes[1 - held]
    schedule = nodes[held].post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="run",
                                misfire="once", misfireGraceMillis=1000)[1]["schedule"]
    first = schedule["nextFireTimes"][0]
    assert survivor.post("pauseTopic", topic=topic)[0] == 200
    time.sleep(max(0.0, (first + 2500) / 1000 - time.time()))  # 2 nominal times and more past the first
    nodes[held].kill()
    killed_ms = int(time.time() * 1000)
    got = survivor.get("getSchedule", topic=topic, scheduleId="s")[1]["schedule"]
    assert got["runs"] == 1 and got["nextFireTimes"][0] == first, got  # held: no run made behind it
    assert message(survivor, topic, f"s@{first}")["status"] == 1  # waiting
    time.sleep(1.5)  # more nominal times pass, the holder dead: nothing moves it
    assert message(survivor, topic, f"s@{first}")["status"] == 1
    resumed_ms = int(time.time() * 1000)
    assert survivor.post("resumeTopic", topic=topic)[0] == 200
    assert elapsed_ms(killed_ms) < LEASE_MS  # (resumed while the dead holder's lease still runs)
    got_runs = pull_until(survivor, topic, 2, timeout_s=LEASE_MS / 1000 + 10, ackTimeoutMillis=60_000)
    times = [m["scheduledTime"] for m in got_runs]
    assert times[0] == first and len(times) == 2, times  # once: the held run alone, then the next on time
    assert times[1] > resumed_ms and (times[1] - first) % 1000 == 0, (times, resumed_ms)
    after = survivor.get("getSchedule", topic=topic, scheduleId="s")[1]["schedule"]
    judged = {r["scheduledTime"]: r for r in after["lastRuns"]}[first]
    assert judged["missed"] is True and judged["latenessMillis"] >= resumed_ms - first, judged
    assert holds_lease(survivor)


def elapsed_ms(since_ms: int) -> int:
    return int(time.time() * 1000) - since_ms


def pull_until(node: Server, topic: str, count: int, timeout_s: float, **params: object) -> list[dict]:
    """Long-poll until `count` messages came (or the timeout)."""
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        code, body = node.post("longPollingMsg", topic=topic, batch=count - len(got), longPollingTimeoutMillis=300,
                               **params)
        assert code == 200, body
        got += body["delayMsgList"]
    return got


def message(node: Server, topic: str, msg_id: str) -> dict | int:
    """getMsg's delayMsg, or the code if not 200."""
    code, body = node.post("getMsg", topic=topic, msgId=msg_id)
    return body["delayMsg"] if code == 200 else code


def test_lastruns_lists_every_acked_run_on_every_node(two_nodes):
    topic, nodes = two_nodes.topic, two_nodes.nodes
    held = holder(nodes)
    other = nodes[1 - held]
    code, answer = other.post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="run")
    assert code == 200, answer
    acked = []
    while len(acked) < 2:
        got = pull_until(other, topic, 1, timeout_s=10, ackTimeoutMillis=60_000)
        assert got, acked
        for m in got:
            assert other.post("ackMsg", topic=topic, msgId=m["msgId"])[0] == 200
            acked.append(m["scheduledTime"])
    for node in (other, nodes[held]):  # at once, whichever node is asked
        code, answer = node.get("getSchedule", topic=topic, scheduleId="s")
        assert code == 200, answer
        runs = {r["scheduledTime"]: r for r in answer["schedule"]["lastRuns"]}
        assert set(acked) <= set(runs), (acked, answer["schedule"]["lastRuns"])
        for nominal in acked:
            assert runs[nominal]["status"] == 4 and runs[nominal]["missed"] is False, runs[nominal]
            assert runs[nominal]["msgId"] == f"s@{nominal}"


def test_a_change_another_node_made_meanwhile_holds(redis_url):
    """Nodes sharing a Redis, in one process over the real server: two that
    serve the API (each deciding on the schedule as stored now: one's
    pause seen by the other's resume, a stale version refused 409), a
    write made on a stale revision refused whole (StaleRows), and the
    node making the runs following two releases while another node paused
    one of them: that pause holds (no next run made for it), the other
    schedule's next run is made."""
    from broker.clock import SystemClock
    from broker.core.params import Defaults
    from broker.observe.metrics import Metrics
    from broker.redis.backend import RedisBroker
    from broker.redis.keys import RedisConfig
    from broker.redis.schedules import RedisScheduleStore
    from broker.schedules.keeper import Schedules, StaleRows
    from broker.schedules.params import parse_put_schedule
    from storage.entry import Status
    from storage.errors import Conflict, NotFound

    url = own_database(redis_url)
    topic = "cas"
    clock = SystemClock()

    def spec(schedule_id: str, every_ms: int = 3_600_000, msg: str = "run"):
        params = {"topic": topic, "scheduleId": schedule_id, "msg": msg, "everyMillis": str(every_ms)}
        return parse_put_schedule(params, now_ms=clock.now_ms(), defaults=Defaults(), max_msg_bytes=65_536)[0]

    async def node(broker: RedisBroker, *, firing: bool) -> tuple[RedisScheduleStore, Schedules]:
        store = RedisScheduleStore(broker.redis, "cas", announce=not firing)
        await store.open(clear_changes=firing)
        schedules = Schedules(store, clock)
        if firing:
            schedules.start(broker)
        else:
            schedules.serve(broker)
        return store, schedules

    async def main() -> None:
        broker = RedisBroker.from_url(url, clock, Defaults(), Metrics(), RedisConfig(key_prefix="cas"))
        await broker.start()
        try:
            (_, a), (b_store, b) = await node(broker, firing=False), await node(broker, firing=False)
            put = await a.put(spec("s"), None)
            assert (await b.pause(topic, "s")).version == 2  # b had never read it: read first
            resumed = await a.resume(topic, "s")  # a's RAM said v1, not paused: read first
            assert resumed.version == 3 and resumed.pending == put.pending
            with pytest.raises(Conflict, match="version 3"):
                await b.put(spec("s", msg="y"), 2)
            # a write on a revision another node wrote since: refused whole, nothing of it applied
            row = b.get(topic, "s").row()
            await a.put(spec("s", msg="z"), None)  # v4
            with pytest.raises(StaleRows) as refused:
                await b_store.write([{"put": {**row, "msg": "stale"}}])
            assert refused.value.keys == [(topic, "s")]
            assert (await b.fetch(topic, "s")).spec.msg == "z"

            # the node making the runs follows two released runs while b paused one of them
            await a.put(spec("t"), None)
            _, firing = await node(broker, firing=True)
            while not firing.idle():
                await asyncio.sleep(0.01)
            runs = [await broker.get(topic, firing.get(topic, sid).msg_id(firing.get(topic, sid).pending))
                    for sid in ("s", "t")]
            await b.pause(topic, "s")  # the firing node does not know yet
            assert firing.on_release(runs, clock.now_ms()) == []
            deadline = time.monotonic() + 5
            while not (firing.idle() and firing.get(topic, "t").runs == 2):
                assert time.monotonic() < deadline, firing.get(topic, "t")
                await asyncio.sleep(0.01)
            s, t = firing.get(topic, "s"), firing.get(topic, "t")
            assert s.paused and s.pending is None and s.version == 5  # b's pause read again, not overwritten
            assert t.pending is not None and t.pending > runs[1].trigger_ms
            assert (await broker.get(topic, t.msg_id(t.pending))).status is Status.WAITING
            with pytest.raises(NotFound):  # no next run made for the paused one
                await broker.get(topic, s.msg_id(runs[0].trigger_ms + 3_600_000))
            stored = await b.fetch(topic, "t")
            assert stored.runs == 2 and stored.pending == t.pending and [r[0] for r in stored.last_runs] == [
                runs[1].trigger_ms]
            await firing.stop()
        finally:
            await broker.stop()

    asyncio.run(main())


def test_a_purge_and_a_run_id_send_through_the_other_node(two_nodes):
    topic, nodes = two_nodes.topic, two_nodes.nodes
    held = holder(nodes)
    other = nodes[1 - held]
    start = int(time.time() * 1000) + 2000
    first = start + 1000
    for sid in ("a", "b"):
        code, answer = nodes[held].post("putSchedule", topic=topic, scheduleId=sid, everyMillis=1000, msg=sid,
                                        startTime=start)
        assert code == 200 and answer["schedule"]["nextFireTimes"][0] == first, answer
    code, refused = other.post("sendMsg", topic=topic, msgId=f"a@{first + 1000}", msg="mine")
    assert code == 400 and refused["msg"].startswith("msgId"), refused
    code, refused = other.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msgId": "fine", "msg": "x"}, {"msgId": f"b@{first + 1000}", "msg": "mine"}]})
    assert code == 400 and refused["msg"].startswith("msgs[1].msgId"), refused
    assert other.post("getMsg", topic=topic, msgId="fine")[0] == 404
    code, purged = other.post("deleteMsgs", topic=topic, all="true")
    assert code == 200 and purged["deleted"] == 2, purged
    got = []
    while time.time() * 1000 < first + 3500:
        code, answer = other.post("longPollingMsg", topic=topic, batch=10, longPollingTimeoutMillis=300)
        assert code == 200, answer
        got += [(m, int(time.time() * 1000)) for m in answer["delayMsgList"]]
        if answer["delayMsgList"]:
            other.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in answer["delayMsgList"]))
    for sid in ("a", "b"):
        runs = [(m, at) for m, at in got if m["scheduleId"] == sid and m["scheduledTime"] <= first + 3000]
        assert [m["scheduledTime"] for m, _ in runs] == [first + 1000, first + 2000, first + 3000], (sid, got)
        assert all(at >= m["triggerTime"] and m["msg"] == sid for m, at in runs)
        schedule = nodes[held].get("getSchedule", topic=topic, scheduleId=sid)[1]["schedule"]
        assert first not in [r["scheduledTime"] for r in schedule["lastRuns"]]


def _lease_left_ms(redis_url: str, key: str) -> int:
    import redis
    with redis.Redis.from_url(redis_url) as client:
        return int(client.pttl(key))


def _holds(node: Server, lease: bytes) -> bool:
    try:
        code, text = node.get("/metrics")
    except OSError:
        return False
    return code == 200 and b"\n" + lease + b" 1" in text


# A schedule's runs missed while its only node was down, delivered after the restart by its misfire
# rule (docs/api.md, "Misfire"; maxCatchUp 2): skip none, once one standing for all, all up to 2
CAUGHT_UP = {"skip": 0, "once": 1, "all": 2}


@pytest.mark.parametrize("misfire", ["once", "skip", "all"])
def test_the_only_node_restarted_after_kill_9_takes_its_own_leases_back_at_once(redis_url, tmp_path, misfire):
    """The only node, killed with SIGKILL, down 3 s and started again on
    its configuration (its --data-dir, where its id is kept: docs/redis.md),
    holds the schedules and jobs leases again before the dead process's
    leases would have lapsed, and the schedule's runs missed meanwhile
    (each at least 1 s, its grace, behind) are judged by its misfire rule
    then too -- skip delivers none of them, once one, all maxCatchUp (2)
    -- and its next run after them comes before the lapse: not 10 s late."""
    url = own_database(redis_url)
    topic = "own-" + uuid.uuid4().hex[:8]
    data = tmp_path / "node"
    node = Server.start(data, "--backend", url, log_path=tmp_path / "node.log")
    try:
        wait_for(lambda: _holds(node, b"hourglass_schedules_lease") and _holds(node, b"hourglass_jobs_lease"),
                 HOLDER_WAIT_S, "the leases")
        code, answer = node.post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="run",
                                 misfire=misfire, maxCatchUp=2, misfireGraceMillis=1000)
        assert code == 200, answer
        time.sleep(2.5)
        port = int(node.base.rsplit(":", 1)[1])
        node.kill()
        killed_ms = int(time.time() * 1000)
        from broker.redis.jobs import job_keys
        from broker.redis.keys import RedisConfig
        prefix = RedisConfig().key_prefix
        lapse_ms = killed_ms + min(_lease_left_ms(url, f"{prefix}:schedlease"), _lease_left_ms(url, job_keys(prefix)[2]))
        time.sleep(3)  # (three runs or more missed by more than their grace)
        restarted_ms = int(time.time() * 1000)
        node = Server.start(data, "--backend", url, port=port, log_path=tmp_path / "node.log")
        wait_for(lambda: _holds(node, b"hourglass_schedules_lease") and _holds(node, b"hourglass_jobs_lease"),
                 HOLDER_WAIT_S, "the leases after the restart")
        took_ms = int(time.time() * 1000)
        assert took_ms < lapse_ms, (took_ms - killed_ms, lapse_ms - killed_ms)
        runs: list[dict] = []
        while int(time.time() * 1000) < lapse_ms and not any(m["scheduledTime"] >= restarted_ms for m in runs):
            batch = node.post("pullMsg", topic=topic, batch=50)[1]["delayMsgList"]
            runs += [m for m in batch if m["scheduledTime"] > killed_ms]  # (those before: released on time)
            time.sleep(0.05)
        assert any(m["scheduledTime"] >= restarted_ms for m in runs), \
            ("no run after the restart before the dead process's lease would have lapsed", runs)
        # (a missed run may be the one made ahead before the kill: its produceTime is then before it)
        missed = sorted(m["scheduledTime"] for m in runs if m["scheduledTime"] < restarted_ms - 1000)
        assert len(missed) == CAUGHT_UP[misfire], (misfire, missed, restarted_ms, killed_ms,
                                                   [(m["scheduledTime"], m["produceTime"]) for m in runs])
    finally:
        node.kill()
