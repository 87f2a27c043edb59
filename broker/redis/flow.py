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

    "v"        the token of the last change (a node's own and a count): a
               node whose copy carries that token reads no more of the hash

and its name is in `<prefix>:flowtopics`, so a node reads every topic's
settings without scanning the topic set. A change writes the fields it
changes (the topic's entry and flags, and the one key paused or resumed)
in ONE script (lua/backend/flow_save.lua), which also parks a paused
key's READY messages, and makes a resumed key's pullable again; a topic
left without settings has its hash deleted. So a pause costs its own
change: neither the node nor Redis reads or writes the topic's other
paused keys, unless another node changed the topic meanwhile (the token
differs: the hash is read whole once).

The pauses are carried out in Redis itself, by the scripts: pull.lua hands
nothing out of a topic whose hash says "paused", and a paused key's
messages stay parked (common.lua), so once pauseTopic is answered no node
sharing the Redis hands anything of it out, whichever node took the call.
What a node carries out itself -- the release rate and the due-age cap of
its pulls -- it reads from here: each change it makes, and every poll_ms
all of them again (`read`, broker.node.standalone.RedisNode), so a change made on
another node takes effect here within poll_ms. Before each change the
keeper reads the topic again (`read_topic`): a change builds on what is
kept, not on this node's copy. Two nodes changing one topic's settings at
the same instant: the last write wins.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from typing import cast

import orjson

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
VERSION = "v"
# flow_save.lua's modes: the hash replaced whole by the fields given, or only the fields given changed
WHOLE, CHANGE = "w", "c"


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


def changed_fields(settings: TopicSettings, changes: Changes) -> list[str]:
    """flow_save.lua's name value pairs of one change of the topic (its
    entry and flags, and each key `changes` names: broker.flow.settings.
    entry_changes); "" removes a field."""
    topic_entry = changes.get(entry_key(settings.topic))
    out = [TOPIC_ENTRY, "" if topic_entry is None else topic_entry.decode(),
           PAUSED, "" if settings.pause is None else "1", FAIR, "1" if settings.fairness == "fairKey" else ""]
    for name, value in changes.items():
        parts = orjson.loads(name)
        if parts[0] == "k":
            out += [KEY_ENTRY + parts[2], "" if value is None else value.decode()]
    return out


def topic_of_change(name: str) -> str:
    """The topic an entry of `Changes` belongs to (broker.flow.settings.entry_key)."""
    return cast(str, orjson.loads(name)[1])


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
    `load` answers what `read` last read; `save` writes what changed, each
    topic in one script, and wakes the long polls of a topic (or key)
    resumed. A topic's copy is kept with the token of its last change
    (`_tokens`): while the hash carries that token, its copy is current."""

    def __init__(self, link: RedisLink, clock: Clock) -> None:
        self._link = link
        self._clock = clock
        self.index_key = f"{link.config.key_prefix}:flowtopics"
        self._known: dict[str, TopicSettings] = {}
        self._tokens: dict[str, str] = {}  # topic -> the "v" its copy in _known was read or written with
        self._name = uuid.uuid4().hex  # (this store's, for its tokens: "<name>.<count>")
        self._count = itertools.count()

    def __repr__(self) -> str:
        return f"RedisTopicSettings({self.index_key!r}, topics={len(self._known)})"

    def load(self) -> dict[str, TopicSettings]:
        return dict(self._known)

    async def read(self) -> dict[str, TopicSettings]:
        """Every topic's settings as Redis keeps them now: the index, then
        READ_SLICE topics' tokens a pipelined round trip, and the hashes of
        those whose token is not their copy's (the event loop free between
        them: --max-topics may be many)."""
        redis = self._link.redis
        out = {}
        try:
            topics = sorted(cast(set[str], await redis.smembers(self.index_key)))  # (a str: the client decodes)
            for start in range(0, len(topics), READ_SLICE):
                chunk = topics[start:start + READ_SLICE]
                async with redis.pipeline(transaction=False) as pipe:
                    for topic in chunk:
                        pipe.hget(self._link.keys(topic).flow, VERSION)
                    tokens = cast(list[str | None], await pipe.execute())
                stale = []
                for topic, token in zip(chunk, tokens):
                    if token is not None and token == self._tokens.get(topic) and topic in self._known:
                        out[topic] = self._known[topic]
                    else:
                        stale.append(topic)
                if not stale:
                    continue
                async with redis.pipeline(transaction=False) as pipe:
                    for topic in stale:
                        pipe.hgetall(self._link.keys(topic).flow)
                    hashes = cast(list[dict[str, str]], await pipe.execute())
                for topic, kept in zip(stale, hashes):
                    settings = self._adopt(topic, kept)
                    if settings is not None:
                        out[topic] = settings
        except REDIS_ERRORS as e:
            raise await self._unavailable(e) from e
        self._known = dict(out)
        self._tokens = {topic: token for topic, token in self._tokens.items() if topic in out}
        return out

    async def read_topic(self, topic: str) -> TopicSettings | None:
        """The topic's settings as Redis keeps them now (None: none): its
        copy while the hash carries the copy's token, else the hash read."""
        redis, flow = self._link.redis, self._link.keys(topic).flow
        try:
            token = cast("str | None", await redis.hget(flow, VERSION))
            if token is not None and token == self._tokens.get(topic) and topic in self._known:
                return self._known[topic]
            kept = cast(dict[str, str], await redis.hgetall(flow))
        except REDIS_ERRORS as e:
            raise await self._unavailable(e) from e
        settings = self._adopt(topic, kept)
        if settings is None:
            self._known.pop(topic, None)
        else:
            self._known[topic] = settings
        return settings

    def _adopt(self, topic: str, kept: Mapping[str, str]) -> TopicSettings | None:
        """The settings a hash read whole keeps, its token noted."""
        token = kept.get(VERSION)
        if token is None:
            self._tokens.pop(topic, None)
        else:
            self._tokens[topic] = token
        return settings_of(topic, kept)

    async def save(self, settings: dict[str, TopicSettings], changes: Changes | None = None) -> None:
        """What changed written, each topic in one script: with `changes`
        (one change, broker.flow.settings.entry_changes), only the fields
        it changes; without, every topic whose settings differ from this
        node's copy, its hash replaced whole. A topic with settings is
        named in the index before its hash is written, and taken out after
        it is emptied."""
        named = set(settings) | set(self._known) if changes is None else {topic_of_change(n) for n in changes}
        for topic in sorted(named):
            new = settings.get(topic)
            if changes is None and new == self._known.get(topic):
                continue
            await self._write(topic, new, changes)

    async def _write(self, topic: str, new: TopicSettings | None, changes: Changes | None) -> None:
        redis = self._link.redis
        token = f"{self._name}.{next(self._count)}"
        if new is None:
            mode, pairs = WHOLE, []
        elif changes is None or topic not in self._known:
            mode, pairs = WHOLE, [part for pair in fields(new).items() for part in pair]
        else:
            mode, pairs = CHANGE, changed_fields(new, changes)
        try:
            if new is not None:
                await redis.sadd(self.index_key, topic)
            now_ms = self._clock.now_ms()
            args = [str(now_ms), str(now_ms + self._link.config.retention_ms), token, mode, *pairs]
            woke = await self._link.script("flow_save", topic, args)
            if new is None:
                await redis.srem(self.index_key, topic)
        except REDIS_ERRORS as e:
            raise await self._unavailable(e) from e
        if new is None:
            self._known.pop(topic, None)
            self._tokens.pop(topic, None)
        else:
            self._known[topic] = new
            self._tokens[topic] = token
        if woke:
            await self._link.publish(topic)

    async def _unavailable(self, error: Exception) -> Unavailable:
        return Unavailable(await self._link.problem(error, []))
