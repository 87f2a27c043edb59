"""A cluster node's role decisions, as a pure step function.

    state, actions = step(state, event, now_ms)

No I/O, no clock, no election object: the node's role loop (broker.cluster
.role_loop) feeds each thing it observed as an event and carries out the
actions in order; an action that produces a result feeds it back as the
next event. `now_ms` is monotonic milliseconds, for the retry timer.

    FOLLOWER ──Polled: Raft calls it leader──► CANDIDATE(T)  [StopFollowing,
       ▲        (not before next_try_ms)           │          GatherPositions(T)]
       │                                           ▼
       │   PositionsGathered: a peer refused ──► give up     ◄── no majority
       │   best position is another's ──► [CatchUp] ── CaughtUp ──┐
       │                                                          ▼
       │            Raft moved on ◄── (is it still Raft's leader of T?) ──► [Claim(T)]
       │                                                                      │
       │   ClaimDone: not committed, or a newer term ──► give up              │
       │   committed ──► [StartLeading(T)] ── Leading ──► LEADER(T) [RecordLeadership START]
       │                                                     │
       └── Polled: Raft moved on / deposed / broker failed ──┘ [StandDown, RecordLeadership END,
                                                                StartFollowing]

Giving up an attempt makes the node a follower again (StartFollowing) that
waits RETRY_MS before the next: Raft may keep it leader. Stop (SIGTERM)
hands the lead over when leading; a stopping node tries nothing more.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field, replace

# After a failed attempt to lead, a follower waits this long before the next.
RETRY_MS = 200


class Role(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"  # elected by Raft, not yet leading; shown as a follower
    LEADER = "leader"


class LeadershipEvent(enum.Enum):
    """The two kinds of line of leadership.log."""

    START = "start"
    END = "end"


@dataclass(frozen=True)
class Position:
    """A node's log position: the epoch of its last record, its log end,
    and its epoch history (see replication.epochs)."""

    last_epoch: int
    end_offset: int
    history: tuple[tuple[int, int], ...] = ()

    @property
    def rank(self) -> tuple[int, int]:
        """The most advanced log is the one with the highest rank."""
        return self.last_epoch, self.end_offset


@dataclass(frozen=True)
class RoleState:
    node_id: str
    quorum: int  # nodes that make a majority, this one counted
    cluster_size: int
    role: Role = Role.FOLLOWER
    term: int = 0  # the term tried (candidate), led (leader) or last led
    next_try_ms: int = 0  # a follower tries to lead no earlier than this
    stopping: bool = False


# == events ======================================================================

@dataclass(frozen=True)
class Started:
    """The role loop starts."""


@dataclass(frozen=True)
class Polled:
    """What the role loop saw on one poll (every POLL_S)."""

    is_leader: bool  # Raft calls this node leader
    term: int  # Raft's term
    leader_id: str | None  # Raft's leader
    deposed: bool = False  # a peer knows a newer epoch than the one led
    broker_failure: str | None = None  # the leader's broker failed (its repr)


@dataclass(frozen=True)
class PositionsGathered:
    """The promises asked for term `term`, and what came back, in peer
    order. `positions` has this node first; peers that did not answer are
    in neither tuple."""

    term: int
    positions: tuple[tuple[str, Position], ...]
    refusals: tuple[tuple[str, int], ...] = ()  # (peer, the term it promised)
    is_leader: bool = True  # Raft's view once the answers were in
    raft_term: int = 0


@dataclass(frozen=True)
class CaughtUp:
    term: int
    is_leader: bool  # Raft's view once caught up
    raft_term: int


@dataclass(frozen=True)
class ClaimDone:
    term: int
    committed: bool
    promised: int  # this node's promise once the claim was answered
    is_leader: bool


@dataclass(frozen=True)
class Leading:
    """The broker runs: this node leads `term`."""

    term: int


@dataclass(frozen=True)
class ActionFailed:
    """Carrying out `action` raised `error`."""

    action: Action
    error: BaseException = field(compare=False)


@dataclass(frozen=True)
class Stop:
    """SIGTERM: hand the lead over (if leading) and leave."""


Event = Started | Polled | PositionsGathered | CaughtUp | ClaimDone | Leading | ActionFailed | Stop


# == actions =====================================================================

@dataclass(frozen=True)
class StartFollowing:
    """Run the follower's fetch loop."""


@dataclass(frozen=True)
class StopFollowing:
    pass


@dataclass(frozen=True)
class GatherPositions:
    """Promise `term` here, then ask every peer for its promise and log
    position; answer with PositionsGathered."""

    term: int


@dataclass(frozen=True)
class CatchUp:
    """Fetch the log from `source` up to its position (or a snapshot);
    answer with CaughtUp."""

    term: int
    source: str
    position: Position


@dataclass(frozen=True)
class Claim:
    """Replicate "this node leads `term`" through the election; answer with
    ClaimDone."""

    term: int


@dataclass(frozen=True)
class StartLeading:
    """Record epoch `term` from the log end, open the broker; answer with
    Leading."""

    term: int


@dataclass(frozen=True)
class RecordLeadership:
    term: int
    event: LeadershipEvent


@dataclass(frozen=True)
class StandDown:
    """Stop the broker, fail the writes waiting for a quorum."""

    term: int
    reason: str


@dataclass(frozen=True)
class HandOver:
    """Drain the lead of `term` to the followers (see broker.cluster.lead)."""

    term: int


@dataclass(frozen=True)
class CloseElection:
    pass


@dataclass(frozen=True)
class Log:
    level: int
    text: str


@dataclass(frozen=True)
class Crash:
    """An action failed where nothing can recover: the node stops."""

    error: BaseException = field(compare=False)


Action = (StartFollowing | StopFollowing | GatherPositions | CatchUp | Claim | StartLeading | RecordLeadership
          | StandDown | HandOver | CloseElection | Log | Crash)


# == the step function ===========================================================

def step(state: RoleState, event: Event, now_ms: int) -> tuple[RoleState, list[Action]]:
    """The next state, and what to do, after `event` at monotonic `now_ms`."""
    if isinstance(event, Stop):
        actions: list[Action] = []
        if state.role is Role.LEADER:
            actions = [HandOver(state.term), RecordLeadership(state.term, LeadershipEvent.END)]
        return replace(state, stopping=True), [*actions, CloseElection(), StopFollowing()]
    if isinstance(event, Started):
        return replace(state, role=Role.FOLLOWER), [StartFollowing()]
    if isinstance(event, Polled):
        return _polled(state, event, now_ms)
    if isinstance(event, ActionFailed):
        return _failed(state, event, now_ms)
    if state.role is not Role.CANDIDATE or event.term != state.term:
        return state, []  # an answer to an attempt that is over
    if isinstance(event, PositionsGathered):
        return _gathered(state, event, now_ms)
    if isinstance(event, CaughtUp):
        return _claim_if_still_elected(state, event.is_leader, event.raft_term, now_ms)
    if isinstance(event, ClaimDone):
        if not event.committed:
            return _give_up(state, now_ms, f"term {state.term}: the claim was not committed")
        if event.promised > state.term or not event.is_leader:
            return _give_up(state, now_ms, f"term {state.term}: a newer term appeared while claiming")
        return state, [StartLeading(state.term)]
    # Leading
    return replace(state, role=Role.LEADER), [RecordLeadership(state.term, LeadershipEvent.START)]


def _polled(state: RoleState, event: Polled, now_ms: int) -> tuple[RoleState, list[Action]]:
    if state.stopping:
        return state, []
    if state.role is Role.FOLLOWER:
        if event.is_leader and now_ms >= state.next_try_ms:
            return replace(state, role=Role.CANDIDATE, term=event.term), [StopFollowing(), GatherPositions(event.term)]
        return state, []
    if state.role is Role.LEADER:
        reason = stand_down_reason(state, event)
        if reason is not None:
            return replace(state, role=Role.FOLLOWER), [
                Log(logging.WARNING, f"term {state.term}: standing down: {reason}"),
                StandDown(state.term, reason), RecordLeadership(state.term, LeadershipEvent.END), StartFollowing()]
    return state, []


def stand_down_reason(state: RoleState, event: Polled) -> str | None:
    """Why the leader of `state.term` must stand down now (None: it need not)."""
    if not event.is_leader or event.term != state.term:
        return f"Raft moved on (term {event.term}, leader {event.leader_id})"
    if event.deposed:
        return "a peer knows a newer epoch"
    if event.broker_failure is not None:
        return f"the broker failed: {event.broker_failure}"
    return None


def _gathered(state: RoleState, event: PositionsGathered, now_ms: int) -> tuple[RoleState, list[Action]]:
    term = state.term
    if event.refusals:
        peer, promised = event.refusals[0]
        return _give_up(state, now_ms, f"term {term}: {peer} has promised term {promised}")
    positions = dict(event.positions)
    if len(positions) < state.quorum:
        return _give_up(state, now_ms, f"term {term}: {len(positions)} of {state.cluster_size} nodes answered, "
                                       "a majority is needed")
    best = max(positions, key=lambda n: positions[n].rank)  # the first of equals: this node comes first
    if best != state.node_id and positions[best].rank > positions[state.node_id].rank:
        return state, [CatchUp(term, best, positions[best])]
    return _claim_if_still_elected(state, event.is_leader, event.raft_term, now_ms)


def _claim_if_still_elected(state: RoleState, is_leader: bool, raft_term: int,
                            now_ms: int) -> tuple[RoleState, list[Action]]:
    if not is_leader or raft_term != state.term:
        return _give_up(state, now_ms, None)
    return state, [Claim(state.term)]


def _failed(state: RoleState, event: ActionFailed, now_ms: int) -> tuple[RoleState, list[Action]]:
    """An attempt to lead that raised is given up (as if refused); anything
    else that raised stops the node."""
    starting = isinstance(event.action, RecordLeadership) and event.action.event is LeadershipEvent.START
    if state.role is Role.CANDIDATE or starting:
        return _give_up(state, now_ms, f"term {state.term}: could not take the lead: {event.error!r}",
                        logging.WARNING)
    return state, [Crash(event.error)]


def _give_up(state: RoleState, now_ms: int, why: str | None,
             level: int = logging.INFO) -> tuple[RoleState, list[Action]]:
    """Back to following; Raft may keep this node leader: try again shortly."""
    logged: list[Action] = [] if why is None else [Log(level, why)]
    return replace(state, role=Role.FOLLOWER, next_try_ms=now_ms + RETRY_MS), [*logged, StartFollowing()]
