"""Topic settings and pauses kept in Redis (docs/redis.md, "Flow"): the
`SettingsStore` of a Redis node's `broker.flow.keeper.TopicFlow`, shared
by every node on the Redis.

Each topic with settings has a `flow` hash in its own slot (broker.redis.keys):

    field      value
    "c"        the topic's entry: its settings and its own pause, the
               JSON broker.flow.settings.entries writes
    "k:<key>"  a paused serial key's entry (its pause)
    "paused"   "1" while the topic itself is paused
    "fair"     "1" while the topic's fairness is fairKey (the scripts index
               its READY messages by fairKey in the `fair` zset, and pull.lua
               takes turns over them: docs/redis.md, "Fairness on Redis")
    "turn"     the fairKey whose group a fair pull served last (kept by
               pull.lua and across a change of the settings)
    "h:<id>"   a schedule's run the pause holds back (lua/backend/common.lua's
               hold), released by the resume's script (flow_save.lua)

and its name is in `<prefix>:flowtopics`, so a node reads every topic's
settings without scanning the topic set. A change replaces the topic's
hash whole in ONE script (lua/backend/flow_save.lua), which also parks a
paused key's READY messages, and makes a resumed key's pullable again.

The pauses are carried out in Redis itself, by the scripts: pull.lua hands
nothing out of a topic whose hash says "paused", and a paused key's
messages stay parked (common.lua), so once pauseTopic is answered no node
sharing the Redis hands anything of it out, whichever node took the call.
What a node carries out itself -- the release rate and the due-age cap of
its pulls -- it reads from here: each change it makes, and every poll_ms
all of them again (`read`, broker.nodes.RedisNode), so a change made on
another node takes effect here within poll_ms. Before each change the
keeper reads the topic again (`read_topic`): a change builds on what is
kept, not on this node's copy. Two nodes changing one topic's settings at
the same instant: the last write wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from storage.errors import Unavailable
from wheel.clock import Clock

from ..flow.settings import Changes, TopicSettings, entries, entry_key, rows
from .link import REDIS_ERRORS, RedisLink

# Topics' hashes one pipelined round trip reads (`read`).
READ_SLICE = 500
TOPIC_ENTRY = "c"
PAUSED = "paused"
FAIR = "fair"
KEY_ENTRY = "k:"


def fields(settings: TopicSettings) -> dict[str, str]:
    """The topic's `flow` hash (empty: it has no settings)."""
    kept = entries([settings])
    out = {}
    if entry_key(settings.topic) in kept:
        out[TOPIC_ENTRY] = kept[entry_key(settings.topic)].decode()
    for key in settings.keys:
        out[KEY_ENTRY + key] = kept[entry_key(settings.topic, key)].decode()
    if settings.pause is not None:
        out[PAUSED] = "1"
    if settings.fairness == "fairKey":
        out[FAIR] = "1"
    return out


def settings_of(topic: str, kept: Mapping[str, str]) -> TopicSettings | None:
    """The settings a topic's `flow` hash keeps (None: none); ContractError
    (broker.flow.settings.rows) for a hash no node wrote."""
    found = {}
    for name, value in kept.items():
        if name == TOPIC_ENTRY:
            found[entry_key(topic)] = value.encode()
        elif name.startswith(KEY_ENTRY):
            found[entry_key(topic, name[len(KEY_ENTRY):])] = value.encode()
    return rows(found).get(topic)


class RedisTopicSettings:
    """broker.flow.keeper's SettingsStore (and SharedSettings) in Redis:
    `load` answers what `read` last read; `save` writes the topics whose
    settings changed, each in one script, and wakes the long polls of a
    topic (or key) resumed."""

    def __init__(self, link: RedisLink, clock: Clock) -> None:
        self._link = link
        self._clock = clock
        self.index_key = f"{link.config.key_prefix}:flowtopics"
        self._known: dict[str, TopicSettings] = {}

    def __repr__(self) -> str:
        return f"RedisTopicSettings({self.index_key!r}, topics={len(self._known)})"

    def load(self) -> dict[str, TopicSettings]:
        return dict(self._known)

    async def read(self) -> dict[str, TopicSettings]:
        """Every topic's settings as Redis keeps them now: the index, then
        READ_SLICE hashes a pipelined round trip (the event loop free
        between them: --max-topics may be many)."""
        redis = self._link.redis
        out = {}
        try:
            topics = sorted(cast(set[str], await redis.smembers(self.index_key)))  # (a str: the client decodes)
            for start in range(0, len(topics), READ_SLICE):
                chunk = topics[start:start + READ_SLICE]
                async with redis.pipeline(transaction=False) as pipe:
                    for topic in chunk:
                        pipe.hgetall(self._link.keys(topic).flow)
                    hashes = cast(list[dict[str, str]], await pipe.execute())
                for topic, kept in zip(chunk, hashes):
                    settings = settings_of(topic, kept)
                    if settings is not None:
                        out[topic] = settings
        except REDIS_ERRORS as e:
            raise await self._unavailable(e) from e
        self._known = dict(out)
        return out

    async def read_topic(self, topic: str) -> TopicSettings | None:
        """The topic's settings as Redis keeps them now (None: none)."""
        try:
            kept = cast(dict[str, str], await self._link.redis.hgetall(self._link.keys(topic).flow))
        except REDIS_ERRORS as e:
            raise await self._unavailable(e) from e
        settings = settings_of(topic, kept)
        if settings is None:
            self._known.pop(topic, None)
        else:
            self._known[topic] = settings
        return settings

    async def save(self, settings: dict[str, TopicSettings], changes: Changes | None = None) -> None:
        """The topics whose settings differ from what this node last knew
        written, each in one script; a topic with settings is named in the
        index before its hash is written, and taken out after it is emptied.
        (`changes` is not needed: other nodes' changes are found too.)"""
        redis = self._link.redis
        for topic in sorted(set(settings) | set(self._known)):
            new = settings.get(topic)
            if new == self._known.get(topic):
                continue
            kept = {} if new is None else fields(new)
            try:
                if kept:
                    await redis.sadd(self.index_key, topic)
                now_ms = self._clock.now_ms()
                args = [str(now_ms), str(now_ms + self._link.config.retention_ms),
                        *(part for pair in kept.items() for part in pair)]
                woke = await self._link.script("flow_save", topic, args)
                if not kept:
                    await redis.srem(self.index_key, topic)
            except REDIS_ERRORS as e:
                raise await self._unavailable(e) from e
            if new is None:
                self._known.pop(topic, None)
            else:
                self._known[topic] = new
            if woke:
                await self._link.publish(topic)

    async def _unavailable(self, error: Exception) -> Unavailable:
        return Unavailable(await self._link.problem(error, []))
