"""SPEC.md section 3 with its state in Redis: `hourglass serve --backend redis://...`.

`RedisBroker` is a `broker.backend.Backend`, as the disk
`broker.service.Broker` is (send, pull, long_poll, ack incl. nack, delete,
get, reschedule, dead letters, topic_info, topic_list), so `broker.api.Api`
serves it unchanged, with the same lifecycle (the disk
backend's docstring has the table). Several hourglass processes may share
one Redis: every read and transition is ONE Lua script over one topic's
keys, so Redis runs it atomically and no message is moved, pulled or
retried twice.

Keys, their layout and the URL: broker.redis.keys.

Tasks: `_mover` runs TICK on every topic (waiting -> ready or expired, ack
timeouts, ready expiry, purge of retired messages), then sleeps until the
earliest score it saw (at most `poll_ms`, to notice other processes'
topics), woken early by a local send due sooner. `_listener` receives the
wake channel (pattern-subscribed) and wakes this process's long polls.
Whoever makes a message READY (send, mover, nack, a give-back) publishes
the wake.

Redis trouble is answered, not hung on: every command has a timeout and a
few quick retries; a Redis that is unreachable, refuses the password, is
out of memory or holds a key of the wrong type under the prefix makes the
request fail with `Unavailable` (HTTP 503) saying which, and the tasks
retry until it is back. `?cluster=1` in the URL selects Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AuthenticationError, ClusterError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from storage.entry import Location, Message, Status
from storage.errors import Conflict, InvalidRequest, NotFound, Unavailable
from storage.store import NewMessage
from wheel.clock import Clock

from ..backend import DEAD_SCAN, REDRIVE_STEP, WAITING_BUCKETS, topic_info_json
from ..lifecycle import Lifecycle
from ..metrics import Metrics
from ..params import AckRequest, Defaults, DeleteRequest, LongPollRequest, NewSend, PullRequest, as_sends
from .keys import KEY_TYPES, RedisConfig, TopicKeys, ready_member, redact, split_cluster_flag
from .scripts import load_scripts

log = logging.getLogger("hourglass.redis")

# Every message read from Redis gets this Location: there is no disk entry.
NO_LOCATION = Location(0, 0)

# Redis errors that say "not now" rather than "hourglass has a bug": the
# first word of the error Redis answered.
REFUSALS = frozenset({"OOM", "READONLY", "LOADING", "MASTERDOWN", "BUSY", "NOREPLICAS", "MISCONF", "CLUSTERDOWN",
                      "TRYAGAIN"})
# What redis-py raises when Redis fails (its cluster errors are not RedisErrors).
REDIS_ERRORS = (RedisError, RedisClusterException)
# == Lua =======================================================================
# Every script, by name (broker/redis/lua/backend/: common.lua, shared by
# every script, reads a message with load() and writes it with save(); KEYS
# are a topic's eight keys, TopicKeys.all). RedisBroker registers these (a
# test may wrap them).
SCRIPTS = load_scripts("backend", with_common=("send", "tick", "pull", "give_back", "ack", "delete", "get", "info",
                                               "reschedule", "dead", "redrive"))


def _message(topic: str, msg_id: str, meta: str, body: str) -> Message:
    f = json.loads(meta)
    return Message(topic=topic, msg_id=msg_id, msg=body, produce_ms=int(f["produce"]),
                   trigger_ms=int(f["trigger"]), ttl_ms=int(f["ttl"]), max_retry=int(f["maxRetry"]),
                   priority=int(f["priority"]), tag=f["tag"], status=Status(int(f["status"])),
                   retry=int(f["retry"]), location=NO_LOCATION)


@dataclass
class _State:
    # Topics this process knows of (its sends, the topic set as last read).
    topics: set[str] = field(default_factory=set)
    # Topics known to be in the topic set (forgotten when Redis was
    # unreachable: it may come back empty).
    registered: set[str] = field(default_factory=set)
    # Last problem reported per place (mover, listener, a topic), so that a
    # lasting outage is logged once, and its end too.
    problems: dict[str, str] = field(default_factory=dict)


class RedisBroker(Lifecycle):
    """The broker over one Redis database (or Redis Cluster); a
    `broker.backend.Backend`, as the disk broker is. `await start()` checks the
    connection and launches the mover and the wake listener; `await stop()`
    ends them and closes the client.

    Example: a send with delayMillis=5000 runs SEND (meta, body, waiting
    zset) and wakes this process's mover if it was sleeping past the
    trigger; 5 s later the mover's TICK puts it in `ready` and publishes the
    wake; a long poll on any process pulls it with PULL (-> `ack` zset,
    deadline now + ackTimeoutMillis); without an ack, a TICK after the
    deadline makes it READY with retry 1. Each step costs one round trip and
    O(log n) in Redis; the mover costs one TICK per topic per round.
    """

    def __init__(self, client: aioredis.Redis | RedisCluster, clock: Clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None, *, url: str = "redis") -> None:
        super().__init__()  # (Lifecycle: stopping, failing, long-poll waiters)
        self.redis = client
        self.clock = clock
        self.defaults = defaults
        self.metrics = metrics
        self.config = config or RedisConfig()
        self.url = redact(url)
        self._state = _State()
        self._mover_wake = asyncio.Event()
        self._next_due_ms = 0
        self._subscribed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._topics_key = f"{self.config.key_prefix}:topics"
        self._channel_prefix = f"{self.config.key_prefix}:wake:"
        self._scripts = {name: client.register_script(source) for name, source in SCRIPTS.items()}

    @classmethod
    def from_url(cls, url: str, clock: Clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None) -> RedisBroker:
        """`url` as redis-py takes it (redis://[:password@]HOST:PORT/DB,
        rediss:// for TLS), plus `?cluster=1` for a Redis Cluster (any of its
        nodes; database 0). Connects lazily: `start()` says if it cannot."""
        config = config or RedisConfig()
        target, cluster = split_cluster_flag(url)
        options = dict(decode_responses=True, socket_connect_timeout=config.connect_timeout_ms / 1000,
                       socket_timeout=config.command_timeout_ms / 1000,
                       retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), config.retries))
        client = RedisCluster.from_url(target, **options) if cluster else aioredis.Redis.from_url(target, **options)
        return cls(client, clock, defaults, metrics, config, url=url)

    def __repr__(self) -> str:
        return (f"RedisBroker(url={self.url!r}, prefix={self.config.key_prefix!r}, "
                f"topics={len(self._state.topics)}, next_due_ms={self._next_due_ms}, stopping={self._stopping})")

    @property
    def problem(self) -> str | None:
        """What keeps the background tasks from Redis now (None: nothing),
        for a health check to report."""
        return "; ".join(f"{where}: {what}" for where, what in sorted(self._state.problems.items())) or None

    def keys(self, topic: str) -> TopicKeys:
        return TopicKeys.of(self.config.key_prefix, topic)

    # == talking to Redis ==========================================================

    async def _script(self, name: str, topic: str, args: Sequence[str]):
        keys = self.keys(topic)
        try:
            return await self._scripts[name](keys=keys.all, args=args)
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, keys.all)) from e

    async def _command(self, name: str, *args: str):
        """A plain command on the topic set."""
        try:
            return await getattr(self.redis, name)(self._topics_key, *args)
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, [])) from e

    async def _problem(self, error: Exception, keys: list[str]) -> str:
        """What a failed command says to the client (a 503), or re-raise
        `error` if it looks like a bug here (a 500, logged)."""
        if isinstance(error, AuthenticationError):
            return f"authentication to Redis at {self.url} failed: {error}"
        if isinstance(error, (RedisConnectionError, RedisTimeoutError, ClusterError, RedisClusterException)):
            self._state.registered.clear()
            return f"Redis at {self.url} is unreachable: {error}"
        if isinstance(error, ResponseError) and str(error).startswith("WRONGTYPE"):
            wrong = await self._wrong_types(keys + [self._topics_key])
            if wrong:
                return (f"{'; '.join(wrong)}; every key under {self.config.key_prefix + ':'!r} is hourglass's: "
                        f"remove or rename it")
        if isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in REFUSALS:
            return f"Redis at {self.url} refused the command: {error}"
        raise error

    async def _wrong_types(self, keys: list[str]) -> list[str]:
        wanted = dict(zip(keys, KEY_TYPES.values()))
        wanted[self._topics_key] = "set"
        wrong = []
        for key, kind in wanted.items():
            try:
                found = await self.redis.type(key)
            except REDIS_ERRORS:
                continue
            if found not in ("none", kind):
                wrong.append(f"Redis key {key!r} holds a {found}, not the {kind} hourglass keeps there")
        return wrong

    def _report(self, where: str, problem: str | None) -> None:
        """Log a lasting problem once, and its end."""
        before = self._state.problems.get(where)
        if problem is None:
            if before is not None:
                del self._state.problems[where]
                log.warning("%s works again", where)
        elif problem != before:
            self._state.problems[where] = problem
            log.error("%s: %s; retrying", where, problem)

    # == lifetime ================================================================

    async def start(self) -> None:
        """Check the connection, then launch the tasks; returns once the wake
        channel is subscribed, so no wake published after start() is missed.
        Raises Unavailable with a sentence if Redis cannot be used."""
        try:
            await self.redis.ping()
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, [])) from e
        self._tasks = [asyncio.create_task(self._listener(), name="redis-wake-listener"),
                       asyncio.create_task(self._mover(), name="redis-mover")]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        wait_s = 2 * (self.config.connect_timeout_ms + self.config.command_timeout_ms) / 1000
        try:
            await self.clock.wait_for(self._subscribed.wait(), wait_s)
        except TimeoutError:
            raise Unavailable(f"cannot subscribe to the wake channel on Redis at {self.url}: "
                              f"{self._state.problems.get('wake listener', 'no answer')}") from None

    _log = log
    _failure_words = "the node stops serving"

    def begin_stop(self) -> None:
        super().begin_stop()
        self._mover_wake.set()

    async def stop(self) -> None:
        self.begin_stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.redis.aclose()

    # == background tasks ==========================================================

    async def _listener(self) -> None:
        """Wake local long polls on other processes' wakes; resubscribe after
        a lost connection (and wake every poll then: a wake may be lost)."""
        while not self._stopping:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(self._channel_prefix + "*")
                self._subscribed.set()
                self._report("wake listener", None)
                self.wake_all()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message["type"] == "pmessage":
                        self._wake(message["channel"][len(self._channel_prefix):])
            except (*REDIS_ERRORS, OSError) as e:
                self._report("wake listener", f"Redis at {self.url} is unreachable: {e}")
            finally:
                with contextlib.suppress(*REDIS_ERRORS, OSError):
                    await pubsub.aclose()
            await self.clock.sleep(self.config.poll_ms / 1000)

    async def _mover(self) -> None:
        while not self._stopping:
            self._mover_wake.clear()
            self._next_due_ms = 0  # a send during this round wakes the next one
            now_ms = self.clock.now_ms()
            due_ms = now_ms + self.config.poll_ms
            try:
                self._state.topics |= await self._command("smembers")
            except (Unavailable, *REDIS_ERRORS) as e:
                self._report("mover", str(e))
            else:
                self._report("mover", None)
                for topic in sorted(self._state.topics):
                    due_ms = min(due_ms, await self._tick(topic, now_ms))
            self._next_due_ms = due_ms
            await self.clock.sleep_until(due_ms, self._mover_wake)

    async def _tick(self, topic: str, now_ms: int) -> int:
        """One TICK of a topic; when it next needs one."""
        limit = self.config.script_batch
        where = f"topic {topic!r}"
        try:
            triggers, retried, ended, full, *heads = await self._script("tick", topic, [
                str(now_ms), str(limit), str(now_ms + self.config.retention_ms)])
        except (Unavailable, *REDIS_ERRORS) as e:  # this topic's trouble must not stop the others
            self._report(where, str(e))
            return now_ms + self.config.poll_ms
        self._report(where, None)
        m = self.metrics.topic(topic)
        m.retries += retried
        m.ended += ended
        self._made_ready(topic, [int(t) for t in triggers], now_ms)
        if triggers or retried:
            await self._publish(topic)
        if full:
            return now_ms
        return min([int(float(h)) for h in heads if h] or [now_ms + self.config.poll_ms])

    def _made_ready(self, topic: str, trigger_times: list[int], now_ms: int) -> None:
        m = self.metrics.topic(topic)
        m.ready += len(trigger_times)
        for trigger_ms in trigger_times:
            m.ready_gap.observe(now_ms - trigger_ms)
            self.metrics.lateness_seconds.observe(max(0, now_ms - trigger_ms) / 1000)

    async def _publish(self, topic: str) -> None:
        self._wake(topic)  # this process at once; others through Redis
        try:
            await self.redis.publish(self._channel_prefix + topic, "1")
        except REDIS_ERRORS as e:  # the change is made: others see it at their next pull or poll_ms
            self._report("wake publisher", f"Redis at {self.url} is unreachable: {e}")
        else:
            self._report("wake publisher", None)

    # == requests ================================================================

    async def send(self, sends: Sequence[NewSend | NewMessage]) -> list[Message]:
        """Store new messages (a duplicate id of a live message, also earlier
        in the batch, answers the stored message, unchanged; an ended one is
        replaced unless the send is strict). One atomic script per topic. A
        message due already is answered READY (or EXPIRED), as it is stored."""
        self._check_serving()
        if not sends:
            return []
        sends = as_sends(sends)
        batch = [s.message for s in sends]
        if any(n.key for n in batch):
            raise InvalidRequest("key", "serial keys are served by the disk backend; the Redis backend refuses "
                                        "them rather than deliver a key's messages at once (for per-key serial "
                                        "consumption on Redis, see broker.redis.rmq)")
        strict = {i for i, s in enumerate(sends) if s.strict}
        now_ms = self.clock.now_ms()
        new_topics = {n.topic for n in batch} - self._state.registered
        if new_topics:
            await self._command("sadd", *new_topics)
            self._state.registered |= new_topics
            self._state.topics |= new_topics
        by_topic: dict[str, list[int]] = defaultdict(list)
        for i, n in enumerate(batch):
            by_topic[n.topic].append(i)
        out: list[Message | None] = [None] * len(batch)
        for topic, positions in by_topic.items():
            for i, message in zip(positions, await self._send_topic(
                    topic, [batch[i] for i in positions], [i in strict for i in positions], now_ms)):
                out[i] = message
        return out

    async def _send_topic(self, topic: str, batch: list[NewMessage], strict: list[bool],
                          now_ms: int) -> list[Message]:
        args = [str(now_ms), str(now_ms + self.config.retention_ms)]
        for n, is_strict in zip(batch, strict):
            args += [n.msg_id, n.msg, str(n.produce_ms), str(n.trigger_ms), str(n.ttl_ms),
                     str(n.trigger_ms + n.ttl_ms), str(n.max_retry), str(n.priority), n.tag,
                     ready_member(n.priority, n.trigger_ms, n.msg_id), "1" if is_strict else "0"]
        results = await self._script("send", topic, args)
        m = self.metrics.topic(topic)
        out, ready = [], []
        answered: dict[str, Message] = {}  # a duplicate of an earlier item gets that item's answer
        for n, (state, *stored) in zip(batch, results):
            if state == "0":
                m.duplicates += 1
                out.append(answered.get(n.msg_id) or _message(topic, n.msg_id, *stored))
                continue
            m.sends += 1
            out.append(Message(*n[:9], status=Status(int(state)), retry=0, location=NO_LOCATION))
            answered[n.msg_id] = out[-1]
            if state == "2":
                ready.append(n.trigger_ms)
            elif state == "5":
                m.ended += 1
            elif n.trigger_ms < self._next_due_ms:
                self._mover_wake.set()
        self._made_ready(topic, ready, now_ms)
        if ready:
            await self._publish(topic)
        return out

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING."""
        return (await self._pull(request))[0]

    async def _pull(self, request: PullRequest | LongPollRequest) -> tuple[list[Message], str]:
        """The pulled messages and their ack deadline."""
        self._check_serving()
        now_ms = self.clock.now_ms()
        deadline = str(now_ms + request.ack_timeout_ms)
        ended, *rows = await self._script("pull", request.topic, [
            str(now_ms), deadline, str(request.batch), str(now_ms + self.config.retention_ms), *request.tags])
        messages = [_message(request.topic, *row) for row in rows]
        m = self.metrics.topic(request.topic, exists=bool(messages) or request.topic in self._state.topics)
        m.ended += ended
        m.pulls += len(messages)
        for message in messages:
            m.pull_gap.observe(now_ms - message.trigger_ms)
        return messages, deadline

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY,
        woken by the topic's wake channel (and pulling again every poll_ms
        in case a wake was lost with a connection). `gone()` says the client hung up:
        then nothing is taken, and what was taken meanwhile goes back to
        READY with its retry unchanged (as the disk broker does)."""
        ack_deadline = ""

        async def pull() -> list[Message]:
            nonlocal ack_deadline
            messages, ack_deadline = await self._pull(request)
            return messages

        async def give_back(messages: list[Message]) -> None:
            await self._give_back(request.topic, messages, ack_deadline)

        # the waiter set before each pull: another process's wake meanwhile counts
        return await self._wait_ready(request.topic, request.long_polling_timeout_ms, pull, give_back, gone,
                                      wait_before_pull=True, repoll_s=self.config.poll_ms / 1000)

    async def _give_back(self, topic: str, messages: list[Message], ack_deadline: str) -> None:
        """Pulled for a client that is gone: READY again, as if never pulled."""
        if await self._script("give_back", topic, [ack_deadline, *(m.msg_id for m in messages)]):
            await self._publish(topic)

    async def ack(self, request: AckRequest) -> None:
        """ack: WAITING, READY or CONSUMING -> ACKED. nack: CONSUMING ->
        READY, or ENDED after its last delivery. Anything else (an unknown
        id, an ended message, a nack of one not consuming) changes nothing
        and is no error, as camellia."""
        self._check_serving()
        now_ms = self.clock.now_ms()
        result = await self._script("ack", request.topic, [
            request.msg_id, "1" if request.ack else "0", str(now_ms), str(now_ms + self.config.retention_ms)])
        if result in ("NF", "NOOP"):
            return
        m = self.metrics.topic(request.topic)
        if request.ack:
            m.acks += 1
            return
        m.nacks += 1
        if result == "READY":
            m.retries += 1
            await self._publish(request.topic)
        else:
            m.ended += 1

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """`ack` of each id in turn (a script each, then a read of its
        status); the status of each after it (None: no such message)."""
        after: dict[str, Status | None] = {}
        for msg_id in msg_ids:
            if msg_id not in after:  # a repeated id: once
                await self.ack(AckRequest(topic, msg_id, ack))
                found = await self._script("get", topic, [msg_id])
                after[msg_id] = _message(topic, msg_id, *found).status if found else None
        return [after[msg_id] for msg_id in msg_ids]

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the
        id. An ended or unknown message raises NotFound (camellia's 404);
        with `release` an ended one is released all the same."""
        self._check_serving()
        result = await self._script("delete", request.topic, [
            request.msg_id, "1" if request.release else "0", str(self.clock.now_ms() + self.config.retention_ms)])
        if result == "NF":
            raise NotFound(f"no message {request.msg_id!r} in topic {request.topic!r}")
        if result == "NOOP":
            raise NotFound(f"message {request.msg_id!r} has ended")
        if result == "OK":
            self.metrics.topic(request.topic).deletes += 1

    async def get(self, topic: str, msg_id: str) -> Message:
        self._check_serving()
        found = await self._script("get", topic, [msg_id])
        self.metrics.topic(topic, exists=bool(found) or topic in self._state.topics).gets += 1
        if not found:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        return _message(topic, msg_id, *found)

    # == reschedule and dead letters ================================================

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """As the disk broker's: a WAITING or READY message gets a new
        trigger time (<= now: READY at once); else Conflict."""
        self._check_serving()
        old = await self.get(topic, msg_id)
        now_ms = self.clock.now_ms()
        result = await self._script("reschedule", topic, [
            msg_id, str(trigger_ms), str(trigger_ms + old.ttl_ms), ready_member(old.priority, trigger_ms, msg_id),
            str(now_ms)])
        message = self._changed(topic, msg_id, result, "rescheduled", "only a waiting or ready message")
        self.metrics.topic(topic).reschedules += 1
        if message.status is Status.READY:
            self._made_ready(topic, [trigger_ms], now_ms)
            await self._publish(topic)
        elif trigger_ms < self._next_due_ms:
            self._mover_wake.set()
        return message

    def _changed(self, topic: str, msg_id: str, result, verb: str, allowed: str) -> Message:
        if result == "NF":
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        if isinstance(result, str) and result.startswith("S"):
            status = Status(int(result[1:]))
            hint = " (ack or nack it first)" if status is Status.CONSUMING else ""
            raise Conflict(f"message {msg_id!r} is {status.name.lower()} (status {int(status)}): {allowed} "
                           f"can be {verb}{hint}")
        return _message(topic, msg_id, *result)

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        """A page of the topic's dead letters, in the order they are purged
        (oldest ended first), reading at most DEAD_SCAN members; the cursor
        ("<purge ms>:<msgId>") of the next page, or None."""
        self._check_serving()
        score, _, after_id = (cursor or "").partition(":")
        if cursor and not (score.isascii() and score.isdigit() and after_id):
            raise InvalidRequest("cursor", f"must be a cursor a listDeadMsg page answered, got {cursor[:40]!r}")
        wanted = "," + ",".join(str(int(s)) for s in sorted(statuses)) + ","
        next_score, next_id, *rows = await self._script("dead", topic, [score, after_id, str(limit),
                                                                        str(DEAD_SCAN), wanted])
        messages = [_message(topic, rows[i], rows[i + 1], rows[i + 2]) for i in range(0, len(rows), 3)]
        return messages, None if not next_score else f"{int(float(next_score))}:{next_id}"

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter READY again now with retry 0 and its ttl from now."""
        self._check_serving()
        old = await self.get(topic, msg_id)
        result, = await self._redrive(topic, [old])
        message = self._changed(topic, msg_id, result, "re-driven", "only an expired (5) or ended (6) message")
        return message

    async def _redrive(self, topic: str, olds: list[Message]) -> list:
        now_ms = self.clock.now_ms()
        args = [str(now_ms)]
        for m in olds:
            args += [m.msg_id, str(now_ms + m.ttl_ms), ready_member(m.priority, now_ms, m.msg_id)]
        results = await self._script("redrive", topic, args)
        done = sum(1 for r in results if not isinstance(r, str))
        if done:
            self.metrics.topic(topic).redrives += done
            self._made_ready(topic, [now_ms] * done, now_ms)
            await self._publish(topic)
        return results

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """The topic's dead letters, oldest first, at most `limit`, a page of
        REDRIVE_STEP a script; how many, and whether more are left."""
        self._check_serving()
        done, cursor = 0, None
        dead = frozenset((Status.EXPIRED, Status.ENDED))
        while done < limit:
            page, cursor = await self.list_dead(topic, dead, cursor, min(REDRIVE_STEP, limit - done))
            if page:
                results = await self._redrive(topic, page)
                done += sum(1 for r in results if not isinstance(r, str))
            if cursor is None:
                return done, False
        more, _ = await self.list_dead(topic, dead, cursor, 1)
        return done, bool(more)

    # == topic information =======================================================

    async def topic_info(self, topic: str) -> dict:
        """camellia's TopicInfo: zset sizes, waiting split into delay buckets."""
        now_ms = self.clock.now_ms()
        bounds = [str(now_ms + upper) for _, upper in WAITING_BUCKETS if upper is not None]
        waiting, ready, consuming, *buckets = await self._script("info", topic, bounds)
        return topic_info_json(topic, waiting, buckets, ready, consuming)

    async def topic_infos(self, topics: Sequence[str]) -> list[dict]:
        """`topic_info` of each of `topics` (a script each: Redis counts by score)."""
        return [await self.topic_info(topic) for topic in topics]

    def topic_list(self) -> list[str]:
        """Topics known to this process (its sends, and the topic set as the
        mover last read it)."""
        return sorted(self._state.topics)
