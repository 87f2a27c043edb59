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

from collections import defaultdict, deque
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
    """A READY message in a window, or a CONSUMING one, as RAM holds it
    (no body unless short). Its status, retry and deadline change only by
    `become`, with a state broker.transitions.step gave."""

    location: Location
    topic: str
    tag: str
    priority: int
    trigger_ms: int
    ttl_ms: int
    max_retry: int
    retry: int
    status: Status
    msg_id: str
    topic_hash: int
    deadline_ms: int = 0  # CONSUMING: when the ack times out
    # READY in a window: the whole message when its text is short (a pull
    # answers it without reading the disk); None otherwise and once pulled.
    message: Message | None = None
    serial_key: str = ""  # the message's serial key (docs/api.md, "Tags and serial keys"): "" none

    @classmethod
    def of(cls, message: Message, topic_hash: int) -> HeldMessage:
        """`message` (READY or CONSUMING) as RAM holds it."""
        return cls(message.location, message.topic, message.tag, message.priority, message.trigger_ms,
                   message.ttl_ms, message.max_retry, message.retry, message.status, message.msg_id, topic_hash,
                   message=message if len(message.msg) <= CACHED_MSG_CHARS else None, serial_key=message.key)

    @property
    def key(self) -> tuple[int, int, int, int]:
        """Ready-queue order: higher priority, then earlier trigger."""
        return (-self.priority, self.trigger_ms, self.location.hour, self.location.global_index)

    @property
    def expire_ms(self) -> int:
        return self.trigger_ms + self.ttl_ms

    @property
    def state(self) -> MessageState:
        return _new_state(MessageState, (self.status, self.retry, self.max_retry, self.trigger_ms, self.ttl_ms,
                                         self.deadline_ms))

    def become(self, state: MessageState) -> None:
        self.status, self.retry, self.deadline_ms = state.status, state.retry, state.deadline_ms


@dataclass
class TopicQueue:
    """One topic's window of ready messages (all, and by tag), its count of
    consuming ones, and where its spilled ones start."""

    name: str
    topic_hash: int
    ready: SortedList = field(default_factory=SortedList)
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
    parked: int = 0

    def add(self, held: HeldMessage) -> None:
        if held.serial_key:
            self.by_key.setdefault(held.serial_key, {})[held.location] = held
            if held.serial_key in self.busy:
                self.parked += 1
                return
        self._order(held)

    def remove(self, held: HeldMessage) -> None:
        if held.serial_key:
            of_key = self.by_key[held.serial_key]
            del of_key[held.location]
            if not of_key:
                del self.by_key[held.serial_key]
            if held.serial_key in self.busy:
                self.parked -= 1
                return
        self._unorder(held)

    def _order(self, held: HeldMessage) -> None:
        key = held.key
        self.ready.add(key)
        self.by_tag[held.tag].add(key)

    def _unorder(self, held: HeldMessage) -> None:
        key = held.key
        self.ready.remove(key)
        tagged = self.by_tag[held.tag]
        tagged.remove(key)
        if not tagged:
            del self.by_tag[held.tag]

    def key_count(self, serial_key: str) -> int:
        """The window's messages of `serial_key`."""
        return len(self.by_key.get(serial_key, ()))

    def hold_key(self, serial_key: str) -> list[HeldMessage]:
        """A message of the key starts consuming: the window's others of
        the key leave the pull order. Returns them, best first, when the key
        was free (the caller keeps the first parked, spills the rest)."""
        n = self.busy.get(serial_key, 0)
        self.busy[serial_key] = n + 1
        if n:
            return []
        others = sorted(self.by_key.get(serial_key, {}).values(), key=lambda held: held.key)
        for held in others:
            self._unorder(held)
            self.parked += 1
        return others

    def release_key(self, serial_key: str) -> int | None:
        """A message of the key stops consuming. None while the key is still
        busy; else how many parked messages are back in the pull order."""
        n = self.busy[serial_key] - 1
        if n:
            self.busy[serial_key] = n
            return None
        del self.busy[serial_key]
        back = self.by_key.get(serial_key, {})
        for held in back.values():
            self._order(held)
        self.parked -= len(back)
        return len(back)

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

    def best(self, tags: frozenset[str] | None) -> Location | None:
        """The first ready message (among those tags), without taking it."""
        if tags is None:
            key = self.ready[0] if self.ready else None
        else:
            heads = [self.by_tag[t][0] for t in tags if t in self.by_tag]
            key = min(heads) if heads else None
        return None if key is None else Location(key[2], key[3])

    def last(self) -> Location | None:
        """The window's last in pull order: the one a better arrival evicts."""
        if not self.ready:
            return None
        key = self.ready[-1]
        return Location(key[2], key[3])

    def spill_at(self, location: Location) -> None:
        """A READY message at `location` stays on disk only."""
        self.spilled = True
        if self.scan is None or location < self.scan:
            self.scan = location
