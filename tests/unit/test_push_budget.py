"""The pure parts of push delivery's bounds: Retry-After taken within
[the backoff's floor, its cap], the failure log's gate (one line a minute
with a count), PushLimits' validation, and the push pool in the node's
descriptor budget (broker.http.descriptors)."""

from __future__ import annotations

import pytest

from broker.http.descriptors import DescriptorBudget
from broker.push import rules as push_rules
from broker.push.rules import LogGate, PushLimits, backoff_ms
from storage.errors import ConfigError


def test_retry_after_is_taken_within_the_backoffs_floor_and_cap():
    assert backoff_ms(1, 0, 1.0) == 500  # Retry-After: 0 waits the floor: half of 1 s
    assert backoff_ms(2, 0, 1.0) == 1000 and backoff_ms(4, 0, 1.0) == 4000  # the floor doubles as the backoff does
    assert backoff_ms(3, 1000, 1.0) == 2000  # shorter than the floor: the floor
    assert backoff_ms(1, 7000, 0.5) == 7000  # longer: as given
    assert backoff_ms(1, 10 * push_rules.BACKOFF_CAP_MS, 1.0) == push_rules.BACKOFF_CAP_MS
    assert backoff_ms(40, 0, 1.0) == push_rules.BACKOFF_CAP_MS // 2
    for failures in range(1, 12):  # never below what the jittered backoff itself could be
        assert backoff_ms(failures, 0, 1.0) == backoff_ms(failures, None, 0.5)


def test_the_log_gate_lets_one_line_a_minute_through_with_a_count_of_the_others():
    gate = LogGate(60_000)
    assert gate.admit(1_000) == 0
    assert [gate.admit(1_000 + i) for i in range(1, 500)] == [None] * 499
    assert gate.admit(60_999) is None
    assert gate.admit(61_000) == 500
    assert gate.admit(61_001) is None and gate.admit(200_000) == 1


def test_push_limits_refuse_a_limit_below_one():
    assert PushLimits().max_head_bytes == 16 * 1024
    for name in ("max_head_bytes", "max_headers", "head_timeout_ms", "body_timeout_ms", "idle_timeout_ms", "max_fds"):
        with pytest.raises(ConfigError, match=f"--push-{name.replace('_', '-')}"):
            PushLimits(**{name: 0})


def test_the_push_pool_is_set_aside_from_the_client_ceiling():
    budget = DescriptorBudget(reserved=128, limit=400)
    budget.others, budget.measured = 145, True
    assert budget.push_pool() == 0 and budget.ceiling() == 127  # no subscription: nothing set aside
    budget.push_max = 256
    assert budget.push_pool() == 63  # half of what storage leaves
    assert budget.ceiling() == 400 - 128 - 145 - 63
    budget.push_max = 10
    assert budget.push_pool() == 10 and budget.ceiling() == 400 - 128 - 145 - 10
    budget.push_open = 12  # (more open than a shrunken pool: counted as they are)
    assert budget.ceiling() == 400 - 128 - 145 - 12
    tight = DescriptorBudget(reserved=128, limit=200)
    tight.others, tight.measured, tight.push_max = 100, True, 256
    assert tight.push_pool() == 1 and tight.ceiling() == 0  # storage first; pushes keep one, clients none
    unlimited = DescriptorBudget(reserved=128, limit=None)
    unlimited.push_max = 256
    assert unlimited.push_pool() == 256 and unlimited.ceiling() is None


def test_push_connections_are_not_counted_among_the_others():
    budget = DescriptorBudget(reserved=0, limit=100_000)
    budget.measure(0)
    before = budget.others
    budget.push_open = 5
    budget.measure(0)
    assert budget.others == max(0, before - 5)
