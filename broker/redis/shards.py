"""Sharded queues over Redis, the ground both `broker.redis.dyno` (Netflix
Dyno-queues) and `broker.redis.rmq` (RMQ's message kinds) stand on: the
errors they raise, the config fields they share, and `ShardedScripts`, which
runs one Lua script on one shard (every key it touches passed in KEYS under
the shard's `{hash tag}`), turns redis-py's errors into sentences, and polls
shards round-robin.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ConnectionError, ResponseError, TimeoutError

from storage.errors import HourglassError, InvalidRequest

from ..clock import SystemClock
from ..tasks import raise_swallowed_cancel
from .keys import at_least, check_key_prefix, escape_topic
from .scripts import Reply

T = TypeVar("T")

# The longest delay push accepts: due times stay below 2^43 ms, where the
# priority fraction is exact enough (see the module docstring).
MAX_DELAY_MS = 100 * 365 * 86_400_000


# == errors =====================================================================

class RedisAdapterError(HourglassError):
    """Raised, as one of its subclasses, by the Dyno-queues and RMQ interfaces
    when Redis fails an operation; catch it to handle any of them."""


class RedisUnavailable(RedisAdapterError):
    """Redis cannot be reached: connection refused, the connect or reply
    timeout passed (after the configured retries), or the connection broke."""


class RedisAuthError(RedisAdapterError):
    """Redis refused the credentials: a wrong password, or none given to a
    Redis that requires one."""


class WrongTypeKey(RedisAdapterError):
    """A key the operation uses holds another Redis type (WRONGTYPE):
    another program writes under the same key names. `keys` maps each
    offending key to the type it holds."""

    def __init__(self, message: str, keys: Mapping[str, str]) -> None:
        super().__init__(message)
        self.keys = dict(keys)


def _address(client: aioredis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


async def call_redis(client: aioredis.Redis, action: Awaitable[T], key_types: Mapping[str, str]) -> T:
    """Await one Redis call (a command, a script or a pipeline's execute)
    and turn redis-py's low-level errors into a sentence. `key_types` maps
    each key the call may touch to the type it must have (zset, hash), to
    name the culprit of a WRONGTYPE."""
    try:
        return await action
    except AuthenticationError as e:  # a subclass of ConnectionError: first
        raise RedisAuthError(f"Redis at {_address(client)} refused the credentials ({e}): "
                             "check the password in the URL") from e
    except (ConnectionError, TimeoutError) as e:
        raise RedisUnavailable(f"cannot reach Redis at {_address(client)} ({e}): "
                               "is it running, and is the address right?") from e
    except ResponseError as e:
        if "WRONGTYPE" not in str(e):  # a pipeline prefixes "Command # n (...) of pipeline caused error"
            raise
        wrong = await _wrong_types(client, key_types)
        held = ", ".join(f"{key} holds a {held}, not a {key_types[key]}" for key, held in wrong.items())
        raise WrongTypeKey(f"a key has the wrong type ({held or e}): another program uses these key "
                           "names; choose another key_prefix or delete the key", wrong) from e


async def _wrong_types(client: aioredis.Redis, key_types: Mapping[str, str]) -> dict[str, str]:
    try:
        async with client.pipeline(transaction=False) as pipe:
            for key in key_types:
                pipe.type(key)
            held = await pipe.execute()
    except (ConnectionError, TimeoutError):
        return {}
    return {key: h for (key, want), h in zip(key_types.items(), held) if h not in (want, "none")}


# == configuration and helpers ==================================================

@dataclass(frozen=True)
class RedisQueueConfig:
    # First part of every key name. Without braces: they would move the
    # Redis Cluster hash tag.
    key_prefix: str = "hg"
    # `connect` only: longest wait for the TCP connection and the
    # handshake; a Redis that is down or unreachable fails within it.
    connect_timeout_ms: int = 2000
    # `connect` only: longest wait for one reply (a script blocks Redis
    # while it runs, so leave room for script_batch messages).
    command_timeout_ms: int = 5000
    # `connect` only: reconnects after a refused, broken or timed-out
    # connection before RedisUnavailable. A failure takes at most about
    # (retries + 1) x the timeout. A resent script may have run once
    # already (its reply lost): pops then wait for their timeout, so
    # delivery stays at least once.
    retries: int = 1
    # Longest sleep between attempts while pop waits: a message pushed by
    # another process is seen within it.
    poll_ms: int = 100
    # Most messages one sweep script moves (a script blocks Redis while it
    # runs); a sweep runs the script again until a batch comes back short.
    script_batch: int = 1000

    def __post_init__(self) -> None:
        check_key_prefix(self.key_prefix)
        at_least(self, 1, "connect_timeout_ms", "command_timeout_ms", "poll_ms", "script_batch")
        at_least(self, 0, "retries")

    def client(self, url: str) -> aioredis.Redis:
        """A redis.asyncio client for `url` (redis://[:password@]HOST:PORT/DB)
        with this config's timeouts and retries; no I/O yet."""
        return aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=self.connect_timeout_ms / 1000,
            socket_timeout=self.command_timeout_ms / 1000, retry=Retry(NoBackoff(), self.retries))


def slot_prefix(key_prefix: str, family: str, name: str, index: int) -> str:
    """"<key_prefix>:<family>:{<name'>:<index>}:" — the braces are one
    shard's (slot's) hash tag; `escape_topic` keeps ':' and braces out of
    name', so the tag is injective."""
    return f"{key_prefix}:{family}:{{{escape_topic(name)}:{index}}}:"


def check_int(parameter: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidRequest(parameter, f"must be an integer from {low} to {high}, got {value!r}")


def check_text(parameter: str, value: str, *, empty: bool = False) -> None:
    if not isinstance(value, str) or (not empty and not value):
        raise InvalidRequest(parameter, f"must be a{'' if empty else ' non-empty'} string, got {value!r}")


async def poll(attempt: Callable[[], Awaitable[tuple[list[T], int | None]]], wait_ms: int, poll_ms: int,
               now_ms: Callable[[], int]) -> list[T]:
    """Run `attempt` until it returns items or `wait_ms` (monotonic time)
    has passed, sleeping at most poll_ms between attempts, and no longer
    than until the next due ms it reported."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        items, next_due_ms = await attempt()
        remaining_s = deadline - time.monotonic()
        if items or remaining_s <= 0:
            return items
        raise_swallowed_cancel()
        sleep_s = min(remaining_s, poll_ms / 1000)
        if next_due_ms is not None:
            sleep_s = min(sleep_s, max(0.001, (next_due_ms - now_ms()) / 1000))
        await asyncio.sleep(sleep_s)


async def repeat(action: Callable[[], Awaitable[object]], interval_ms: int) -> None:
    """`action` every interval_ms until cancelled; an error ends it."""
    while True:
        await action()
        raise_swallowed_cancel()
        await asyncio.sleep(interval_ms / 1000)


class ShardKeys(Protocol):
    """The keys of one shard (slot) of a queue: `all` in the order the
    scripts take them as KEYS, `types` each key's Redis type."""

    @property
    def all(self) -> list[str]: ...

    @property
    def types(self) -> dict[str, str]: ...


K = TypeVar("K", bound=ShardKeys)
Take = Callable[[int, int, int], Awaitable[tuple[list[T], int | None]]]


class ShardedScripts(Generic[K]):
    """What DynoQueue and RmqTopic share: a client (closed by `aclose` if
    `connect` made it), the keys of each shard, and Lua scripts run on one
    shard at a time with that shard's keys as KEYS, so each script stays in
    one Redis Cluster slot. Errors come out as the errors above."""

    def __init__(self, client: aioredis.Redis, config: RedisQueueConfig, now_ms: Callable[[], int] | None,
                 scripts: Mapping[str, str], shards: list[K]) -> None:
        self.redis = client
        self.now_ms = now_ms or SystemClock().now_ms
        self._poll_ms = config.poll_ms
        self._batch = config.script_batch
        self._shards = shards
        self._types = {key: t for shard in shards for key, t in shard.types.items()}
        self._scripts = {op: client.register_script(source) for op, source in scripts.items()}
        self._owns_client = False
        self._next_pop = 0

    async def _opened(self) -> Self:
        """Take ownership of the client and PING: a Redis that is down, or a
        wrong password, fails here with a sentence."""
        self._owns_client = True
        try:
            await call_redis(self.redis, self.redis.ping(), {})
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        """Close the client if `connect` made it."""
        if self._owns_client:
            await self.redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _script(self, op: str, shard: int, args: Sequence[str]) -> Reply:
        keys = self._shards[shard]
        return await call_redis(self.redis, self._scripts[op](keys=keys.all, args=list(args)), keys.types)

    async def _on_shards(self, op: str, args_of: Mapping[int, Sequence[str]]) -> list[Reply]:
        """Run script `op` on the shards `args_of` names, each with its args,
        in one pipelined round trip; the results in that order."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard, args in args_of.items():
                await self._scripts[op](keys=self._shards[shard].all, args=list(args), client=pipe)
            return await call_redis(self.redis, pipe.execute(), self._types)

    async def _on_every_shard(self, op: str, args: Sequence[str]) -> list[Reply]:
        """For the by-id calls, whose id lives in a shard we do not know."""
        return await self._on_shards(op, {shard: args for shard in range(len(self._shards))})

    async def _read_every_shard(self, command: Callable[[aioredis.client.Pipeline, K], object]) -> list[Reply]:
        """`command(pipe, keys)` queues reads for one shard; the replies of all."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for keys in self._shards:
                command(pipe, keys)
            return await call_redis(self.redis, pipe.execute(), self._types)

    async def _drain(self, op: str, args: Sequence[str]) -> int:
        """Run script `op` (args + [script_batch] -> how many it handled) on
        every shard until a run handles less than a batch; the total."""
        total = 0
        for shard in range(len(self._shards)):
            while True:
                handled = await self._script(op, shard, [*args, str(self._batch)])
                total += handled
                if handled < self._batch:
                    break
        return total

    async def _pop(self, count: int, wait_ms: int, take: Take[T]) -> list[T]:
        """Up to `count` items from the shards round-robin (each attempt
        starts one shard further), waiting up to wait_ms for the first:
        `take(now_ms, shard, want)` -> (items, that shard's next due ms)."""
        check_int("count", count, 1, 100_000)
        check_int("wait_ms", wait_ms, 0, 86_400_000)

        async def attempt() -> tuple[list[T], int | None]:
            now_ms = self.now_ms()
            start, self._next_pop = self._next_pop, (self._next_pop + 1) % len(self._shards)
            out: list[T] = []
            next_due_ms: int | None = None
            for i in range(len(self._shards)):
                items, due_ms = await take(now_ms, (start + i) % len(self._shards), count - len(out))
                out += items
                if due_ms is not None:
                    next_due_ms = due_ms if next_due_ms is None else min(next_due_ms, due_ms)
                if len(out) >= count:
                    break
            return out, next_due_ms

        return await poll(attempt, wait_ms, self._poll_ms, self.now_ms)
