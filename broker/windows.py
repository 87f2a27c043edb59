"""The RAM side of READY and CONSUMING messages: each topic's bounded ready
window, the in-flight set, and refilling windows from disk.

A READY message is on disk always; RAM holds at most `window` of them per
topic (and `window_total` in all), the best by (-priority, triggerTime)
(broker.ready.TopicQueue). When a window is full, a message that outranks
its last takes its place (the last goes back to disk only); one that does
not stays on disk, and the topic is marked spilled at its place. A pull
that finds the window low, and a background task (`_run_refills`), read
spilled messages back from disk in filing order, at most REFILL_SCAN index
entries at a time, so memory stays flat however far consumers fall behind.

Example (window 2): READY a(p0) b(p0) c(p5): a, b fill the window; c
outranks b, so b is spilled (on disk only) and c held; a pull takes c,
then a; the refill reads b back.

Serial keys (docs/api.md, Tags and serial keys): a key's messages hold at most `key_window`
places; while one of them is CONSUMING the others are parked (held, not
pulled); beyond that they wait on disk, their places remembered per key.

`Windows` is a part of `broker.service.Broker` (a mixin): its methods use
the Broker's state (`live`, `topics`, the totals) and run on the event
loop; the request, timer and release code call them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from storage.entry import MS_PER_HOUR, Location, Message, Status
from storage.store import StateChange, text_hash

from .ready import CACHED_MSG_CHARS, Live, TopicQueue

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


class Windows:
    """READY windows, in-flight messages and refills of `broker.service.Broker`."""

    # == RAM state of READY / CONSUMING messages (broker.ready) =================

    def _queue(self, topic: str) -> TopicQueue:
        queue = self.topics.get(topic)
        if queue is None:
            queue = self.topics[topic] = TopicQueue(topic, text_hash(topic))
        return queue

    def _admit(self, live: Live) -> None:
        """A READY message: into its topic's window if there is room, or if it
        outranks the window's last (which goes back to disk); else it stays
        on disk only, for a refill to find."""
        queue = self._queue(live.topic)
        limits = self.limits
        if live.serial_key and self._key_full(queue, live.serial_key):
            self.live.pop(live.location, None)  # its key has its share of the window: it waits on disk
            self._key_spill(queue, live.serial_key, live.location)
            return
        if len(queue.ready) < limits.window and self.window_total - self.parked_total < limits.window_total:
            self._window_add(queue, live)
            return
        last = queue.last()
        if last is not None and live.key < self.live[last].key:
            self._spill(queue, self.live[last])
            self._window_add(queue, live)
            return
        self.live.pop(live.location, None)
        queue.spill_at(live.location)

    def _key_spill(self, queue: TopicQueue, serial_key: str, location: Location) -> None:
        """A READY message of a key with its share of RAM stays on disk; its
        place is remembered while fewer than window_total are."""
        if queue.key_spill_at(serial_key, location, self.key_spilled_total < self.limits.window_total):
            self.key_spilled_total += 1

    def _key_full(self, queue: TopicQueue, serial_key: str) -> bool:
        """The key has its share of the window (key_window messages), or it
        is busy and the topic holds `window` parked messages already."""
        return (queue.key_count(serial_key) >= self.limits.key_window
                or serial_key in queue.busy and queue.parked >= self.limits.window)

    def _window_add(self, queue: TopicQueue, live: Live) -> None:
        self.live[live.location] = live
        queue.add(live)
        self.window_total += 1
        if live.serial_key in queue.busy:  # (parked)
            self.parked_total += 1
        self._timer(live.expire_ms, live.location, "expire")

    def _window_remove(self, queue: TopicQueue, live: Live) -> None:
        if live.serial_key in queue.busy:  # (parked)
            self.parked_total -= 1
        queue.remove(live)
        self.window_total -= 1

    def _spill(self, queue: TopicQueue, live: Live) -> None:
        """A message of the window goes back to disk only (it is READY there)."""
        self._window_remove(queue, live)
        del self.live[live.location]
        queue.spill_at(live.location)

    def _consume(self, live: Live, deadline_ms: int) -> None:
        queue = self.topics[live.topic]
        if live.status is Status.READY:
            self._window_remove(queue, live)
            self._track_consuming(queue, live)
        live.status, live.deadline_ms = Status.CONSUMING, deadline_ms
        self._timer(deadline_ms, live.location, "ack")

    def _track_consuming(self, queue: TopicQueue, live: Live) -> None:
        """Count a consuming message against the caps and find it by id."""
        queue.consuming += 1
        self.consuming_total += 1
        self._inflight[(live.topic, live.msg_id)] = live
        if live.serial_key:
            others = queue.hold_key(live.serial_key)
            self.parked_total += len(others)
            room = self.limits.window - (queue.parked - len(others))
            for other in others[max(0, room):]:  # parked beyond `window` in the topic: back to disk
                self._window_remove(queue, other)
                del self.live[other.location]
                self._key_spill(queue, other.serial_key, other.location)

    def _unconsume(self, queue: TopicQueue, live: Live) -> None:
        """One fewer consuming: a pull held back by a cap may go on."""
        del self._inflight[(live.topic, live.msg_id)]
        capped = queue.consuming >= self.limits.inflight
        total_capped = self.consuming_total >= self.limits.inflight_total
        queue.consuming -= 1
        self.consuming_total -= 1
        back = queue.release_key(live.serial_key) if live.serial_key else None
        if back is not None:
            self.parked_total -= back
            capped = True  # the key is free: its parked message can go, wake the topic's long polls
            if queue.has_spilled(live.serial_key):
                self._key_refills.add((queue.name, live.serial_key))
                self._refill_wake.set()
        if total_capped:
            self.wake_all()
        elif capped:
            self._wake(queue.name)

    def _requeue(self, live: Live, retry: int) -> None:
        """CONSUMING -> READY with `retry`."""
        queue = self.topics[live.topic]
        self._unconsume(queue, live)
        live.status, live.retry = Status.READY, retry
        self._admit(live)

    def _forget(self, live: Live) -> None:
        queue = self.topics[live.topic]
        if live.status is Status.READY:
            self._window_remove(queue, live)
        else:
            self._unconsume(queue, live)
        del self.live[live.location]

    # == refilling windows from disk ==============================================

    def _refill(self, queue: TopicQueue, want: int, max_scan: int = REFILL_SCAN) -> int:
        """Up to `want` spilled READY messages of the topic into its window,
        in filing order (reading at most about `max_scan` index entries);
        those past their ttl end instead. Returns how many were added."""
        now_ms = self.clock.now_ms()
        added, ended = 0, []
        for _ in range(REFILL_ROUNDS):  # (entries held already count in a scan's finds: go on past them)
            if not queue.spilled or added >= want:
                break
            entries, queue.scan = self.store.scan_ready(queue.topic_hash, queue.scan or Location(0, 0),
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
            if location not in self.live:
                added += self._hold(queue, location, self.store.read_message(location), now_ms, ended)
        return added

    def _hold(self, queue: TopicQueue, location: Location, message: Message | None, now_ms: int,
              ended: list[StateChange]) -> bool:
        """One message read from disk into the window, if it is still READY
        and alive and its key has room (else it ends, or stays on disk)."""
        if message is None or message.status is not Status.READY or message.topic != queue.name:
            return False
        if now_ms >= message.expire_ms:
            ended.append(StateChange(location, Status.EXPIRED if message.retry == 0 else Status.ENDED,
                                     message.retry))
            self.metrics.topic(queue.name).ended += 1
            return False
        if message.key and self._key_full(queue, message.key):
            self._key_spill(queue, message.key, location)  # (read again when the key has room)
            return False
        self._window_add(queue, live_of(message, queue.topic_hash))
        return True

    def _refill_key(self, queue: TopicQueue, serial_key: str) -> None:
        """Spilled READY messages of one serial key into the window, up to
        its key_window, from its own disk position (ready.py), reading at
        most about REFILL_SCAN index entries; the rest later."""
        want = min(self.limits.key_window - queue.key_count(serial_key), self.limits.window - len(queue.ready))
        if want <= 0:
            return  # (no room: the next pull or refill of the topic tries again)
        now_ms = self.clock.now_ms()
        ended: list[StateChange] = []
        places = queue.take_spilled(serial_key, want)
        self.key_spilled_total -= len(places)
        want -= self._hold_found(queue, places, now_ms, ended)
        start = queue.key_scan.get(serial_key)
        if start is None or want <= 0:
            self._ended(ended, now_ms)
            self._wake(queue.name)
            return
        del queue.key_scan[serial_key]
        entries, after = self.store.scan_ready(queue.topic_hash, start, now_ms // MS_PER_HOUR + 1, REFILL_SCAN,
                                               REFILL_FOUND)
        for entry in entries:
            if entry.location in self.live:
                continue
            message = self.store.read_message(entry.location)
            if message is not None and message.key == serial_key:  # (another key's: its own position covers it)
                if want <= 0:  # the rest later, from here
                    queue.key_spill_at(serial_key, entry.location)
                    break
                want -= self._hold(queue, entry.location, message, now_ms, ended)
        if after is not None and serial_key not in queue.key_scan:
            queue.key_spill_at(serial_key, after)
        self._ended(ended, now_ms)
        self._wake(queue.name)

    def _ended(self, ended: list[StateChange], now_ms: int) -> None:
        if ended:
            self._update(ended, now_ms)
            self.commits.kick()

    def _schedule_refill(self, queue: TopicQueue) -> None:
        if queue.spilled and len(queue.ready) <= self.limits.window // 2:
            self._to_refill.add(queue.name)
            self._refill_wake.set()

    async def _run_refills(self) -> None:
        """Refill spilled topics' windows in the background, a slice at a time."""
        while not self._stopping:
            await self._refill_wake.wait()
            self._refill_wake.clear()
            while self._key_refills and not self._stopping:
                name, serial_key = self._key_refills.pop()
                queue = self.topics.get(name)
                if queue is not None and serial_key not in queue.busy:
                    self._refill_key(queue, serial_key)
                await asyncio.sleep(0)
            while self._to_refill and not self._stopping:
                for name in list(self._to_refill):
                    queue = self.topics.get(name)
                    room = 0 if queue is None else min(self.limits.window - len(queue.ready),
                                                       self.limits.window_total - self.window_total
                                                       + self.parked_total)
                    if queue is None or not queue.spilled or room <= 0:
                        self._to_refill.discard(name)
                        continue
                    if self._refill(queue, min(room, REFILL_FOUND)):
                        self._wake(name)
                    await asyncio.sleep(0)


def live_of(message: Message, topic_hash: int) -> Live:
    return Live(message.location, message.topic, message.tag, message.priority, message.trigger_ms,
                message.expire_ms, message.max_retry, message.retry, message.status, message.msg_id, topic_hash,
                message=message if len(message.msg) <= CACHED_MSG_CHARS else None, serial_key=message.key)
