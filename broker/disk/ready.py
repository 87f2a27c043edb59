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

from collections import deque
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from storage.entry import Location, Message, Status
from storage.errors import ConfigError

from ..core.bulk_params import DEFAULT_PAGE_BYTES
from ..core.transitions import MessageState

OrderKey = tuple[int, int, Location]  # (-priority, triggerTime, place): less is pulled first

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
    body unless short). `state` is what broker.core.transitions steps; it changes
    only by broker.disk.messages' `apply`, to the state a step gave."""

    location: Location
    topic: str
    tag: str
    msg_id: str
    topic_hash: int
    serial_key: str  # the message's serial key (docs/api.md, "Tags and serial keys"): "" none
    key: OrderKey  # pull order: higher priority, then earlier trigger, then filing
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
                   (-message.priority, message.trigger_ms, location),
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


# A topic's order heaps are rebuilt from its window once they may hold this
# many entries more than twice the window (stale ones: TopicQueue).
ORDER_SLACK = 64


@dataclass
class TopicQueue:
    """One topic's window of ready messages, its count of consuming ones,
    where its spilled ones start, and its serial keys' state. Data that
    broker.disk.windows' ReadyWindows keeps (and alone changes): the methods here
    are the order's and the places' bookkeeping, no counts of the part's.

    The pull order is `ready` (the unparked window messages by place) and
    three heaps of their keys, chosen for what a pull and an ack cost:
    `heap` (the best first: a pull pops it, O(log n) in C), `by_tag` (the
    same per tag, for a pull by tags) and `worst` (the keys negated: the
    window's last, which a better arrival evicts when the window is full).
    Leaving the order is `del ready[place]`, O(1): the heaps keep the
    entry, stale, and whoever pops one whose place is not in `ready` skips
    it (an entry twice, after a message left and came back, is the same
    key: the second pops stale). `entries` bounds what each heap holds;
    past twice the window and ORDER_SLACK, `rebuild` makes them again from
    `ready`, O(window) once every window's worth of changes.

    Worked example: a(p0) b(p0) c(p5) enter: heap pops c, a, b in that
    order, worst pops b first. A pull takes c (popped); an ack by id of
    b deletes ready[b]: its entries stay, stale; the next pull pops a,
    then b's entry, not in ready: skipped."""

    name: str
    topic_hash: int
    ready: dict[Location, HeldMessage] = field(default_factory=dict)  # the pull order's members
    heap: list[OrderKey] = field(default_factory=list)
    by_tag: dict[str, list[OrderKey]] = field(default_factory=dict)
    worst: list[tuple[int, int, int, int, Location]] = field(default_factory=list)
    entries: int = 0  # at least the length of each heap
    consuming: int = 0
    # READY messages of this topic may lie on disk beyond the window, none
    # before `scan` (hour, globalIndex).
    spilled: bool = False
    scan: Location | None = None
    # Serial keys: consuming messages per busy key; the window's messages of
    # each key (a busy key's are parked: not in `ready`); where a key's
    # ready messages beyond its `key_window` may lie on disk.
    busy: dict[str, int] = field(default_factory=dict)
    by_key: dict[str, dict[Location, HeldMessage]] = field(default_factory=dict)
    key_scan: dict[str, Location] = field(default_factory=dict)
    key_spilled: dict[str, deque[Location]] = field(default_factory=dict)  # key -> places of its messages on disk
    key_spilled_count: int = 0
    parked: int = 0  # window messages parked (their key busy)

    def order(self, held: HeldMessage) -> None:
        """Into the pull order."""
        key = held.key
        location = key[2]
        self.ready[location] = held
        heappush(self.heap, key)
        tagged = self.by_tag.get(held.tag)
        if tagged is None:
            tagged = self.by_tag[held.tag] = []
        heappush(tagged, key)
        heappush(self.worst, (-key[0], -key[1], -location.hour, -location.global_index, location))
        self.entries += 1
        if self.entries > 2 * len(self.ready) + ORDER_SLACK:
            self.rebuild()

    def unorder(self, held: HeldMessage) -> None:
        """Out of the pull order: its heap entries go stale."""
        del self.ready[held.location]
        self.tidy()

    def tidy(self) -> None:
        """After messages left `ready` (`del ready[place]`, as `unorder`
        does): the heaps rebuilt if their stale entries may outnumber it."""
        if self.entries > 2 * len(self.ready) + ORDER_SLACK:
            self.rebuild()

    def rebuild(self) -> None:
        """The heaps made again from `ready`: no stale entry left."""
        keys = [held.key for held in self.ready.values()]
        self.heap = keys[:]
        heapify(self.heap)
        self.by_tag = {}
        for held in self.ready.values():
            tagged = self.by_tag.get(held.tag)
            if tagged is None:
                tagged = self.by_tag[held.tag] = []
            tagged.append(held.key)
        for tagged in self.by_tag.values():
            heapify(tagged)
        self.worst = [(-p, -t, -at.hour, -at.global_index, at) for p, t, at in keys]
        heapify(self.worst)
        self.entries = len(keys)

    def best(self, room: int, tags: frozenset[str] | None) -> list[HeldMessage]:
        """Up to `room` of the order's best (among `tags`), best first, one
        of a serial key at most (taking it parks the key's others): out of
        the heaps, still in `ready` (the caller takes them out of it)."""
        ready = self.ready
        chosen: dict[Location, HeldMessage] = {}
        serial_keys: set[str] = set()
        heap: list[OrderKey] | None = self.heap
        tagged = [] if tags is None else [self.by_tag[tag] for tag in tags if tag in self.by_tag]
        while len(chosen) < room:
            if tags is not None:  # the best of the tags' heads, their stale entries popped first
                heap = None
                for candidates in tagged:
                    while candidates and (candidates[0][2] not in ready or candidates[0][2] in chosen):
                        heappop(candidates)
                    if candidates and (heap is None or candidates[0] < heap[0]):
                        heap = candidates
            if not heap:
                break
            location = heappop(heap)[2]
            held = ready.get(location)
            if held is None or location in chosen:
                continue  # stale, or its second entry
            if held.serial_key:
                if held.serial_key in serial_keys:
                    continue  # (parked once the key's first is taken)
                serial_keys.add(held.serial_key)
            chosen[location] = held
        return list(chosen.values())

    def last(self) -> HeldMessage | None:
        """The window's last in pull order: the one a better arrival evicts."""
        worst, ready = self.worst, self.ready
        while worst:
            held = ready.get(worst[0][4])
            if held is not None:
                return held
            heappop(worst)
        return None

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
