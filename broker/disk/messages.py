"""The messages: the one part that applies broker.core.transitions to a
message, held in RAM or stored on disk alike, a new send included. Each
method looks a message (or a batch) up, asks `step` what the event does,
and carries the effects out -- the only place either is done:

    HOLD, TAKE, REQUEUE, FORGET   the ready windows (broker.disk.windows'
                                  `carry_out`, `forget_at`), which WAKE long polls
    FILE, CANCEL                  the wheel (broker.disk.filing)
    DUE_NOW                       `ready_now`, once the step's record is durable
    MOVE, RELEASE_ID, REPLACE     the commit log (broker.disk.journal)
    COUNT_*                       the counters (broker.observe.metrics)

and appends the status changes as one record, for the request parts
(requests, dead_letters, bulk) to await durable before they answer. The
wheel's releases (`release`), the windows' timers (`fire`, `trim`) and
refills (`ended_on_disk`) are stepped here too. Cost: a pull of N or an
ackMsg of N ids is one `apply` (one cell call a message, one `carry_out`);
a batch of sends is stepped by its earliest message (a new id's cell
files every one; none is due unless the earliest is), each message again
only if that one is due.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import NamedTuple, cast

from storage.delay_index import FLAG_PAUSED
from storage.entry import STATUS_BY_VALUE, Fields, IndexEntry, Location, Message, Status
from storage.errors import InvariantError, NotFound
from storage.reading import Match
from storage.store import SendOutcome, SendResult, StateChange, Store, text_hash
from wheel.clock import Clock

from ..core.leases import new_delivery
from ..core.params import DeleteRequest, Fenced, FencedRequest, LongPollRequest, NewSend, PullRequest
from ..core.release_rate import smoothing_ms
from ..core.transitions import (
    ACK,
    GIVE_BACK,
    NACK,
    RELEASE,
    SKIPPED_RELEASE,
    TABLE,
    TTL,
    Ack,
    Delete,
    Effect,
    EndPaused,
    Event,
    Extend,
    Fencing,
    MessageState,
    Nack,
    Pull,
    Redrive,
    Refusal,
    Reschedule,
    RetryAt,
    Send,
    Step,
    step,
)
from ..observe.metrics import Metrics, due_ms
from .filing import Filing
from .journal import Journal
from .ready import HeldMessage
from .timers import Timer
from .topics import Topics
from .windows import ReadyWindows

STORED = SendOutcome.STORED
READY, CONSUMING, WAITING, ACKED = Status.READY, Status.CONSUMING, Status.WAITING, Status.ACKED
TAKE, REQUEUE, FORGET, HOLD, WAKE = Effect.TAKE, Effect.REQUEUE, Effect.FORGET, Effect.HOLD, Effect.WAKE
CANCEL, DUE_NOW, EXTEND = Effect.CANCEL, Effect.DUE_NOW, Effect.EXTEND
_new = tuple.__new__  # (a NamedTuple without its Python-level __new__)
_TRIGGER_MS = operator.attrgetter("trigger_ms")
_UNDECIDED = Fencing(None)  # (a fenced call's message held, its outcome once applied)
_MESSAGE = operator.itemgetter(0)  # a NewSend's message


class Moved(NamedTuple):
    """Messages filed anew (MOVE, FILE), not yet durable."""

    messages: list[Message]  # WAITING at their new places
    due: list[Message]  # of those, the ones due already (DUE_NOW): `ready_now` once durable
    now_ms: int  # when they were stepped


class Messages:
    """Steps messages and carries the steps out. Runs on the event loop."""

    def __init__(self, store: Store, clock: Clock, metrics: Metrics, windows: ReadyWindows, filing: Filing,
                 journal: Journal, topics: Topics) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._windows = windows
        self._filing = filing
        self._journal = journal
        self._topics = topics
        windows.messages = self  # (its timers' compaction and its refills ask the steps here)
        # Told of the messages each release is about to make READY, with the
        # time (the node's recurring schedules: broker.schedules.keeper); answers
        # the runs that missed with misfire=skip, which end EXPIRED unseen.
        self.on_release: Callable[[Sequence[Message], int], Sequence[Location]] | None = None
        # Told first of the messages a release is about to carry out, with
        # the time: answers those it holds back (a recurring schedule's run
        # whose topic or serial key is paused), which stay WAITING, out of
        # the wheel, until `release_held` (docs/api.md, "Recurring schedules").
        self.on_hold: Callable[[Sequence[Message], int], Collection[Location]] | None = None
        # Each topic's dedupWindowMillis, when not 0 (broker.flow: `Broker.set_dedup_window`).
        self.dedup_windows: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"Messages({self._windows!r})"

    def now_ms(self) -> int:
        """The node's time, the one steps are taken at."""
        return self._clock.now_ms()

    # == held messages: a batch, one event =========================================

    def apply(self, event: Event, batch: Sequence[HeldMessage], now_ms: int,
              events: Sequence[Event] | None = None,
              refused: list[tuple[HeldMessage, Refusal]] | None = None) -> list[StateChange]:
        """`event` to each message of `batch` (held, or WAITING on its way in:
        a release), in one pass: its step (its status's cell of the event's
        row); then the windows move the batch at once (`carry_out`: out of a
        window or flight, into flight, a window, disk only or nowhere, long
        polls woken); counts kept (COUNT_*). `events`: each message's own
        event instead, all of `event`'s type (a fenced call's, each with
        its delivery); `refused`: where the refused ones go, with why. The
        status changes, to append."""
        cells = TABLE[type(event)]
        changes: list[StateChange] = []
        out_of_window: list[HeldMessage] = []
        out_of_flight: list[HeldMessage] = []
        into_flight: list[HeldMessage] = []
        into_window: list[HeldMessage] = []
        extended: list[HeldMessage] = []
        extended_from: list[MessageState] = []
        forgotten: list[Location] = []
        woken: set[str] = set()
        counted_topic, times = "", 0  # a run of one topic's same effects: counted once
        topic_metrics = self._metrics.topic
        counted: tuple[Effect, ...] = ()
        for i, held in enumerate(batch):
            before = held.state
            status = before.status
            state, effects, refusal = cells[status](before, event if events is None else events[i], now_ms)
            if state is None or not effects:
                if refusal is not None and refused is not None:
                    refused.append((held, refusal))
                continue
            held.state = state
            if EXTEND in effects:  # (in flight still: only its ack timer moves)
                extended.append(held)
                extended_from.append(before)
            elif status is READY:
                out_of_window.append(held)
            elif status is CONSUMING:
                out_of_flight.append(held)  # (a WAITING one, released, was not held)
            if TAKE in effects:
                into_flight.append(held)
            elif REQUEUE in effects or HOLD in effects:
                into_window.append(held)
            elif FORGET in effects:
                forgotten.append(held.location)
            if WAKE in effects:
                woken.add(held.topic)
            f: Fields = state  # (by index: its ints go into the change as they are)
            changes.append(_new(StateChange, (held.location, f[0], f[1], False, f[5], status, held.topic_hash, 0, f[6])))
            if effects is not counted or held.topic != counted_topic:
                if times:
                    topic_metrics(counted_topic).count(counted, times)
                counted_topic, counted, times = held.topic, effects, 0
            times += 1
        if times:
            topic_metrics(counted_topic).count(counted, times)
        if extended:
            self._windows.extend(extended, extended_from)
        if changes:
            self._windows.carry_out(out_of_window, out_of_flight, into_flight, into_window, forgotten, woken)
        return changes

    def pull(self, request: PullRequest | LongPollRequest) -> list[Message] | None:
        """`Pull` to up to `batch` of the topic's best READY messages (among
        its tags; fewer at the in-flight caps), appended: the messages
        (None: none was taken)."""
        now_ms = self._clock.now_ms()
        rate = self._windows.release_rate(request.topic)
        held_since_ms = None if rate is None else rate.held_since_ms  # (before this pull's take)
        taken = self._windows.choose(request.topic, request.batch,
                                     frozenset(request.tags) if request.tags else None)
        if not taken:
            return None
        delivery = new_delivery(now_ms)
        self._journal.append(self.apply(_new(Pull, (now_ms + request.ack_timeout_ms, delivery)), taken, now_ms),
                             now_ms)
        messages = []
        for held in taken:
            cached = held.message
            if cached is None:
                message = self._store.read_message(held.location)
                if message is not None:
                    messages.append(message.handed_over(held.state.retry, delivery))
            else:
                messages.append(cached.handed_over(held.state.retry, delivery))
                held.message = None
        self._metrics.topic(request.topic).pulled(messages, now_ms)
        if rate is not None:  # (a topic without a rate: its lateness is all load, the pull gap's)
            observe = self._metrics.observe_release
            for m in messages:
                due = due_ms(m.trigger_ms, m.produce_ms)
                smoothing = smoothing_ms(due, held_since_ms, now_ms)
                observe(request.topic, max(0, now_ms - due) - smoothing, smoothing)
        return messages

    def give_back(self, messages: list[Message]) -> bool:
        """`GiveBack` to messages pulled for a client that is gone (READY as
        if never pulled), appended; whether any changed."""
        now_ms = self._clock.now_ms()
        held_at = self._windows.held
        changes = self.apply(GIVE_BACK, [held for m in messages if (held := held_at.get(m.location)) is not None],
                             now_ms)
        if changes:
            self._journal.append(changes, now_ms)
        return bool(changes)

    def ack(self, topic: str, msg_ids: Sequence[str], ack: bool) -> tuple[list[Status | None], bool]:
        """`Ack` (or `Nack`) to each id (a repeated one once), appended as one
        record: the consuming ones held (one `apply`), the others by their
        stored copies. Each one's status after it (None: no such message),
        and whether any changed."""
        now_ms = self._clock.now_ms()
        flying = self._windows.in_flight_of(topic, msg_ids)
        changes = self.apply(ACK if ack else NACK, list(flying.values()), now_ms) if flying else []
        after: dict[str, Status | None] = {}
        for msg_id, held in flying.items():
            after[msg_id] = held.state.status
        if ack and flying:  # (in flight: due, so each acked one dwelt from its trigger time)
            self._metrics.acked([held.state.trigger_ms for held in flying.values() if held.state.status is ACKED],
                                now_ms)
        if len(after) < len(msg_ids):
            for msg_id in msg_ids:
                if msg_id not in after:
                    change, after[msg_id] = self._ack_stored(topic, msg_id, ack, now_ms)
                    if change is not None:
                        changes.append(change)
        if changes:
            self._journal.append(changes, now_ms)
        return list(map(after.__getitem__, msg_ids)), bool(changes)

    def fenced(self, request: FencedRequest) -> tuple[list[Fencing], bool]:
        """A fenced ack, nack or extension (docs/api.md, "Leases") of each id
        (a repeated one once, by its first delivery): stepped with its
        delivery, those not refused applied in one pass and appended as one
        record. Each one's outcome, and whether any changed."""
        now_ms = self._clock.now_ms()
        kind, topic = request.kind, request.topic
        flying = self._windows.in_flight_of(topic, request.msg_ids)
        deadline_ms = now_ms + request.ack_timeout_ms
        # An id's first delivery, as an object: the request's own int, not
        # boxed anew a message by the compiled build (storage.entry's Fields).
        first: dict[str, object] = dict(zip(reversed(request.msg_ids), reversed(request.deliveries)))
        outcomes: dict[str, Fencing] = {}
        stale = 0
        taken: list[HeldMessage] = []
        events: list[Event] = []
        of_delivery: dict[object, Event] = {}  # (one event a delivery: a pull's messages share theirs)
        for msg_id, held in flying.items():
            delivery = first[msg_id]
            event = of_delivery.get(delivery)
            if event is None:
                event = of_delivery[delivery] = _fenced_event(kind, cast(int, delivery), deadline_ms,
                                                              request.max_lease_ms)
            taken.append(held)
            events.append(event)
        if len(flying) < len(first):
            for msg_id, delivery in first.items():
                if msg_id not in flying:  # (not consuming: no delivery of it is current)
                    stored = self._store.get(topic, msg_id)
                    state = None if stored is None else MessageState.of(stored)
                    refusal = step(state, _fenced_event(kind, cast(int, delivery), deadline_ms, request.max_lease_ms),
                                   now_ms).refusal
                    stale += refusal is Refusal.STALE
                    outcomes[msg_id] = _new(Fencing, (None if state is None else state.status, refusal, 0))
        refused: list[tuple[HeldMessage, Refusal]] = []
        changes = self.apply(events[0], taken, now_ms, events, refused) if taken else []
        for held, refusal in refused:
            stale += refusal is Refusal.STALE
            outcomes[held.msg_id] = _new(Fencing, (held.state.status, refusal, 0))
        done: dict[Status, Fencing] = {}  # (the outcome of those it changed, by status: shared)
        for held in taken:
            if held.msg_id not in outcomes:
                status = held.state.status
                outcome = done.get(status)
                if outcome is None:
                    outcome = done[status] = _new(Fencing, (status, None,
                                                            deadline_ms if kind is Fenced.EXTEND else 0))
                outcomes[held.msg_id] = outcome
        counts = self._metrics.topic(topic, exists=bool(taken) or self._store.has_topic(topic))
        if kind is Fenced.EXTEND:
            counts.extensions += len(taken) - len(refused)
        counts.stale += stale
        if kind is Fenced.ACK and taken:
            self._metrics.acked([held.state.trigger_ms for held in taken if held.state.status is ACKED], now_ms)
        if changes:
            self._journal.append(changes, now_ms)
        return [outcomes[msg_id] for msg_id in request.msg_ids], bool(changes)

    def _ack_stored(self, topic: str, msg_id: str, ack: bool,
                    now_ms: int) -> tuple[StateChange | None, Status | None]:
        """An ack or nack of an id not in flight, by its stored copy: its
        change (None: none) and its status after it (None: no such message)."""
        message = self._store.get(topic, msg_id)
        self._metrics.topic(topic, exists=message is not None)  # (the topic's counters made if it exists)
        if message is None:
            return None, None
        if not ack:  # a nack of a message not held consuming changes nothing
            return None, message.status
        done = step(MessageState.of(message), ACK, now_ms)
        if done.state is None or not done.effects:
            return None, message.status
        if message.status is READY or message.status is CONSUMING:  # (a WAITING one was never due)
            self._metrics.acked((message.trigger_ms,), now_ms)
        return self._carried_out(message, done), done.state.status

    def fire(self, timers: list[Timer], now_ms: int) -> list[StateChange]:
        """Due timers (broker.disk.timers): each one's event (an ack timeout,
        an expiry) to its messages still held; the status changes."""
        changes: list[StateChange] = []
        fired = self._windows.fired
        for timer in timers:
            batch = fired(timer)
            if batch:
                changes += self.apply(timer.event, batch, now_ms)
        return changes

    def trim(self, timer: Timer) -> bool:
        """Drop the timer's messages it would no longer change when it fires
        (then it never will: they moved on); whether any is left. Asked of
        every timer by the windows' compaction: what the timer's event's
        step says."""
        held_at, event = self._windows.held, timer.event
        timer.locations[:] = [location for location in timer.locations if (held := held_at.get(location)) is not None
                              and step(held.state, event, timer.due_ms).effects]
        return bool(timer.locations)

    def ended_on_disk(self, message: Message, now_ms: int) -> StateChange | None:
        """`Ttl` to a READY message a refill read back from disk: its change
        if it ended (counted), for the refill to append; None if it lives."""
        ending = step(MessageState.of(message), TTL, now_ms)
        if not ending.effects or ending.state is None:
            return None
        self._metrics.topic(message.topic).count(ending.effects)
        return StateChange(message.location, ending.state.status, ending.state.retry)

    # == releases: WAITING -> READY ================================================

    def release(self, entries: list[IndexEntry]) -> None:
        """Released by the wheel (wheel.WheelDriver's deliver): due now, each
        still WAITING made READY (or EXPIRED)."""
        status, read = self._store.status, self._store.read_message
        self._release([(m, entry.topic_hash) for entry in entries
                       if status(entry.location) is WAITING  # (no body read for one released already)
                       and (m := read(entry.location)) is not None])

    def release_held(self, messages: Sequence[Message]) -> int:
        """Messages a release held back (`on_hold`) released now, through
        the same path (told again to `on_hold`, then `on_release`): each
        still WAITING and due, never one before its trigger time. How many
        were looked at."""
        status, now_ms = self._store.status, self._clock.now_ms()
        due = [(m, text_hash(m.topic)) for m in messages
               if status(m.location) is WAITING and m.trigger_ms <= now_ms]
        self._release(due)
        return len(due)

    def ready_now(self, messages: list[Message], due: list[Message], now_ms: int) -> list[Message]:
        """DUE_NOW of steps whose records are durable (a send, a move at
        `now_ms`): the `due` ones of `messages` still WAITING READY now
        rather than at the wheel's next poll (which forgets them: CANCEL),
        so the answer says 2 and long polls wake at once; `messages` with
        their statuses."""
        if not due:
            return messages
        status = self._store.status
        waiting = [m for m in due if status(m.location) is WAITING]  # (the wheel may have been first)
        for m in waiting:
            self._filing.cancel(m.location)
        self._release([(m, text_hash(m.topic)) for m in waiting], arrived_ms=now_ms)
        after = {m.location: status(m.location) for m in due}  # (a duplicate in a batch shares its location)
        return [m._replace(status=after[m.location]) if m.location in after else m for m in messages]

    def _release(self, messages: list[tuple[Message, int]], arrived_ms: int | None = None) -> None:
        """`Release` to WAITING messages (with their topic hashes) due now:
        READY into their topics' windows (which wake the long polls), or
        EXPIRED past their ttl or skipped (`on_release`); appended. Their
        lateness counts from their due time: the trigger time, or the
        arrival if later -- each one's produce time, or `arrived_ms` (the
        request that made them due: a send, a rescheduleMsg, a re-drive)."""
        if not messages:
            return
        now_ms = self._clock.now_ms()
        if self.on_hold is not None:
            kept_back = self.on_hold([m for m, _ in messages], now_ms)
            if kept_back:
                messages = [(m, h) for m, h in messages if m.location not in kept_back]
                if not messages:
                    return
        lateness = self._metrics.load_lateness_seconds
        dues = []
        for message, _ in messages:
            due = due_ms(message.trigger_ms, message.produce_ms if arrived_ms is None else arrived_ms)
            lateness.observe(max(0, now_ms - due) / 1000)
            dues.append(due)
        batch = [HeldMessage.of(message, topic_hash) for message, topic_hash in messages]
        skipped = () if self.on_release is None else self.on_release([m for m, _ in messages], now_ms)
        if skipped:
            ended = set(skipped)
            changes = self.apply(SKIPPED_RELEASE, [h for h in batch if h.location in ended], now_ms)
            changes += self.apply(RELEASE, [h for h in batch if h.location not in ended], now_ms)
        else:
            changes = self.apply(RELEASE, batch, now_ms)
        for held, due in zip(batch, dues):
            if held.state.status is READY:
                self._metrics.topic(held.topic).ready_gap.observe(now_ms - due)
        if changes:
            self._journal.append(changes, now_ms)

    # == stored copies, by id or found =============================================

    def send(self, sends: Sequence[NewSend], now_ms: int) -> tuple[list[SendResult], list[Message]]:
        """`Send` of new messages at `now_ms`: the topic cap (broker.disk
        .topics), one record; an id whose message is alive answers it
        unchanged, one whose message has ended is stored anew, the ended
        one released (REPLACE), unless the send is strict or its topic's
        dedup window holds the end (`_in_window`: then answered unchanged,
        the window moved on). Each new one FILEd; counted. The results,
        and the new messages due already (DUE_NOW: `ready_now` of the
        results' messages once durable)."""
        batch = list(map(_MESSAGE, sends))
        topics = self._topics
        new_topics = None if len(batch) == 1 and batch[0].topic in topics.stored else topics.new_topics(batch)
        results = self._journal.send(batch, now_ms)
        if new_topics:
            topics.filing(new_topics)
        fresh: list[Message] = []  # the messages stored
        replace: list[int] = []  # the duplicates of ended messages to store anew
        windows = self.dedup_windows
        seen_again: list[Location] = []  # ended messages a dedup window answers: their window moved on
        for i, (outcome, stored) in enumerate(results):
            if outcome is STORED:
                fresh.append(stored)
                continue
            if windows and stored.status >= ACKED and self._in_window(stored, now_ms):
                seen_again.append(stored.location)
                continue
            if Effect.REPLACE in step(MessageState.of(stored), Send(MessageState.sent(batch[i]), sends[i].strict),
                                      now_ms).effects:
                replace.append(i)
        if seen_again:
            self._journal.seen_again(seen_again, now_ms)
        if replace:  # rare: release the ended ones, then store those sends again
            ended = {results[i].message.location: results[i].message for i in replace}
            self._journal.append([StateChange(m.location, m.status, m.retry, released=True) for m in ended.values()],
                                 now_ms)
            for i, result in zip(replace, self._journal.send([batch[i] for i in replace], now_ms)):
                results[i] = result
                if result.outcome is STORED:
                    fresh.append(result.message)
        live = fresh
        if fresh and any(s.kept is not None for s in sends):  # (an import's: importMsgBatch)
            fresh = self._keep_imported(sends, results, fresh, now_ms)
            live = [m for m in fresh if m.status is Status.WAITING]
        self._filing.add_many(fresh, now_ms)  # (FILE: every new id's step; a dead import's too, as its entry is)
        due: list[Message] = []
        if live and DUE_NOW in step(None, Send(MessageState.of(min(live, key=_TRIGGER_MS))), now_ms).effects:
            due = [m for m in live if DUE_NOW in step(None, Send(MessageState.of(m)), now_ms).effects]
        self._count_sends(results)
        return results, due

    def _keep_imported(self, sends: Sequence[NewSend], results: list[SendResult], fresh: list[Message],
                       now_ms: int) -> list[Message]:
        """The status and retry an import keeps (NewSend.kept) of each
        message stored just now, appended in the same turn as its send (one
        STATE record, durable with it): a dead one (5, 6) is answered dead
        (filed as its entry is, but the wheel releases WAITING ones only,
        and it is never made READY); a pending one keeps its retry (its
        deliveries left: maxRetry + 1 - retry). The messages stored, as
        they now are."""
        kept: dict[tuple[str, str], tuple[int, int] | None] = {}
        for s in sends:  # (an id twice in a batch: its first send is the one stored)
            kept.setdefault((s.message.topic, s.message.msg_id), s.kept)
        changes, now = [], {}
        for m in fresh:
            k = kept.get((m.topic, m.msg_id))
            if k is None:
                continue
            status, retry = STATUS_BY_VALUE[k[0]], k[1]
            changes.append(_new(StateChange, (m.location, status, retry, False, 0, int(m.status), text_hash(m.topic),
                                              0, 0)))
            now[m.location] = m._replace(status=status, retry=retry)
        if changes:
            self._journal.append(changes, now_ms)
            for i, (outcome, m) in enumerate(results):
                if outcome is STORED and m.location in now:
                    results[i] = SendResult(outcome, now[m.location])
            dead = len(changes) - sum(1 for m in now.values() if m.status is Status.WAITING)
            if dead:
                self._metrics.topic(fresh[0].topic).ended += dead
        return [now.get(m.location, m) for m in fresh]

    def _in_window(self, ended: Message, now_ms: int) -> bool:
        """Whether the ended message's topic has a dedup window and the
        message ended, or was last sent again, less than the window before
        `now_ms` (docs/api.md, "Deduplication window")."""
        window_ms = self.dedup_windows.get(ended.topic, 0)
        if not window_ms:
            return False
        ended_ms = self._store.ended_at(ended.location, now_ms)
        return ended_ms is not None and now_ms - ended_ms < window_ms

    def _count_sends(self, results: list[SendResult]) -> None:
        topic, m = "", None  # (a batch's messages share their topic, as a rule)
        for outcome, message in results:
            if m is None or message.topic != topic:
                topic, m = message.topic, self._metrics.topic(message.topic)
            if outcome is STORED:
                m.sends += 1
            else:
                m.duplicates += 1

    def get(self, topic: str, msg_id: str) -> Message:
        """The stored message (counted: getMsg); NotFound if there is none."""
        self._metrics.topic(topic, exists=self._topics.has_topic(topic)).gets += 1
        message = self._store.get(topic, msg_id)
        if message is None:
            raise not_found(topic, msg_id)
        return message

    def delete(self, request: DeleteRequest) -> tuple[Message, Step]:
        """`Delete` to the stored message, carried out and appended (nothing
        for an ended one unless released); NotFound for an unknown id. The
        message and its step (a refusal ENDED: it had ended)."""
        message = self._store.get(request.topic, request.msg_id)
        now_ms = self._clock.now_ms()
        done = step(None if message is None else MessageState.of(message), Delete(request.release), now_ms)
        if message is None or done.state is None:
            raise not_found(request.topic, request.msg_id)
        if done.effects:
            self._journal.append([self._carried_out(message, done)], now_ms)
        return message, done

    def end_found(self, found: Iterable[Match], topic: str, call_id: int, event: Delete | EndPaused) -> int:
        """`event` -- a delete (deleteMsgs), or a resume's `expire` (EndPaused:
        the entry flagged FLAG_PAUSED, its end reason) -- to each match
        (place, status, retry, trigger time: as just read), out of the
        wheel and the windows, appended as one record (a PART of `call_id`
        unless 0); how many changed (counted: deletes, or ended)."""
        now_ms = self._clock.now_ms()
        topic_hash = text_hash(topic)
        flags = FLAG_PAUSED if type(event) is EndPaused else 0
        changes = []
        steps: dict[tuple[int, int], Step] = {}  # these steps depend on the status and retry only
        for where, status, retry, _ in found:
            done = steps.get((status, retry))
            if done is None:
                done = steps[status, retry] = step(MessageState(STATUS_BY_VALUE[status], retry, 0, 0, 0), event,
                                                   now_ms)
            if done.state is None or not done.effects:
                continue  # ended meanwhile
            self._leave(where, done.effects)
            changes.append(_new(StateChange, (where, done.state.status, retry, False, 0, status, topic_hash, flags, 0)))
        if changes:
            self._journal.append(changes, now_ms, call_id)
            m = self._metrics.topic(topic)
            if flags:
                m.ended += len(changes)
            else:
                m.deletes += len(changes)
        return len(changes)

    def move(self, found: Iterable[tuple[Location, MessageState, Event]], topic: str) -> Moved:
        """Each (place, state, event) stepped -- a reschedule, a re-drive, a
        retry at a later time -- and those whose step files them anew
        (MOVE) filed anew as one record: out of the wheel or the windows
        (CANCEL, FORGET: after the append, so a refused one changes
        nothing), into the wheel (FILE); counted. The rest (refused, or
        nothing to do) change nothing."""
        now_ms = self._clock.now_ms()
        moves = [(where, done, event) for where, state, event in found
                 if Effect.MOVE in (done := step(state, event, now_ms)).effects and done.state is not None]
        if not moves:
            return Moved([], [], now_ms)
        first = moves[0][2]
        counted = type(first) is Redrive and first.counted  # (a redriveMsgs job's: redriveCount + 1)
        if any((type(event) is Redrive and event.counted) != counted for _, _, event in moves):
            raise InvariantError("a move of counted re-drives and other moves in one record")
        moved = self._journal.move([(where, done.state.trigger_ms, done.state.retry)
                                    for where, done, _ in moves if done.state is not None], now_ms, counted)
        m = self._metrics.topic(topic)
        due = []
        for (where, done, event), new in zip(moves, moved):
            self._leave(where, done.effects)
            self._filing.add(new.location, new.trigger_ms, now_ms)  # (FILE)
            if DUE_NOW in done.effects:
                due.append(new)
            if type(event) is Reschedule:
                m.reschedules += 1
            elif type(event) is Redrive:
                m.redrives += 1
            else:
                m.count(done.effects)
        return Moved(moved, due, now_ms)

    def retry_at(self, topic: str, msg_id: str, at_ms: int) -> tuple[Status | None, Moved | None]:
        """`RetryAt` to the CONSUMING message of the id (a failed push
        delivery): ENDED as a nack (carried out on RAM, appended) or filed
        anew (`move`). Its status after it (None: none in flight), and what
        moved (None: it did not)."""
        held = self._windows.in_flight_of(topic, (msg_id,)).get(msg_id)
        if held is None:
            return None, None
        now_ms = self._clock.now_ms()
        event = RetryAt(max(at_ms, now_ms))
        moved = self.move([(held.location, held.state, event)], topic)
        if moved.messages:
            return WAITING, moved
        changes = self.apply(event, [held], now_ms)  # (ENDED: the windows carry it out, as a nack's)
        if changes:
            self._journal.append(changes, now_ms)
        return held.state.status, None

    def _leave(self, where: Location, effects: tuple[Effect, ...]) -> None:
        """A stored copy's step carried out on RAM: it leaves the wheel
        (CANCEL) or its window or flight (FORGET), if RAM holds it."""
        if CANCEL in effects:
            self._filing.cancel(where)
        elif FORGET in effects:
            self._windows.forget_at(where)


    def _carried_out(self, message: Message, done: Step) -> StateChange:
        """A stored copy's step (an ack, a delete by id) carried out: `_leave`,
        counted; its status change."""
        assert done.state is not None
        self._leave(message.location, done.effects)
        self._metrics.topic(message.topic).count(done.effects)
        return StateChange(message.location, done.state.status, done.state.retry,
                           released=Effect.RELEASE_ID in done.effects)

def not_found(topic: str, msg_id: str) -> NotFound:
    return NotFound(f"no message {msg_id!r} in topic {topic!r}")


def _fenced_event(kind: Fenced, delivery: int, deadline_ms: int, max_lease_ms: int) -> Ack | Nack | Extend:
    """A fenced call's event for one delivery (broker.core.transitions)."""
    if kind is Fenced.ACK:
        return _new(Ack, (delivery,))
    if kind is Fenced.NACK:
        return _new(Nack, (delivery,))
    return _new(Extend, (deadline_ms, delivery, max_lease_ms))
