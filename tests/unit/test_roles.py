"""replication.roles.step: every move between roles, and every refusal,
as (state, event, now_ms) -> (state, actions); no sockets, no sleeps."""

from __future__ import annotations

import logging
from dataclasses import replace

from replication.roles import (
    RETRY_MS,
    ActionFailed,
    CatchUp,
    CaughtUp,
    Claim,
    ClaimDone,
    CloseElection,
    Crash,
    GatherPositions,
    HandOver,
    LeadershipEvent,
    Leading,
    Log,
    Polled,
    Position,
    PositionsGathered,
    RecordLeadership,
    Role,
    RoleState,
    StandDown,
    Started,
    StartFollowing,
    StartLeading,
    Stop,
    StopFollowing,
    step,
)

FOLLOWER = RoleState("n1", quorum=2, cluster_size=3)
CANDIDATE = replace(FOLLOWER, role=Role.CANDIDATE, term=7)
LEADER = replace(FOLLOWER, role=Role.LEADER, term=7)
MINE = Position(6, 100, ((6, 0),))


def gathered(*peers: tuple[str, Position], refusals=(), is_leader=True, raft_term=7, term=7) -> PositionsGathered:
    return PositionsGathered(term, (("n1", MINE), *peers), tuple(refusals), is_leader, raft_term)


def gave_up(state, actions, now_ms, why=None, level=logging.INFO):
    assert state == replace(FOLLOWER, term=7, next_try_ms=now_ms + RETRY_MS)
    assert actions == ([] if why is None else [Log(level, why)]) + [StartFollowing()]


def test_starting_follows():
    assert step(FOLLOWER, Started(), 0) == (FOLLOWER, [StartFollowing()])


def test_a_follower_raft_calls_leader_becomes_a_candidate_and_gathers_positions():
    assert step(FOLLOWER, Polled(False, 7, "n2"), 0) == (FOLLOWER, [])
    assert step(FOLLOWER, Polled(True, 7, "n1"), 0) == (CANDIDATE, [StopFollowing(), GatherPositions(7)])


def test_a_follower_that_just_gave_up_waits_before_the_next_try():
    waiting = replace(FOLLOWER, next_try_ms=1_200)
    assert step(waiting, Polled(True, 8, "n1"), 1_199) == (waiting, [])
    state, actions = step(waiting, Polled(True, 8, "n1"), 1_200)
    assert state.role is Role.CANDIDATE and state.term == 8 and actions == [StopFollowing(), GatherPositions(8)]


def test_positions_of_a_majority_with_this_node_most_advanced_lead_to_a_claim():
    assert step(CANDIDATE, gathered(("n2", Position(6, 90))), 0) == (CANDIDATE, [Claim(7)])
    # equal positions: this node (first) is the best, no catch-up
    assert step(CANDIDATE, gathered(("n2", MINE), ("n3", MINE)), 0) == (CANDIDATE, [Claim(7)])


def test_a_more_advanced_peer_is_caught_up_from_first():
    ahead = Position(6, 150, ((6, 0),))
    newer = Position(7, 10, ((6, 0), (7, 120)))
    assert step(CANDIDATE, gathered(("n2", ahead)), 0) == (CANDIDATE, [CatchUp(7, "n2", ahead)])
    # a later epoch beats a longer log; the first of equals wins
    assert step(CANDIDATE, gathered(("n2", ahead), ("n3", newer)), 0) == (CANDIDATE, [CatchUp(7, "n3", newer)])
    assert step(CANDIDATE, gathered(("n2", ahead), ("n3", ahead)), 0) == (CANDIDATE, [CatchUp(7, "n2", ahead)])
    assert step(CANDIDATE, CaughtUp(7, True, 7), 0) == (CANDIDATE, [Claim(7)])


def test_refused_no_quorum():
    gave_up(*step(CANDIDATE, gathered(), 500), 500, "term 7: 1 of 3 nodes answered, a majority is needed")


def test_refused_a_peer_promised_a_newer_epoch():
    event = gathered(("n2", MINE), refusals=[("n3", 9), ("n2", 8)])
    gave_up(*step(CANDIDATE, event, 500), 500, "term 7: n3 has promised term 9")


def test_refused_the_term_moved_on_before_the_claim():
    gave_up(*step(CANDIDATE, gathered(("n2", MINE), raft_term=8), 500), 500)
    gave_up(*step(CANDIDATE, gathered(("n2", MINE), is_leader=False), 500), 500)
    gave_up(*step(CANDIDATE, CaughtUp(7, True, 8), 500), 500)
    gave_up(*step(CANDIDATE, CaughtUp(7, False, 7), 500), 500)


def test_refused_a_claim_not_committed_or_overtaken():
    gave_up(*step(CANDIDATE, ClaimDone(7, False, 7, True), 500), 500, "term 7: the claim was not committed")
    gave_up(*step(CANDIDATE, ClaimDone(7, True, 8, True), 500), 500, "term 7: a newer term appeared while claiming")
    gave_up(*step(CANDIDATE, ClaimDone(7, True, 7, False), 500), 500, "term 7: a newer term appeared while claiming")


def test_a_committed_claim_starts_leading_and_records_it():
    assert step(CANDIDATE, ClaimDone(7, True, 7, True), 0) == (CANDIDATE, [StartLeading(7)])
    assert step(CANDIDATE, Leading(7), 0) == (LEADER, [RecordLeadership(7, LeadershipEvent.START)])


def test_answers_to_an_attempt_that_is_over_are_ignored():
    for event in (gathered(term=6), CaughtUp(6, True, 6), ClaimDone(6, True, 6, True), Leading(6)):
        assert step(CANDIDATE, event, 0) == (CANDIDATE, [])
        assert step(FOLLOWER, event, 0) == (FOLLOWER, [])
    assert step(CANDIDATE, Polled(True, 7, "n1"), 0) == (CANDIDATE, [])


def test_a_failed_attempt_is_given_up():
    error = ConnectionError("catch-up from n2 stopped at 100: diverged")
    for action in (GatherPositions(7), CatchUp(7, "n2", MINE), Claim(7), StartLeading(7)):
        gave_up(*step(CANDIDATE, ActionFailed(action, error), 500), 500,
                f"term 7: could not take the lead: {error!r}", logging.WARNING)
    # recording the start is part of taking the lead, too
    state, actions = step(LEADER, ActionFailed(RecordLeadership(7, LeadershipEvent.START), error), 500)
    assert state.role is Role.FOLLOWER and actions[-1] == StartFollowing()


def test_any_other_failure_stops_the_node():
    error = OSError("disk")
    assert step(LEADER, ActionFailed(StandDown(7, "x"), error), 0) == (LEADER, [Crash(error)])
    assert step(FOLLOWER, ActionFailed(RecordLeadership(7, LeadershipEvent.END), error), 0)[1] == [Crash(error)]


def test_a_leader_stays_while_raft_keeps_it_and_no_one_deposes_it():
    assert step(LEADER, Polled(True, 7, "n1"), 0) == (LEADER, [])


def stood_down(state, actions, reason):
    assert state == replace(LEADER, role=Role.FOLLOWER)
    assert actions == [Log(logging.WARNING, f"term 7: standing down: {reason}"), StandDown(7, reason),
                       RecordLeadership(7, LeadershipEvent.END), StartFollowing()]


def test_a_leader_stands_down_when_raft_moves_on():
    stood_down(*step(LEADER, Polled(True, 8, "n1"), 0), "Raft moved on (term 8, leader n1)")
    stood_down(*step(LEADER, Polled(False, 7, "n2"), 0), "Raft moved on (term 7, leader n2)")
    # Raft moving on comes before any other reason
    stood_down(*step(LEADER, Polled(False, 8, None, True, "E()"), 0), "Raft moved on (term 8, leader None)")


def test_a_leader_stands_down_when_deposed_or_its_broker_failed():
    stood_down(*step(LEADER, Polled(True, 7, "n1", deposed=True), 0), "a peer knows a newer epoch")
    stood_down(*step(LEADER, Polled(True, 7, "n1", deposed=True, broker_failure="OSError()"), 0),
               "a peer knows a newer epoch")
    stood_down(*step(LEADER, Polled(True, 7, "n1", broker_failure="OSError('disk')"), 0),
               "the broker failed: OSError('disk')")


def test_a_standing_down_leader_may_try_again_at_once():
    state, _ = step(LEADER, Polled(True, 7, "n1", deposed=True), 0)
    assert state.next_try_ms == 0
    assert step(state, Polled(True, 7, "n1"), 0)[1] == [StopFollowing(), GatherPositions(7)]


def test_stopping_hands_the_lead_over_and_then_tries_nothing():
    state, actions = step(LEADER, Stop(), 0)
    assert state == replace(LEADER, stopping=True)  # still shown as leader while it drains
    assert actions == [HandOver(7), RecordLeadership(7, LeadershipEvent.END), CloseElection(), StopFollowing()]
    assert step(state, Polled(False, 8, "n2"), 0) == (state, [])
    state, actions = step(FOLLOWER, Stop(), 0)
    assert actions == [CloseElection(), StopFollowing()]
    assert step(state, Polled(True, 8, "n1"), 0) == (state, [])
    state, actions = step(CANDIDATE, Stop(), 0)
    assert state.role is Role.CANDIDATE and actions == [CloseElection(), StopFollowing()]
