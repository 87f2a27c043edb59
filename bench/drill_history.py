"""What a fault drill records (its *history*) and the checker that judges it.

bench/drills.py records every operation its clients make, with the time it
started and the time its answer came (ms since the epoch, the drill's
clock: every node runs on the same machine, so the same clock), every
message a pull handed out, and every fault it injected. When the faults
stop and the cluster settles, `check(history)` reads the whole history and
counts what docs/api.md forbids. It is pure (no clock, no I/O), so it is
tested on hand-made histories (tests/unit/test_drill_history.py), those
that must pass and those that must fail.

What it can know. A client sees an operation between its start and its
end; the node applied it somewhere in between, or never (a timeout, a
refused connection: `ok` False, outcome unknown). The checker counts only
what no order of those unknowns could explain:

    rule (docs/api.md)                       counted as        when
    a send answered 200 is delivered         lost              never delivered, not deleted (any attempt),
                                                               not past its expiry, not out of retries
    never delivered before its trigger       early             delivery received < trigger time in force
    an acked message is never delivered      after_ack         a pull started after an ack answered 200
    a deleted one neither                    after_delete      a pull started after a delete answered 200
    rescheduled: never at its old time       early             a pull started after the reschedule's answer,
                                                               received before the new trigger
    a send's answer names what is stored     answer_mismatch   a delivery with another trigger than its send's
                                                               answer names, before any reschedule of it began
    one consuming message per (topic, key)   key_violations    a pull of the key started after another
                                                               message of it was received, and answered
                                                               before that one's ack or nack started and
                                                               before its ack timeout could have passed
                                                               (on a standalone node, and no kill between:
                                                               a pull is answered before its fsync there)
    one message per recurring schedule's     runs_twice        a (topic, scheduleId, nominal time) delivered
    run, made once whatever fails                              with more than one produceTime, or a run
                                                               whose msgId is not `<scheduleId>@<nominal>`
    a run never before its nominal time      runs_early        a run received before its scheduledTime

The trigger "in force" for a delivery is the send's, or a reschedule's
answered 200 before the pull started (a reschedule whose answer came
while the pull ran may or may not have applied: the earlier of the two).
A delivery received before its send was answered (the answer of an
attempt, or of a retry, was lost or slow) is judged by the trigger it
names. And since the drill's sends are strictly idempotent
(strictIdempotence=true: an id's every answer is the one message stored
under it, ended or not), every delivery until a reschedule of the
message began must name the trigger the send's answer names
(`answer_mismatch`): another means a node answered 200 for a message
that is not the one it stored and delivered.

A recurring schedule's run (docs/api.md, "Recurring schedules") is one
message whatever restarts or failovers happen: its msgId is derived from
the schedule and the nominal time, and the node that makes it records it
before sending it strictly, so a second message for the same nominal time
(a second produceTime: the run made again after a crash or by a second
node) is `runs_twice`, while the same message delivered twice (the same
produceTime) is only a duplicate. Runs are judged among the deliveries
that carry `scheduled_ms` (bench/drills.py records it, and the produce
time, with every delivery: a run is any message answered with a
`scheduledTime`).

Duplicates are not errors (delivery is at least once), but each is
counted with the fault nearest to it in time: a delivery of a message
after its first that no nack asked for (the drill nacks some on purpose).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

# A delivery counts as the same as another within this many ms of its fault.
NEAR_FAULT_MS = 10_000
# The counts a correct run has at 0.
MUST_BE_ZERO = ("lost", "early", "after_ack", "after_delete", "key_violations", "answer_mismatch", "runs_twice",
                "runs_early")


@dataclass(frozen=True)
class Sent:
    """A message a send (or a batch send) was answered 200 for."""

    topic: str
    msg_id: str
    trigger_ms: int  # the answer's triggerTime
    expire_ms: int  # the answer's expireTime
    max_retry: int
    key: str | None
    answered_ms: int  # the send's end


@dataclass(frozen=True)
class Op:
    """One client call (not a send or a pull): delete, reschedule, ack,
    nack. `ok`: answered code 200 (False: refused, or outcome unknown);
    `applied`: what the answer says changed (a delete that answered 404,
    an ack_many result whose status is not 4, a reschedule answered 409:
    False)."""

    kind: str  # "delete" | "reschedule" | "ack" | "nack"
    topic: str
    msg_id: str
    start_ms: int
    end_ms: int
    ok: bool
    applied: bool
    # a reschedule's triggerTime: the answer's, or (outcome unknown) the one asked for
    new_trigger_ms: int | None = None


@dataclass(frozen=True)
class Delivery:
    """One message a pull (or long poll) answered with."""

    topic: str
    msg_id: str
    poll_start_ms: int
    received_ms: int
    retry: int
    trigger_ms: int  # as the delivered message says
    key: str | None
    ack_timeout_ms: int
    # a recurring schedule's run: its message's produceTime and scheduledTime
    # (None for any other message)
    produce_ms: int | None = None
    scheduled_ms: int | None = None


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "pause" | "partition" | "full_disk" | ...
    node: str
    was_leader: bool
    start_ms: int
    end_ms: int  # healed (restarted, resumed, reconnected)


@dataclass
class History:
    sent: list[Sent] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    send_attempts: int = 0  # every send tried (answered or not)
    # A cluster answers a pull once a quorum has it; a standalone node
    # before its fsync (docs/api.md, "Pulling"), so a kill -9 may undo a
    # pull: the message is ready again and its key free.
    pulls_durable: bool = True
    end_ms: int = 0  # when the history was closed (after the drain)

    def __repr__(self) -> str:
        return (f"History(sent={len(self.sent)}, ops={len(self.ops)}, deliveries={len(self.deliveries)}, "
                f"faults={len(self.faults)})")

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> History:
        """A history as `dataclasses.asdict` wrote it (bench/drills.py --history)."""
        return cls([Sent(**s) for s in saved["sent"]], [Op(**o) for o in saved["ops"]],
                   [Delivery(**d) for d in saved["deliveries"]], [Fault(**f) for f in saved["faults"]],
                   saved["send_attempts"], saved["pulls_durable"], saved["end_ms"])


@dataclass
class Findings:
    """What `check` counted; `examples` holds a few of each nonzero count."""

    lost: int = 0
    early: int = 0
    after_ack: int = 0
    after_delete: int = 0
    key_violations: int = 0
    answer_mismatch: int = 0
    runs_twice: int = 0
    runs_early: int = 0
    duplicates: int = 0
    duplicates_by_fault: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, what: str, example: str) -> None:
        setattr(self, what, getattr(self, what) + 1)
        shown = self.examples.setdefault(what, [])
        if len(shown) < 5:
            shown.append(example)

    @property
    def failed(self) -> list[str]:
        """The counts that must be zero and are not."""
        return [name for name in MUST_BE_ZERO if getattr(self, name)]

    def as_dict(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in MUST_BE_ZERO}, "duplicates": self.duplicates,
                "duplicates_by_fault": self.duplicates_by_fault, "examples": self.examples}


MsgKey = tuple[str, str]  # (topic, msgId)


def _index(history: History) -> tuple[dict[MsgKey, list[Delivery]], dict[MsgKey, list[Op]], dict[MsgKey, Sent]]:
    """Deliveries (in order received), operations and sends by message."""
    by_msg: dict[MsgKey, list[Delivery]] = defaultdict(list)
    for d in sorted(history.deliveries, key=lambda d: d.received_ms):
        by_msg[(d.topic, d.msg_id)].append(d)
    ops: dict[MsgKey, list[Op]] = defaultdict(list)
    for op in history.ops:
        ops[(op.topic, op.msg_id)].append(op)
    return by_msg, ops, {(s.topic, s.msg_id): s for s in history.sent}


def count_lost(history: History) -> int:
    """`check(history).lost` alone: what a drain polls every second."""
    found = Findings()
    by_msg, ops, sent = _index(history)
    _check_lost(history, sent, by_msg, ops, found)
    return found.lost


def check(history: History) -> Findings:
    """Every count of the module docstring's table, over the whole history."""
    found = Findings()
    by_msg, ops, sent = _index(history)
    _check_lost(history, sent, by_msg, ops, found)
    _check_early(sent, by_msg, ops, found)
    _check_answers(sent, by_msg, ops, found)
    _check_after(by_msg, ops, found)
    undone = [] if history.pulls_durable else sorted(f.start_ms for f in history.faults if f.kind == "kill")
    _check_keys(by_msg, ops, undone, found)
    _check_runs(history.deliveries, found)
    _count_duplicates(history.faults, by_msg, ops, found)
    return found


def _check_lost(history: History, sent: dict[MsgKey, Sent], by_msg: dict[MsgKey, list[Delivery]],
                ops: dict[MsgKey, list[Op]], found: Findings) -> None:
    for key, s in sent.items():
        if by_msg.get(key):
            continue
        if any(op.kind == "delete" for op in ops.get(key, ())):
            continue  # any delete attempt may have applied
        if s.expire_ms <= history.end_ms:
            continue  # may have ended by its ttl (status 5)
        moved = [op.new_trigger_ms for op in ops.get(key, ()) if op.kind == "reschedule"]
        if any(t is None or t > history.end_ms for t in moved):
            continue  # rescheduled to a time the history did not reach (or an unknown one)
        found.note("lost", f"{s.topic}/{s.msg_id} (trigger {s.trigger_ms})")


def _trigger_in_force(s: Sent | None, d: Delivery, ops: list[Op]) -> int | None:
    """The earliest trigger time the message may have had when `d`'s pull
    ran: the send's, or that of the last reschedule answered before the
    pull started; a reschedule not yet answered then (or of unknown
    outcome) may or may not have applied, so the earlier of the two. A
    delivery received before the send's answer is judged by the trigger
    it names (and `_check_answers` holds that trigger to the answer's)."""
    trigger = s.trigger_ms if s is not None and s.answered_ms <= d.received_ms else None
    for op in sorted((o for o in ops if o.kind == "reschedule"), key=lambda o: o.end_ms):
        if op.start_ms > d.received_ms:
            break  # after the delivery: no bearing
        if op.ok and op.applied and op.new_trigger_ms is not None and op.end_ms < d.poll_start_ms:
            trigger = op.new_trigger_ms
        elif op.ok and not op.applied:
            continue  # refused (409, 404): no change
        elif op.new_trigger_ms is not None and trigger is not None:
            trigger = min(trigger, op.new_trigger_ms)  # may or may not have applied before the pull
        else:
            trigger = None  # cannot judge this delivery
    return trigger


def _check_early(sent: dict[MsgKey, Sent], by_msg: dict[MsgKey, list[Delivery]], ops: dict[MsgKey, list[Op]],
                 found: Findings) -> None:
    for key, deliveries in by_msg.items():
        for d in deliveries:
            in_force = _trigger_in_force(sent.get(key), d, ops.get(key, []))
            # delivered before the trigger time it says it has is early too
            trigger = d.trigger_ms if in_force is None else max(in_force, d.trigger_ms)
            if d.received_ms < trigger:
                found.note("early", f"{d.topic}/{d.msg_id} received {d.received_ms} < trigger {trigger}")


def _check_answers(sent: dict[MsgKey, Sent], by_msg: dict[MsgKey, list[Delivery]], ops: dict[MsgKey, list[Op]],
                   found: Findings) -> None:
    """Every delivery received before a reschedule of the message began
    bears the trigger its send's answer names: the drill's sends are
    strictly idempotent, it redrives nothing, and nothing else changes a
    stored message's trigger (a nack, an ack timeout, a kill keep it)."""
    for key, s in sent.items():
        moved_ms = min((op.start_ms for op in ops.get(key, ()) if op.kind == "reschedule"), default=None)
        for d in by_msg.get(key, ()):
            if moved_ms is not None and d.received_ms >= moved_ms:
                break  # in order received: the rest may bear a reschedule's trigger
            if d.trigger_ms != s.trigger_ms:
                found.note("answer_mismatch", f"{d.topic}/{d.msg_id} received {d.received_ms} with trigger "
                                              f"{d.trigger_ms}; its send answered {s.answered_ms} with trigger "
                                              f"{s.trigger_ms}")


def _check_after(by_msg: dict[MsgKey, list[Delivery]], ops: dict[MsgKey, list[Op]], found: Findings) -> None:
    for key, msg_ops in ops.items():
        for op in msg_ops:
            if not (op.ok and op.applied) or op.kind not in ("ack", "delete"):
                continue
            for d in by_msg.get(key, ()):
                if d.poll_start_ms > op.end_ms:
                    what = "after_ack" if op.kind == "ack" else "after_delete"
                    found.note(what, f"{d.topic}/{d.msg_id}: {op.kind} answered {op.end_ms}, "
                                     f"pulled {d.poll_start_ms}..{d.received_ms}")
                    break


def _check_keys(by_msg: dict[MsgKey, list[Delivery]], ops: dict[MsgKey, list[Op]], undone: list[int],
                found: Findings) -> None:
    """`undone`: times of kills that may have undone a pull (not durable)."""
    by_key: dict[tuple[str, str], list[tuple[Delivery, int]]] = defaultdict(list)
    for key, deliveries in by_msg.items():
        settles = sorted(op.start_ms for op in ops.get(key, ()) if op.kind in ("ack", "nack", "delete"))
        for d in deliveries:
            if d.key is None:
                continue
            # certainly consuming from its receipt until its ack or nack was
            # sent, and at most until its ack timeout (from the pull's start)
            i = bisect.bisect_left(settles, d.received_ms)
            settled = settles[i] if i < len(settles) else None
            busy_until = d.poll_start_ms + d.ack_timeout_ms
            if settled is not None:
                busy_until = min(busy_until, settled)
            by_key[(d.topic, d.key)].append((d, busy_until))
    for (topic, k), held in by_key.items():
        held.sort(key=lambda pair: pair[0].received_ms)
        for i, (d, busy_until) in enumerate(held):
            for j in range(i + 1, len(held)):  # (indices: a slice a delivery would copy the rest, O(n^2))
                other = held[j][0]
                if other.received_ms >= busy_until:
                    break  # the rest were received later still
                u = bisect.bisect_left(undone, d.poll_start_ms)
                if u < len(undone) and undone[u] <= other.received_ms:
                    continue  # a kill between them may have undone d's pull
                if other.msg_id != d.msg_id and other.poll_start_ms >= d.received_ms:
                    found.note("key_violations", f"{topic} key {k}: {other.msg_id} pulled "
                                                 f"{other.poll_start_ms}..{other.received_ms} while {d.msg_id} "
                                                 f"consumed {d.received_ms}..{busy_until}")


def _check_runs(deliveries: list[Delivery], found: Findings) -> None:
    """Each recurring schedule's run one message (one produceTime per
    (topic, scheduleId, nominal time), its msgId `<scheduleId>@<nominal>`),
    none received before its nominal time."""
    produced: dict[tuple[str, str, int], set[int]] = defaultdict(set)
    for d in deliveries:
        if d.scheduled_ms is None:
            continue
        schedule_id, at, nominal = d.msg_id.rpartition("@")
        if not at or nominal != str(d.scheduled_ms):
            found.note("runs_twice", f"{d.topic}/{d.msg_id}: scheduledTime {d.scheduled_ms} is not its msgId's")
            continue
        if d.produce_ms is not None:
            produced[(d.topic, schedule_id, d.scheduled_ms)].add(d.produce_ms)
        if d.received_ms < d.scheduled_ms:
            found.note("runs_early", f"{d.topic}/{d.msg_id} received {d.received_ms} before its nominal time")
    for (topic, schedule_id, nominal_ms), times in sorted(produced.items()):
        if len(times) > 1:
            found.note("runs_twice", f"{topic}/{schedule_id}@{nominal_ms} made {len(times)} times "
                                     f"(produceTimes {sorted(times)})")


def _count_duplicates(faults: list[Fault], by_msg: dict[MsgKey, list[Delivery]], ops: dict[MsgKey, list[Op]],
                      found: Findings) -> None:
    """A delivery after the first is expected after a nack (answered or
    not) sent between the two; any other is a duplicate, counted with the
    fault whose start is nearest (within NEAR_FAULT_MS; "none" else)."""
    starts = sorted((f.start_ms, f"{f.kind}{'-leader' if f.was_leader else ''}") for f in faults)
    counts: Counter[str] = Counter()
    for key, deliveries in by_msg.items():
        nacks = [op.start_ms for op in ops.get(key, ()) if op.kind == "nack"]
        for before, d in itertools.pairwise(deliveries):
            if any(before.received_ms <= t <= d.received_ms for t in nacks):
                continue
            found.duplicates += 1
            counts[_nearest(starts, d.received_ms)] += 1
    found.duplicates_by_fault = dict(counts)


def _nearest(starts: list[tuple[int, str]], at_ms: int) -> str:
    best: tuple[int, str] | None = None
    for start, name in starts:
        gap = abs(at_ms - start)
        if gap <= NEAR_FAULT_MS and (best is None or gap < best[0]):
            best = (gap, name)
    return best[1] if best else "none"
