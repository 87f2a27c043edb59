"""A message's lifecycle as a pure step function: the one table of what
each request and each timer does to a message in each status.

    step(state, event, now_ms) -> Step(state, effects, refusal)

No I/O, no clock, no RAM structure: `state` is what a transition depends on
(status, retry, maxRetry, trigger time and ttl, ack deadline; None when no
message has the id), `event` what happened, `now_ms` the caller's time. The
disk broker's one caller (broker.disk.messages) asks `step` what a message
becomes and carries out the effects on the parts: the ready windows (HOLD, TAKE,
REQUEUE, FORGET: broker.disk.windows), the wheel (FILE, CANCEL: broker.disk.filing),
the commit log (MOVE, RELEASE_ID, REPLACE: broker.disk.journal), long polls
(WAKE), counters (COUNT_*: broker.observe.metrics). A refusal is an answer, not a
change: the part raises it as the error the API answers (NotFound 404,
Conflict 409). The rules as a client sees them are in docs/api.md.

The table is the code: `TABLE[type(event)][status]` is the cell (a small
function of the state, the event and now_ms) that says what the event does
in that column, and `step` is one look-up and one call of it -- no other
statement of these rules exists. A part that applies one event to a batch
(a pull of N, an ackMsg of N ids) looks the event's row up once and calls
the cells. Drawn ("-": nothing changes, no error; retry counts deliveries;
expire = triggerTime + ttlMillis; final = ACKED, EXPIRED, ENDED, DELETED):

    event        no such id    WAITING         READY            CONSUMING          final
    send         WAITING [1]   - (duplicate)   - (duplicate)    - (duplicate)      WAITING anew [2]
    release      -             READY [HOLD],   -                -                  -
                               EXPIRED >= exp
                               or skipped [10]
    pull         -             -               CONSUMING,       -                  -
                                               retry+1 [TAKE]
    ack          -             ACKED [CANCEL]  ACKED [FORGET]   ACKED [FORGET]     -
    nack         -             -               -                READY [REQUEUE],   -
                                                                ENDED [3]
    ack timeout  -             -               -                as nack [4]        -
    ttl          -             -               EXPIRED or       - (its ack or      -
                                               ENDED [5]        timeout decides)
    delete       NotFound      DELETED         DELETED          DELETED            NotFound [6]
                               [CANCEL]        [FORGET]         [FORGET]
    reschedule   NotFound      WAITING at the new time [7]      Conflict           Conflict
    redrive      NotFound      Conflict        Conflict         Conflict           5, 6: WAITING now,
                                                                                   retry 0 [8]; 4, 7: Conflict
    give back    -             -               -                READY, retry-1     -
    retry at     -             -               -                WAITING at that    -
                                                                time [9], ENDED [3]
    end paused   -             EXPIRED [11]    EXPIRED [11]     -                  -

    [1] FILE: into the wheel; DUE_NOW too if its trigger time has come (it
        is made READY, or EXPIRED, once its record is durable).
    [2] unless the send is strict: then answered unchanged. Else the ended
        message's id is released and the send stored again (REPLACE).
    [3] ENDED after maxRetry + 1 deliveries (retry > maxRetry) or once now
        >= expire; else READY with its retry, its next pull the next delivery.
    [4] only if the timer is its current deadline's (a message pulled again
        has a new one); a stale timer changes nothing.
    [5] once now >= expire: EXPIRED (5) if never delivered (retry 0), else
        ENDED (6). A message on disk only is ended so when a refill reads it.
    [6] with `release`, the ended message's id is released all the same,
        and the answer is still NotFound ("had ended; released").
    [7] from WAITING (CANCEL) or READY (FORGET): filed anew (MOVE, FILE)
        with its retry; READY at once (DUE_NOW) if the new time has come.
    [8] filed anew at now (MOVE, FILE, DUE_NOW) with a fresh retry budget
        and ttl, so READY at once; a redriveMsgs job's at the job's trigger
        time (DUE_NOW only if it has come), its redriveCount one more.
    [9] a failed push delivery (broker.push.pusher): a nack with a delay. Out
        of flight (its key freed), filed anew (MOVE, FILE) at the retry
        time, its trigger time then (its ttl counting from it, as a
        reschedule's), with its retry; ENDED instead, as a nack, after
        maxRetry + 1 deliveries or if the retry time is past its expiry.
    [10] a schedule's run that missed with misfire=skip (broker.schedules.keeper):
        EXPIRED at its release, never delivered.
    [11] a resume's `expire` (broker.flow.keeper): a message that fell due
        while its topic (or key) was paused ends, out of the wheel (CANCEL)
        or its window (FORGET), its end reason `paused`; one consuming was
        handed out before the pause and is left to its ack.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from storage.entry import Fields, Message, Status
from storage.types import NewMessage

from .leases import handed_over_ms

WAITING, READY, CONSUMING = Status.WAITING, Status.READY, Status.CONSUMING
ACKED, EXPIRED, ENDED, DELETED = Status.ACKED, Status.EXPIRED, Status.ENDED, Status.DELETED


class MessageState(NamedTuple):
    """What a transition depends on, of one message."""

    status: Status
    retry: int  # deliveries so far: 1 on the first pull (camellia)
    max_retry: int
    trigger_ms: int
    ttl_ms: int
    deadline_ms: int = 0  # CONSUMING: when the ack times out
    delivery: int = 0  # CONSUMING: its hand-over (`deliveryId`: `delivery_id`); 0 otherwise

    @property
    def expire_ms(self) -> int:
        return self.trigger_ms + self.ttl_ms

    @classmethod
    def of(cls, message: Message) -> MessageState:
        return _new(cls, (message.status, message.retry, message.max_retry, message.trigger_ms, message.ttl_ms, 0, 0))

    @classmethod
    def sent(cls, message: NewMessage) -> MessageState:
        """What a send stores: WAITING, never delivered."""
        return cls(WAITING, 0, message.max_retry, message.trigger_ms, message.ttl_ms)


# NamedTuples made without their generated (Python-level) __new__: the
# lifecycle makes several per message, and this is a third of the cost.
_new = tuple.__new__


def due(trigger_ms: int, now_ms: int) -> bool:
    """The release rule: a message is due once its trigger time has come
    (never before: it is READY at its trigger millisecond, not earlier)."""
    return trigger_ms <= now_ms


def expired(trigger_ms: int, ttl_ms: int, now_ms: int) -> bool:
    """The ttl rule: a message's life ends at triggerTime + ttlMillis."""
    return now_ms >= trigger_ms + ttl_ms


class Effect(enum.Enum):
    """What the parts do to carry a step out (in no particular order)."""

    FILE = "file"  # a new or moved WAITING message goes to the wheel (or its span's mover)
    DUE_NOW = "due now"  # ... and is due already: release it once its record is durable
    CANCEL = "cancel"  # the wheel forgets the WAITING message's place
    HOLD = "hold"  # into its topic's ready window (or on disk only, if it does not rank)
    TAKE = "take"  # out of the window, in flight, with an ack timer at its deadline
    REQUEUE = "requeue"  # from in flight back to the ready window
    FORGET = "forget"  # RAM lets it go (window or in flight), if it holds it
    EXTEND = "extend"  # stays in flight, its ack timer at its new deadline
    WAKE = "wake"  # its topic's long polls pull again
    MOVE = "move"  # filed anew (a MOVE record): its old place never delivers it
    RELEASE_ID = "release id"  # the msgId is free: getMsg answers 404, a send stores it anew
    REPLACE = "replace"  # the send is stored again, in the released message's stead
    COUNT_READY = "count ready"
    COUNT_ACK = "count ack"
    COUNT_NACK = "count nack"
    COUNT_RETRY = "count retry"
    COUNT_ENDED = "count ended"  # EXPIRED or ENDED
    COUNT_DELETE = "count delete"


class Refusal(enum.Enum):
    """Why an event may not change the message (nothing changed)."""

    NOT_FOUND = "not found"  # no message has the id (404)
    ENDED = "ended"  # a delete of a final message (404)
    NOT_MOVABLE = "not movable"  # a reschedule of a consuming or final message (409)
    NOT_DEAD = "not dead"  # a redrive of a message neither EXPIRED nor ENDED (409)
    STALE = "stale"  # an ack, nack or extension fenced by a delivery that is not the current one (409)
    LEASE_CAP = "lease cap"  # an extension past its lease's longest (409)


class Step(NamedTuple):
    state: MessageState | None
    effects: tuple[Effect, ...] = ()
    refusal: Refusal | None = None


class Fencing(NamedTuple):
    """A fenced ack, nack or extension's outcome for one msgId (docs/api.md,
    "Leases"): the message's status after it (None: no such message), why
    it was refused (None: done), and an extension's new ack deadline."""

    status: Status | None
    refusal: Refusal | None = None
    deadline_ms: int = 0


# == events ======================================================================

@dataclass(frozen=True, slots=True)
class Send:
    """A send of the message `sent` (WAITING, retry 0) under an id that may
    be taken. `strict`: strictIdempotence (an ended message is answered,
    not replaced)."""

    sent: MessageState
    strict: bool = False


@dataclass(frozen=True, slots=True)
class Release:
    """Its trigger time came: the wheel released it, or a request made it
    due at once. `skipped`: a schedule's run that missed and ends unseen."""

    skipped: bool = False


class Pull(NamedTuple):  # (a tuple: one is made for every pull, by tuple.__new__ without a Python call)
    deadline_ms: int  # when this delivery's ack times out
    delivery: int  # this hand-over (`new_delivery`)


# (Ack, Nack and Extend are tuples, as Pull: a fenced call makes one a delivery it names.)
class Ack(NamedTuple):
    """ackMsg with ack=true; `delivery` its deliveryId's (0: none given,
    camellia's ack by msgId)."""

    delivery: int = 0


class Nack(NamedTuple):
    """ackMsg with ack=false; `delivery` as Ack's."""

    delivery: int = 0


class Extend(NamedTuple):
    """extendMsg: consuming until `deadline_ms`, for the holder of
    `delivery`, as long as the lease stays within `max_lease_ms` of its
    hand-over."""

    deadline_ms: int
    delivery: int
    max_lease_ms: int


class AckTimeout(NamedTuple):  # (a tuple, as Pull: one for every ack timer that fires)
    deadline_ms: int  # the deadline the timer was set for


@dataclass(frozen=True, slots=True)
class Ttl:
    """An expiry timer fired, or a refill read the message back from disk."""


@dataclass(frozen=True, slots=True)
class Delete:
    release: bool = False  # also free the msgId


@dataclass(frozen=True, slots=True)
class Reschedule:
    trigger_ms: int  # the new trigger time


@dataclass(frozen=True, slots=True)
class Redrive:
    """redriveMsg (now, not counted), or a redriveMsgs job's re-drive:
    `trigger_ms` its new trigger time (None: now), `counted` its
    redriveCount one more."""

    trigger_ms: int | None = None
    counted: bool = False


@dataclass(frozen=True, slots=True)
class RetryAt:
    """A failed push delivery: WAITING again until `at_ms` (a nack with a delay)."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Pulled for a long poll whose client hung up: READY as if never pulled."""


@dataclass(frozen=True, slots=True)
class EndPaused:
    """resumeTopic with onResume=expire: it fell due while paused."""


Event = (Send | Release | Pull | Ack | Nack | Extend | AckTimeout | Ttl | Delete | Reschedule | Redrive | GiveBack
         | RetryAt | EndPaused)

RELEASE, ACK, NACK, TTL, REDRIVE, GIVE_BACK = Release(), Ack(), Nack(), Ttl(), Redrive(), GiveBack()
END_PAUSED = EndPaused()
SKIPPED_RELEASE = Release(skipped=True)

E = Effect
_FILED = (E.FILE,)
_FILED_DUE = (E.FILE, E.DUE_NOW)
_HELD = (E.HOLD, E.WAKE, E.COUNT_READY)
_TAKEN = (E.TAKE,)
_EXTENDED = (E.EXTEND,)
_ENDED_AT_RELEASE = (E.COUNT_ENDED,)
_ENDED = (E.FORGET, E.COUNT_ENDED)
_ACKED_WAITING = (E.CANCEL, E.COUNT_ACK)
_ACKED_HELD = (E.FORGET, E.COUNT_ACK)
_REQUEUED = (E.REQUEUE, E.WAKE, E.COUNT_RETRY)
_NACK_REQUEUED = (E.REQUEUE, E.WAKE, E.COUNT_NACK, E.COUNT_RETRY)
_NACK_ENDED = (E.FORGET, E.COUNT_NACK, E.COUNT_ENDED)
_GIVEN_BACK = (E.REQUEUE, E.WAKE)
_REPLACED = (E.RELEASE_ID, E.REPLACE)
_RELEASED_ENDED = (E.RELEASE_ID, E.COUNT_DELETE)
_PAUSED_WAITING = (E.CANCEL, E.COUNT_ENDED)
_NOTHING: tuple[Effect, ...] = ()

# A cell of the table: (state, event, now_ms) -> Step. A cell is only ever
# called with the state of its column (None in the "no such id" one) and an
# event of its row, so each types its arguments as the table files it.
Rule = Callable[[Any, Any, int], Step]


def step(state: MessageState | None, event: Event, now_ms: int) -> Step:
    """What `event` at `now_ms` does to a message in `state` (None: no
    message has the id): its new state, the effects to carry out, or a
    refusal. One look-up in TABLE (the module docstring's table), one call
    of its cell."""
    return TABLE[type(event)][None if state is None else state.status](state, event, now_ms)


# == the cells, row by row (each states one rule, once) =========================

def _unchanged(state: MessageState | None, event: Event, now_ms: int) -> Step:
    """"-": nothing changes, no error."""
    return _new(Step, (state, _NOTHING, None))


def _not_found(state: None, event: Event, now_ms: int) -> Step:
    return _new(Step, (None, _NOTHING, Refusal.NOT_FOUND))


def _not_movable(state: MessageState, event: Reschedule, now_ms: int) -> Step:
    return _new(Step, (state, _NOTHING, Refusal.NOT_MOVABLE))


def _not_dead(state: MessageState, event: Redrive, now_ms: int) -> Step:
    return _new(Step, (state, _NOTHING, Refusal.NOT_DEAD))


def _send_new(state: None, event: Send, now_ms: int) -> Step:
    return _new(Step, (event.sent, _FILED_DUE if due(event.sent.trigger_ms, now_ms) else _FILED, None))


def _send_ended(state: MessageState, event: Send, now_ms: int) -> Step:
    return _new(Step, (state, _NOTHING if event.strict else _REPLACED, None))


def _release(state: MessageState, event: Release, now_ms: int) -> Step:
    if event.skipped or expired(state.trigger_ms, state.ttl_ms, now_ms):
        return _new(Step, (_to(state, EXPIRED, state.retry), _ENDED_AT_RELEASE, None))
    return _new(Step, (_to(state, READY, state.retry), _HELD, None))


def _pull(state: MessageState, event: Pull, now_ms: int) -> Step:
    s: Fields = state
    e: Fields = event
    return _new(Step, (_new(MessageState, (CONSUMING, state.retry + 1, s[2], s[3], s[4], e[0], e[1])), _TAKEN, None))


def _ack_waiting(state: MessageState, event: Ack, now_ms: int) -> Step:
    if event.delivery:
        return _new(Step, (state, _NOTHING, Refusal.STALE))  # (never handed over: no delivery is current)
    return _new(Step, (_to(state, ACKED, state.retry), _ACKED_WAITING, None))


def _ack_held(state: MessageState, event: Ack, now_ms: int) -> Step:
    if event.delivery and event.delivery != state.delivery:
        return _new(Step, (state, _NOTHING, Refusal.STALE))
    s: Fields = state
    return _new(Step, (_new(MessageState, (ACKED, s[1], s[2], s[3], s[4], 0, 0)), _ACKED_HELD, None))  # (_to, inline)


def _nack(state: MessageState, event: Nack, now_ms: int) -> Step:
    if event.delivery and event.delivery != state.delivery:
        return _new(Step, (state, _NOTHING, Refusal.STALE))
    return _retry_or_end(state, now_ms, _NACK_REQUEUED, _NACK_ENDED)


def _fenced_elsewhere(state: MessageState | None, event: Ack | Nack | Extend, now_ms: int) -> Step:
    """An ack or nack not consuming (or of no such id): "-" by msgId; fenced
    by a delivery, refused: none is current."""
    return _new(Step, (state, _NOTHING, Refusal.STALE if event.delivery else None))


def _extend(state: MessageState, event: Extend, now_ms: int) -> Step:
    if event.delivery != state.delivery:
        return _new(Step, (state, _NOTHING, Refusal.STALE))
    if event.deadline_ms - handed_over_ms(state.delivery) > event.max_lease_ms:
        return _new(Step, (state, _NOTHING, Refusal.LEASE_CAP))
    s: Fields = state
    e: Fields = event
    return _new(Step, (_new(MessageState, (s[0], s[1], s[2], s[3], s[4], e[0], s[6])), _EXTENDED, None))


def _ack_timeout(state: MessageState, event: AckTimeout, now_ms: int) -> Step:
    if state.deadline_ms != event.deadline_ms:
        return _new(Step, (state, _NOTHING, None))  # pulled again since: a stale timer [4]
    return _retry_or_end(state, now_ms, _REQUEUED, _ENDED)


def _ttl(state: MessageState, event: Ttl, now_ms: int) -> Step:
    if not expired(state.trigger_ms, state.ttl_ms, now_ms):
        return _new(Step, (state, _NOTHING, None))
    return _new(Step, (_to(state, EXPIRED if state.retry == 0 else ENDED, state.retry), _ENDED, None))


def _delete_waiting(state: MessageState, event: Delete, now_ms: int) -> Step:
    effects = (E.CANCEL, E.COUNT_DELETE, E.RELEASE_ID) if event.release else (E.CANCEL, E.COUNT_DELETE)
    return _new(Step, (_to(state, DELETED, state.retry), effects, None))


def _delete_held(state: MessageState, event: Delete, now_ms: int) -> Step:
    effects = (E.FORGET, E.COUNT_DELETE, E.RELEASE_ID) if event.release else (E.FORGET, E.COUNT_DELETE)
    return _new(Step, (_to(state, DELETED, state.retry), effects, None))


def _delete_ended(state: MessageState, event: Delete, now_ms: int) -> Step:
    return _new(Step, (state, _RELEASED_ENDED if event.release else _NOTHING, Refusal.ENDED))


def _reschedule(state: MessageState, event: Reschedule, now_ms: int) -> Step:
    moved = _new(MessageState, (WAITING, state.retry, state.max_retry, event.trigger_ms, state.ttl_ms, 0, 0))
    return _new(Step, (moved, (E.CANCEL if state.status is WAITING else E.FORGET, E.MOVE,
                               *(_FILED_DUE if due(event.trigger_ms, now_ms) else _FILED)), None))


def _redrive(state: MessageState, event: Redrive, now_ms: int) -> Step:
    trigger_ms = now_ms if event.trigger_ms is None else event.trigger_ms
    return _new(Step, (_new(MessageState, (WAITING, 0, state.max_retry, trigger_ms, state.ttl_ms, 0, 0)),
                       (E.MOVE, *(_FILED_DUE if due(trigger_ms, now_ms) else _FILED)), None))


def _retry_at(state: MessageState, event: RetryAt, now_ms: int) -> Step:
    if state.retry > state.max_retry or expired(state.trigger_ms, state.ttl_ms, max(now_ms, event.at_ms)):
        return _new(Step, (_to(state, ENDED, state.retry), _NACK_ENDED, None))
    later = _new(MessageState, (WAITING, state.retry, state.max_retry, event.at_ms, state.ttl_ms, 0, 0))
    return _new(Step, (later, (E.FORGET, E.MOVE, *(_FILED_DUE if due(event.at_ms, now_ms) else _FILED),
                               E.COUNT_NACK, E.COUNT_RETRY), None))


def _give_back(state: MessageState, event: GiveBack, now_ms: int) -> Step:
    return _new(Step, (_to(state, READY, state.retry - 1), _GIVEN_BACK, None))


def _end_paused_waiting(state: MessageState, event: EndPaused, now_ms: int) -> Step:
    return _new(Step, (_to(state, EXPIRED, state.retry), _PAUSED_WAITING, None))


def _end_paused_held(state: MessageState, event: EndPaused, now_ms: int) -> Step:
    return _new(Step, (_to(state, EXPIRED, state.retry), _ENDED, None))


def _retry_or_end(state: MessageState, now_ms: int, requeued: tuple[Effect, ...],
                  ended: tuple[Effect, ...]) -> Step:
    """A delivery was not acked: READY again, or ENDED after maxRetry + 1
    deliveries or past its ttl [3]."""
    if state.retry > state.max_retry or expired(state.trigger_ms, state.ttl_ms, now_ms):
        return _new(Step, (_to(state, ENDED, state.retry), ended, None))
    return _new(Step, (_to(state, READY, state.retry), requeued, None))


def _to(state: MessageState, status: Status, retry: int) -> MessageState:
    """`state` in `status` with `retry`, no ack deadline nor delivery (not consuming)."""
    s: Fields = state
    return _new(MessageState, (status, retry, s[2], s[3], s[4], 0, 0))


# == the table ===================================================================

_COLUMNS: tuple[Status | None, ...] = (None, *Status)


def _row(cells: dict[Status | None, Rule], otherwise: Rule = _unchanged) -> dict[Status | None, Rule]:
    """A row of the table: its cells, every other column `otherwise`."""
    return {column: cells.get(column, otherwise) for column in _COLUMNS}


# TABLE[type(event)][status, or None for no such id]: the cell that says what
# the event does. The module docstring draws it; a batch of one event may
# look its row up once and call the cells.
TABLE: dict[type[Event], dict[Status | None, Rule]] = {
    Send: _row({None: _send_new, ACKED: _send_ended, EXPIRED: _send_ended, ENDED: _send_ended,
                DELETED: _send_ended}),
    Release: _row({WAITING: _release}),
    Pull: _row({READY: _pull}),
    Ack: _row({WAITING: _ack_waiting, READY: _ack_held, CONSUMING: _ack_held}, _fenced_elsewhere),
    Nack: _row({CONSUMING: _nack}, _fenced_elsewhere),
    Extend: _row({CONSUMING: _extend}, _fenced_elsewhere),
    AckTimeout: _row({CONSUMING: _ack_timeout}),
    Ttl: _row({READY: _ttl}),
    Delete: _row({None: _not_found, WAITING: _delete_waiting, READY: _delete_held, CONSUMING: _delete_held},
                 _delete_ended),
    Reschedule: _row({None: _not_found, WAITING: _reschedule, READY: _reschedule}, _not_movable),
    Redrive: _row({None: _not_found, EXPIRED: _redrive, ENDED: _redrive}, _not_dead),
    RetryAt: _row({CONSUMING: _retry_at}),
    GiveBack: _row({CONSUMING: _give_back}),
    EndPaused: _row({WAITING: _end_paused_waiting, READY: _end_paused_held}),
}
