"""broker.redis.backend.RedisBroker against a real redis-server (one per
test session, on a free loopback port, no persistence; each test flushes
it). Drives the broker directly, with the real clock and short delays; then
Redis trouble met by real `hourglass serve` processes (each with a
redis-server of its own): down at start or while serving, a wrong
password, a key of the wrong type, a crash of Redis. The API and lifecycle
over HTTP, the same as the disk backend's, are in tests/conformance."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from redis_server import free_port, redis_cli, redis_server
from serving import ROOT, Server

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from broker.clock import SystemClock
from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest
from broker.core.params import AckRequest, Defaults, DeleteRequest, LongPollRequest, PullRequest
from broker.observe.metrics import Metrics
from broker.redis.backend import RedisBroker
from broker.redis.keys import RedisConfig, TopicKeys, redact
from storage.entry import Status
from storage.errors import NotFound
from storage.store import NewMessage

TOPIC = "orders"


def run(redis_url: str, scenario, brokers: int = 1, config: RedisConfig | None = None):
    """Flush the database, start `brokers` RedisBrokers on it, run
    `scenario(*brokers)`, stop them."""
    async def main():
        started = [RedisBroker.from_url(redis_url, SystemClock(), Defaults(), Metrics(), config)
                   for _ in range(brokers)]
        await started[0].redis.flushdb()
        for b in started:
            await b.start()
        try:
            return await scenario(*started)
        finally:
            for b in started:
                await b.stop()
    return asyncio.run(main())


def new(msg_id: str, *, delay_ms: int = 0, ttl_ms: int = 60_000, max_retry: int = 3, priority: int = 0,
        tag: str = "", now_ms: int | None = None, body: str = "body", topic: str = TOPIC) -> NewMessage:
    now_ms = SystemClock().now_ms() if now_ms is None else now_ms
    return NewMessage(topic, msg_id, body, now_ms, now_ms + delay_ms, ttl_ms, max_retry, priority, tag)


def pulling(batch: int = 10, ack_timeout_ms: int = 30_000, tags: tuple[str, ...] = ()) -> PullRequest:
    return PullRequest(TOPIC, ack_timeout_ms, batch, tags)


async def wait_for_status(broker: RedisBroker, msg_id: str, status: Status, within_s: float = 3.0):
    deadline = time.monotonic() + within_s
    while True:
        message = await broker.get(TOPIC, msg_id)
        if message.status is status or time.monotonic() > deadline:
            return message
        await asyncio.sleep(0.02)


def test_send_get_and_duplicate_id_returns_the_stored_message(redis_url):
    async def scenario(b: RedisBroker):
        first, = await b.send([new("a", delay_ms=120_000, body="one", priority=5, tag="t")])
        assert (first.msg_id, first.msg, first.status, first.retry, first.priority, first.tag) == \
            ("a", "one", Status.WAITING, 0, 5, "t")
        again, = await b.send([new("a", delay_ms=0, body="two")])
        assert again == first
        assert await b.get(TOPIC, "a") == first
        with pytest.raises(NotFound):
            await b.get(TOPIC, "nope")
        info = await b.topic_info(TOPIC)
        assert info["waitingQueueSize"] == 1 and info["waitingQueueInfo"]["sizeOf1minTo10min"] == 1
        assert b.topic_list() == [TOPIC]
        assert (await b.topic_info("unknown"))["waitingQueueSize"] == 0  # camellia: zeros
        assert await b.pull(PullRequest("never-sent", 1000, 10, ())) == []
    run(redis_url, scenario)


def test_pull_order_is_priority_then_trigger_and_tags_filter(redis_url):
    async def scenario(b: RedisBroker):
        now = SystemClock().now_ms()
        await b.send([new("late", now_ms=now - 10), new("early", now_ms=now - 20), new("high", now_ms=now, priority=9),
                      new("low", now_ms=now - 30, priority=-1), new("tagged", now_ms=now - 40, tag="x")])
        assert [m.msg_id for m in await b.pull(pulling(tags=("x",)))] == ["tagged"]
        taken = await b.pull(pulling())
        assert [m.msg_id for m in taken] == ["high", "early", "late", "low"]
        assert all(m.status is Status.CONSUMING for m in taken)
        assert await b.pull(pulling()) == []
    run(redis_url, scenario)


def test_ack_and_its_edges(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a"), new("w", delay_ms=60_000)])
        await b.pull(pulling())
        await b.ack(AckRequest(TOPIC, "a", True))
        await b.ack(AckRequest(TOPIC, "a", True))  # repeated: fine
        assert (await b.get(TOPIC, "a")).status is Status.ACKED
        await b.ack(AckRequest(TOPIC, "w", True))  # waiting: acked, never delivered (camellia)
        assert (await b.get(TOPIC, "w")).status is Status.ACKED
        await b.ack(AckRequest(TOPIC, "nope", True))  # unknown: no error, no change
        info = await b.topic_info(TOPIC)
        assert (info["readyQueueSize"], info["ackQueueSize"]) == (0, 0)
    run(redis_url, scenario)


def test_nack_requeues_with_retry_and_ends_after_max_retry(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a", max_retry=1)])
        first, = await b.pull(pulling())
        assert first.retry == 1  # retry counts deliveries
        await b.ack(AckRequest(TOPIC, "a", False))
        await b.ack(AckRequest(TOPIC, "a", False))  # of a READY message: no-op
        second, = await b.pull(pulling())
        assert (second.retry, second.status) == (2, Status.CONSUMING)
        await b.ack(AckRequest(TOPIC, "a", False))
        assert (await b.get(TOPIC, "a")).status is Status.ENDED
        assert await b.pull(pulling()) == []
    run(redis_url, scenario)


def test_ack_timeout_redelivers_with_retry_then_ends(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a", max_retry=1)])
        m, = await b.pull(pulling(ack_timeout_ms=100))
        assert m.retry == 1
        again = await wait_for_status(b, "a", Status.READY)
        assert again.retry == 1
        m, = await b.pull(pulling(ack_timeout_ms=100))
        assert m.retry == 2
        ended = await wait_for_status(b, "a", Status.ENDED)
        assert (ended.status, ended.retry) == (Status.ENDED, 2)
    run(redis_url, scenario)


def test_ttl_expiry_ends_as_5_when_never_delivered_and_6_after(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("one", ttl_ms=150), new("two", ttl_ms=150)])
        taken, = await b.pull(pulling(batch=1))
        await b.ack(AckRequest(TOPIC, taken.msg_id, False))  # READY again, retry 1
        never = "two" if taken.msg_id == "one" else "one"
        assert (await wait_for_status(b, never, Status.EXPIRED)).status is Status.EXPIRED
        assert (await wait_for_status(b, taken.msg_id, Status.ENDED)).status is Status.ENDED
        assert await b.pull(pulling()) == []
        # due after its expiry already: expired at the move
        now = SystemClock().now_ms()
        await b.send([NewMessage(TOPIC, "dead", "x", now - 1000, now - 500, 100, 3)])
        assert (await b.get(TOPIC, "dead")).status is Status.EXPIRED
    run(redis_url, scenario)


def test_delete_and_release(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("w", delay_ms=60_000), new("r"), new("c")])
        await b.pull(pulling(batch=1))  # takes "c" or "r": both trigger now; ids break the tie
        for msg_id in ("w", "r", "c"):
            await b.delete(DeleteRequest(TOPIC, msg_id, False))
            assert (await b.get(TOPIC, msg_id)).status is Status.DELETED
        info = await b.topic_info(TOPIC)
        assert (info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]) == (0, 0, 0)
        with pytest.raises(NotFound):  # ended: camellia answers 404, released all the same
            await b.delete(DeleteRequest(TOPIC, "w", True))
        with pytest.raises(NotFound):
            await b.get(TOPIC, "w")
        with pytest.raises(NotFound):
            await b.delete(DeleteRequest(TOPIC, "w", False))
        again, = await b.send([new("w", body="new")])  # the id is free again
        assert (again.msg, again.status) == ("new", Status.READY)  # due now: ready at once
        assert (await b.get(TOPIC, "w")).status is Status.READY
    run(redis_url, scenario)


def test_delayed_message_becomes_ready_on_time_and_wakes_a_long_poll(redis_url):
    async def scenario(b: RedisBroker):
        poll = asyncio.create_task(b.long_poll(LongPollRequest(TOPIC, 30_000, 10, (), 5_000)))
        await asyncio.sleep(0.05)
        sent, = await b.send([new("a", delay_ms=300)])
        got = await asyncio.wait_for(poll, 5)
        assert [m.msg_id for m in got] == ["a"]  # before the poll's 5 s timeout
        assert SystemClock().now_ms() >= sent.trigger_ms
        empty = await b.long_poll(LongPollRequest(TOPIC, 30_000, 10, (), 100))
        assert empty == []
    run(redis_url, scenario)


def test_long_poll_on_one_broker_is_woken_by_another(redis_url):
    async def scenario(a: RedisBroker, b: RedisBroker):
        poll = asyncio.create_task(a.long_poll(LongPollRequest(TOPIC, 30_000, 1, (), 5_000)))
        await asyncio.sleep(0.05)
        await b.send([new("x")])
        got = await asyncio.wait_for(poll, 5)
        assert [m.msg_id for m in got] == ["x"]  # before the poll's 5 s timeout
    run(redis_url, scenario, brokers=2)


def test_two_brokers_on_one_redis_never_deliver_a_message_twice(redis_url):
    count = 300

    async def scenario(a: RedisBroker, b: RedisBroker):
        now = SystemClock().now_ms()
        await a.send([new(f"m{i}", now_ms=now, delay_ms=(i % 30) * 10) for i in range(count)])
        seen: list[str] = []

        async def consume(broker: RedisBroker):
            while len(seen) < count:
                got = await broker.long_poll(LongPollRequest(TOPIC, 30_000, 7, (), 200))
                for m in got:
                    seen.append(m.msg_id)
                    await broker.ack(AckRequest(TOPIC, m.msg_id, True))

        await asyncio.wait_for(asyncio.gather(*(consume(x) for x in (a, b, a, b))), 20)
        assert sorted(seen) == sorted(f"m{i}" for i in range(count))
    run(redis_url, scenario, brokers=2, config=RedisConfig(poll_ms=50))


def test_repr_and_problem(redis_url):
    async def scenario(b: RedisBroker):
        assert repr(b).startswith(f"RedisBroker(url='{redis_url}', prefix='hg', topics=0,")
        assert b.problem is None
    run(redis_url, scenario)


def test_a_long_poll_whose_client_hung_up_during_its_pull_gives_the_messages_back(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a", max_retry=0), new("b", max_retry=0)])
        answers = iter([False])  # here when the poll starts; gone once it has pulled

        got = await b.long_poll(LongPollRequest(TOPIC, 30_000, 10, (), 1_000), lambda: next(answers, True))
        assert got == []
        for msg_id in ("a", "b"):
            m = await b.get(TOPIC, msg_id)
            assert (m.status, m.retry) == (Status.READY, 0)  # as if never pulled
        info = await b.topic_info(TOPIC)
        assert (info["readyQueueSize"], info["ackQueueSize"]) == (2, 0)
        assert [m.msg_id for m in await b.pull(pulling())] == ["a", "b"]
    run(redis_url, scenario)


def test_a_give_back_leaves_a_message_pulled_again_by_another_consumer(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a")])
        first, deadline = await b.requests._pull(pulling(ack_timeout_ms=50))
        again = await wait_for_status(b, "a", Status.READY)
        assert again.retry == 1
        second = await b.pull(pulling())  # another consumer holds it now
        await b.requests._give_back(TOPIC, first, deadline)  # the first poll's give-back comes late
        m = await b.get(TOPIC, "a")
        assert (m.status, m.retry) == (Status.CONSUMING, 2) and second[0].msg_id == "a"
    run(redis_url, scenario)


# -- Redis trouble: clear errors, never hangs (real processes) ---------------------------------


def serve_until_exit(backend: str, timeout_s: float = 20) -> tuple[int, str, float]:
    """Run `hourglass serve --backend backend` expecting it to exit: (code, output, seconds)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--port", str(free_port()),
                           "--backend", backend], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_serve_exits_at_once_naming_the_url_when_redis_is_down():
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    code, output, seconds = serve_until_exit(url)
    assert code != 0 and seconds < 10, output
    assert f"Redis at {url} is unreachable" in output, output


def test_serve_exits_saying_authentication_failed(tmp_path):
    with redis_server(tmp_path, "--requirepass", "secret") as port:
        for url in (f"redis://:wrong@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            code, output, seconds = serve_until_exit(url)
            assert code != 0 and seconds < 10, output
            assert f"authentication to Redis at {redact(url)} failed" in output, output


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own, and a serve process on it."""
    with redis_server(tmp_path) as port:
        server = Server.start(tmp_path / "data", "--backend", f"redis://127.0.0.1:{port}/0")
        yield port, server
        server.kill()


def test_requests_answer_503_while_redis_is_down_and_recover(own_redis, tmp_path):
    port, server = own_redis
    assert server.post("sendMsg", topic="t", msg="m", msgId="a")[0] == 200
    redis_cli(port, "SHUTDOWN", "NOSAVE")  # Redis goes away under the serving node
    url = f"redis://127.0.0.1:{port}/0"
    for call, params in [("sendMsg", {"msg": "m"}), ("pullMsg", {}), ("getMsg", {"msgId": "a"}),
                         ("ackMsg", {"msgId": "a"}), ("longPollingMsg", {"longPollingTimeoutMillis": 60000})]:
        started = time.monotonic()
        status, body = server.post(call, topic="t", **params)
        assert status == 503 and f"Redis at {url} is unreachable" in body["msg"], (call, body)
        assert time.monotonic() - started < 10, call
    status, body = server.get("getTopicInfo", topic="t")
    assert status == 503 and body["code"] == 503
    with redis_server(tmp_path, port=port):  # back, empty (no persistence)
        deadline = time.monotonic() + 10
        while server.post("sendMsg", topic="t", msg="again", msgId="b")[0] != 200:
            assert time.monotonic() < deadline, "the node did not recover when Redis came back"
            time.sleep(0.1)
        status, body = server.post("longPollingMsg", topic="t", longPollingTimeoutMillis=5000)
        assert status == 200 and [m["msgId"] for m in body["delayMsgList"]] == ["b"]
        assert server.get("getTopicInfo", topic="t")[0] == 200  # the topic set was refilled
        assert server.proc.poll() is None
    assert server.stop() == 0


def test_the_mover_and_listener_outlive_an_outage(tmp_path):
    async def until(check, within_s: float = 10):
        deadline = time.monotonic() + within_s
        while not check():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    async def main(port: int):
        b = RedisBroker.from_url(f"redis://127.0.0.1:{port}/0", SystemClock(), Defaults(), Metrics(),
                                 RedisConfig(poll_ms=50))
        other = RedisBroker.from_url(f"redis://127.0.0.1:{port}/0", SystemClock(), Defaults(), Metrics())
        await b.start()
        await b.send([new("a", delay_ms=60_000)])
        redis_cli(port, "SHUTDOWN", "NOSAVE")
        await until(lambda: b.problem is not None and "unreachable" in b.problem)
        with redis_server(tmp_path, port=port):
            await until(lambda: b.problem is None)
            poll = asyncio.create_task(b.long_poll(LongPollRequest(TOPIC, 30_000, 1, (), 5_000)))
            await other.start()  # resubscribed: a wake from another process reaches b's poll
            await asyncio.sleep(0.1)
            await other.send([new("b")])
            assert [m.msg_id for m in await asyncio.wait_for(poll, 4)] == ["b"]
            await other.stop()
            await b.stop()

    with redis_server(tmp_path) as port:
        asyncio.run(main(port))


def test_a_key_of_the_wrong_type_answers_503_naming_it(own_redis):
    port, server = own_redis
    ready = TopicKeys.of("hg", "broken").ready
    redis_cli(port, "SET", ready, "not a zset")
    for call, params in [("sendMsg", {"msg": "m"}), ("pullMsg", {}),
                         ("longPollingMsg", {"longPollingTimeoutMillis": 60000})]:
        started = time.monotonic()
        status, body = server.post(call, topic="broken", **params)
        assert status == 503 and f"Redis key '{ready}' holds a string, not the zset" in body["msg"], (call, body)
        assert time.monotonic() - started < 10
    assert server.post("sendMsg", topic="fine", msg="m", msgId="f")[0] == 200  # other topics are served
    status, body = server.post("longPollingMsg", topic="fine", longPollingTimeoutMillis=5000)
    assert [m["msgId"] for m in body["delayMsgList"]] == ["f"]
    redis_cli(port, "DEL", ready)
    assert server.post("pullMsg", topic="broken")[0] == 200
    redis_cli(port, "SET", "hg:topics", "1")
    status, body = server.post("sendMsg", topic="new", msg="m")
    assert status == 503 and "Redis key 'hg:topics' holds a string, not the set" in body["msg"], body
    assert server.get("/health")[0] == 200 and server.proc.poll() is None
    assert server.stop() == 0


@pytest.mark.parametrize(("persistence", "kept"), [
    ((), False),
    (("--appendonly", "yes", "--appendfsync", "always"), True),
], ids=["no-persistence", "aof-always"])
def test_what_survives_a_redis_crash_is_redis_persistence(tmp_path, persistence, kept):
    """The backends' one durability difference: disk answers 200 once fsync'ed;
    the Redis backend once Redis has it, so a crash of Redis keeps it only
    with AOF appendfsync always (the suites' redis-servers run without)."""
    with redis_server(tmp_path, *persistence) as port:
        url = f"redis://127.0.0.1:{port}/0"
        asyncio.run(send_one(url))
        pid = int(redis_cli(port, "INFO", "server").split("process_id:")[1].split()[0])
        os.kill(pid, signal.SIGKILL)
    with redis_server(tmp_path, *persistence, port=port):
        assert asyncio.run(still_there(url)) is kept


async def send_one(url: str) -> None:
    b = RedisBroker.from_url(url, SystemClock(), Defaults(), Metrics())
    await b.send([new("a", delay_ms=60_000)])
    await b.redis.aclose()


async def still_there(url: str) -> bool:
    b = RedisBroker.from_url(url, SystemClock(), Defaults(), Metrics())
    try:
        return (await b.get(TOPIC, "a")).status is Status.WAITING
    except NotFound:
        return False
    finally:
        await b.redis.aclose()


def test_a_bulk_call_by_tag_reads_the_tag_index_and_a_purge_empties_it(redis_url):
    """Each tagged message is in the topic's `tags` zset from its send until
    it is purged; a topic from before `tags` (no "" member: its messages may
    be missing there) is scanned instead, and is indexed again once empty."""
    async def scenario(b: RedisBroker):
        keys = TopicKeys.of(b.config.key_prefix, TOPIC)
        await b.send([new(f"r{i}", tag="red", delay_ms=60_000) for i in range(5)] +
                     [new(f"b{i}", tag="blue", delay_ms=60_000) for i in range(3)] + [new("n", delay_ms=60_000)])
        assert sorted(await b.redis.zrange(keys.tags, 0, -1)) == sorted(
            ["", *(f"red,r{i}" for i in range(5)), *(f"blue,b{i}" for i in range(3))])
        assert (await b.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(tag="red"), 2))) == (2, True)
        await b.redis.zrem(keys.tags, "", "red,r4")  # a topic from before the index, missing one
        assert await b.count_msgs(TOPIC, BulkFilter(tag="red")) == 3  # scanned: r4 found all the same
        await b.redis.zadd(keys.tags, {"": 0})
        assert await b.count_msgs(TOPIC, BulkFilter(tag="red")) == 2  # the index as it stands
        assert (await b.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 100))) == (7, False)
        for msg_id in [f"r{i}" for i in range(5)] + [f"b{i}" for i in range(3)] + ["n"]:
            with pytest.raises(NotFound):  # ended: 404, released all the same
                await b.delete(DeleteRequest(TOPIC, msg_id, True))
        assert await b.redis.zrange(keys.tags, 0, -1) == [""]
    run(redis_url, scenario)
