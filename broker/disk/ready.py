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
stay on disk: the topic remembers where (`key_spills.places`, read back
without a scan; `window_total` places over all topics), and beyond that the
first place one may lie (`key_spills.scan[key]`, read back by a scan that
reads bodies to find the key's): either when the key has room.
So a hot key with a million ready messages takes `key_window` slots,
never the window, and busy keys never crowd out free ones.

Fairness between tenants (docs/api.md, "Fairness between tenants"), on a
topic whose fairness is `fairKey`: its window's messages are grouped by
their fairKey (those without one: the group ""). One group holds at most
`fair_window` places of the pull order; its further ready messages stay on
disk, remembered per group as a serial key's are (`fair_spills`, the same
`Spills` as `key_spills`), and are read back when the group has room. A
pull hands out round-robin over the groups (`rotation`): the group at the
front gives its best (by (-priority, triggerTime)) and goes to the back;
a group with nothing this pull may take (tags, a key taken already) keeps
its place. So a group's million due messages take `fair_window` places
and one turn a round: another group's message waits at most a round, one
message of each other group.

Worked example (fair_window 2): A1 A2 A3 A4 then B1 become ready. A1, A2
enter (A's share), A3 and A4 stay on disk, remembered under A; B1 enters:
the rotation is [A, B]. A pull of 2 takes A1 (A to the back) then B1; A
is refilled from its places (A3, A4); the next pull takes A2, A3.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from storage.entry import Location, Message, Status
from storage.errors import ConfigError

from ..core.bulk_params import DEFAULT_PAGE_BYTES
from ..core.release_rate import ReleaseRate
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
    # Places of a fair topic's pull order one fairKey holds at most
    # (--fair-window; 0: window // 16, at least 1): the rest wait on disk.
    # window // 16 lets 16 tenants with backlogs share the window by
    # turns while each keeps a pull's batch (256 of the default window)
    # in RAM; past that many, the window holds them by the plain order.
    fair_window: int = 0
    # Topics whose fairness is `fairKey` from the broker's build (an embedder's
    # or a test's; a node's come from setTopicConfig: broker.flow's set_flow).
    fair_topics: frozenset[str] = frozenset()
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
        if self.fair_window == 0:
            object.__setattr__(self, "fair_window", max(1, self.window // 16))
        for name, value, least in (("--ready-window", self.window, 1), ("--ready-window-total", self.window_total, 1),
                                   ("--max-inflight", self.inflight, 1),
                                   ("--max-inflight-total", self.inflight_total, 1),
                                   ("--key-window", self.key_window, 1), ("--fair-window", self.fair_window, 1),
                                   ("--max-topics", self.topics, 1),
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
    fair_key: str = ""  # the tenant a fair topic groups it by (docs/api.md): "" none
    # CONSUMING, extended past the deadline its ack timer was set at: that
    # timer's due time (broker.disk.windows' `extend`, `fired`); 0 none.
    armed_ms: int = 0

    @classmethod
    def of(cls, message: Message, topic_hash: int) -> HeldMessage:
        """`message` (READY or CONSUMING, or WAITING on its way to READY) as
        RAM holds it."""
        location = message.location
        return cls(location, message.topic, message.tag, message.msg_id, topic_hash, message.key,
                   (-message.priority, message.trigger_ms, location),
                   _new_state(MessageState, (message.status, message.retry, message.max_retry, message.trigger_ms,
                                             message.ttl_ms, 0, 0)),
                   message if len(message.msg) <= CACHED_MSG_CHARS else None, message.fair_key)

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
class Spills:
    """Where READY messages of a named share of a window -- a serial key's
    (`key_window`) or a fairKey's (`fair_window`) -- wait on disk beyond it:
    `places` remembered per name (read back without a scan; the caller
    bounds how many over all topics), and beyond those `scan[name]`, the
    first place one may lie (read back by a scan that reads bodies to find
    the name's). Example: places {"k": [p1, p2]}, scan {} -> take("k", 1)
    gives [p1]; a spill at p9 not remembered makes scan {"k": p9}, and from
    then on every spill of "k" only lowers it."""

    places: dict[str, deque[Location]] = field(default_factory=dict)
    scan: dict[str, Location] = field(default_factory=dict)
    count: int = 0  # places remembered, over every name

    def __bool__(self) -> bool:
        return bool(self.places) or bool(self.scan)

    def spill_at(self, name: str, location: Location, remember: bool = False) -> bool:
        """A READY message of `name` at `location` stays on disk only: its
        place is remembered if `remember` and no scan of the name is owed
        (True returned), else the name is read back by a scan from there."""
        if remember and name not in self.scan:
            self.places.setdefault(name, deque()).append(location)
            self.count += 1
            return True
        at = self.scan.get(name)
        if at is None or location < at:
            self.scan[name] = location
        return False

    def has(self, name: str) -> bool:
        return name in self.places or name in self.scan

    def names(self) -> list[str]:
        """The names with messages on disk."""
        return list(dict.fromkeys((*self.places, *self.scan)))

    def take(self, name: str, count: int) -> list[Location]:
        """Up to `count` remembered places of the name's messages on disk."""
        places = self.places.get(name)
        if not places:
            return []
        taken = [places.popleft() for _ in range(min(count, len(places)))]
        self.count -= len(taken)
        if not places:
            del self.places[name]
        return taken

    def first(self) -> Location | None:
        """The earliest place of any name (remembered or a scan's start)."""
        starts = [min(places) for places in self.places.values()]
        starts.extend(self.scan.values())
        return min(starts) if starts else None


@dataclass
class FairGroup:
    """One fairKey's messages in a fair topic's pull order: heaps of their
    keys as the topic's own (`heap`, `by_tag`, `worst`: the group's last,
    which a better arrival of a full group evicts; stale entries skipped
    the same way) and how many of them the order holds."""

    heap: list[OrderKey] = field(default_factory=list)
    by_tag: dict[str, list[OrderKey]] = field(default_factory=dict)
    worst: list[tuple[int, int, int, int, Location]] = field(default_factory=list)
    ordered: int = 0  # its messages in the topic's `ready`
    queued: bool = False  # in the topic's `rotation`


@dataclass
class TopicQueue:
    """One topic's window of ready messages, its consuming ones by id,
    where its spilled ones start, and its serial keys' state. Data that
    broker.disk.windows' ReadyWindows keeps (and alone changes): the methods here
    are the order's and the places' bookkeeping, no counts of the part's.

    The pull order is `ready` (the unparked window messages by place) and
    three heaps of their keys, chosen for what a pull and an ack cost:
    `heap` (the best first: a pull pops it, O(log n) in C), `by_tag` (the
    same per tag, for a pull by tags: tagged messages only, as a pull never
    asks for the empty tag) and `worst` (the keys negated: the window's
    last, which a better arrival evicts when the window is full; made when
    first asked for, `last`, then kept until the next `rebuild`: a window
    that never fills while messages arrive -- a drain -- never makes it).
    Leaving the order is `del ready[place]`, O(1): the heaps keep the
    entry, stale, and whoever pops one whose place is not in `ready` skips
    it (an entry twice, after a message left and came back, is the same
    key: the second pops stale). `entries` bounds what each heap holds;
    past twice the window and ORDER_SLACK, `rebuild` makes them again from
    `ready`, O(window) once every window's worth of changes.

    A fair topic (`fair`) keeps `heap` and `by_tag` per fairKey instead
    (`groups`), and `rotation`, the groups' turns (module docstring); a
    pull costs the same pops, and one deque move a message.

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
    worst_kept: bool = False  # `worst` made and kept up (`last`)
    entries: int = 0  # at least the length of each heap
    flying: dict[str, HeldMessage] = field(default_factory=dict)  # its CONSUMING messages by msgId
    # READY messages of this topic may lie on disk beyond the window, none
    # before `scan` (hour, globalIndex).
    spilled: bool = False
    scan: Location | None = None
    # Serial keys: consuming messages per busy key; the window's messages of
    # each key (a busy key's are parked: not in `ready`); where a key's
    # ready messages beyond its `key_window` may lie on disk.
    busy: dict[str, int] = field(default_factory=dict)
    by_key: dict[str, dict[Location, HeldMessage]] = field(default_factory=dict)
    key_spills: Spills = field(default_factory=Spills)
    parked: int = 0  # window messages parked (their key busy)
    # Fairness (`fair`): the order per fairKey, the groups' turns, where a
    # group's ready messages beyond its `fair_window` may lie on disk.
    fair: bool = False
    groups: dict[str, FairGroup] = field(default_factory=dict)
    rotation: deque[str] = field(default_factory=deque)
    fair_spills: Spills = field(default_factory=Spills)
    # Flow settings (broker.disk.windows' `set_flow`): the release rate's
    # bucket (None: no rate); the due-age cap (0: none) and, while set, the
    # order's messages by trigger time (`by_due`, stale entries as `heap`'s).
    rate: ReleaseRate | None = None
    max_due_age_ms: int = 0
    by_due: list[tuple[int, Location]] = field(default_factory=list)

    def best_head(self) -> tuple[int, int] | None:
        """(priority, triggerTime) of the order's best message, which a pull
        takes first (its stale heap entries popped); None: none, or an order
        that is not by priority then trigger time (fair, or a due-age cap)."""
        if self.fair or self.max_due_age_ms:
            return None
        heap, ready = self.heap, self.ready
        while heap and heap[0][2] not in ready:
            heappop(heap)
        return (-heap[0][0], heap[0][1]) if heap else None

    def order(self, held: HeldMessage) -> None:
        """Into the pull order."""
        key = held.key
        location = key[2]
        self.ready[location] = held
        if self.fair:
            group = self.groups.get(held.fair_key)
            if group is None:
                group = self.groups[held.fair_key] = FairGroup()
            if not group.queued:
                group.queued = True
                self.rotation.append(held.fair_key)
            group.ordered += 1
            heappush(group.worst, _negated(key))
            heap, by_tag = group.heap, group.by_tag
        else:
            heap, by_tag = self.heap, self.by_tag
        heappush(heap, key)
        tag = held.tag
        if tag:
            tagged = by_tag.get(tag)
            if tagged is None:
                tagged = by_tag[tag] = []
            heappush(tagged, key)
        if self.worst_kept:
            heappush(self.worst, _negated(key))
        if self.max_due_age_ms:
            heappush(self.by_due, (key[1], location))
        self.entries += 1
        if self.entries > 2 * len(self.ready) + ORDER_SLACK:
            self.rebuild()

    def unorder(self, held: HeldMessage) -> None:
        """Out of the pull order: its heap entries go stale."""
        del self.ready[held.location]
        if self.fair:
            self.groups[held.fair_key].ordered -= 1
        self.tidy()

    def tidy(self) -> None:
        """After messages left `ready` (`del ready[place]`, as `unorder`
        does): the heaps rebuilt if their stale entries may outnumber it."""
        if self.entries > 2 * len(self.ready) + ORDER_SLACK:
            self.rebuild()

    def rebuild(self) -> None:
        """The heaps made again from `ready`: no stale entry left (a fair
        topic's groups too, their turns kept)."""
        keys = [held.key for held in self.ready.values()]
        self.heap, self.by_tag = [], {}
        if self.fair:
            groups: dict[str, FairGroup] = {}
            for held in self.ready.values():
                group = groups.get(held.fair_key)
                if group is None:
                    group = groups[held.fair_key] = FairGroup(queued=True)
                group.ordered += 1
                _file(group.heap, group.by_tag, held)
            for name in self.rotation:  # (an empty group keeps its turn: it leaves at it, as `_by_turns` says)
                if name not in groups:
                    groups[name] = FairGroup(queued=True)
            for group in groups.values():
                _heapify_all(group.heap, group.by_tag)
                group.worst = [_negated(key) for key in group.heap]
                heapify(group.worst)
            rotation = list(self.rotation)
            rotation.extend([name for name in groups if name not in self.groups or not self.groups[name].queued])
            self.rotation = deque(rotation)
            self.groups = groups
        else:
            for held in self.ready.values():
                _file(self.heap, self.by_tag, held)
            _heapify_all(self.heap, self.by_tag)
        self.worst, self.worst_kept = [], False
        self.by_due = [(t, at) for _, t, at in keys] if self.max_due_age_ms else []
        heapify(self.by_due)
        self.entries = len(keys)

    def set_max_due_age(self, max_due_age_ms: int) -> None:
        """The due-age cap (0: none): `by_due` kept while one is set."""
        if max_due_age_ms != self.max_due_age_ms:
            self.max_due_age_ms = max_due_age_ms
            self.rebuild()

    def set_fair(self, on: bool) -> None:
        """Fairness on or off: the order regrouped (`rebuild`). The caller
        first returns what `fair_spills` remembers to the topic's scan."""
        if on != self.fair:
            self.fair = on
            self.groups, self.rotation = {}, deque()
            self.rebuild()

    def group_count(self, fair_key: str) -> int:
        """The order's messages of the group `fair_key` (a fair topic)."""
        group = self.groups.get(fair_key)
        return 0 if group is None else group.ordered

    def best(self, room: int, tags: frozenset[str] | None, now_ms: int = 0) -> list[HeldMessage]:
        """Up to `room` of the order's best (among `tags`: non-empty ones, as
        broker.core.params gives them), best first, one
        of a serial key at most (taking it parks the key's others): out of
        the heaps, still in `ready` (the caller takes them out of it). A
        fair topic's: one from each group in turn (`rotation`). With a
        due-age cap, those due longer than it before `now_ms` first, the
        oldest first (`_aged`)."""
        chosen: dict[Location, HeldMessage] = {}
        serial_keys: set[str] = set()
        if self.max_due_age_ms and now_ms:
            self._aged(room, tags, now_ms - self.max_due_age_ms, chosen, serial_keys)
        if self.fair:
            return self._by_turns(room, tags, chosen, serial_keys)
        tagged = None if tags is None else [self.by_tag[tag] for tag in tags if tag in self.by_tag]
        while len(chosen) < room:
            held = _next(self.heap, tagged, self.ready, chosen, serial_keys)
            if held is None:
                break
            chosen[held.location] = held
        return list(chosen.values())

    def _aged(self, room: int, tags: frozenset[str] | None, due_before_ms: int,
              chosen: dict[Location, HeldMessage], serial_keys: set[str]) -> None:
        """Into `chosen`, up to `room` of the order's messages due before
        `due_before_ms` (trigger time earlier: older than the cap), oldest
        first, whatever their priority. A pull by tags stops at the oldest
        one of another tag (the rest of the pull goes by priority order).
        Worked example (cap 10 s, now 100 s): a(p9, due 95 s), b(p0, due
        80 s), c(p0, due 85 s): b, c (aged, oldest first), then a."""
        by_due, ready = self.by_due, self.ready
        while len(chosen) < room and by_due:
            trigger_ms, location = by_due[0]
            if trigger_ms >= due_before_ms:
                return
            held = ready.get(location)
            if held is None or location in chosen:
                heappop(by_due)  # stale, or its second entry
                continue
            if tags is not None and held.tag not in tags:
                return
            heappop(by_due)
            if held.serial_key:
                if held.serial_key in serial_keys:
                    continue  # (parked once the key's first is taken; filed again when it is freed)
                serial_keys.add(held.serial_key)
            chosen[location] = held

    def _by_turns(self, room: int, tags: frozenset[str] | None, chosen: dict[Location, HeldMessage],
                  serial_keys: set[str]) -> list[HeldMessage]:
        """`best` of a fair topic: the group at the front of the rotation
        gives its best and goes to the back; one with nothing this pull
        may take keeps its place (in front again after the pull), as does
        one with messages on disk only; one with none leaves the rotation."""
        ready, groups, rotation = self.ready, self.groups, self.rotation
        skipped: list[str] = []
        while len(chosen) < room and rotation:
            name = rotation.popleft()
            group = groups[name]
            tagged = None if tags is None else [group.by_tag[tag] for tag in tags if tag in group.by_tag]
            held = _next(group.heap, tagged, ready, chosen, serial_keys)
            if held is not None:
                chosen[held.location] = held
                rotation.append(name)
            elif group.ordered or self.fair_spills.has(name):
                skipped.append(name)  # (one with messages on disk only: its turn kept for when they are read)
            else:
                del groups[name]  # (its heaps: stale entries only)
        rotation.extendleft(reversed(skipped))
        return list(chosen.values())

    def last(self, fair_key: str | None = None) -> HeldMessage | None:
        """The window's last in pull order: the one a better arrival evicts
        (of a fair topic's group `fair_key`, if given)."""
        ready = self.ready
        if fair_key is not None:
            group = self.groups.get(fair_key)
            if group is None:
                return None
            worst = group.worst
        else:
            if not self.worst_kept:
                self.worst = [_negated(held.key) for held in ready.values()]
                heapify(self.worst)
                self.worst_kept = True
            worst = self.worst
        while worst:
            held = ready.get(worst[0][4])
            if held is not None:
                return held
            heappop(worst)
        return None

    def key_count(self, serial_key: str) -> int:
        """The window's messages of `serial_key`."""
        return len(self.by_key.get(serial_key, ()))

    def spill_at(self, location: Location) -> None:
        """A READY message at `location` stays on disk only."""
        self.spilled = True
        if self.scan is None or location < self.scan:
            self.scan = location


def _next(heap: list[OrderKey], tagged: list[list[OrderKey]] | None, ready: dict[Location, HeldMessage],
          chosen: dict[Location, HeldMessage], serial_keys: set[str]) -> HeldMessage | None:
    """The best of `heap` (or, given `tagged`, of those tags' heaps) still
    in `ready`, not in `chosen`, not of a serial key in `serial_keys` (that
    key added), popped; None when there is none. Entries of a key taken
    already are popped too: taking the key parks its others, and freeing it
    files them again."""
    while True:
        if tagged is not None:  # the best of the tags' heads, their stale entries popped first
            best: list[OrderKey] | None = None
            for candidates in tagged:
                while candidates and (candidates[0][2] not in ready or candidates[0][2] in chosen):
                    heappop(candidates)
                if candidates and (best is None or candidates[0] < best[0]):
                    best = candidates
            if best is None:
                return None
            heap = best
        if not heap:
            return None
        location = heappop(heap)[2]
        held = ready.get(location)
        if held is None or location in chosen:
            continue  # stale, or its second entry
        if held.serial_key:
            if held.serial_key in serial_keys:
                continue  # (parked once the key's first is taken)
            serial_keys.add(held.serial_key)
        return held


def _negated(key: OrderKey) -> tuple[int, int, int, int, Location]:
    """`key` as the worst-first heaps hold it: the worst smallest."""
    location = key[2]
    return (-key[0], -key[1], -location.hour, -location.global_index, location)


def _file(heap: list[OrderKey], by_tag: dict[str, list[OrderKey]], held: HeldMessage) -> None:
    """`held`'s key appended to `heap` and, tagged, its tag's heap (heapified after)."""
    heap.append(held.key)
    if held.tag:
        tagged = by_tag.get(held.tag)
        if tagged is None:
            tagged = by_tag[held.tag] = []
        tagged.append(held.key)


def _heapify_all(heap: list[OrderKey], by_tag: dict[str, list[OrderKey]]) -> None:
    heapify(heap)
    for tagged in by_tag.values():
        heapify(tagged)
