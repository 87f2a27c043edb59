"""The ready windows: the one part that owns what RAM holds of READY and
CONSUMING messages -- each topic's window, the messages in flight, their
timers -- and refills windows from disk.

A READY message is on disk always; RAM holds at most `window` of them per
topic (and `window_total` in all), the best by (-priority, triggerTime)
(broker.disk.ready.TopicQueue). When a window is full, a message that outranks
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
they wait on disk, their places remembered per key. Fairness (docs/api.md,
"Fairness between tenants"), per topic (`set_fairness`): a fairKey's
messages hold at most `fair_window` places of the order, the rest wait on
disk remembered per fairKey the same way (`Spills`), and pulls take from
the groups by turns (broker.disk.ready).

Stepping a message is broker.disk.messages' (broker.core.transitions'
table); `carry_out` is the one place a batch's steps are carried out on
RAM, in one pass (a pull of N, an ackMsg of N ids: one call): out of where
each old status kept it (its window, or flight), into where its new one
does (TAKE: flight, with an ack timer; REQUEUE, HOLD: a window, with an
expiry timer, or disk only; FORGET: nowhere), long polls woken (WAKE). A
message changed by its stored copy (acked, deleted, moved by id) leaves
by `forget_at`.

Cost (a window of w messages): a pull of N takes N heap pops (O(log w)
each, in C) and one cell call a message; an ack of N ids, N dict look-ups
and one cell call each; every other Python call of either is once a
batch. Everything runs on the event loop: who may call what is only
"the loop's tasks, one at a time".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from storage.entry import MS_PER_HOUR, Location, Message, Status
from storage.store import StateChange, Store, text_hash
from wheel.clock import Clock

from ..core.leases import handed_over_ms
from ..core.lifecycle import Lifecycle
from ..core.long_polls import LongPolls
from ..core.release_rate import ReleaseRate
from ..core.transitions import MessageState
from .group_commit import GroupCommit
from .journal import Journal
from .ready import HeldMessage, OrderKey, QueueLimits, Spills, TopicQueue
from .timers import COMPACT_SLACK, Fire, Timer, TimerKind, Timers

# A refill reads at most about this many index entries (192 KiB) and takes
# at most REFILL_FOUND messages before other work runs.
REFILL_SCAN = 4096
REFILL_FOUND = 512
REFILL_ROUNDS = 4
# A pull that finds its topic's window nearly empty refills it whole, reading
# at most about this many index entries a round.
INLINE_REFILL_SCAN = 65536
# Freed serial keys (and fair groups with room) with messages on disk a
# pull reads back itself (the rest: the background refill).
INLINE_KEY_REFILLS = 4

READY = Status.READY


class MessageSteps(Protocol):
    """What the windows ask of the messages' steps (broker.disk.messages.Messages)."""

    def trim(self, timer: Timer) -> bool: ...

    def ended_on_disk(self, message: Message, now_ms: int) -> StateChange | None: ...


class ReadyWindows:
    """Each topic's window of READY messages, the CONSUMING ones, their
    timers, and the refills. `topics` (the names: broker.disk.topics), `held`
    and the totals may be read; they change only through the methods."""

    # What steps the messages RAM holds (broker.disk.messages: it sets
    # itself here when built): asked by the timers' compaction and refills.
    messages: MessageSteps

    def __init__(self, store: Store, clock: Clock, limits: QueueLimits, long_polls: LongPolls,
                 journal: Journal, commits: GroupCommit, lifecycle: Lifecycle) -> None:
        self._store = store
        self._clock = clock
        self._limits = limits
        self._timers = Timers(clock, lifecycle, journal, commits)  # its messages' ack deadlines and expiries
        self._long_polls = long_polls
        self._journal = journal
        self._commits = commits
        self._lifecycle = lifecycle
        self.topics: dict[str, TopicQueue] = {}
        self.held: dict[Location, HeldMessage] = {}  # every window and consuming message
        self.consuming_total = 0  # CONSUMING messages over all topics (each topic's: its queue's `flying`)
        # The totals over all topics (each topic's own: its TopicQueue), kept
        # where the counts change, in this part alone:
        self.window_total = 0  # READY messages held in windows (parked ones included)
        self.parked_total = 0  # of which parked: held behind a busy serial key
        self.key_spilled_total = 0  # places of serial keys' and fair groups' messages on disk remembered
        self._to_refill: set[str] = set()  # spilled topics whose window has room
        # (topic, fair, name): a serial key freed (fair False) or a fair group
        # with room (True), with messages on disk
        self._key_refills: set[tuple[str, bool, str]] = set()
        self._fair_topics = set(limits.fair_topics)  # topics whose fairness is fairKey
        self._refill_wake = asyncio.Event()
        # Paused (broker.flow): a topic's pulls take nothing; a serial key is
        # busy (its messages parked) as if one of them were in flight.
        self.paused_topics: set[str] = set()
        self.paused_keys: set[tuple[str, str]] = set()
        # Topic settings (broker.flow, `set_flow`): a release rate a second
        # (this shard's share), a due-age cap in ms; a topic's queue takes them
        # when made.
        self._rates: dict[str, float] = {}
        # What `set_flow` gave each (the even share of a node of shards; the
        # share in `_rates` is moved by demand: broker.shards.rates).
        self._even_rates: dict[str, float] = {}
        self._max_due_ages: dict[str, int] = {}
        self._rate_wakes: set[str] = set()  # topics with a long-poll wake set for their next token

    def __repr__(self) -> str:
        return (f"ReadyWindows(topics={len(self.topics)}, window={self.window_total}, parked={self.parked_total}, "
                f"consuming={self.consuming_total}, to_refill={len(self._to_refill)}, {self._timers!r})")

    # == what other parts ask =====================================================

    def best_head(self, topic: str) -> tuple[int, int] | None:
        """(priority, triggerTime) of the topic's best READY message here,
        the first a pull takes; None: none to take (none, paused), or an
        order not by priority then trigger time (TopicQueue.best_head)."""
        queue = self.topics.get(topic)
        if queue is None or topic in self.paused_topics:
            return None
        return queue.best_head()

    def queue(self, topic: str) -> TopicQueue:
        queue = self.topics.get(topic)
        if queue is None:
            queue = self.topics[topic] = TopicQueue(topic, text_hash(topic), fair=topic in self._fair_topics)
            per_s = self._rates.get(topic)
            if per_s is not None:
                queue.rate = ReleaseRate(per_s, self._clock.now_ms())
            if topic in self._max_due_ages:
                queue.set_max_due_age(self._max_due_ages[topic])
        return queue

    def set_flow(self, topic: str, fair: bool, release_per_s: float, max_due_age_ms: int) -> None:
        """The topic's settings carried out from now on (broker.flow): its
        fairness (`set_fairness`), its release rate a second (this shard's
        share; 0: none) and its due-age cap (0: none)."""
        self.set_fairness(topic, fair)
        queue = self.topics.get(topic)
        if release_per_s > 0:
            if self._even_rates.get(topic) != release_per_s:  # (a share moved since is kept while the rate is)
                self._even_rates[topic] = self._rates[topic] = release_per_s
                if queue is not None:
                    queue.rate = ReleaseRate(release_per_s, self._clock.now_ms())
        else:
            self._rates.pop(topic, None)
            self._even_rates.pop(topic, None)
            if queue is not None:
                queue.rate = None
        if max_due_age_ms > 0:
            self._max_due_ages[topic] = max_due_age_ms
        else:
            self._max_due_ages.pop(topic, None)
        if queue is not None:
            queue.set_max_due_age(max_due_age_ms)
        self._long_polls.wake(topic)

    def set_fairness(self, topic: str, on: bool) -> None:
        """The topic's fairness: `fairKey` (on) or `none` (docs/api.md,
        "Fairness between tenants"), from now on. Turned off, what its
        groups left on disk is found again by the topic's scan."""
        if on:
            self._fair_topics.add(topic)
        else:
            self._fair_topics.discard(topic)
        queue = self.topics.get(topic)
        if queue is None or queue.fair == on:
            return
        if not on and queue.fair_spills:
            first = queue.fair_spills.first()
            self.key_spilled_total -= queue.fair_spills.count
            queue.fair_spills = Spills()
            if first is not None:
                self.spilled_from(topic, first)
                self._refill_wake.set()
        queue.set_fair(on)
        self._long_polls.wake(topic)

    def in_flight_of(self, topic: str, msg_ids: Iterable[str]) -> dict[str, HeldMessage]:
        """Those of the ids whose message is CONSUMING, each's held message."""
        queue = self.topics.get(topic)
        if queue is None:
            return {}
        flying = queue.flying
        found = {}
        for msg_id in msg_ids:
            held = flying.get(msg_id)
            if held is not None:
                found[msg_id] = held
        return found

    def choose(self, topic: str, batch: int, tags: frozenset[str] | None) -> list[HeldMessage]:
        """For a pull: up to `batch` of the topic's best READY messages (among
        `tags`), fewer at the in-flight caps, the window topped up from
        disk first (`Pull` is then stepped to them: broker.disk.messages).
        None of a paused topic."""
        queue = self.topics.get(topic)
        if queue is None or topic in self.paused_topics:
            return []
        limits = self._limits
        room = min(batch, limits.inflight - len(queue.flying), limits.inflight_total - self.consuming_total)
        if room <= 0:
            return []
        if queue.key_spills and len(queue.ready) < limits.window:
            free = [k for k in queue.key_spills.names() if k not in queue.busy]
            for serial_key in free[:INLINE_KEY_REFILLS]:
                self._refill_share(queue, False, serial_key)
        if queue.fair_spills and len(queue.ready) < limits.window:
            # (a group's share, or the pull's batch if more: one tenant alone still takes whole batches)
            share = max(limits.fair_window, room)
            low = sorted((g for g in queue.fair_spills.names() if queue.group_count(g) < share),
                         key=queue.group_count)  # (an empty group first: it would miss its turn)
            for fair_key in low[:INLINE_KEY_REFILLS]:
                self._refill_share(queue, True, fair_key, share)
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
        rate = queue.rate
        if rate is None:
            return queue.best(room, tags, self._clock.now_ms() if queue.max_due_age_ms else 0)
        now_ms = self._clock.now_ms()
        tokens = rate.available(now_ms)
        chosen = queue.best(min(room, tokens), tags, now_ms) if tokens > 0 else []
        limited = tokens < room and len(chosen) == tokens and len(queue.ready) > len(chosen)
        rate.took(len(chosen), limited, now_ms)
        if limited:
            self._wake_at_token(queue.name, rate, now_ms)
        return chosen

    def release_shares(self) -> list[tuple[str, int, float, float]]:
        """(topic, demand, share, even share) of each topic with a release
        rate whose due messages wait here (demand: its pull order's READY
        messages; none while paused) or whose share is not the even one:
        what broker.shards.rates reports, the idle rest left out."""
        shares = []
        for topic, per_s in self._rates.items():
            queue = self.topics.get(topic)
            demand = 0 if queue is None or topic in self.paused_topics else len(queue.ready)
            even = self._even_rates[topic]
            if demand or per_s != even:
                shares.append((topic, demand, per_s, even))
        return shares

    def rated_topics(self) -> int:
        """Topics with a release rate."""
        return len(self._rates)

    def set_release_share(self, topic: str, per_s: float) -> None:
        """This shard's share of the topic's rate a second from now on
        (broker.shards.rates); a topic without a rate (any more) keeps none.
        A larger share wakes the topic's long polls (tokens come sooner)."""
        have = self._rates.get(topic)
        if have is None or per_s <= 0 or per_s == have:
            return
        self._rates[topic] = per_s
        queue = self.topics.get(topic)
        if queue is not None and queue.rate is not None:
            queue.rate.set_rate(per_s, self._clock.now_ms())
        if per_s > have:
            self._long_polls.wake(topic)

    def release_rate(self, topic: str) -> ReleaseRate | None:
        """The topic's bucket (None: no release rate): its smoothing lateness."""
        queue = self.topics.get(topic)
        return None if queue is None else queue.rate

    def _wake_at_token(self, topic: str, rate: ReleaseRate, now_ms: int) -> None:
        """The topic's bucket held due messages back: its long polls pull
        again when the next token is there (one timer a topic)."""
        if topic in self._rate_wakes:
            return
        self._rate_wakes.add(topic)

        def wake() -> None:
            self._rate_wakes.discard(topic)
            self._long_polls.wake(topic)
        self._clock.call_later(rate.next_token_ms(now_ms) / 1000, wake)

    def carry_out(self, out_of_window: list[HeldMessage], out_of_flight: list[HeldMessage],
                  into_flight: list[HeldMessage], into_window: list[HeldMessage], forgotten: list[Location],
                  woken: set[str]) -> None:
        """A batch's steps (broker.disk.messages' `apply`) on RAM: out of the
        windows (READY before) and flight (CONSUMING before); into flight
        (TAKE: with an ack timer; a pull's topic, if its window is half
        empty with messages on disk, refilled), into a window or disk only
        (REQUEUE, HOLD), nowhere (FORGET); the long polls of `woken` woken."""
        if out_of_window:
            self._leave_windows(out_of_window)
        wake_all = bool(out_of_flight) and self._leave_flight(out_of_flight, woken)
        if into_flight:
            self._enter_flight(into_flight)
            queue = self.topics[into_flight[0].topic]  # (a pull's batch: one topic)
            if queue.spilled and len(queue.ready) <= self._limits.window // 2:
                self._schedule_refill(queue.name)
            if queue.fair_spills:
                self._schedule_group_refills(queue, into_flight)
        for held in into_window:
            self._admit(held)
        held_at = self.held
        for location in forgotten:
            del held_at[location]
        if wake_all:
            self._long_polls.wake_all()
        else:
            for name in woken:
                self._long_polls.wake(name)

    def extend(self, batch: list[HeldMessage], before: list[MessageState]) -> None:
        """EXTEND of consuming messages (an extendMsg: broker.disk.messages'
        `apply`), with their states before: each stays in flight. A later
        deadline sets no timer: the one armed for the message sets it again
        at its deadline then, when it fires (`fired`), so a lease extended
        every few seconds costs one timer a lease period, not one an
        extension. A sooner one is given its own timer now (the armed one
        goes stale: it changes nothing when it fires)."""
        sooner: dict[int, list[Location]] = {}
        for held, was in zip(batch, before):
            armed_ms = held.armed_ms or was.deadline_ms  # (0: armed at the deadline it had)
            deadline_ms = held.state.deadline_ms
            if deadline_ms > armed_ms:
                held.armed_ms = armed_ms
            else:
                held.armed_ms = 0
                if deadline_ms < armed_ms:
                    sooner.setdefault(deadline_ms, []).append(held.location)
        for deadline_ms, locations in sooner.items():
            self._set_timer(TimerKind.ACK, deadline_ms, locations)

    def fired(self, timer: Timer) -> list[HeldMessage]:
        """A due timer's messages still held, for its event (broker.disk.messages'
        `fire`); those extended past it are not among them: their timer
        is set again, at their deadline."""
        held_at = self.held
        batch = [held for location in timer.locations if (held := held_at.get(location)) is not None]
        if timer.kind is not TimerKind.ACK:
            return batch
        due_ms = timer.due_ms
        kept: list[HeldMessage] = []
        later: dict[int, list[Location]] = {}
        for held in batch:
            if held.armed_ms == due_ms:
                held.armed_ms = 0
                later.setdefault(held.state.deadline_ms, []).append(held.location)
            else:
                kept.append(held)
        for deadline_ms, locations in later.items():
            self._set_timer(TimerKind.ACK, deadline_ms, locations)
        return kept

    def forget_at(self, location: Location) -> None:
        """FORGET of a message changed by its stored copy's step (acked,
        deleted or moved by id): RAM lets it go, if it holds it."""
        held = self.held.get(location)
        if held is not None:
            ready = held.state.status is READY
            self.carry_out([held] if ready else [], [] if ready else [held], [], [], [location], set())

    def pause(self, topic: str, serial_key: str | None) -> None:
        """Pulls take nothing more of the topic (`serial_key` None), or of
        its serial key: the key is held busy, its window messages parked
        and the rest left on disk, as while one of its messages is in
        flight (its count in `busy` is one more while paused)."""
        if serial_key is None:
            self.paused_topics.add(topic)
        elif (topic, serial_key) not in self.paused_keys:
            self.paused_keys.add((topic, serial_key))
            self._key_busy(self.queue(topic), serial_key)

    def resume(self, topic: str, serial_key: str | None) -> None:
        """`pause` undone; the topic's long polls woken."""
        if serial_key is None:
            self.paused_topics.discard(topic)
            self._long_polls.wake(topic)
        elif (topic, serial_key) in self.paused_keys:
            self.paused_keys.discard((topic, serial_key))
            if self._key_freed(self.queue(topic), serial_key):
                self._long_polls.wake(topic)

    def paused_for(self, topic: str, serial_key: str) -> bool:
        """Whether a message of the topic with this serial key ("" none) is
        held by a pause: the topic's, or its key's."""
        return topic in self.paused_topics or (bool(serial_key) and (topic, serial_key) in self.paused_keys)

    def first_handed_over_ms(self, topic: str) -> int | None:
        """When the topic's longest-held consuming message was handed over
        (None: none in flight, or none with a known hand-over): O(in flight
        of the topic, which --max-inflight caps)."""
        queue = self.topics.get(topic)
        deliveries = [held.state.delivery for held in queue.flying.values() if held.state.delivery] if queue else []
        return handed_over_ms(min(deliveries)) if deliveries else None

    def oldest_ready_ms(self, topic: str) -> int | None:
        """The oldest trigger time among the topic's READY messages (None:
        none): those the window holds, parked ones included, and the first
        ones on disk in filing order (at most REFILL_SCAN index entries
        read: a second's precision, the filing order's)."""
        queue = self.topics.get(topic)
        oldest: int | None = None
        topic_hash = text_hash(topic)
        if queue is not None:  # (parked messages are in by_key only)
            for of_key in (queue.ready, *queue.by_key.values()):
                for held in of_key.values():
                    if oldest is None or held.state.trigger_ms < oldest:
                        oldest = held.state.trigger_ms
        now_ms = self._clock.now_ms()
        entries, _ = self._store.scan_ready(topic_hash, Location(0, 0), now_ms // MS_PER_HOUR + 1, REFILL_SCAN, 64)
        for entry in entries:
            if oldest is None or entry.trigger_ms < oldest:
                oldest = entry.trigger_ms
        return oldest

    async def run_timers(self, fire: Fire) -> None:
        """The timer task (broker.disk.timers), until the node stops: due timers
        fired (`fire`: broker.disk.messages), their changes made durable."""
        await self._timers.run(fire)

    def wake_timers(self) -> None:
        self._timers.wake()

    # == recovery (broker.disk.recovery) ================================================

    def hold_consuming(self, message: Message, deadline_ms: int, delivery: int) -> None:
        """A CONSUMING message found at a restart, its ack due at `deadline_ms`,
        held by `delivery` (0: unknown, no fenced call matches it)."""
        held = HeldMessage.of(message, text_hash(message.topic))
        held.message = None
        held.state = held.state._replace(deadline_ms=deadline_ms, delivery=delivery)
        self.queue(message.topic)
        self.held[held.location] = held
        self._enter_flight([held])

    def spilled_from(self, topic: str, location: Location) -> None:
        """The topic's READY messages lie on disk, none before `location`."""
        self.queue(topic).spill_at(location)
        self._to_refill.add(topic)

    # == where a held message is: a window, flight ================================

    def _admit(self, held: HeldMessage) -> None:
        """A READY message into its topic's window if there is room, or if
        it outranks the window's last (which goes back to disk); else it
        stays on disk only, for a refill to find. Its serial key's share
        first, and a fair topic's group's: a full group takes it only in
        place of its own last."""
        queue = self.queue(held.topic)
        limits = self._limits
        if held.serial_key and self._key_full(queue, held.serial_key):
            self.held.pop(held.location, None)  # its key has its share of the window: it waits on disk
            self._spill_share(queue.key_spills, held.serial_key, held.location)
            return
        if queue.fair and self._group_full(queue, held, limits.fair_window):
            last = queue.last(held.fair_key)
            if last is None or not held.key < last.key:
                self.held.pop(held.location, None)  # its group has its share of the order: it waits on disk
                self._spill_share(queue.fair_spills, held.fair_key, held.location)
                return
            self._leave_windows([last])  # it outranks its group's last, which waits on disk instead
            del self.held[last.location]
            self._spill_share(queue.fair_spills, last.fair_key, last.location)
        if len(queue.ready) < limits.window and self.window_total - self.parked_total < limits.window_total:
            self._enter_window(queue, held)
            return
        last = queue.last()
        if last is not None and held.key < last.key:
            self._spill(queue, last)
            self._enter_window(queue, held)
            return
        self.held.pop(held.location, None)
        queue.spill_at(held.location)

    def _enter_window(self, queue: TopicQueue, held: HeldMessage) -> None:
        self.held[held.location] = held
        self.window_total += 1
        serial_key = held.serial_key
        if serial_key:
            queue.by_key.setdefault(serial_key, {})[held.location] = held
            if serial_key in queue.busy:  # parked
                queue.parked += 1
                self.parked_total += 1
                self._set_timer(TimerKind.EXPIRY, held.expire_ms, [held.location])
                return
        queue.order(held)
        self._set_timer(TimerKind.EXPIRY, held.expire_ms, [held.location])

    def _leave_windows(self, batch: list[HeldMessage]) -> None:
        """Out of their windows (still in `held`: the caller says where
        they go)."""
        topics = self.topics
        last: TopicQueue | None = None  # the topic whose order to tidy (once a run of one topic)
        for held in batch:
            queue = topics[held.topic]
            serial_key = held.serial_key
            if serial_key:
                of_key = queue.by_key[serial_key]
                del of_key[held.location]
                if not of_key:
                    del queue.by_key[serial_key]
                if serial_key in queue.busy:  # parked: not in the order
                    queue.parked -= 1
                    self.parked_total -= 1
                    continue
            del queue.ready[held.location]  # (its heap entries go stale: TopicQueue)
            if queue.fair:
                queue.groups[held.fair_key].ordered -= 1
            if queue is not last:
                if last is not None:
                    last.tidy()
                last = queue
        self.window_total -= len(batch)
        if last is not None:
            last.tidy()

    def _spill(self, queue: TopicQueue, held: HeldMessage) -> None:
        """A message of the window goes back to disk only (it is READY there)."""
        self._leave_windows([held])
        del self.held[held.location]
        queue.spill_at(held.location)

    def _enter_flight(self, batch: list[HeldMessage]) -> None:
        """Consuming messages (each in `held`) counted against the caps,
        found by id, given their ack timers (one a deadline); each one's
        serial key busy, its other window messages parked."""
        topics = self.topics
        acks: dict[int, list[Location]] = {}
        self.consuming_total += len(batch)
        for held in batch:
            queue = topics[held.topic]
            queue.flying[held.msg_id] = held
            deadline_ms = held.state.deadline_ms
            at_deadline = acks.get(deadline_ms)
            if at_deadline is None:
                acks[deadline_ms] = [held.location]
            else:
                at_deadline.append(held.location)
            if held.serial_key:
                self._key_busy(queue, held.serial_key)
        for deadline_ms, locations in acks.items():
            self._set_timer(TimerKind.ACK, deadline_ms, locations)

    def _key_busy(self, queue: TopicQueue, serial_key: str) -> None:
        """A message of the key starts consuming: when the key was free, its
        window messages leave the pull order, parked (at most `window` in
        the topic: the rest go back to disk)."""
        n = queue.busy.get(serial_key, 0)
        queue.busy[serial_key] = n + 1
        if n:
            return
        others = sorted(queue.by_key.get(serial_key, {}).values(), key=_order_key)
        for other in others:
            queue.unorder(other)
        queue.parked += len(others)
        self.parked_total += len(others)
        room = self._limits.window - (queue.parked - len(others))
        for other in others[max(0, room):]:  # parked beyond `window` in the topic: back to disk
            self._leave_windows([other])
            del self.held[other.location]
            self._spill_share(queue.key_spills, serial_key, other.location)

    def _leave_flight(self, batch: list[HeldMessage], woken: set[str]) -> bool:
        """Fewer consuming (still in `held`: the caller says where they go).
        A pull held back by a cap may go on, and so may one of a serial key
        now free: the topic is added to `woken`; True when every topic's
        long polls are to be woken (the total cap)."""
        topics, limits = self.topics, self._limits
        total_capped = self.consuming_total >= limits.inflight_total
        self.consuming_total -= len(batch)
        for held in batch:
            held.armed_ms = 0  # (its armed timer, if extended, is stale now)
            queue = topics[held.topic]
            if len(queue.flying) >= limits.inflight:
                woken.add(queue.name)
            del queue.flying[held.msg_id]
            if held.serial_key and self._key_freed(queue, held.serial_key):
                woken.add(queue.name)
        return total_capped

    def _key_freed(self, queue: TopicQueue, serial_key: str) -> bool:
        """A message of the key stops consuming: True when the key is free
        (its parked messages are back in the pull order)."""
        n = queue.busy[serial_key] - 1
        if n:
            queue.busy[serial_key] = n
            return False
        del queue.busy[serial_key]
        back = queue.by_key.get(serial_key, {})
        for held in back.values():
            queue.order(held)
        queue.parked -= len(back)
        self.parked_total -= len(back)
        if queue.key_spills.has(serial_key):
            self._key_refills.add((queue.name, False, serial_key))
            self._refill_wake.set()
        return True

    def _spill_share(self, spills: Spills, name: str, location: Location) -> None:
        """A READY message of a key (or fair group) with its share of RAM
        stays on disk; its place is remembered while fewer than window_total
        are (keys' and groups' together)."""
        if spills.spill_at(name, location, self.key_spilled_total < self._limits.window_total):
            self.key_spilled_total += 1

    def _key_full(self, queue: TopicQueue, serial_key: str) -> bool:
        """The key has its share of the window (key_window messages), or it
        is busy and the topic holds `window` parked messages already."""
        return (queue.key_count(serial_key) >= self._limits.key_window
                or (serial_key in queue.busy and queue.parked >= self._limits.window))

    @staticmethod
    def _group_full(queue: TopicQueue, held: HeldMessage, share: int) -> bool:
        """A fair topic's message that would go into the order finds its
        group with `share` places (fair_window; a pull's refill: up to its
        batch) or more."""
        if held.serial_key and held.serial_key in queue.busy:
            return False  # (parked: no place in the order)
        return queue.group_count(held.fair_key) >= share

    def _schedule_group_refills(self, queue: TopicQueue, pulled: list[HeldMessage]) -> None:
        """After a pull of a fair topic: its groups with messages on disk
        left half their share or less are refilled in the background."""
        half = self._limits.fair_window // 2
        for fair_key in {held.fair_key for held in pulled}:
            if queue.fair_spills.has(fair_key) and queue.group_count(fair_key) <= half:
                self._key_refills.add((queue.name, True, fair_key))
                self._refill_wake.set()

    # == timers =====================================================================

    def _set_timer(self, kind: TimerKind, due_ms: int, locations: list[Location]) -> None:
        timers = self._timers
        if timers.locations > 2 * len(self.held) + COMPACT_SLACK:
            timers.compact(self._trim)
        timers.set(kind, due_ms, locations)

    def _trim(self, timer: Timer) -> bool:
        """The compaction's question of a timer (`TimerQueue.compact`): its
        places whose messages' steps it would still change (broker.disk.messages'
        `trim`) and those it sets again (`fired`); whether any is left."""
        if timer.kind is not TimerKind.ACK:
            return self.messages.trim(timer)
        held_at, due_ms = self.held, timer.due_ms
        armed = [location for location in timer.locations
                 if (held := held_at.get(location)) is not None and held.armed_ms == due_ms]
        left = self.messages.trim(timer)  # (drops the armed ones: their steps change nothing yet)
        timer.locations.extend(armed)
        return left or bool(armed)

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
                    ended: list[StateChange], share: int = 0) -> int:
        """Spilled messages found on disk into the window; how many."""
        added = 0
        for location in locations:
            if location not in self.held:
                added += self._hold(queue, location, self._store.read_message(location), now_ms, ended, share)
        return added

    def _hold(self, queue: TopicQueue, location: Location, message: Message | None, now_ms: int,
              ended: list[StateChange], share: int = 0) -> bool:
        """One message read from disk into the window, if it is still READY
        and alive and its key has room, and its fair group `share` places
        (0: fair_window) (else it ends, or stays on disk)."""
        if message is None or message.status is not READY or message.topic != queue.name:
            return False
        change = self.messages.ended_on_disk(message, now_ms)
        if change is not None:  # past its ttl: it ends (its step says how), never held
            ended.append(change)
            return False
        if message.key and self._key_full(queue, message.key):
            self._spill_share(queue.key_spills, message.key, location)  # (read again when the key has room)
            return False
        held = HeldMessage.of(message, queue.topic_hash)
        if queue.fair and self._group_full(queue, held, share or self._limits.fair_window):
            self._spill_share(queue.fair_spills, message.fair_key, location)  # (... when the group has room)
            return False
        self._enter_window(queue, held)
        return True

    def _refill_share(self, queue: TopicQueue, fair: bool, name: str, share: int = 0) -> None:
        """Spilled READY messages of one serial key (or, `fair`, one fair
        group) into the window, up to its share -- key_window (fair_window,
        or `share` if more) -- from its own disk places (broker.disk.ready's
        Spills), reading at most about REFILL_SCAN index entries; the rest
        later."""
        limits = self._limits
        spills = queue.fair_spills if fair else queue.key_spills
        if fair:
            share = max(share, limits.fair_window)
            want = share - queue.group_count(name)
        else:
            want = limits.key_window - queue.key_count(name)
        want = min(want, limits.window - len(queue.ready))
        if want <= 0:
            return  # (no room: the next pull or refill of the topic tries again)
        now_ms = self._clock.now_ms()
        ended: list[StateChange] = []
        places = spills.take(name, want)
        self.key_spilled_total -= len(places)
        want -= self._hold_found(queue, places, now_ms, ended, share)
        start = spills.scan.get(name)
        if start is None or want <= 0:
            self._ended(ended, now_ms)
            self._long_polls.wake(queue.name)
            return
        del spills.scan[name]
        entries, after = self._store.scan_ready(queue.topic_hash, start, now_ms // MS_PER_HOUR + 1, REFILL_SCAN,
                                                REFILL_FOUND)
        for entry in entries:
            if entry.location in self.held:
                continue
            message = self._store.read_message(entry.location)
            # (another key's or group's: its own position covers it)
            if message is not None and (message.fair_key if fair else message.key) == name:
                if want <= 0:  # the rest later, from here
                    spills.spill_at(name, entry.location)
                    break
                want -= self._hold(queue, entry.location, message, now_ms, ended, share)
        if after is not None and name not in spills.scan:
            spills.spill_at(name, after)
        self._ended(ended, now_ms)
        self._long_polls.wake(queue.name)

    def _ended(self, ended: list[StateChange], now_ms: int) -> None:
        if ended:
            self._journal.append(ended, now_ms)
            self._commits.kick()

    def _schedule_refill(self, name: str) -> None:
        """The topic's window is half empty and messages wait on disk: the
        refill task tops it up."""
        self._to_refill.add(name)
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
                name, fair, share = self._key_refills.pop()
                queue = self.topics.get(name)
                if queue is not None and (queue.fair if fair else share not in queue.busy):
                    self._refill_share(queue, fair, share)
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


def _order_key(held: HeldMessage) -> OrderKey:
    return held.key
