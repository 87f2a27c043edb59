"""SPEC.md section 3 with its state in Redis: `hourglass serve --backend redis://...`.

`RedisBroker` answers the same request methods as `broker.service.Broker`
(send, pull, long_poll, ack incl. nack, delete, get, topic_info, topic_list),
so `broker.api.Api` serves it unchanged. Several hourglass processes may
share one Redis: every transition is ONE Lua script, so Redis runs it
atomically and no message is moved, pulled or retried twice.

Keys of topic T (P = "<prefix>:{T'}:", T' = T with % { } : percent-escaped,
so the braces hold a Redis Cluster hash tag and every key of a topic shares
one slot; escaping keeps a topic from forging another topic's keys):

    P waiting    zset  msgId -> triggerTime ms                       status 1
    P ready      zset  rk -> -priority  (rk = "%015d:msgId" % trigger) 2
    P tag:<tag>  zset  as ready, only the messages with that tag      2
    P expire     zset  msgId -> expireTime ms, of READY messages      2
    P ack        zset  msgId -> ack deadline ms                       3
    P m:<msgId>  hash  the message: id msg produce trigger ttl expire
                       maxRetry priority tag rk status retry
    <prefix>:topics          set of topic names (not hash-tagged)
    <prefix>:wake:<T>        pub/sub channel: "a message became READY"

Ready order is exact: a zset orders by score, then by member bytes, so
score = -priority (higher priority first) and a member starting with the
zero-padded trigger time (earlier first) give (-priority, trigger, msgId)
with no float arithmetic (a combined score would need 16 + 48 bits, more
than a double holds exactly). A final message (4..7) keeps its hash for
`retention_ms` (PEXPIRE), then Redis purges it.

Scripts never do arithmetic on times (a Lua number printed by an old Redis
loses digits past 14): the caller passes `now_ms` and deadlines as strings,
the expire time is stored at send, and scores are compared, not computed.

Tasks: `_mover` runs the move (waiting -> ready/expired) and sweep (ack
timeouts, ready expiry) scripts of every topic, then sleeps until the
earliest score it saw (at most `poll_ms`, to notice other processes'
topics), woken early by a local send due sooner. `_listener` receives the
wake channel (pattern-subscribed) and wakes this process's long polls.
Whoever makes a message READY (send, mover, nack) publishes the wake.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from storage.entry import Location, Message, Status
from storage.errors import InvalidRequest
from storage.store import NewMessage

from .metrics import Metrics
from .params import AckRequest, DeleteRequest, Defaults, LongPollRequest, PullRequest
from .service import WAITING_BUCKETS, NotFound, Unavailable

log = logging.getLogger("hourglass.redis")

# Every message read from Redis gets this Location: there is no disk entry.
NO_LOCATION = Location(0, 0)


@dataclass(frozen=True)
class RedisConfig:
    # First part of every key and channel name.
    key_prefix: str = "hg"
    # How long a final (4..7) message stays readable by getMsg.
    retention_ms: int = 24 * 3_600_000
    # Longest the mover sleeps with nothing due: it also rereads the topic set,
    # so a topic only another process sends to is swept within this.
    poll_ms: int = 1000
    # Most messages one move or sweep script handles (a script blocks Redis).
    script_batch: int = 1000

    def __post_init__(self) -> None:
        if not self.key_prefix or any(c in self.key_prefix for c in "{}"):
            raise ValueError(f"key_prefix must be non-empty without braces, got {self.key_prefix!r}")
        if self.retention_ms < 1:
            raise ValueError(f"retention_ms must be at least 1, got {self.retention_ms}")
        if self.poll_ms < 1:
            raise ValueError(f"poll_ms must be at least 1, got {self.poll_ms}")
        if self.script_batch < 1:
            raise ValueError(f"script_batch must be at least 1, got {self.script_batch}")


def escape_topic(topic: str) -> str:
    """Injective, and free of the characters that delimit keys and hash tags."""
    return topic.replace("%", "%25").replace("{", "%7B").replace("}", "%7D").replace(":", "%3A")


def ready_member(trigger_ms: int, msg_id: str) -> str:
    return f"{trigger_ms:015d}:{msg_id}"


# Shared by every script. KEYS = waiting, ready, expire, ack of one topic;
# ARGV[1] = the topic's key prefix P (message and tag keys are built from it:
# they share the topic's hash tag, hence its slot).
_LUA_COMMON = """
local P = ARGV[1]
local function mkey(id) return P .. 'm:' .. id end
local function tagkey(tag) return P .. 'tag:' .. tag end
local function ready_add(id, m)
  local f = redis.call('HMGET', m, 'priority', 'rk', 'tag', 'expire')
  local score = -tonumber(f[1])
  redis.call('ZADD', KEYS[2], score, f[2])
  if f[3] ~= '' then redis.call('ZADD', tagkey(f[3]), score, f[2]) end
  redis.call('ZADD', KEYS[3], f[4], id)
  redis.call('HSET', m, 'status', '2')
end
local function ready_remove(id, m)
  local f = redis.call('HMGET', m, 'rk', 'tag')
  redis.call('ZREM', KEYS[2], f[1])
  if f[2] ~= '' then redis.call('ZREM', tagkey(f[2]), f[1]) end
  redis.call('ZREM', KEYS[3], id)
end
local function finish(m, status, retention)
  redis.call('HSET', m, 'status', status)
  redis.call('PEXPIRE', m, retention)
end
-- A CONSUMING message (already out of the ack zset) is READY again with
-- retry+1, or ends (6) past maxRetry or its expire time. 1 if READY.
local function retry_or_end(id, m, now, retention)
  local f = redis.call('HMGET', m, 'retry', 'maxRetry', 'expire')
  local retry = tonumber(f[1])
  if retry >= tonumber(f[2]) or tonumber(now) >= tonumber(f[3]) then
    finish(m, '6', retention)
    return 0
  end
  redis.call('HSET', m, 'retry', tostring(retry + 1))
  ready_add(id, m)
  return 1
end
local function head_score(key)
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return h[2] or false
end
"""

# ARGV: P id msg produce trigger ttl expire maxRetry priority tag rk now retention
# -> {1 stored | 0 duplicate, HGETALL of the message}
_SEND = _LUA_COMMON + """
local id = ARGV[2]
local m = mkey(id)
if redis.call('EXISTS', m) == 1 then return {0, redis.call('HGETALL', m)} end
redis.call('HSET', m, 'id', id, 'msg', ARGV[3], 'produce', ARGV[4], 'trigger', ARGV[5], 'ttl', ARGV[6],
           'expire', ARGV[7], 'maxRetry', ARGV[8], 'priority', ARGV[9], 'tag', ARGV[10], 'rk', ARGV[11],
           'retry', '0', 'status', '1')
local now = tonumber(ARGV[12])
if tonumber(ARGV[5]) > now then
  redis.call('ZADD', KEYS[1], ARGV[5], id)
elseif now >= tonumber(ARGV[7]) then
  finish(m, '5', ARGV[13])
else
  ready_add(id, m)
end
return {1, redis.call('HGETALL', m)}
"""

# WAITING -> READY, or EXPIRED (5) past its expire time.
# ARGV: P now limit retention -> {made ready, handled, next waiting score | false}
_MOVE = _LUA_COMMON + """
local now = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local ready = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local m = mkey(id)
  local expire = redis.call('HGET', m, 'expire')
  if expire then
    if now >= tonumber(expire) then finish(m, '5', ARGV[4]) else ready_add(id, m); ready = ready + 1 end
  end
end
return {ready, #ids, head_score(KEYS[1])}
"""

# Ack timeouts (CONSUMING -> READY retry+1, or 6) and READY expiry (-> 5 if
# never delivered, else 6). ARGV: P now limit retention
# -> {made ready, handled, next ack deadline | false, next expiry | false}
_SWEEP = _LUA_COMMON + """
local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ready = 0
local timed_out = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2], 'LIMIT', 0, limit)
for _, id in ipairs(timed_out) do
  redis.call('ZREM', KEYS[4], id)
  local m = mkey(id)
  if redis.call('HGET', m, 'status') == '3' then ready = ready + retry_or_end(id, m, ARGV[2], ARGV[4]) end
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[2], 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  local m = mkey(id)
  ready_remove(id, m)
  if redis.call('HGET', m, 'retry') == '0' then finish(m, '5', ARGV[4]) else finish(m, '6', ARGV[4]) end
end
return {ready, #timed_out + #expired, head_score(KEYS[4]), head_score(KEYS[3])}
"""

# READY -> CONSUMING, best first (among the tags' zsets when tags are given);
# an expired head is ended on the way, never delivered.
# ARGV: P now deadline batch retention ntags tag... -> list of HGETALL
_PULL = _LUA_COMMON + """
local now = tonumber(ARGV[2])
local batch = tonumber(ARGV[4])
local ntags = tonumber(ARGV[6])
local function head()
  if ntags == 0 then return redis.call('ZRANGE', KEYS[2], 0, 0)[1] end
  local best, best_score
  for i = 1, ntags do
    local h = redis.call('ZRANGE', tagkey(ARGV[6 + i]), 0, 0, 'WITHSCORES')
    if h[1] then
      local s = tonumber(h[2])
      if best == nil or s < best_score or (s == best_score and h[1] < best) then best, best_score = h[1], s end
    end
  end
  return best
end
local out = {}
while #out < batch do
  local rk = head()
  if not rk then break end
  local id = string.sub(rk, 17)
  local m = mkey(id)
  ready_remove(id, m)
  local f = redis.call('HMGET', m, 'expire', 'retry')
  if now >= tonumber(f[1]) then
    if f[2] == '0' then finish(m, '5', ARGV[5]) else finish(m, '6', ARGV[5]) end
  else
    redis.call('HSET', m, 'status', '3')
    redis.call('ZADD', KEYS[4], ARGV[3], id)
    out[#out + 1] = redis.call('HGETALL', m)
  end
end
return out
"""

# ARGV: P id ack(1|0) now retention -> 'NF' | 'OK' | 'READY' (nack requeued) | 'BAD:<status>'
_ACK = _LUA_COMMON + """
local id = ARGV[2]
local m = mkey(id)
local st = redis.call('HGET', m, 'status')
if not st then return 'NF' end
if ARGV[3] == '1' then
  if st == '4' then return 'OK' end
  if st == '2' then ready_remove(id, m)
  elseif st == '3' then redis.call('ZREM', KEYS[4], id)
  else return 'BAD:' .. st end
  finish(m, '4', ARGV[5])
  return 'OK'
end
if st == '2' then return 'OK' end
if st ~= '3' then return 'BAD:' .. st end
redis.call('ZREM', KEYS[4], id)
if retry_or_end(id, m, ARGV[4], ARGV[5]) == 1 then return 'READY' end
return 'OK'
"""

# ARGV: P id release(1|0) retention -> 'NF' | 'OK'
_DELETE = _LUA_COMMON + """
local id = ARGV[2]
local m = mkey(id)
local st = redis.call('HGET', m, 'status')
if not st then return 'NF' end
if st == '1' then redis.call('ZREM', KEYS[1], id)
elseif st == '2' then ready_remove(id, m)
elseif st == '3' then redis.call('ZREM', KEYS[4], id) end
if st == '1' or st == '2' or st == '3' then finish(m, '7', ARGV[4]) end
if ARGV[3] == '1' then redis.call('DEL', m) end
return 'OK'
"""


def _message(topic: str, flat: Sequence[str]) -> Message:
    f = dict(zip(flat[::2], flat[1::2]))
    return Message(topic=topic, msg_id=f["id"], msg=f["msg"], produce_ms=int(f["produce"]),
                   trigger_ms=int(f["trigger"]), ttl_ms=int(f["ttl"]), max_retry=int(f["maxRetry"]),
                   priority=int(f["priority"]), tag=f["tag"], status=Status(int(f["status"])),
                   retry=int(f["retry"]), location=NO_LOCATION)


@dataclass
class _Keys:
    prefix: str  # P
    waiting: str
    ready: str
    expire: str
    ack: str
    channel: str

    @property
    def all(self) -> list[str]:
        return [self.waiting, self.ready, self.expire, self.ack]


@dataclass
class _State:
    topics: set[str] = field(default_factory=set)
    waiters: dict[str, list[asyncio.Future]] = field(default_factory=lambda: defaultdict(list))


class RedisBroker:
    """The broker over one Redis database; same request methods as
    `broker.service.Broker`. `await start()` launches the mover and the
    wake listener; `await stop()` ends them and closes the client.

    Example: a send with delayMillis=5000 runs SEND (hash + waiting zset),
    wakes this process's mover if it was sleeping past the trigger; 5 s
    later the mover's MOVE puts it in `ready` and publishes the wake; a long
    poll on any process pulls it with PULL (-> `ack` zset, deadline now +
    ackTimeoutMillis); without an ack, a SWEEP after the deadline makes it
    READY with retry 1. Each step costs one round trip and O(log n) in Redis.
    """

    def __init__(self, client: aioredis.Redis, clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None) -> None:
        self.redis = client
        self.clock = clock
        self.defaults = defaults
        self.metrics = metrics
        self.config = config or RedisConfig()
        self.failed: BaseException | None = None
        self.on_fatal: Callable[[BaseException], None] | None = None
        self._state = _State()
        self._stopping = False
        self._mover_wake = asyncio.Event()
        self._next_due_ms = 0
        self._subscribed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._topics_key = f"{self.config.key_prefix}:topics"
        self._channel_prefix = f"{self.config.key_prefix}:wake:"
        self._send_script = client.register_script(_SEND)
        self._move_script = client.register_script(_MOVE)
        self._sweep_script = client.register_script(_SWEEP)
        self._pull_script = client.register_script(_PULL)
        self._ack_script = client.register_script(_ACK)
        self._delete_script = client.register_script(_DELETE)

    @classmethod
    def from_url(cls, url: str, clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None) -> RedisBroker:
        """`url` as redis-py takes it: redis://HOST:PORT/DB."""
        return cls(aioredis.Redis.from_url(url, decode_responses=True), clock, defaults, metrics, config)

    def __repr__(self) -> str:
        return (f"RedisBroker(prefix={self.config.key_prefix!r}, topics={len(self._state.topics)}, "
                f"next_due_ms={self._next_due_ms}, stopping={self._stopping})")

    def _keys(self, topic: str) -> _Keys:
        p = f"{self.config.key_prefix}:{{{escape_topic(topic)}}}:"
        return _Keys(p, p + "waiting", p + "ready", p + "expire", p + "ack", self._channel_prefix + topic)

    # == lifetime ================================================================

    async def start(self) -> None:
        """Launch the tasks; returns once the wake channel is subscribed, so
        no wake published after start() is missed."""
        await self.redis.ping()
        self._tasks = [asyncio.create_task(self._listener(), name="redis-wake-listener"),
                       asyncio.create_task(self._mover(), name="redis-mover")]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        waiting = asyncio.ensure_future(self._subscribed.wait())
        await asyncio.wait([waiting, self._tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            raise Unavailable(f"cannot subscribe to the wake channel: {self._tasks[0].exception()!r}")

    def _task_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception(), f"task {task.get_name()}")

    def fail(self, error: BaseException, where: str) -> None:
        if self.failed is None:
            log.critical("%s failed: %r; the node stops serving", where, error)
            self.failed = error
            self.begin_stop()
            if self.on_fatal is not None:
                self.on_fatal(error)

    def begin_stop(self) -> None:
        self._stopping = True
        self.wake_all()
        self._mover_wake.set()

    async def stop(self) -> None:
        self.begin_stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.redis.aclose()

    def _check_serving(self) -> None:
        if self._stopping:
            raise Unavailable("the node is stopping")

    # == background tasks ==========================================================

    async def _listener(self) -> None:
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.psubscribe(self._channel_prefix + "*")
            self._subscribed.set()
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None and message["type"] == "pmessage":
                    self._wake(message["channel"][len(self._channel_prefix):])
        finally:
            await pubsub.aclose()

    async def _mover(self) -> None:
        limit = self.config.script_batch
        while not self._stopping:
            self._mover_wake.clear()
            self._next_due_ms = 0  # a send during this round wakes the next one
            now_ms = self.clock.now_ms()
            self._state.topics |= await self.redis.smembers(self._topics_key)
            due_ms = now_ms + self.config.poll_ms
            for topic in sorted(self._state.topics):
                keys = self._keys(topic)
                args = [keys.prefix, str(now_ms), str(limit), str(self.config.retention_ms)]
                moved, handled, waiting_head = await self._move_script(keys=keys.all, args=args)
                requeued, swept, ack_head, expire_head = await self._sweep_script(keys=keys.all, args=args)
                if moved or requeued:
                    m = self.metrics.topic(topic)
                    m.ready += moved
                    m.retries += requeued
                    await self._publish(topic)
                if handled >= limit or swept >= limit:
                    due_ms = now_ms
                for head in (waiting_head, ack_head, expire_head):
                    if head:
                        due_ms = min(due_ms, int(float(head)))
            self._next_due_ms = due_ms
            await self.clock.sleep_until(due_ms, self._mover_wake)

    async def _publish(self, topic: str) -> None:
        self._wake(topic)  # this process at once; others through Redis
        await self.redis.publish(self._channel_prefix + topic, "1")

    def _wake(self, topic: str) -> None:
        for future in self._state.waiters.pop(topic, ()):
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        for topic in list(self._state.waiters):
            self._wake(topic)

    # == requests ================================================================

    async def send(self, batch: Sequence[NewMessage]) -> list[Message]:
        """Store new messages (a duplicate id answers the stored message,
        unchanged). Each message is one atomic script; a batch is one
        pipeline, not one transaction (it was validated whole already)."""
        self._check_serving()
        if not batch:
            return []
        now_ms = self.clock.now_ms()
        retention = str(self.config.retention_ms)
        new_topics = {n.topic for n in batch} - self._state.topics
        if new_topics:
            await self.redis.sadd(self._topics_key, *new_topics)
            self._state.topics |= new_topics
        async with self.redis.pipeline(transaction=False) as pipe:
            for n in batch:
                keys = self._keys(n.topic)
                await self._send_script(keys=keys.all, client=pipe, args=[
                    keys.prefix, n.msg_id, n.msg, str(n.produce_ms), str(n.trigger_ms), str(n.ttl_ms),
                    str(n.trigger_ms + n.ttl_ms), str(n.max_retry), str(n.priority), n.tag,
                    ready_member(n.trigger_ms, n.msg_id), str(now_ms), retention])
            results = await pipe.execute()
        out, ready_topics = [], set()
        for n, (stored, flat) in zip(batch, results):
            message = _message(n.topic, flat)
            m = self.metrics.topic(n.topic)
            if stored:
                m.sends += 1
                if message.status is Status.READY:
                    ready_topics.add(n.topic)
                elif message.status is Status.WAITING and message.trigger_ms < self._next_due_ms:
                    self._mover_wake.set()
            else:
                m.duplicates += 1
            out.append(message)
        for topic in ready_topics:
            await self._publish(topic)
        return out

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING."""
        self._check_serving()
        keys = self._keys(request.topic)
        now_ms = self.clock.now_ms()
        flats = await self._pull_script(keys=keys.all, args=[
            keys.prefix, str(now_ms), str(now_ms + request.ack_timeout_ms), str(request.batch),
            str(self.config.retention_ms), str(len(request.tags)), *request.tags])
        messages = [_message(request.topic, flat) for flat in flats]
        if messages:
            m = self.metrics.topic(request.topic)
            m.pulls += len(messages)
            for message in messages:
                m.pull_gap.observe(now_ms - message.trigger_ms)
        return messages

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY,
        woken by the topic's wake channel. `gone()` (the client hung up) is
        checked before each pull; unlike the disk broker, what was pulled for
        a client that hangs up meanwhile is not given back: it waits for its
        ack timeout (a give-back script keeping retry is still to write)."""
        deadline = time.monotonic() + request.long_polling_timeout_ms / 1000
        while True:
            if self._stopping or gone():
                return []
            future = asyncio.get_running_loop().create_future()
            self._state.waiters[request.topic].append(future)  # before pulling: a wake in between counts
            try:
                messages = await self.pull(request)
                remaining = deadline - time.monotonic()
                if messages or remaining <= 0:
                    return messages
                try:
                    await asyncio.wait_for(future, remaining)
                except TimeoutError:
                    pass
            finally:
                waiters = self._state.waiters.get(request.topic)
                if waiters and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._state.waiters[request.topic]

    async def ack(self, request: AckRequest) -> None:
        """ack: CONSUMING or READY -> ACKED (again: no-op). nack: CONSUMING
        -> READY with retry+1, or ENDED; of a READY message: no-op."""
        self._check_serving()
        keys = self._keys(request.topic)
        result = await self._ack_script(keys=keys.all, args=[
            keys.prefix, request.msg_id, "1" if request.ack else "0", str(self.clock.now_ms()),
            str(self.config.retention_ms)])
        if result == "NF":
            raise NotFound(f"no message {request.msg_id!r} in topic {request.topic!r}")
        if result.startswith("BAD:"):
            status = Status(int(result[4:]))
            what = "not deliverable: cannot ack" if request.ack else "not consuming: cannot nack"
            raise InvalidRequest("msgId", f"message is in status {int(status)} ({status.name.lower()}), {what}")
        m = self.metrics.topic(request.topic)
        if request.ack:
            m.acks += 1
        else:
            m.nacks += 1
            if result == "READY":
                m.retries += 1
                await self._publish(request.topic)

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the id."""
        self._check_serving()
        keys = self._keys(request.topic)
        result = await self._delete_script(keys=keys.all, args=[
            keys.prefix, request.msg_id, "1" if request.release else "0", str(self.config.retention_ms)])
        if result == "NF":
            raise NotFound(f"no message {request.msg_id!r} in topic {request.topic!r}")
        self.metrics.topic(request.topic).deletes += 1

    async def get(self, topic: str, msg_id: str) -> Message:
        self._check_serving()
        self.metrics.topic(topic).gets += 1
        flat = await self.redis.hgetall(self._keys(topic).prefix + "m:" + msg_id)
        if not flat:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        return _message(topic, [x for kv in flat.items() for x in kv])

    # == topic information =======================================================

    async def topic_info(self, topic: str) -> dict:
        """camellia's TopicInfo: zset sizes, waiting split into delay buckets."""
        if not await self.redis.sismember(self._topics_key, topic):
            raise NotFound(f"no topic {topic!r}")
        keys = self._keys(topic)
        now_ms = self.clock.now_ms()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.waiting)
            pipe.zcard(keys.ready)
            pipe.zcard(keys.ack)
            low = "-inf"
            for _, upper in WAITING_BUCKETS:
                high = "+inf" if upper is None else f"({now_ms + upper}"
                pipe.zcount(keys.waiting, low, high)
                low = f"{now_ms + upper}" if upper is not None else low
            waiting, ready, consuming, *buckets = await pipe.execute()
        return {
            "topic": topic,
            "waitingQueueSize": waiting,
            "waitingQueueInfo": {name: n for (name, _), n in zip(WAITING_BUCKETS, buckets)},
            "readyQueueSize": ready,
            "ackQueueSize": consuming,
        }

    def topic_list(self) -> list[str]:
        """Topics known to this process (its sends, and the topic set as the
        mover last read it)."""
        return sorted(self._state.topics)
