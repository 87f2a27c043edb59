"""broker.redis.dyno.DynoQueue against a real redis-server (the session's,
flushed by each test; a password-protected one and a Redis Cluster node
started by the tests that need them). Time is a FakeClock, except where a
test exercises pop's wait or concurrent consumers.

Also holds the helpers test_redis_rmq.py imports: FakeClock, run_with,
cluster_node, silent_port, and the failure checks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from redis_server import free_port, redis_server

import broker.redis.dyno as redis_dyno
from broker.redis.dyno import DynoConfig, DynoMessage, DynoQueue, ShardSize
from broker.redis.shards import RedisAuthError, RedisUnavailable, WrongTypeKey
from storage.errors import InvalidRequest

T0 = 1_000_000


class FakeClock:
    """now_ms for the queues: moves only when a test says so."""

    def __init__(self, now_ms: int = T0) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now})"


def run_with(redis_url: str, open_queue, scenario, queues: int = 1):
    """Flush the database, open `queues` queues with `await
    open_queue(redis_url)`, run `scenario(*queues)`, close them."""
    async def main():
        async with aioredis.Redis.from_url(redis_url) as client:
            await client.flushdb()
        opened = [await open_queue(redis_url) for _ in range(queues)]
        try:
            return await scenario(*opened)
        finally:
            for q in opened:
                await q.aclose()
    return asyncio.run(main())


def run(redis_url: str, scenario, config: DynoConfig | None = None, clock=None, queues: int = 1):
    config = config or DynoConfig(shards=2, unack_timeout_ms=1000)
    return run_with(redis_url, lambda url: DynoQueue.connect(url, "q", config, clock), scenario, queues)


@contextlib.contextmanager
def cluster_node(workdir) -> Iterator[str]:
    """A one-node Redis Cluster owning every slot: scripts whose KEYS span
    slots get CROSSSLOT, and "#!lua" scripts touching another slot fail."""
    # the cluster bus port defaults to port + 10000, past 65535 for a high free port: name one
    with redis_server(workdir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                      "--cluster-port", str(free_port())) as port:
        async def setup():
            client = aioredis.Redis(port=port, decode_responses=True)
            try:
                await client.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
                deadline = time.monotonic() + 10
                while "cluster_state:ok" not in await client.execute_command("CLUSTER", "INFO"):
                    assert time.monotonic() < deadline, "the cluster node did not reach cluster_state:ok"
                    await asyncio.sleep(0.05)
            finally:
                await client.aclose()
        asyncio.run(setup())
        yield f"redis://127.0.0.1:{port}/0"


def strict_scripts(monkeypatch, module) -> None:
    """Prefix every script of `module` with "#!lua": Redis 7 then refuses
    any key access outside the slot of the script's KEYS."""
    monkeypatch.setattr(module, "SCRIPTS", {op: "#!lua\n" + src for op, src in module.SCRIPTS.items()})


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def check_unreachable_fails_fast(connect) -> None:
    """`connect(url, connect_timeout_ms, retries)` on a port with nothing
    listening, then on one that never answers: RedisUnavailable with a
    sentence, well within a bounded time."""
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match=r"cannot reach Redis at 127.0.0.1:.*is it running"):
        asyncio.run(connect(f"redis://127.0.0.1:{free_port()}/0", 200, 1))
    with silent_port() as port, pytest.raises(RedisUnavailable, match="cannot reach Redis"):
        asyncio.run(connect(f"redis://127.0.0.1:{port}/0", 200, 1))
    assert time.monotonic() - started < 5  # 2 x 200 ms per attempt, not redis-py's default 10 retries


def check_password(tmp_path, connect) -> None:
    """`connect(url)` against a Redis with requirepass: wrong or missing
    password -> RedisAuthError; the right one works."""
    with redis_server(tmp_path, "--requirepass", "pw") as port:
        for url in (f"redis://:wrong@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            with pytest.raises(RedisAuthError, match=r"refused the credentials.*check the password"):
                asyncio.run(connect(url))
        asyncio.run(connect(f"redis://:pw@127.0.0.1:{port}/0"))


# == the interface ===========================================================

def test_config_and_arguments_are_validated_with_a_sentence():
    with pytest.raises(ValueError, match="shards must be from 1 to 1024, got 0"):
        DynoConfig(shards=0)
    with pytest.raises(ValueError, match="key_prefix must be non-empty without braces"):
        DynoConfig(key_prefix="a{b}")
    with pytest.raises(ValueError, match="unack_timeout_ms must be at least 1"):
        DynoConfig(unack_timeout_ms=0)
    with pytest.raises(ValueError, match="retries must be at least 0, got -1"):
        DynoConfig(retries=-1)


def test_bad_arguments_raise_invalid_request(redis_url):
    async def scenario(q: DynoQueue):
        for call, parameter in ((q.push("a", "x", priority=100), "priority"), (q.push("a", "x", delay_ms=-1), "delay_ms"),
                                (q.push("", "x"), "msg_id"), (q.pop(count=0), "count"),
                                (q.set_timeout("a", -5), "delay_ms"), (q.peek(0), "count")):
            with pytest.raises(InvalidRequest) as caught:
                await call
            assert caught.value.parameter == parameter
        assert await q.size() == 0
    run(redis_url, scenario)


def test_push_get_peek_pop_ack_remove(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        assert await q.push("a", "alpha", priority=7) == 0
        assert await q.push("b", "beta", delay_ms=100) == 1
        assert await q.get("a") == DynoMessage("a", "alpha", 7, 0)
        assert await q.get("nope") is None
        assert (await q.size(), await q.peek(10)) == (2, ["a"])
        popped = await q.pop(count=10)
        assert popped == [DynoMessage("a", "alpha", 7, 0)]
        assert await q.size() == 1 and await q.shard_sizes() == [ShardSize(0, 1), ShardSize(1, 0)]
        assert await q.get("a") == DynoMessage("a", "alpha", 7, 0)  # still readable while unacked
        assert await q.pop() == [] and await q.peek() == []
        assert await q.ack("a") is True
        assert await q.ack("a") is False and await q.get("a") is None
        assert await q.ack("b") is False  # queued, not popped
        clock.advance(100)
        assert await q.peek() == ["b"]
        assert await q.remove("b") is True
        assert await q.remove("b") is False
        assert await q.shard_sizes() == [ShardSize(0, 0), ShardSize(0, 0)]
        assert await q.redis.keys("*") == []  # nothing left behind
    run(redis_url, scenario, clock=clock)


def test_priority_folds_into_the_score_and_higher_pops_first_within_a_millisecond(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        await q.push("later", "", delay_ms=1, priority=99)
        for msg_id, priority in (("low", 0), ("high", 99), ("mid", 50), ("mid2", 50)):
            await q.push(msg_id, "", priority=priority)
        queue_key = q._shards[0].queue
        scores = dict(await q.redis.zrange(queue_key, 0, -1, withscores=True))
        assert scores == {"high": T0, "mid": float(f"{T0}.49"), "mid2": float(f"{T0}.49"), "low": float(f"{T0}.99"),
                          "later": T0 + 1}
        assert await q.peek(10) == ["high", "mid", "mid2", "low"]  # "later" is not due
        clock.advance(1)
        assert [m.id for m in await q.pop(count=10)] == ["high", "mid", "mid2", "low", "later"]
    run(redis_url, scenario, config=DynoConfig(shards=1), clock=clock)


def test_push_and_pop_go_round_robin_over_the_shards(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        assert [await q.push(f"m{i}", str(i)) for i in range(6)] == [0, 1, 2, 0, 1, 2]
        assert await q.push("m1", "again", priority=3) == 1  # an existing id stays in its shard
        assert await q.shard_sizes() == [ShardSize(2, 0)] * 3
        assert await q.get("m1") == DynoMessage("m1", "again", 3, 1)
        # each pop starts one shard further; a shard with nothing left is skipped
        assert [(m.id, m.shard) for m in await q.pop()] == [("m0", 0)]
        assert [(m.id, m.shard) for m in await q.pop()] == [("m1", 1)]
        assert [(m.id, m.shard) for m in await q.pop(count=3)] == [("m2", 2), ("m5", 2), ("m3", 0)]
        assert [(m.id, m.shard) for m in await q.pop(count=5)] == [("m4", 1)]
        assert repr(q) == "DynoQueue(name='q', shards=3, next_push_shard=0, next_pop_shard=1)"
    run(redis_url, scenario, config=DynoConfig(shards=3), clock=clock)


def test_unack_timeout_redelivers_and_set_unack_timeout_extends_the_lease(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        await q.push("a", "x", priority=9)
        assert [m.id for m in await q.pop()] == ["a"]
        clock.advance(999)
        assert await q.process_unacks() == 0
        clock.advance(1)  # the deadline: now + unack_timeout_ms = T0 + 1000
        assert await q.process_unacks() == 1
        assert await q.redis.zscore(q._shards[0].queue, "a") == float(f"{T0 + 1000}.90")  # due now, priority kept
        assert await q.pop() == [DynoMessage("a", "x", 9, 0)]
        assert await q.set_unack_timeout("a", 5000) is True
        assert await q.set_unack_timeout("nope", 5000) is False
        clock.advance(4999)
        assert await q.process_unacks() == 0
        clock.advance(1)
        assert await q.process_unacks() == 1 and await q.peek() == ["a"]
        assert await q.set_unack_timeout("a", 5000) is False  # queued, not popped
    run(redis_url, scenario, config=DynoConfig(shards=1, unack_timeout_ms=1000, script_batch=2), clock=clock)


def test_process_unacks_runs_batches_until_all_are_back(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        for i in range(7):
            await q.push(f"m{i}", "")
        assert len(await q.pop(count=10)) == 7
        clock.advance(1000)
        assert await q.process_unacks() == 7  # script_batch 2: several runs per shard
        assert await q.size() == 7
    run(redis_url, scenario, config=DynoConfig(shards=2, unack_timeout_ms=1000, script_batch=2), clock=clock)


def test_unack_set_timeout_and_remove_of_queued_and_popped_messages(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        await q.push("a", "x")
        await q.push("b", "y")
        await q.pop(count=1)  # a
        assert await q.unack("a") is True and await q.unack("a") is False
        assert await q.unack("b") is False  # queued
        assert await q.peek(5) == ["a", "b"]
        assert await q.set_timeout("a", 500) is True  # queued: rescheduled
        assert await q.peek(5) == ["b"]
        await q.pop()  # b
        assert await q.set_timeout("b", 200) is True  # popped: back in the queue, later
        assert await q.shard_sizes() == [ShardSize(2, 0)] and await q.peek(5) == []
        assert await q.set_timeout("nope", 1) is False
        clock.advance(200)
        assert await q.peek(5) == ["b"]
        clock.advance(300)
        assert await q.peek(5) == ["b", "a"]
        await q.pop()  # b
        assert await q.remove("b") is True  # popped
        assert await q.remove("a") is True  # queued
        assert await q.size() == 0 and await q.shard_sizes() == [ShardSize(0, 0)]
    run(redis_url, scenario, config=DynoConfig(shards=1), clock=clock)


def test_pushing_a_popped_id_again_puts_it_back_in_the_queue(redis_url):
    clock = FakeClock()

    async def scenario(q: DynoQueue):
        await q.push("a", "old")
        await q.pop()
        await q.push("a", "new", delay_ms=10)
        assert await q.shard_sizes() == [ShardSize(1, 0), ShardSize(0, 0)]
        assert await q.ack("a") is False
        clock.advance(10)
        assert await q.pop() == [DynoMessage("a", "new", 0, 0)]
    run(redis_url, scenario, clock=clock)


def test_pop_waits_for_a_message_due_soon_and_returns_empty_after_the_wait(redis_url):
    async def scenario(q: DynoQueue):
        assert await q.pop(wait_ms=50) == []
        await q.push("soon", "x", delay_ms=150)
        got = await q.pop(count=5, wait_ms=5000)
        assert [m.id for m in got] == ["soon"]  # before the 5 s wait ran out
    run(redis_url, scenario, config=DynoConfig(shards=3, poll_ms=20))


def test_sweep_unacks_forever_puts_timed_out_messages_back(redis_url):
    async def scenario(q: DynoQueue):
        await q.push("a", "x")
        assert len(await q.pop()) == 1
        sweeper = asyncio.create_task(q.sweep_unacks_forever())
        try:
            got = await q.pop(wait_ms=5000)
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        assert [m.id for m in got] == ["a"]
    run(redis_url, scenario, config=DynoConfig(shards=2, unack_timeout_ms=50, unack_sweep_ms=20, poll_ms=20))


def test_two_consumers_never_pop_the_same_id(redis_url):
    count = 400

    async def scenario(a: DynoQueue, b: DynoQueue):
        for i in range(count):
            await (a if i % 2 else b).push(f"m{i}", str(i), priority=i % 100)
        seen: list[str] = []

        async def consume(q: DynoQueue):
            while got := await q.pop(count=7):
                seen.extend(m.id for m in got)

        await asyncio.wait_for(asyncio.gather(*(consume(q) for q in (a, b) * 4)), 20)
        assert len(seen) == count and set(seen) == {f"m{i}" for i in range(count)}
        assert await a.shard_sizes() == [ShardSize(0, count // 4)] * 4
    run(redis_url, scenario, config=DynoConfig(shards=4), queues=2)


# == failures ================================================================

def test_a_key_of_the_wrong_type_is_a_named_error(redis_url):
    async def scenario(q: DynoQueue):
        await q.redis.set(q._shards[0].queue, "not a zset")
        with pytest.raises(WrongTypeKey, match=r"hg:dyno:\{q:0\}:queue holds a string, not a zset") as caught:
            await q.push("a", "x")
        assert caught.value.keys == {q._shards[0].queue: "string"}
        with pytest.raises(WrongTypeKey):
            await q.pop()
        with pytest.raises(WrongTypeKey):
            await q.size()
    run(redis_url, scenario, config=DynoConfig(shards=1))


def test_a_redis_that_is_down_or_silent_fails_within_a_bounded_time():
    async def connect(url, connect_timeout_ms, retries):
        config = DynoConfig(connect_timeout_ms=connect_timeout_ms, command_timeout_ms=connect_timeout_ms,
                            retries=retries)
        await (await DynoQueue.connect(url, "q", config)).aclose()
    check_unreachable_fails_fast(connect)


def test_a_wrong_password_is_a_named_error(tmp_path):
    async def connect(url):
        async with await DynoQueue.connect(url, "q") as q:
            await q.push("a", "x")
    check_password(tmp_path, connect)


def test_every_script_stays_in_its_shards_slot_on_a_redis_cluster_node(tmp_path, monkeypatch):
    strict_scripts(monkeypatch, redis_dyno)
    clock = FakeClock()
    with cluster_node(tmp_path) as url:
        async def scenario(q: DynoQueue):
            for i in range(6):
                await q.push(f"m{i}", "x", priority=i)
            popped = await q.pop(count=6)
            assert len(popped) == 6
            assert await q.ack("m0") and await q.unack("m1") and await q.set_unack_timeout("m2", 1)
            assert await q.set_timeout("m3", 1) and await q.remove("m4")
            clock.advance(1000)
            assert await q.process_unacks() == 2  # m2 and m5
            assert await q.get("m1") == DynoMessage("m1", "x", 1, 1)
            assert sorted(await q.peek(10)) == ["m1", "m2", "m3", "m5"] and await q.size() == 4
        run(url, scenario, config=DynoConfig(shards=3, unack_timeout_ms=1000), clock=clock)


# == a model =================================================================

class DynoModel:
    """What DynoQueue should do, in memory (SPEC of the module docstring)."""

    def __init__(self, config: DynoConfig, clock: FakeClock) -> None:
        self.config, self.clock = config, clock
        self.messages: dict[str, DynoMessage] = {}
        self.queue: dict[str, int] = {}  # id -> due ms
        self.unacked: dict[str, int] = {}  # id -> deadline ms
        self.next_push = self.next_pop = 0

    def push(self, msg_id: str, payload: str, delay_ms: int, priority: int) -> int:
        if msg_id in self.messages:
            shard = self.messages[msg_id].shard
        else:
            shard, self.next_push = self.next_push, (self.next_push + 1) % self.config.shards
        self.messages[msg_id] = DynoMessage(msg_id, payload, priority, shard)
        self.unacked.pop(msg_id, None)
        self.queue[msg_id] = self.clock() + delay_ms
        return shard

    def due(self, shard: int | None = None) -> list[str]:
        ids = [i for i, due in self.queue.items()
               if due <= self.clock() and shard in (None, self.messages[i].shard)]
        return sorted(ids, key=lambda i: (self.queue[i], -self.messages[i].priority, i))

    def pop(self, count: int) -> list[DynoMessage]:
        start, self.next_pop = self.next_pop, (self.next_pop + 1) % self.config.shards
        out: list[DynoMessage] = []
        for k in range(self.config.shards):
            for msg_id in self.due((start + k) % self.config.shards)[:count - len(out)]:
                del self.queue[msg_id]
                self.unacked[msg_id] = self.clock() + self.config.unack_timeout_ms
                out.append(self.messages[msg_id])
            if len(out) >= count:
                break
        return out

    def forget(self, msg_id: str) -> bool:
        self.queue.pop(msg_id, None)
        self.unacked.pop(msg_id, None)
        return self.messages.pop(msg_id, None) is not None

    def ack(self, msg_id: str) -> bool:
        return msg_id in self.unacked and self.forget(msg_id)

    def requeue(self, msg_id: str, due_ms: int) -> bool:
        if msg_id not in self.unacked and msg_id not in self.queue:
            return False
        self.unacked.pop(msg_id, None)
        self.queue[msg_id] = due_ms
        return True

    def unack(self, msg_id: str) -> bool:
        return msg_id in self.unacked and self.requeue(msg_id, self.clock())

    def set_unack_timeout(self, msg_id: str, timeout_ms: int) -> bool:
        if msg_id not in self.unacked:
            return False
        self.unacked[msg_id] = self.clock() + timeout_ms
        return True

    def process_unacks(self) -> int:
        expired = [i for i, deadline in self.unacked.items() if deadline <= self.clock()]
        for msg_id in expired:
            self.requeue(msg_id, self.clock())
        return len(expired)

    def shard_sizes(self) -> list[ShardSize]:
        return [ShardSize(sum(self.messages[i].shard == s for i in self.queue),
                          sum(self.messages[i].shard == s for i in self.unacked)) for s in range(self.config.shards)]


IDS = st.sampled_from(["a", "b", "c", "d", "e"])
# Few values, on the boundaries: due exactly now, a deadline reached exactly.
DELAYS = st.sampled_from([0, 0, 1, 5, 30])
STEPS = st.sampled_from([0, 1, 29, 30])
MODEL_CONFIG = DynoConfig(shards=3, unack_timeout_ms=30)


class DynoMachine(RuleBasedStateMachine):
    """DynoQueue on a real Redis and DynoModel, driven by the same calls on
    one FakeClock, must answer the same."""

    def __init__(self, redis_url: str) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.runner = asyncio.Runner()
        self.queue = self.runner.run(DynoQueue.connect(redis_url, "q", MODEL_CONFIG, self.clock))
        self.runner.run(self.queue.redis.flushdb())
        self.model = DynoModel(MODEL_CONFIG, self.clock)

    def teardown(self) -> None:
        self.runner.run(self.queue.aclose())
        self.runner.close()

    def both(self, method: str, *args, model_method: str | None = None):
        got = self.runner.run(getattr(self.queue, method)(*args))
        assert got == getattr(self.model, model_method or method)(*args), method
        return got

    @rule(msg_id=IDS, payload=st.text(max_size=3), delay_ms=DELAYS, priority=st.sampled_from([0, 1, 50, 99]))
    def push(self, msg_id, payload, delay_ms, priority):
        got = self.runner.run(self.queue.push(msg_id, payload, delay_ms=delay_ms, priority=priority))
        assert got == self.model.push(msg_id, payload, delay_ms, priority)

    @rule(ms=STEPS)
    def advance(self, ms):
        self.clock.advance(ms)

    @rule(count=st.integers(1, 4))
    def pop(self, count):
        self.both("pop", count)

    @rule(msg_id=IDS)
    def ack(self, msg_id):
        self.both("ack", msg_id)

    @rule(msg_id=IDS)
    def unack(self, msg_id):
        self.both("unack", msg_id)

    @rule(msg_id=IDS, timeout_ms=DELAYS)
    def set_unack_timeout(self, msg_id, timeout_ms):
        self.both("set_unack_timeout", msg_id, timeout_ms)

    @rule(msg_id=IDS, delay_ms=DELAYS)
    def set_timeout(self, msg_id, delay_ms):
        got = self.runner.run(self.queue.set_timeout(msg_id, delay_ms))
        assert got == self.model.requeue(msg_id, self.clock() + delay_ms)

    @rule(msg_id=IDS)
    def remove(self, msg_id):
        self.both("remove", msg_id, model_method="forget")

    @rule()
    def process_unacks(self):
        self.both("process_unacks")

    @rule(count=st.integers(1, 6))
    def peek(self, count):
        assert self.runner.run(self.queue.peek(count)) == self.model.due()[:count]

    @rule(msg_id=IDS)
    def get(self, msg_id):
        assert self.runner.run(self.queue.get(msg_id)) == self.model.messages.get(msg_id)

    @rule()
    def size(self):
        assert self.runner.run(self.queue.size()) == len(self.model.queue)

    @invariant()
    def same_shard_sizes(self):
        assert self.runner.run(self.queue.shard_sizes()) == self.model.shard_sizes()


def test_dyno_queue_agrees_with_an_in_memory_model(redis_url):
    run_state_machine_as_test(lambda: DynoMachine(redis_url), settings=settings(
        max_examples=30, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)))
