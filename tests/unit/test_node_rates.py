"""broker.shards.rates' board, case by case: a shard gone frees its share,
a job's part that ended gives its share to the parts still running, a
shard not heard from is counted at the even share, a board new again
takes the shares the shards report; and a topic's bucket on a shard
(broker.disk.windows) keeps a moved share across a setTopicConfig of the
same rate, reports only its busy or moved topics."""

from __future__ import annotations

import pytest
from broker_harness import BrokerHarness

from broker.core.params import Defaults
from broker.disk.ready import QueueLimits
from broker.shards.rates import FLOOR, STALE_S, RateBoard

RATE = 1000.0


def moved(board: RateBoard, shard: int, rows: list[list[object]], now_s: float) -> dict[str, float]:
    return {key: share for key, share in board.report(shard, rows, now_s)}


def test_a_lone_busy_shard_takes_the_rate_once_the_idle_one_gave_it_up():
    board = RateBoard(2)
    assert moved(board, 1, [["t:x", RATE, 500, RATE / 2]], 0.0) == {}  # shard 0 holds its half yet
    assert moved(board, 0, [], 0.1) == {"t:x": pytest.approx(RATE * FLOOR / 2)}
    assert moved(board, 1, [["t:x", RATE, 500, RATE / 2]], 0.2) == {"t:x": pytest.approx(RATE * (1 - FLOOR / 2))}


def test_a_shard_gone_frees_its_share_after_stale_s():
    board = RateBoard(2)
    moved(board, 0, [["t:x", RATE, 900, RATE / 2]], 0.0)
    moved(board, 0, [["t:x", RATE, 900, RATE / 2]], 0.1)  # (shard 1 not heard from: even, so nothing more)
    assert moved(board, 1, [["t:x", RATE, 900, RATE / 2]], 0.15) == {}  # both busy: even
    # shard 1 stops reporting (killed); shard 0 is busy alone
    assert moved(board, 0, [["t:x", RATE, 900, RATE / 2]], 0.15 + STALE_S / 2) == {}
    assert moved(board, 0, [["t:x", RATE, 900, RATE / 2]], 0.2 + STALE_S) == {
        "t:x": pytest.approx(RATE * (1 - FLOOR / 2))}


def test_a_jobs_part_that_ended_gives_its_share_to_the_running_part():
    board = RateBoard(2)
    assert moved(board, 1, [["j:a", 40, 1, 20]], 0.0) == {}  # shard 0 not heard from: it may run its part
    assert moved(board, 0, [], 0.05) == {}  # shard 0 runs no part of it (ended: no row)
    assert moved(board, 1, [["j:a", 40, 1, 20]], 0.1) == {"j:a": pytest.approx(40)}


def test_a_board_new_again_takes_the_shares_the_shards_report():
    board = RateBoard(2)
    # shard 1 held 990 of the last board's grants; the new board hears shard 0 first
    assert moved(board, 0, [["t:x", RATE, 0, 10]], 0.0) == {}  # idle at its floor: no raise before all are heard
    assert moved(board, 1, [["t:x", RATE, 800, 990]], 0.1) == {}
    assert moved(board, 0, [["t:x", RATE, 800, 10]], 0.2) == {}  # busy too, but shard 1 holds 990
    assert moved(board, 1, [["t:x", RATE, 800, 990]], 0.3) == {"t:x": pytest.approx(RATE / 2)}
    assert moved(board, 0, [["t:x", RATE, 800, 10]], 0.4) == {"t:x": pytest.approx(RATE / 2)}


def test_windows_keep_a_moved_share_across_the_same_rate_and_report_busy_or_moved_topics():
    harness = BrokerHarness("hourglass-rates-", 1_000, QueueLimits(), Defaults())
    try:
        harness.open_broker()
        broker = harness.broker
        broker.set_flow("x", False, 500.0, 0)
        broker.set_flow("y", False, 500.0, 0)
        assert broker.rated_topics() == 2 and broker.release_shares() == []  # idle at the even share
        broker.set_release_share("x", 990.0)
        assert broker.release_shares() == [("x", 0, 990.0, 500.0)]
        broker.set_flow("x", False, 500.0, 0)  # a setTopicConfig of another setting: the share kept
        assert broker.release_shares() == [("x", 0, 990.0, 500.0)]
        broker.set_flow("x", False, 250.0, 0)  # a new rate: even again
        assert broker.release_shares() == []
        broker.set_flow("x", False, 0.0, 0)
        broker.set_release_share("x", 100.0)  # no rate any more: none kept
        assert broker.rated_topics() == 1 and broker.release_shares() == []
    finally:
        harness.teardown()
