"""The ready windows: what RAM holds of READY and CONSUMING messages, and
refilling windows from disk.

A READY message is on disk always; RAM holds at most `window` of them per
topic (and `window_total` in all), the best by (-priority, triggerTime)
(broker.ready.TopicQueue). When a window is full, a message that outranks
its last takes its place (the last goes back to disk only); one that does
not stays on disk, and the topic is marked spilled at its place. A pull
that finds the window low, and a background task (`run_refills`), read
spilled messages back from disk in filing order, at most REFILL_SCAN index
entries at a time, so memory stays flat however far consumers fall behind.

Example (window 2): READY a(p0) b(p0) c(p5): a, b fill the window; c
outranks b, so b is spilled (on disk only) and c held; a pull takes c,
then a; the refill reads b back.

CONSUMING messages are all held (with an ack timer), capped per topic and
in all: a pull at a cap takes fewer. Serial keys (docs/api.md, "Tags and
serial keys"): a key's messages hold at most `key_window` places; while one
of them is CONSUMING the others are parked (held, not pulled); beyond that
they wait on disk, their places remembered per key.

What a held message becomes is broker.transitions' `step`; `carry_out`
does it here (HOLD, TAKE, REQUEUE, FORGET, WAKE), and sets the message's
timers (broker.timers). Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from storage.entry import MS_PER_HOUR, Location, Message, Status
from storage.store import StateChange, Store, text_hash
from wheel.clock import Clock

from .group_commit import GroupCommit
from .journal import Journal
from .lifecycle import Lifecycle
from .long_polls import LongPolls
from .metrics import Metrics
from .ready import HeldMessage, QueueLimits, TopicQueue
from .timers import COMPACT_SLACK, Timer, TimerKind, Timers
from .transitions import TTL, Effect, Event, MessageState, Pull, Step, expired, step

# A refill reads at most about this many index entries (192 KiB) and takes
# at most REFILL_FOUND messages before other work runs.
REFILL_SCAN = 4096
REFILL_FOUND = 512
REFILL_ROUNDS = 4
# A pull that finds its topic's window nearly empty refills it whole, reading
# at most about this many index entries a round.
INLINE_REFILL_SCAN = 65536
# Freed serial keys with messages on disk a pull reads back itself (the
# rest: the background refill).
INLINE_KEY_REFILLS = 4


class ReadyWindows:
    """Each topic's window of READY messages, the CONSUMING ones, and the
    refills. `topics` (the names: broker.topics), `held` and the totals
    may be read; they change only through the methods."""

    def __init__(self, store: Store, clock: Clock, limits: QueueLimits, metrics: Metrics, timers: Timers,
                 long_polls: LongPolls, journal: Journal, commits: GroupCommit, lifecycle: Lifecycle) -> None:
        self._store = store
        self._clock = clock
        self._limits = limits
        self._metrics = metrics
        self._timers = timers
        self._long_polls = long_polls
        self._journal = journal
        self._commits = commits
        self._lifecycle = lifecycle
        self.topics: dict[str, TopicQueue] = {}
        self.held: dict[Location, HeldMessage] = {}  # every window and consuming message
        self._in_flight: dict[tuple[str, str], HeldMessage] = {}  # the consuming ones by (topic, msgId)
        self.window_total = 0  # READY messages held in windows (parked ones included)
        self.parked_total = 0  # of which parked: held behind a busy serial key (broker.ready)
        self.key_spilled_total = 0  # places of serial keys' messages on disk remembered (broker.ready)
        self.consuming_total = 0
        self._to_refill: set[str] = set()  # spilled topics whose window has room
        self._key_refills: set[tuple[str, str]] = set()  # (topic, serial key) freed with messages on disk
        self._refill_wake = asyncio.Event()

    def __repr__(self) -> str:
        return (f"ReadyWindows(topics={len(self.topics)}, window={self.window_total}, parked={self.parked_total}, "
                f"consuming={self.consuming_total}, to_refill={len(self._to_refill)})")

    # == what other parts ask =====================================================

    def queue(self, topic: str) -> TopicQueue:
        queue = self.topics.get(topic)
        if queue is None:
            queue = self.topics[topic] = TopicQueue(topic, text_hash(topic))
        return queue

    def in_flight(self, topic: str, msg_id: str) -> HeldMessage | None:
        """The CONSUMING message of that id (every one is held), or None."""
        return self._in_flight.get((topic, msg_id))

    def take(self, topic: str, batch: int, tags: frozenset[str] | None, deadline_ms: int,
             now_ms: int) -> list[HeldMessage]:
        """A pull's READY -> CONSUMING in RAM: up to `batch` of the topic's
        best (among `tags`), fewer at the in-flight caps, the window topped
        up from disk first. Their ack is due at `deadline_ms`."""
        queue = self.topics.get(topic)
        if queue is None:
            return []
        limits = self._limits
        room = min(batch, limits.inflight - queue.consuming, limits.inflight_total - self.consuming_total)
        if room <= 0:
            return []
        if (queue.key_scan or queue.key_spilled) and len(queue.ready) < limits.window:
            free = [k for k in dict.fromkeys((*queue.key_spilled, *queue.key_scan)) if k not in queue.busy]
            for serial_key in free[:INLINE_KEY_REFILLS]:
                self._refill_key(queue, serial_key)
        if queue.spilled and len(queue.ready) < limits.window:
            # Top the window up first (after a restart it starts empty; a send
            # may have put a message in it while older ones wait on disk), so
            # the pull picks by priority among as many as the window holds. A
            # pull may take the window over the total cap by its batch.
            want = min(limits.window - len(queue.ready),
                       max(room, limits.window_total - self.window_total + self.parked_total))
            self._refill(queue, want, max_scan=INLINE_REFILL_SCAN)
        if not queue.ready:
            return []
        pull = Pull(deadline_ms)
        taken: list[HeldMessage] = []
        while len(taken) < room:
            location = queue.best(tags)
            if location is None:
                break
            held = self.held[location]
            pulled = step(held.state, pull, now_ms)
            if Effect.TAKE not in pulled.effects or pulled.state is None:
                break  # (the window holds READY messages only: never)
            self._consume(held, pulled.state)
            taken.append(held)
        self._schedule_refill(queue)
        return taken

    def carry_out(self, held: HeldMessage, done: Step) -> None:
        """Carry out on a held message what a step made of it."""
        effects, state = done.effects, done.state
        if state is None or not effects:
            return
        if Effect.TAKE in effects:
            self._consume(held, state)
        elif Effect.REQUEUE in effects:
            self._requeue(held, state)
        elif Effect.FORGET in effects:
            self._forget(held)
            held.become(state)
        if Effect.WAKE in effects:
            self._long_polls.wake(held.topic)
        self._metrics.topic(held.topic).count(effects)

    def forget_at(self, location: Location) -> None:
        """A READY message left READY without a step on its held copy (acked
        or moved by id): out of its window, if there."""
        held = self.held.get(location)
        if held is not None:
            self._forget(held)

    def admit(self, held: HeldMessage) -> None:
        """A READY message: into its topic's window if there is room, or if it
        outranks the window's last (which goes back to disk); else it stays
        on disk only, for a refill to find."""
        queue = self.queue(held.topic)
        limits = self._limits
        if held.serial_key and self._key_full(queue, held.serial_key):
            self.held.pop(held.location, None)  # its key has its share of the window: it waits on disk
            self._key_spill(queue, held.serial_key, held.location)
            return
        if len(queue.ready) < limits.window and self.window_total - self.parked_total < limits.window_total:
            self._window_add(queue, held)
            return
        last = queue.last()
        if last is not None and held.key < self.held[last].key:
            self._spill(queue, self.held[last])
            self._window_add(queue, held)
            return
        self.held.pop(held.location, None)
        queue.spill_at(held.location)

    def fire(self, timers: list[Timer], now_ms: int) -> list[StateChange]:
        """Due timers (broker.timers): the status changes of those still
        current (an ack timeout, an expiry), done in RAM."""
        changes = []
        for timer in timers:
            change = self.step_held(timer.location, timer.event, now_ms)
            if change is not None:
                changes.append(change)
        return changes

    def step_held(self, location: Location, event: Event, now_ms: int) -> StateChange | None:
        """`event` to the message held at `location`, carried out in RAM: the
        status change to log, or None (not held, or the event changes nothing)."""
        held = self.held.get(location)
        if held is None:
            return None
        before = held.status
        done = step(held.state, event, now_ms)
        if done.state is None or not done.effects:
            return None
        self.carry_out(held, done)
        return StateChange(location, done.state.status, done.state.retry, prev_status=before,
                           topic_hash=held.topic_hash)

    # == recovery (broker.recovery) ================================================

    def hold_consuming(self, message: Message, deadline_ms: int) -> None:
        """A CONSUMING message found at a restart, its ack due at `deadline_ms`."""
        held = HeldMessage.of(message, text_hash(message.topic))
        held.message = None
        self.held[held.location] = held
        self._track_consuming(self.queue(message.topic), held)
        held.deadline_ms = deadline_ms
        self._set_timer(held.location, TimerKind.ACK, deadline_ms)

    def spilled_from(self, topic: str, location: Location) -> None:
        """The topic's READY messages lie on disk, none before `location`."""
        self.queue(topic).spill_at(location)
        self._to_refill.add(topic)

    # == RAM state of READY / CONSUMING messages (broker.ready) =================

    def _set_timer(self, location: Location, kind: TimerKind, due_ms: int) -> None:
        timers = self._timers
        if len(timers) > 2 * len(self.held) + COMPACT_SLACK:
            timers.compact(self._timer_current)
        timers.set(location, kind, due_ms)

    def _timer_current(self, timer: Timer) -> bool:
        """Would the timer, firing at its time, change its message? (If not,
        it never will: the message moved on.) The rules step() applies to a
        timer, asked without a step: compaction asks it of every timer."""
        held = self.held.get(timer.location)
        return held is not None and bool(step(held.state, timer.event, timer.due_ms).effects)

    def _key_spill(self, queue: TopicQueue, serial_key: str, location: Location) -> None:
        """A READY message of a key with its share of RAM stays on disk; its
        place is remembered while fewer than window_total are."""
        if queue.key_spill_at(serial_key, location, self.key_spilled_total < self._limits.window_total):
            self.key_spilled_total += 1

    def _key_full(self, queue: TopicQueue, serial_key: str) -> bool:
        """The key has its share of the window (key_window messages), or it
        is busy and the topic holds `window` parked messages already."""
        return (queue.key_count(serial_key) >= self._limits.key_window
                or (serial_key in queue.busy and queue.parked >= self._limits.window))

    def _window_add(self, queue: TopicQueue, held: HeldMessage) -> None:
        self.held[held.location] = held
        queue.add(held)
        self.window_total += 1
        if held.serial_key in queue.busy:  # (parked)
            self.parked_total += 1
        self._set_timer(held.location, TimerKind.EXPIRY, held.expire_ms)

    def _window_remove(self, queue: TopicQueue, held: HeldMessage) -> None:
        if held.serial_key in queue.busy:  # (parked)
            self.parked_total -= 1
        queue.remove(held)
        self.window_total -= 1

    def _spill(self, queue: TopicQueue, held: HeldMessage) -> None:
        """A message of the window goes back to disk only (it is READY there)."""
        self._window_remove(queue, held)
        del self.held[held.location]
        queue.spill_at(held.location)

    def _consume(self, held: HeldMessage, state: MessageState) -> None:
        queue = self.topics[held.topic]
        if held.status is Status.READY:
            self._window_remove(queue, held)
            self._track_consuming(queue, held)
        held.become(state)
        self._set_timer(held.location, TimerKind.ACK, state.deadline_ms)

    def _track_consuming(self, queue: TopicQueue, held: HeldMessage) -> None:
        """Count a consuming message against the caps and find it by id."""
        queue.consuming += 1
        self.consuming_total += 1
        self._in_flight[(held.topic, held.msg_id)] = held
        if held.serial_key:
            others = queue.hold_key(held.serial_key)
            self.parked_total += len(others)
            room = self._limits.window - (queue.parked - len(others))
            for other in others[max(0, room):]:  # parked beyond `window` in the topic: back to disk
                self._window_remove(queue, other)
                del self.held[other.location]
                self._key_spill(queue, other.serial_key, other.location)

    def _unconsume(self, queue: TopicQueue, held: HeldMessage) -> None:
        """One fewer consuming: a pull held back by a cap may go on."""
        del self._in_flight[(held.topic, held.msg_id)]
        capped = queue.consuming >= self._limits.inflight
        total_capped = self.consuming_total >= self._limits.inflight_total
        queue.consuming -= 1
        self.consuming_total -= 1
        back = queue.release_key(held.serial_key) if held.serial_key else None
        if back is not None:
            self.parked_total -= back
            capped = True  # the key is free: its parked message can go, wake the topic's long polls
            if queue.has_spilled(held.serial_key):
                self._key_refills.add((queue.name, held.serial_key))
                self._refill_wake.set()
        if total_capped:
            self._long_polls.wake_all()
        elif capped:
            self._long_polls.wake(queue.name)

    def _requeue(self, held: HeldMessage, state: MessageState) -> None:
        """CONSUMING -> READY (`state`)."""
        queue = self.topics[held.topic]
        self._unconsume(queue, held)
        held.become(state)
        self.admit(held)

    def _forget(self, held: HeldMessage) -> None:
        queue = self.topics[held.topic]
        if held.status is Status.READY:
            self._window_remove(queue, held)
        else:
            self._unconsume(queue, held)
        del self.held[held.location]

    # == refilling windows from disk ==============================================

    def _refill(self, queue: TopicQueue, want: int, max_scan: int = REFILL_SCAN) -> int:
        """Up to `want` spilled READY messages of the topic into its window,
        in filing order (reading at most about `max_scan` index entries);
        those past their ttl end instead. Returns how many were added."""
        now_ms = self._clock.now_ms()
        added = 0
        ended: list[StateChange] = []
        for _ in range(REFILL_ROUNDS):  # (entries held already count in a scan's finds: go on past them)
            if not queue.spilled or added >= want:
                break
            entries, queue.scan = self._store.scan_ready(queue.topic_hash, queue.scan or Location(0, 0),
                                                         now_ms // MS_PER_HOUR + 1, max_scan, want - added)
            queue.spilled = queue.scan is not None
            added += self._hold_found(queue, [e.location for e in entries], now_ms, ended)
            if not entries:
                break
        self._ended(ended, now_ms)
        return added

    def _hold_found(self, queue: TopicQueue, locations: Iterable[Location], now_ms: int,
                    ended: list[StateChange]) -> int:
        """Spilled messages found on disk into the window; how many."""
        added = 0
        for location in locations:
            if location not in self.held:
                added += self._hold(queue, location, self._store.read_message(location), now_ms, ended)
        return added

    def _hold(self, queue: TopicQueue, location: Location, message: Message | None, now_ms: int,
              ended: list[StateChange]) -> bool:
        """One message read from disk into the window, if it is still READY
        and alive and its key has room (else it ends, or stays on disk)."""
        if message is None or message.status is not Status.READY or message.topic != queue.name:
            return False
        if expired(message.trigger_ms, message.ttl_ms, now_ms):  # (step says what its end is)
            ending = step(MessageState.of(message), TTL, now_ms)
            if ending.state is not None and ending.effects:
                ended.append(StateChange(location, ending.state.status, ending.state.retry))
                self._metrics.topic(queue.name).count(ending.effects)
                return False
        if message.key and self._key_full(queue, message.key):
            self._key_spill(queue, message.key, location)  # (read again when the key has room)
            return False
        self._window_add(queue, HeldMessage.of(message, queue.topic_hash))
        return True

    def _refill_key(self, queue: TopicQueue, serial_key: str) -> None:
        """Spilled READY messages of one serial key into the window, up to
        its key_window, from its own disk position (broker.ready), reading
        at most about REFILL_SCAN index entries; the rest later."""
        want = min(self._limits.key_window - queue.key_count(serial_key), self._limits.window - len(queue.ready))
        if want <= 0:
            return  # (no room: the next pull or refill of the topic tries again)
        now_ms = self._clock.now_ms()
        ended: list[StateChange] = []
        places = queue.take_spilled(serial_key, want)
        self.key_spilled_total -= len(places)
        want -= self._hold_found(queue, places, now_ms, ended)
        start = queue.key_scan.get(serial_key)
        if start is None or want <= 0:
            self._ended(ended, now_ms)
            self._long_polls.wake(queue.name)
            return
        del queue.key_scan[serial_key]
        entries, after = self._store.scan_ready(queue.topic_hash, start, now_ms // MS_PER_HOUR + 1, REFILL_SCAN,
                                                REFILL_FOUND)
        for entry in entries:
            if entry.location in self.held:
                continue
            message = self._store.read_message(entry.location)
            if message is not None and message.key == serial_key:  # (another key's: its own position covers it)
                if want <= 0:  # the rest later, from here
                    queue.key_spill_at(serial_key, entry.location)
                    break
                want -= self._hold(queue, entry.location, message, now_ms, ended)
        if after is not None and serial_key not in queue.key_scan:
            queue.key_spill_at(serial_key, after)
        self._ended(ended, now_ms)
        self._long_polls.wake(queue.name)

    def _ended(self, ended: list[StateChange], now_ms: int) -> None:
        if ended:
            self._journal.append(ended, now_ms)
            self._commits.kick()

    def _schedule_refill(self, queue: TopicQueue) -> None:
        if queue.spilled and len(queue.ready) <= self._limits.window // 2:
            self._to_refill.add(queue.name)
            self._refill_wake.set()

    def wake_refills(self) -> None:
        self._refill_wake.set()

    async def run_refills(self) -> None:
        """Refill spilled topics' windows in the background, a slice at a
        time, until the node stops (the first round: the topics a restart
        found with READY messages on disk)."""
        limits, lifecycle = self._limits, self._lifecycle
        if self._to_refill:
            self._refill_wake.set()
        while not lifecycle.stopping:
            await self._refill_wake.wait()
            self._refill_wake.clear()
            while self._key_refills and not lifecycle.stopping:
                name, serial_key = self._key_refills.pop()
                queue = self.topics.get(name)
                if queue is not None and serial_key not in queue.busy:
                    self._refill_key(queue, serial_key)
                await asyncio.sleep(0)
            while self._to_refill and not lifecycle.stopping:
                for name in list(self._to_refill):
                    queue = self.topics.get(name)
                    room = 0 if queue is None else min(limits.window - len(queue.ready),
                                                       limits.window_total - self.window_total + self.parked_total)
                    if queue is None or not queue.spilled or room <= 0:
                        self._to_refill.discard(name)
                        continue
                    if self._refill(queue, min(room, REFILL_FOUND)):
                        self._long_polls.wake(name)
                    await asyncio.sleep(0)
