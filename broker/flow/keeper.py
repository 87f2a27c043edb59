"""`TopicFlow`: a node's topic settings and pauses, kept durable (and, on
a cluster, replicated) and carried out on the backend that serves
(docs/api.md, "Flow").

The settings live in a `SettingsStore`: `broker.flow.file.SettingsFile`
on a standalone node (shard 0's on a node of many: the router sends every
change to every shard, and the others read shard 0's files at start,
`ShardSettings`), the Raft group's state on a cluster
(broker.cluster.records), read again by each node that comes to lead. A
change is durable (and on a majority) before it is answered.

A topic's fairness, release rate and due-age cap are set on the backend's
`PauseGate` (`set_flow`) when it starts serving and after each
setTopicConfig; on a node of N shards each shard starts at releaseRate
/ N (`shares`), its share then moved by demand (broker.shards.rates). A pause is carried out by the same gate (the disk broker's
ready windows): a paused topic's pulls take nothing (a long poll waits,
and so does a push subscription's, which pulls through it); a paused
serial key's READY messages are parked as those of a key with a message
in flight are (broker.disk.windows). Sends, acks, deletes and
reschedules are taken as ever. Ordering, so that nothing is handed out
once a pause is answered and nothing stays paused once a resume is:

    pause    the gate closed in RAM, then the settings saved (a failed
             save opens it again, and the call answers 503)
    resume   hold: the settings saved, then the gate opened (the topic's
             long polls woken). shift: the resume's time R kept with the
             pause (saved), then every WAITING or READY message of the
             topic (or key) whose trigger time is in [pausedAt, R) moved by
             R - pausedAt -- rescheduleMsgs' machinery (broker.disk.bulk),
             RESUME_SLICE messages a call, each call whole and durable,
             the loop free between -- then saved and opened as hold. A
             shift cut short (a crash, a failover) leaves the topic paused
             with R kept: the next resume moves the rest of [pausedAt, R),
             each message once (a moved one lies at R or later).
             expire: as shift, but each message in [pausedAt, R) ends
             (EXPIRED, end reason `paused`: Bulk.expire_paused, whole
             calls of RESUME_SLICE) instead of moving; cut short and asked
             again, it ends the rest (an ended one matches no more).

The runs of recurring schedules a pause holds back (left WAITING by the
backend: broker.schedules.keeper's `on_hold`) are the schedules': a
shift or an expire leaves them out (`HeldRuns.held_places`), and once
the gate is open `HeldRuns.resumed` releases them, each judged by its
misfire rule against the resume time.

Who may call what: everything on the event loop; the changes of one node
are serialised by one lock (a shift may take a while: a pause or a
setTopicConfig of another topic waits behind it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from storage.entry import Location, Status
from storage.errors import LimitReached, Unavailable

from ..core.bulk_params import BulkFilter, RescheduleMsgsRequest
from .settings import (
    DEFAULT_MAX_PAUSED_KEYS,
    DEFAULT_MAX_PAUSED_KEYS_TOTAL,
    Changes,
    OnResume,
    Pause,
    PauseRequest,
    TopicConfig,
    TopicSettings,
    entry_changes,
)

# Messages one call of a shift moves (rescheduleMsgs' default limit): each
# call whole and durable, the event loop free between its slices.
RESUME_SLICE = 100_000
MOVABLE = frozenset((Status.WAITING, Status.READY))


class SettingsStore(Protocol):
    """Where a node keeps its topic settings."""

    def load(self) -> dict[str, TopicSettings]:
        ...

    async def save(self, settings: dict[str, TopicSettings], changes: Changes) -> None:
        """`settings`, all of them as they are after one change, whose
        entries `changes` says (broker.flow.settings.entry_changes):
        durable (and replicated) once it returns; raises Unavailable if not."""
        ...


class SharedSettings(Protocol):
    """A store several nodes share (Redis: broker.redis.flow), read again
    rather than trusted from this node's copy."""

    async def read(self) -> dict[str, TopicSettings]:
        """Every topic's settings as kept now."""
        ...

    async def read_topic(self, topic: str) -> TopicSettings | None:
        """The topic's settings as kept now (None: none)."""
        ...


class PauseGate(Protocol):
    """What a backend does for the pauses (the disk broker's)."""

    def pause(self, topic: str, key: str | None) -> None:
        """Hand out nothing more of the topic (key None) or of its serial key."""
        ...

    def resume(self, topic: str, key: str | None) -> None:
        """Hand them out again (long polls of the topic woken)."""
        ...

    def set_flow(self, topic: str, fair: bool, release_per_s: float, max_due_age_ms: int) -> None:
        """Carry the topic's settings out from now on: fairness by fairKey
        (or none), a release rate a second (0: none), a due-age cap (0: none)."""
        ...

    async def reschedule_msgs(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        ...

    async def expire_paused(self, topic: str, flt: BulkFilter, limit: int) -> tuple[int, bool]:
        """The WAITING and READY matches (at most `limit`) EXPIRED with the
        end reason `paused`, as one whole call: how many, and whether more match."""
        ...

    def set_dedup_window(self, topic: str, window_ms: int) -> None:
        """The topic's dedupWindowMillis from now on (0: none)."""
        ...


class HeldRuns(Protocol):
    """The node's recurring schedules, as a resume sees them
    (broker.schedules.keeper.Schedules): the runs a pause held back are
    theirs, left out of a shift or an expire, and released once it is over."""

    def held_places(self, topic: str, key: str | None) -> frozenset[Location]:
        ...

    async def resumed(self, topic: str, key: str | None) -> int:
        ...


class TopicFlow:
    """The node's topic settings (`settings`, by topic), and the pauses
    carried out on the gate of the backend serving (`start`; `stop` when
    it no longer does: a cluster node that stands down)."""

    def __init__(self, store: SettingsStore, clock_ms: Callable[[], int], max_topics: int,
                 max_paused_keys: int = DEFAULT_MAX_PAUSED_KEYS, shares: int = 1,
                 max_paused_keys_total: int = DEFAULT_MAX_PAUSED_KEYS_TOTAL,
                 shared: SharedSettings | None = None) -> None:
        self._store = store
        # The same store when other nodes change it too (Redis): each change
        # reads its topic again first, and `reload` reads them all.
        self._shared = shared
        # The shards of the node (each its own TopicFlow, every change sent to
        # all): each starts at releaseRate / shares a second of its messages
        # (then moved by demand: broker.shards.rates).
        self.shares = shares
        self._now_ms = clock_ms
        self.max_topics = max_topics  # --max-topics: topics with settings at most
        self.max_paused_keys = max_paused_keys  # --max-paused-keys: paused serial keys of a topic at most
        self.max_paused_keys_total = max_paused_keys_total  # --max-paused-keys-total: of the node at most
        self.settings: dict[str, TopicSettings] = store.load()
        self.paused_keys = sum(len(s.keys) for s in self.settings.values())
        self._gate: PauseGate | None = None
        self._runs: HeldRuns | None = None
        self._lock = asyncio.Lock()
        self.moved = 0  # messages a shift moved (tests, logs)
        self.expired = 0  # messages an expire ended (tests, logs)

    def __repr__(self) -> str:
        paused = sum(1 for s in self.settings.values() if s.pause is not None)
        keys = sum(len(s.keys) for s in self.settings.values())
        return f"TopicFlow(topics={len(self.settings)}, paused={paused}, paused_keys={keys})"

    def start(self, gate: PauseGate, runs: HeldRuns | None = None) -> None:
        """Carry the pauses and the dedup windows out on `gate` (read again
        from the store: a cluster node that starts leading reads what the
        last leader replicated), the schedules' runs they hold back
        released by `runs` on resume. Before the gate's backend hands
        anything out or takes a send."""
        self.settings = self._store.load()
        self.paused_keys = sum(len(s.keys) for s in self.settings.values())
        self._gate, self._runs = gate, runs
        for s in self.settings.values():
            self._carry_out(gate, s)
            if s.pause is not None:
                gate.pause(s.topic, None)
            for key in s.keys:
                gate.pause(s.topic, key)

    def stop(self) -> None:
        self._gate = self._runs = None

    def gate(self) -> PauseGate:
        if self._gate is None:
            raise Unavailable("no broker runs on this node yet; retry")
        return self._gate

    def get(self, topic: str) -> TopicSettings:
        return self.settings.get(topic) or TopicSettings(topic)

    async def fresh(self, topic: str) -> TopicSettings:
        """The topic's settings as the store keeps them now: read again from
        a shared store (another node may have changed them: carried out
        here too), else `get`."""
        if self._shared is not None:
            self._adopt(topic, await self._shared.read_topic(topic))
        return self.get(topic)

    async def reload(self) -> None:
        """Every topic's settings read again from a shared store, and the
        changes other nodes made carried out on the gate (a node on Redis,
        every poll_ms: broker.node.standalone.RedisNode)."""
        if self._shared is None:
            return
        async with self._lock:
            new = await self._shared.read()
            for topic in sorted(set(self.settings) | set(new)):
                self._adopt(topic, new.get(topic))

    def _adopt(self, topic: str, found: TopicSettings | None) -> None:
        """The topic's settings as a shared store keeps them, taken as this
        node's, and what changed carried out on the gate."""
        before, after = self.get(topic), found or TopicSettings(topic)
        self.paused_keys += len(after.keys) - len(before.keys)
        if found is None:
            self.settings.pop(topic, None)
        else:
            self.settings[topic] = found
        gate = self._gate
        if gate is None or before == after:
            return
        self._carry_out(gate, after)
        for key in (None, *before.keys, *after.keys):
            was, now = before.pause_of(key) is not None, after.pause_of(key) is not None
            if now and not was:
                gate.pause(topic, key)
            elif was and not now:
                gate.resume(topic, key)

    def paused(self, topic: str) -> bool | list[str]:
        """getTopicInfo's `paused`."""
        s = self.settings.get(topic)
        return False if s is None else s.paused_json()

    async def _save(self, settings: TopicSettings, key: str | None = None) -> None:
        """The topic's settings, changed (only its `key`'s pause, when
        given), kept: the store writes what changed."""
        new = dict(self.settings)
        if settings.is_default:
            new.pop(settings.topic, None)
        else:
            new[settings.topic] = settings
        if settings.topic not in self.settings and len(new) > self.max_topics:
            raise LimitReached(f"{len(self.settings)} topics have settings and --max-topics is {self.max_topics}: "
                               f"clear a topic's settings first, or raise --max-topics")
        old = self.settings.get(settings.topic)
        await self._store.save(new, entry_changes(settings, key))
        self.settings = new
        self.paused_keys += len(settings.keys) - (0 if old is None else len(old.keys))

    async def set_config(self, config: TopicConfig) -> TopicSettings:
        """setTopicConfig (validated whole by broker.flow.settings.parse_config):
        saved, then carried out on the gate, if one serves."""
        async with self._lock:
            await self.fresh(config.topic)
            await self._save(self.get(config.topic).with_config(config))
            settings = self.get(config.topic)
            if self._gate is not None:
                self._carry_out(self._gate, settings)
            return settings

    def _carry_out(self, gate: PauseGate, s: TopicSettings) -> None:
        """The topic's fairness, release rate (this shard's share), due-age
        cap and dedup window on the gate."""
        gate.set_flow(s.topic, s.fairness == "fairKey", s.release_rate / self.shares, s.max_due_age_ms)
        gate.set_dedup_window(s.topic, s.dedup_window_ms)

    async def pause(self, request: PauseRequest) -> TopicSettings:
        """pauseTopic: a pause already in place keeps its time (an
        `onResume` given replaces its policy). LimitReached (429) past
        --max-paused-keys paused keys in the topic."""
        async with self._lock:
            gate = self.gate()
            current = await self.fresh(request.topic)
            had = current.pause_of(request.key)
            if had is None:
                if request.key is not None and len(current.keys) >= self.max_paused_keys:
                    raise LimitReached(f"topic {request.topic!r} has {len(current.keys)} paused keys and "
                                       f"--max-paused-keys is {self.max_paused_keys}: resume one first, pause "
                                       f"the topic, or raise --max-paused-keys")
                if request.key is not None and self.paused_keys >= self.max_paused_keys_total:
                    raise LimitReached(f"the node has {self.paused_keys} paused keys and --max-paused-keys-total "
                                       f"is {self.max_paused_keys_total}: resume one first, pause a topic, or "
                                       f"raise --max-paused-keys-total")
                pause = Pause(self._at(request), request.on_resume or OnResume.HOLD)
            else:
                pause = replace(had, on_resume=request.on_resume or had.on_resume)
            if had is None:
                gate.pause(request.topic, request.key)
            try:
                await self._save(current.with_pause(request.key, pause), request.key)
            except BaseException:
                if had is None:
                    gate.resume(request.topic, request.key)
                raise
            return self.get(request.topic)

    def _at(self, request: PauseRequest) -> int:
        """When a pause or resume happens: the request's time, given on a
        node of shards (each shard carries it out alike), else now."""
        return self._now_ms() if request.at_ms is None else request.at_ms

    async def resume(self, request: PauseRequest) -> TopicSettings:
        """resumeTopic: the pause's policy (or `onResume` given) carried
        out, then the topic (or key) handed out again. Resuming what is not
        paused changes nothing."""
        async with self._lock:
            gate = self.gate()
            current = await self.fresh(request.topic)
            pause = current.pause_of(request.key)
            if pause is None:
                return current
            policy = request.on_resume or pause.on_resume
            if policy is not OnResume.HOLD:
                if pause.resume_ms is None:
                    pause = replace(pause, resume_ms=max(self._at(request), pause.since_ms))
                    await self._save(current.with_pause(request.key, pause), request.key)
                    current = self.get(request.topic)
                if policy is OnResume.SHIFT:
                    await self._shift(gate, request, pause)
                else:
                    await self._expire(gate, request, pause)
            await self._save(current.with_pause(request.key, None), request.key)
            gate.resume(request.topic, request.key)
            if self._runs is not None:  # the runs it held, judged by their misfire rule now
                await self._runs.resumed(request.topic, request.key)
            return self.get(request.topic)

    def _held(self, request: PauseRequest) -> frozenset[Location]:
        """The places a shift or an expire leaves out: the schedules' runs."""
        return frozenset() if self._runs is None else self._runs.held_places(request.topic, request.key)

    async def _shift(self, gate: PauseGate, request: PauseRequest, pause: Pause) -> None:
        """Every WAITING or READY message of the topic (or key) whose trigger
        time is in [pausedAt, resumedAt) moved by the pause's length, a
        whole durable call of RESUME_SLICE at a time."""
        assert pause.resume_ms is not None
        length_ms = pause.resume_ms - pause.since_ms
        if length_ms <= 0:
            return
        flt = BulkFilter(key=request.key, statuses=MOVABLE, trigger_from_ms=pause.since_ms,
                         trigger_to_ms=pause.resume_ms, exclude=self._held(request), held_runs=False)
        more = True
        while more:
            moved, more = await gate.reschedule_msgs(
                RescheduleMsgsRequest(request.topic, flt, RESUME_SLICE, length_ms, None))
            self.moved += moved
            if more and not moved:
                raise Unavailable(f"the shift of topic {request.topic!r}'s paused messages moved none of those "
                                  f"left; retry resumeTopic")
            await asyncio.sleep(0)

    async def _expire(self, gate: PauseGate, request: PauseRequest, pause: Pause) -> None:
        """Every WAITING or READY message of the topic (or key) whose trigger
        time is in [pausedAt, resumedAt) EXPIRED, end reason `paused`, a
        whole durable call of RESUME_SLICE at a time (one cut short and
        asked again ends the rest: an ended one matches no more)."""
        assert pause.resume_ms is not None
        if pause.resume_ms <= pause.since_ms:
            return
        flt = BulkFilter(key=request.key, statuses=MOVABLE, trigger_from_ms=pause.since_ms,
                         trigger_to_ms=pause.resume_ms, exclude=self._held(request), held_runs=False)
        more = True
        while more:
            ended, more = await gate.expire_paused(request.topic, flt, RESUME_SLICE)
            self.expired += ended
            if more and not ended:
                raise Unavailable(f"the expiry of topic {request.topic!r}'s paused messages ended none of those "
                                  f"left; retry resumeTopic")
            await asyncio.sleep(0)
