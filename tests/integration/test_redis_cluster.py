"""RedisBroker on a real Redis Cluster: three masters on loopback (started
once for the module by tests/redis_server.py, stopped by PID), selected by
`?cluster=1` in the backend URL.

What Redis Cluster needs of the adapter, checked here: every key of one
topic hashes to one slot (its `{hash tag}`), and every script declares all
the keys it touches in KEYS. Redis itself lets a script reach an undeclared
key of the same slot, so the test runs the scripts with `redis.call`
replaced by a check that fails on any key not in KEYS; then the whole
lifecycle runs across topics held by different masters, pauses and topic
settings (broker.redis.flow) among it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis_server import redis_cluster
from serving import Server

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from broker.clock import SystemClock
from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest, RescheduleMsgsRequest
from broker.core.params import AckRequest, Defaults, DeleteRequest, LongPollRequest, PullRequest
from broker.observe.metrics import Metrics
from broker.redis import lease as redis_lease
from broker.redis import link as redis_link
from broker.redis import schedules as redis_schedules
from broker.redis.backend import RedisBroker
from broker.redis.keys import RedisConfig, TopicKeys
from broker.redis.lease import RedisLease
from broker.redis.schedules import ScheduleWork
from broker.schedules.keeper import ScheduleLimits
from broker.schedules.params import ScheduleSpec, parse_put_schedule
from storage.entry import Status
from storage.errors import NotFound
from storage.store import NewMessage

pytestmark = pytest.mark.slow

# Every redis.call goes through this: a key not in KEYS is an error.
DECLARED_ONLY = """
local declared = {}
for _, key in ipairs(KEYS) do declared[key] = true end
local function checked_call(command, key, ...)
  if not declared[key] then error('undeclared key ' .. tostring(key) .. ' in ' .. command) end
  return redis.call(command, key, ...)
end
"""


def declared_only(source: str) -> str:
    return DECLARED_ONLY + source.replace("redis.call(", "checked_call(")


@pytest.fixture(scope="module")
def cluster_ports(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as ports:
        yield ports


@pytest.fixture
def cluster_url(cluster_ports) -> str:
    return f"redis://127.0.0.1:{cluster_ports[0]}/0?cluster=1"


async def owners(url: str, topics: list[str]) -> dict[str, tuple[int, set[int]]]:
    """topic -> (the port of the master holding it, the slots of its keys)."""
    client = RedisCluster.from_url(url.removesuffix("?cluster=1"), decode_responses=True)
    try:
        out = {}
        for topic in topics:
            keys = TopicKeys.of("hg", topic).all
            slots = {await client.cluster_keyslot(key) for key in keys}
            out[topic] = (client.get_node_from_key(keys[0]).port, slots)
        return out
    finally:
        await client.aclose()


def topics_on_every_master(url: str, masters: int, per_master: int = 2) -> list[str]:
    """Topic names, `per_master` of them held by each master."""
    held: dict[int, list[str]] = {}
    names = [f"topic-{i}" for i in range(200)]
    for topic, (port, _) in asyncio.run(owners(url, names)).items():
        if len(held.setdefault(port, [])) < per_master:
            held[port].append(topic)
    assert len(held) == masters and all(len(t) == per_master for t in held.values())
    return [t for group in held.values() for t in group]


def test_every_key_of_a_topic_hashes_to_one_slot(cluster_url, cluster_ports):
    tricky = ["orders", "{", "}", "a}b{c", "{x}", "x:y", "100%", "%7B", "é", "t" * 256, "tag,like"]
    found = asyncio.run(owners(cluster_url, tricky + topics_on_every_master(cluster_url, len(cluster_ports))))
    assert all(len(slots) == 1 for _, slots in found.values()), found
    assert len({port for port, _ in found.values()}) == len(cluster_ports)
    assert TopicKeys.of("hg", "{").waiting != TopicKeys.of("hg", "%7B").waiting  # escaping is injective


def test_the_declared_keys_check_catches_an_undeclared_key(cluster_url):
    async def main():
        client = RedisCluster.from_url(cluster_url.removesuffix("?cluster=1"), decode_responses=True)
        try:
            keys = TopicKeys.of("hg", "t")
            ok = client.register_script(declared_only("return redis.call('ZCARD', KEYS[1])"))
            assert await ok(keys=keys.all) == 0
            sneaky = client.register_script(declared_only("return redis.call('HLEN', KEYS[6] .. 'x')"))
            with pytest.raises(ResponseError, match="undeclared key"):
                await sneaky(keys=keys.all)
        finally:
            await client.aclose()
    asyncio.run(main())


def new(topic: str, msg_id: str, *, delay_ms: int = 0, ttl_ms: int = 60_000, max_retry: int = 3, priority: int = 0,
        tag: str = "", key: str = "") -> NewMessage:
    now_ms = SystemClock().now_ms()
    return NewMessage(topic, msg_id, f"body of {msg_id}", now_ms, now_ms + delay_ms, ttl_ms, max_retry, priority, tag,
                      key)


def test_the_lifecycle_across_masters_touches_only_declared_keys(cluster_url, cluster_ports, monkeypatch):
    monkeypatch.setattr(redis_link, "SCRIPTS", {n: declared_only(s) for n, s in redis_link.SCRIPTS.items()})
    topics = topics_on_every_master(cluster_url, len(cluster_ports))
    config = RedisConfig(key_prefix="life", poll_ms=50, retention_ms=300)

    async def lifecycle(a: RedisBroker, b: RedisBroker, topic: str) -> None:
        sent = await a.send([new(topic, "w", delay_ms=1000), new(topic, "r", priority=2, tag="red"),
                             new(topic, "t", max_retry=1), new(topic, "x", delay_ms=600_000),
                             new(topic, "r", priority=9)])  # a duplicate in the batch
        assert [m.msg_id for m in sent] == ["w", "r", "t", "x", "r"] and sent[4] == sent[1]
        assert [m.msg_id for m in await b.pull(PullRequest(topic, 30_000, 5, ("red", "blue")))] == ["r"]
        await b.ack(AckRequest(topic, "r", True))
        taken, = await b.pull(PullRequest(topic, 150, 5, ()))  # "w" is not due yet
        assert (taken.msg_id, taken.retry) == ("t", 1)  # retry counts deliveries
        # not acked: back after 150 ms, moved by either broker's mover; delivered a second time
        again, = await b.long_poll(LongPollRequest(topic, 30_000, 5, (), 5_000))
        assert (again.msg_id, again.retry) == ("t", 2)
        await b.ack(AckRequest(topic, "t", False))  # maxRetry 1: a nack ends it
        assert (await a.get(topic, "t")).status is Status.ENDED
        due, = await b.long_poll(LongPollRequest(topic, 30_000, 5, (), 5_000))  # woken when "w" is due
        assert (due.msg_id, due.status) == ("w", Status.CONSUMING)
        await a.ack(AckRequest(topic, "w", True))
        with pytest.raises(NotFound):  # acked: 404 (camellia), released all the same
            await a.delete(DeleteRequest(topic, "w", True))
        with pytest.raises(NotFound):
            await a.get(topic, "w")
        await a.delete(DeleteRequest(topic, "x", False))
        assert (await a.get(topic, "x")).status is Status.DELETED
        info = await a.topic_info(topic)
        assert (info["topic"], info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]) == \
            (topic, 0, 0, 0)
        purged = time.monotonic() + 5  # final messages are purged after retention_ms
        while time.monotonic() < purged:
            try:
                await a.get(topic, "x")
            except NotFound:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"{topic}: the deleted message was not purged after its retention")

    async def main():
        brokers = [RedisBroker.from_url(cluster_url, SystemClock(), Defaults(), Metrics(), config) for _ in range(2)]
        await brokers[0].redis.flushdb()
        for broker in brokers:
            await broker.start()
            assert all(script.script.startswith(DECLARED_ONLY) for script in broker._link.scripts.values())
        try:
            await asyncio.gather(*(lifecycle(*brokers, topic) for topic in topics))
            assert set(brokers[1].topic_list()) >= set(topics)  # read back from the topic set
            for topic in topics:  # a send on one broker wakes a long poll on the other through pub/sub
                poll = asyncio.create_task(brokers[1].long_poll(LongPollRequest(topic, 30_000, 1, (), 20_000)))
                await asyncio.sleep(0.1)
                await brokers[0].send([new(topic, "now")])
                got = await asyncio.wait_for(poll, 5)  # long before the poll's own timeout
                assert [m.msg_id for m in got] == ["now"]
        finally:
            for broker in brokers:
                await broker.stop()
    asyncio.run(main())


def test_serial_keys_bulk_calls_by_key_and_push_leases_across_masters_touch_only_declared_keys(
        cluster_url, cluster_ports, monkeypatch):
    monkeypatch.setattr(redis_link, "SCRIPTS", {n: declared_only(s) for n, s in redis_link.SCRIPTS.items()})
    topics = topics_on_every_master(cluster_url, len(cluster_ports), per_master=1)
    config = RedisConfig(key_prefix="keys", poll_ms=50, lease_ms=200)

    async def keyed(a: RedisBroker, b: RedisBroker, topic: str) -> None:
        await a.send([new(topic, f"a{i}", key="A", tag="x" if i else "") for i in range(4)]
                     + [new(topic, "b0", key="B"), new(topic, "n0")])
        first = await b.pull(PullRequest(topic, 30_000, 10, ()))
        assert sorted(m.msg_id for m in first) == ["a0", "b0", "n0"] and {m.key for m in first} == {"A", "B", ""}
        assert await a.pull(PullRequest(topic, 30_000, 10, ("x",))) == []  # A is busy
        await a.ack(AckRequest(topic, "a0", True))
        assert [m.msg_id for m in await a.pull(PullRequest(topic, 30_000, 10, ("x",)))] == ["a1"]
        assert (await a.delete_msgs(DeleteMsgsRequest(topic, BulkFilter(key="A"), 100))) == (3, False)
        moved = await b.reschedule_msgs(RescheduleMsgsRequest(
            topic, BulkFilter(key="B").narrowed(frozenset({Status.WAITING, Status.READY})), 100, 60_000, None))
        assert moved == (0, False)  # b0 is consuming: a reschedule leaves it
        # a pusher's delivery, its node gone: back once its push timeout passed and its lease lapsed
        await a.send([new(topic, "p0", key="P")])
        pushed, = await a.long_poll(LongPollRequest(topic, 60_000, 1, (), 1_000, push_timeout_ms=100))
        assert pushed.msg_id == "p0"

    async def main():
        brokers = [RedisBroker.from_url(cluster_url, SystemClock(), Defaults(), Metrics(), config) for _ in range(2)]
        await brokers[0].redis.flushdb()
        for broker in brokers:
            await broker.start()
        stopped = False
        try:
            await asyncio.gather(*(keyed(*brokers, topic) for topic in topics))
            await brokers[0].stop()
            stopped = True
            for topic in topics:
                again, = await brokers[1].long_poll(LongPollRequest(topic, 30_000, 1, (), 5_000))
                assert (again.msg_id, again.retry) == ("p0", 2)
        finally:
            for broker in brokers[1:] if stopped else brokers:
                await broker.stop()
    asyncio.run(main())


def test_pauses_and_topic_settings_across_masters_touch_only_declared_keys(cluster_url, cluster_ports, monkeypatch):
    """A topic paused and a key paused on one node hold on the other; the
    settings read back on it (the index and each topic's hash on different
    masters); a shift resume and an expire resume carried out, each script
    touching only the keys it declares."""
    from broker.flow.keeper import TopicFlow
    from broker.flow.settings import OnResume, PauseRequest, TopicConfig

    monkeypatch.setattr(redis_link, "SCRIPTS", {n: declared_only(s) for n, s in redis_link.SCRIPTS.items()})
    topics = topics_on_every_master(cluster_url, len(cluster_ports), per_master=1)
    config = RedisConfig(key_prefix="flow", poll_ms=50)

    async def paused(a: RedisBroker, b: RedisBroker, flow: TopicFlow, topic: str) -> None:
        now_ms = SystemClock().now_ms()
        await flow.set_config(TopicConfig(topic, 0, "none", 1_000, 60_000))
        await flow.pause(PauseRequest(topic, None, OnResume.SHIFT, at_ms=now_ms - 10_000))
        await flow.pause(PauseRequest(topic, "K", OnResume.EXPIRE, at_ms=now_ms - 10_000))
        sent = await a.send([new(topic, "m0"), new(topic, "k0", key="K")])
        assert await b.pull(PullRequest(topic, 30_000, 10, ())) == []
        assert (await b.topic_info(topic))["paused"] is True
        assert (await b.topic_settings.read_topic(topic)) == flow.get(topic)
        resume_ms = SystemClock().now_ms() + 1
        resumed = await flow.resume(PauseRequest(topic, "K", None, at_ms=resume_ms))
        assert resumed.pause is not None and not resumed.keys
        k0 = await b.get(topic, "k0")
        assert k0.status is Status.EXPIRED and k0.end_reason == "paused"
        assert (await b.topic_info(topic))["paused"] is True
        assert (await flow.resume(PauseRequest(topic, None, None, at_ms=resume_ms))).pause is None
        moved = (await b.get(topic, "m0")).trigger_ms
        assert moved == sent[0].trigger_ms + resume_ms - (now_ms - 10_000)  # by the pause's length
        assert (await b.topic_info(topic))["paused"] is False

    async def main():
        brokers = [RedisBroker.from_url(cluster_url, SystemClock(), Defaults(), Metrics(), config) for _ in range(2)]
        await brokers[0].redis.flushdb()
        for broker in brokers:
            await broker.start()
        try:
            store = brokers[0].topic_settings
            flow = TopicFlow(store, SystemClock().now_ms, 100, shared=store)
            flow.start(brokers[0])
            for topic in topics:
                await paused(*brokers, flow, topic)
            assert set(await brokers[1].topic_settings.read()) == set(topics)  # (their due-age cap and dedup window stay)
        finally:
            for broker in brokers:
                await broker.stop()
    asyncio.run(main())


def test_serve_over_the_cluster(cluster_url, cluster_ports, tmp_path):
    topics = topics_on_every_master(cluster_url, len(cluster_ports), per_master=1)
    server = Server.start(tmp_path / "data", "--backend", cluster_url)
    try:
        for topic in topics:
            status, body = server.post("sendMsg", topic=topic, msg="hi", msgId="m", delayMillis=200)
            assert status == 200 and body["delayMsg"]["status"] == 1
        for topic in topics:
            status, body = server.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=5000,
                                       ackTimeoutMillis=200)
            assert status == 200 and [m["msgId"] for m in body["delayMsgList"]] == ["m"]
        for topic in topics:  # not acked: back after the ack timeout, its second delivery
            status, body = server.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=5000)
            assert status == 200 and [(m["msgId"], m["retry"]) for m in body["delayMsgList"]] == [("m", 2)]
            assert server.post("ackMsg", topic=topic, msgId="m")[0] == 200
            assert server.post("getMsg", topic=topic, msgId="m")[1]["delayMsg"]["status"] == 4
            assert server.get("getTopicInfo", topic=topic)[1]["data"]["ackQueueSize"] == 0
    finally:
        assert server.stop() == 0


def test_bulk_calls_in_steps_across_masters_touch_only_declared_keys(cluster_url, cluster_ports, monkeypatch):
    """deleteMsgs and rescheduleMsgs staged, committed and applied in steps
    (broker.redis.bulk) on topics of every master, every script checked for
    undeclared keys (the staging list is the commit's KEYS[12]), the
    reads (scan.lua) by tag and by HSCAN too."""
    monkeypatch.setattr(redis_link, "SCRIPTS", {n: declared_only(s) for n, s in redis_link.SCRIPTS.items()})
    topics = topics_on_every_master(cluster_url, len(cluster_ports), per_master=1)

    async def bulk(b: RedisBroker, topic: str) -> None:
        # (an hour to live: moved 2 minutes back, a minute's ttl would end the red ones as the calls run)
        await b.send([new(topic, f"m{i:02d}", delay_ms=60_000 + i, ttl_ms=3_600_000, tag="red" if i % 2 else "")
                      for i in range(20)])
        moved, more = await b.reschedule_msgs(RescheduleMsgsRequest(topic, BulkFilter(tag="red"), 100, -120_000, None))
        assert (moved, more) == (10, False)
        assert (await b.get(topic, "m01")).status is Status.READY
        assert (await b.delete_msgs(DeleteMsgsRequest(topic, BulkFilter(msg_id_prefix="m0"), 100))) == (10, False)
        assert (await b.delete_msgs(DeleteMsgsRequest(topic, BulkFilter(), 100))) == (10, False)
        assert await b.count_msgs(topic, BulkFilter(statuses=frozenset({Status.DELETED}))) == 20

    async def main():
        b = RedisBroker.from_url(cluster_url, SystemClock(), Defaults(), Metrics(),
                                 RedisConfig(key_prefix="bulk", bulk_batch=3))
        await b.start()
        try:
            await asyncio.gather(*(bulk(b, topic) for topic in topics))
        finally:
            await b.stop()
    asyncio.run(main())


def test_schedules_across_masters_touch_only_declared_keys(cluster_url, cluster_ports, monkeypatch):
    """Recurring schedules (broker.redis.schedules) on topics of every
    master: an every-second and a cron-with-seconds schedule on each, every
    run delivered as one message (msgId `<scheduleId>@<nominal ms>`, each
    nominal second once), get/list/pause/resume answered by the lease
    holder and by the other node (the holder reading its change), the
    lease handed to the other node and the schedules deleted there; the
    schedules' own scripts (WRITE, READ, PAGE, RENEW, RELEASE) and the
    backend's checked for undeclared keys like every other."""
    monkeypatch.setattr(redis_link, "SCRIPTS", {n: declared_only(s) for n, s in redis_link.SCRIPTS.items()})
    for name in ("WRITE", "READ", "PAGE"):
        monkeypatch.setattr(redis_schedules, name, declared_only(getattr(redis_schedules, name)))
    for name in ("RENEW", "RELEASE"):
        monkeypatch.setattr(redis_lease, name, declared_only(getattr(redis_lease, name)))
    topics = topics_on_every_master(cluster_url, len(cluster_ports), per_master=1)
    config = RedisConfig(key_prefix="sched", poll_ms=50, lease_ms=600)
    clock = SystemClock()

    def spec(topic: str, schedule_id: str, **when: str) -> ScheduleSpec:
        params = {"topic": topic, "scheduleId": schedule_id, "msg": f"run of {schedule_id}", **when}
        return parse_put_schedule(params, now_ms=clock.now_ms(), defaults=Defaults(), max_msg_bytes=65_536)[0]

    async def holding(leases: list[RedisLease]) -> RedisLease:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for lease in leases:
                if lease.work.schedules is not None:
                    return lease
            await asyncio.sleep(0.05)
        pytest.fail("no node took the schedules lease")

    async def runs(b: RedisBroker, topic: str, per_schedule: int) -> dict[str, list[int]]:
        """Pull and ack until each schedule of the topic had `per_schedule` runs: nominal times by scheduleId."""
        seen: dict[str, list[int]] = {"every": [], "cron": []}
        deadline = time.monotonic() + 15
        while min(len(t) for t in seen.values()) < per_schedule:
            assert time.monotonic() < deadline, seen
            got = await b.long_poll(LongPollRequest(topic, 30_000, 10, (), 1_000))
            for m in got:
                schedule_id, nominal = m.msg_id.split("@")
                assert m.trigger_ms == int(nominal) and m.msg == f"run of {schedule_id}", m
                seen[schedule_id].append(int(nominal))
                await b.ack(AckRequest(topic, m.msg_id, True))
        return seen

    async def main():
        brokers = [RedisBroker.from_url(cluster_url, clock, Defaults(), Metrics(), config) for _ in range(2)]
        await brokers[0].redis.flushdb()
        for broker in brokers:
            await broker.start()
        leases = [RedisLease(b.redis, ScheduleWork(b.redis, config.key_prefix, b, clock, ScheduleLimits(),
                                                   lambda _: None, lease_ms=config.lease_ms),
                             clock, lease_ms=config.lease_ms, node=None) for b in brokers]
        for lease in leases:
            lease.start()
        try:
            first = await holding(leases)
            assert all(s.script.startswith(DECLARED_ONLY) for s in (first._renew, first._release))
            schedules = first.work.schedules
            for topic in topics:
                every = await schedules.put(spec(topic, "every", everyMillis="1000"), None)
                cron = await schedules.put(spec(topic, "cron", cron="* * * * * *"), 0)
                assert (every.version, cron.version, every.pending is not None, cron.pending % 1000) == (1, 1, True, 0)
            other = brokers[1 - leases.index(first)]  # runs released by any node's mover, consumed on the other
            seen = await asyncio.gather(*(runs(other, topic, 3) for topic in topics))
            for topic, by_id in zip(topics, seen):
                for schedule_id, nominal in by_id.items():
                    assert len(set(nominal)) == len(nominal), (topic, schedule_id, nominal)  # one message a run
                    assert nominal == list(range(nominal[0], nominal[0] + 1000 * len(nominal), 1000)), nominal
                state = schedules.get(topic, "every")
                assert [s.spec.schedule_id for s in schedules.page(topic, None, 10)[0]] == ["cron", "every"]
                done = [r for r in await schedules.last_runs(state) if r["scheduledTime"] in by_id["every"]]
                assert done and all(r["status"] == int(Status.ACKED) for r in done), done
                paused = await schedules.pause(topic, "every")
                assert paused.paused and paused.pending is None
                resumed = await schedules.resume(topic, "every")
                assert not resumed.paused and resumed.pending is not None
                pending = await other.get(topic, resumed.msg_id(resumed.pending))
                assert pending.status is Status.WAITING
                view = leases[1 - leases.index(first)].work.view  # the other node's: served from Redis too
                assert view is not None and not view.firing
                assert (await view.pause(topic, "cron")).version == 2
                deadline = time.monotonic() + 5
                while not schedules.get(topic, "cron").paused:  # the holder read the other node's change
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                assert (await view.resume(topic, "cron")).version == 3
            await first.stop()  # the lease let go: the other node takes it, claiming every topic
            second = await holding([lease for lease in leases if lease is not first])
            assert second.work.epoch > first.work.epoch and len(second.work.schedules) == 2 * len(topics)
            for topic in topics:
                state = second.work.schedules.get(topic, "cron")
                run = state.msg_id(state.pending)
                await second.work.schedules.delete(topic, "cron")
                await second.work.schedules.delete(topic, "every")
                assert second.work.schedules.page(topic, None, 10) == ([], None)
                try:  # the pending run deleted with its schedule, if it was still waiting
                    left = await other.get(topic, run)
                except NotFound:
                    continue
                # (released before the delete -- the lease changed hands just
                # before, and no holder had followed it yet -- it is delivered
                # as any run: never left waiting)
                assert left.status is not Status.WAITING, left
        finally:
            for lease in leases:
                await lease.stop()
            for broker in brokers:
                await broker.stop()
    # a bound of its own (it takes some 5 s): a hang is cancelled where it waits, and its traceback names the await
    asyncio.run(asyncio.wait_for(main(), 120))


def test_redrive_jobs_across_masters_touch_only_declared_keys(cluster_url, cluster_ports, monkeypatch):
    """redriveMsgs jobs (broker.redis.jobs) over topics of every master:
    a job per topic made through the node that does not hold the jobs
    lease, run by the holder, each dead letter re-driven once; the jobs'
    own scripts (SAVE, ASK_CANCEL, FETCH, REMOVE, RENEW, RELEASE) and the
    slice's checked for undeclared keys like every other."""
    from broker.core.bulk_params import DEAD, DeadFilter, RedriveMsgsRequest
    from broker.jobs.runner import JobLimits, JobState, RedriveJobs
    from broker.redis import jobs as redis_jobs

    monkeypatch.setattr(redis_link, "SCRIPTS", {n: declared_only(s) for n, s in redis_link.SCRIPTS.items()})
    for name in ("SAVE", "ASK_CANCEL", "FETCH", "REMOVE"):
        monkeypatch.setattr(redis_jobs, name, declared_only(getattr(redis_jobs, name)))
    for name in ("RENEW", "RELEASE"):
        monkeypatch.setattr(redis_lease, name, declared_only(getattr(redis_lease, name)))
    topics = topics_on_every_master(cluster_url, len(cluster_ports), per_master=1)
    config = RedisConfig(key_prefix="jobs", poll_ms=50, lease_ms=600)
    clock = SystemClock()

    async def main():
        brokers = [RedisBroker.from_url(cluster_url, clock, Defaults(), Metrics(), config) for _ in range(2)]
        await brokers[0].redis.flushdb()
        for broker in brokers:
            await broker.start()
        views: list[RedriveJobs] = []
        leases = [RedisLease(b.redis, redis_jobs.JobWork(b.redis, config.key_prefix, b, clock, JobLimits(),
                                                         views.append), clock, lease_ms=config.lease_ms, node=None)
                  for b in brokers]
        for lease in leases:
            await lease.open()
            lease.start()
        try:
            deadline = time.monotonic() + 10
            while not any(lease.holding for lease in leases):
                assert time.monotonic() < deadline, "no node took the jobs lease"
                await asyncio.sleep(0.05)
            other = next(i for i, lease in enumerate(leases) if not lease.holding)
            now_ms = clock.now_ms()
            for topic in topics:
                stored = await brokers[0].send([NewMessage(topic, f"d{i}", "x", 1, 1000, 60_000, 0) for i in range(30)],
                                               now_ms=now_ms)
                assert {m.status for m in stored} == {Status.EXPIRED}
            made = [await views[other].create(RedriveMsgsRequest(topic, DeadFilter(statuses=DEAD), None, 0, 10**8))
                    for topic in topics]
            deadline = time.monotonic() + 15
            while True:
                await views[other].sync()
                got = [views[other].get(job.job_id) for job in made]
                if all(job.state is JobState.DONE for job in got):
                    break
                assert time.monotonic() < deadline, got
                await asyncio.sleep(0.05)
            assert [job.redriven for job in got] == [30] * len(topics)
            for topic in topics:
                for i in range(30):
                    m = await brokers[1].get(topic, f"d{i}")
                    assert (m.status, m.redrive_count) == (Status.READY, 1), m
        finally:
            for lease in leases:
                await lease.stop()
            for broker in brokers:
                await broker.stop()

    asyncio.run(main())
