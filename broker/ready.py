"""What RAM holds of READY and CONSUMING messages: a bounded window per topic.

A READY message is on disk (its index entry says 2) whether or not RAM
holds it. RAM holds, per topic, a *window* of at most `QueueLimits.window`
of them (and `window_total` over all topics), ordered for pulls by
(-priority, triggerTime); the rest stay on disk only, *spilled*. A topic
whose window is full keeps one number for everything beyond it: `scan`,
the first (hour, globalIndex) at which a spilled message may lie. Refilling
reads the index from there (`Store.scan_ready`), skipping what is held or
no longer ready, so the backlog beyond the window costs no RAM at all.

Worked example (window 2): A (priority 0), B (0), C (5) and D (0) become
ready in that order. A and B fill the window; C outranks B, so B goes back
to disk (scan = B's place) and C takes its slot; D is spilled (scan stays
at B's, which is earlier). A pull takes C then A; refilling from the scan
finds B, then D, in the order they were filed.

Consuming messages are held in RAM (with their ack deadline), capped by
`inflight` per topic and `inflight_total`: a pull at the cap takes fewer
or none, so RAM never grows with the messages handed out.

Serial keys (docs/api.md, "Tags and serial keys"): while a message of
(topic, key) is consuming, the key is *busy*: its other window messages
are *parked* -- held, out of the pull order, taking no window slot; a
topic parks at most `window` of them (the rest go back to disk) -- so
pulls pass over busy keys at no cost. When the key's message is acked,
nacked or times out, its parked ones return to the pull order. One key
holds at most `key_window` messages in RAM; its further ready messages
stay on disk: the topic remembers where (`key_spilled`, read back without
a scan; `window_total` places over all topics), and beyond that the first
place one may lie (`key_scan[key]`, read back by a scan that reads bodies
to find the key's): either when the key has room.
So a hot key with a million ready messages takes `key_window` slots,
never the window, and busy keys never crowd out free ones.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from storage.entry import Location, Message, Status
from storage.errors import ConfigError

from .bulk_params import DEFAULT_PAGE_BYTES
from .transitions import MessageState

_new_state = tuple.__new__  # (a MessageState without its Python-level __new__)

# A window message keeps its whole Message in RAM when its text is at most
# this many characters (a pull then reads nothing from disk).
CACHED_MSG_CHARS = 512


@dataclass(frozen=True)
class QueueLimits:
    # READY messages held in RAM per topic (--ready-window): beyond, on disk.
    window: int = 4096
    # ... and over all topics (--ready-window-total).
    window_total: int = 65536
    # CONSUMING messages per topic (--max-inflight): a pull at the cap takes
    # fewer or none until acks, nacks or ack timeouts make room.
    inflight: int = 10000
    # ... and over all topics (--max-inflight-total).
    inflight_total: int = 100000
    # Messages of one serial key the window holds at most (--key-window):
    # the rest wait on disk, so one hot key never fills the window.
    key_window: int = 8
    # Topics the node keeps (--max-topics): a send that would make one more
    # is refused (LimitReached, 429) until topics retire. What each topic
    # costs in RAM (its counts, counters, label values) is bounded with it.
    topics: int = 10_000
    # Bytes of messages one listMsg or listDeadMsg page answers at most
    # (--max-page-bytes; at least one message a page, the cursor goes on):
    # a client that asks for pages and does not read them holds this much
    # of the node's memory a page, not `limit` x --max-msg-bytes.
    page_bytes: int = DEFAULT_PAGE_BYTES

    def __post_init__(self) -> None:
        for name, value, least in (("--ready-window", self.window, 1), ("--ready-window-total", self.window_total, 1),
                                   ("--max-inflight", self.inflight, 1),
                                   ("--max-inflight-total", self.inflight_total, 1),
                                   ("--key-window", self.key_window, 1), ("--max-topics", self.topics, 1),
                                   ("--max-page-bytes", self.page_bytes, 1)):
            if value < least:
                raise ConfigError(f"{name} must be at least {least}, got {value}")


@dataclass(slots=True)
class HeldMessage:
    """A READY message in a window, or a CONSUMING one, as RAM holds it (no
    body unless short). `state` is what broker.transitions steps; it changes
    only by broker.windows' `apply`, to the state a step gave."""

    location: Location
    topic: str
    tag: str
    msg_id: str
    topic_hash: int
    serial_key: str  # the message's serial key (docs/api.md, "Tags and serial keys"): "" none
    key: tuple[int, int, int, int]  # ready-queue order: higher priority, then earlier trigger, then filing
    state: MessageState
    # READY in a window: the whole message when its text is short (a pull
    # answers it without reading the disk); None otherwise and once pulled.
    message: Message | None = None

    @classmethod
    def of(cls, message: Message, topic_hash: int) -> HeldMessage:
        """`message` (READY or CONSUMING, or WAITING on its way to READY) as
        RAM holds it."""
        location = message.location
        return cls(location, message.topic, message.tag, message.msg_id, topic_hash, message.key,
                   (-message.priority, message.trigger_ms, location.hour, location.global_index),
                   _new_state(MessageState, (message.status, message.retry, message.max_retry, message.trigger_ms,
                                             message.ttl_ms, 0)),
                   message if len(message.msg) <= CACHED_MSG_CHARS else None)

    # (for readers: the part itself reads `state`'s fields)
    @property
    def status(self) -> Status:
        return self.state.status

    @property
    def retry(self) -> int:
        return self.state.retry

    @property
    def deadline_ms(self) -> int:
        return self.state.deadline_ms

    @property
    def expire_ms(self) -> int:
        return self.state.trigger_ms + self.state.ttl_ms


@dataclass
class TopicQueue:
    """One topic's window of ready messages, its count of consuming ones,
    where its spilled ones start, and its serial keys' state. Data that
    broker.windows' ReadyWindows keeps (and alone changes): the methods here
    are the order's and the places' bookkeeping, no counts of the part's."""

    name: str
    topic_hash: int
    ready: SortedList = field(default_factory=SortedList)  # the pull order: keys of unparked window messages
    by_tag: dict[str, SortedList] = field(default_factory=lambda: defaultdict(SortedList))
    consuming: int = 0
    # READY messages of this topic may lie on disk beyond the window, none
    # before `scan` (hour, globalIndex).
    spilled: bool = False
    scan: Location | None = None
    # Serial keys: consuming messages per busy key; the window's messages of
    # each key (a busy key's are parked: not in `ready`, `by_tag`); where a
    # key's ready messages beyond its `key_window` may lie on disk.
    busy: dict[str, int] = field(default_factory=dict)
    by_key: dict[str, dict[Location, HeldMessage]] = field(default_factory=dict)
    key_scan: dict[str, Location] = field(default_factory=dict)
    key_spilled: dict[str, deque[Location]] = field(default_factory=dict)  # key -> places of its messages on disk
    key_spilled_count: int = 0
    parked: int = 0  # window messages parked (their key busy)

    def order(self, held: HeldMessage) -> None:
        """Into the pull order."""
        key = held.key
        self.ready.add(key)
        self.by_tag[held.tag].add(key)

    def unorder(self, held: HeldMessage) -> None:
        """Out of the pull order."""
        key = held.key
        self.ready.remove(key)
        tagged = self.by_tag[held.tag]
        tagged.remove(key)
        if not tagged:
            del self.by_tag[held.tag]

    def best(self, tags: frozenset[str] | None) -> Iterator[tuple[int, int, int, int]]:
        """The pull order's keys (among those tags), best first; the order
        must not change while it is read."""
        if tags is None:
            return iter(self.ready)
        return heapq.merge(*(self.by_tag[t] for t in tags if t in self.by_tag))

    def last(self) -> Location | None:
        """The window's last in pull order: the one a better arrival evicts."""
        if not self.ready:
            return None
        key = self.ready[-1]
        return Location(key[2], key[3])

    def key_count(self, serial_key: str) -> int:
        """The window's messages of `serial_key`."""
        return len(self.by_key.get(serial_key, ()))

    def key_spill_at(self, serial_key: str, location: Location, remember: bool = False) -> bool:
        """A READY message of the key at `location` stays on disk only (the
        key has its `key_window` in RAM): its place is remembered if
        `remember` (True returned), else the key is read back by a scan
        from there."""
        if remember and serial_key not in self.key_scan:
            self.key_spilled.setdefault(serial_key, deque()).append(location)
            self.key_spilled_count += 1
            return True
        at = self.key_scan.get(serial_key)
        if at is None or location < at:
            self.key_scan[serial_key] = location
        return False

    def has_spilled(self, serial_key: str) -> bool:
        return serial_key in self.key_spilled or serial_key in self.key_scan

    def take_spilled(self, serial_key: str, count: int) -> list[Location]:
        """Up to `count` remembered places of the key's messages on disk."""
        places = self.key_spilled.get(serial_key)
        if not places:
            return []
        taken = [places.popleft() for _ in range(min(count, len(places)))]
        self.key_spilled_count -= len(taken)
        if not places:
            del self.key_spilled[serial_key]
        return taken

    def spill_at(self, location: Location) -> None:
        """A READY message at `location` stays on disk only."""
        self.spilled = True
        if self.scan is None or location < self.scan:
            self.scan = location
