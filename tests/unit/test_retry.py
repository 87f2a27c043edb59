"""broker.retry: which failures are retried for which requests, the
backoff's bounds and jitter, Retry-After."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from broker.retry import (
    RETRY_STATUSES,
    Failure,
    RetryPolicy,
    retry_after_s,
    status_failure,
)
from storage.errors import ConfigError

NOW_S = 1_700_000_000.0


def test_statuses_the_node_refused_are_not_applied_and_a_proxys_are_maybe():
    assert {s: status_failure(s) for s in (429, 503, 502, 504)} == {
        429: Failure.NOT_APPLIED, 503: Failure.NOT_APPLIED, 502: Failure.MAYBE_APPLIED, 504: Failure.MAYBE_APPLIED}
    assert {429, 502, 503, 504} == RETRY_STATUSES
    for final in (200, 307, 400, 401, 404, 405, 409, 413, 500, 501):
        assert status_failure(final) is Failure.FINAL, final


def test_a_request_not_applied_is_retried_and_one_maybe_applied_only_when_idempotent():
    policy = RetryPolicy(retries=3)
    assert policy.may_retry(0, Failure.NOT_APPLIED, idempotent=False)
    assert policy.may_retry(0, Failure.NOT_APPLIED, idempotent=True)
    assert policy.may_retry(0, Failure.MAYBE_APPLIED, idempotent=True)
    assert not policy.may_retry(0, Failure.MAYBE_APPLIED, idempotent=False)  # a pull: it may have handed out messages
    assert not policy.may_retry(0, Failure.FINAL, idempotent=True)


def test_at_most_retries_plus_one_attempts():
    policy = RetryPolicy(retries=3)
    assert [policy.may_retry(n, Failure.NOT_APPLIED, True) for n in range(5)] == [True, True, True, False, False]
    assert not RetryPolicy(retries=0).may_retry(0, Failure.NOT_APPLIED, True)


def test_the_ceiling_doubles_from_backoff_up_to_the_cap():
    policy = RetryPolicy(backoff_s=0.1, max_backoff_s=2.0)
    assert [policy.ceiling_s(n) for n in range(7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert policy.ceiling_s(10_000) == 2.0  # no overflow however many attempts


def test_a_pause_spans_zero_to_the_ceiling():
    policy = RetryPolicy(backoff_s=0.1, max_backoff_s=2.0)
    assert policy.pause_s(3, draw=lambda: 0.0) == 0.0
    assert policy.pause_s(3, draw=lambda: 0.999999) == pytest.approx(0.8, rel=1e-5)
    assert policy.pause_s(3, draw=lambda: 0.5) == pytest.approx(0.4)


def test_full_jitter_spreads_pauses_over_the_whole_range():
    policy = RetryPolicy(backoff_s=0.1, max_backoff_s=2.0)
    rng = random.Random(7)
    pauses = [policy.pause_s(4, draw=rng.random) for _ in range(2000)]
    assert all(0.0 <= p <= 1.6 for p in pauses)
    assert min(pauses) < 0.05 and max(pauses) > 1.55  # not clustered near the ceiling
    assert sum(pauses) / len(pauses) == pytest.approx(0.8, rel=0.1)
    assert len({policy.pause_s(4) for _ in range(10)}) > 1  # the default draw is random


def test_retry_after_is_a_floor_up_to_its_cap():
    policy = RetryPolicy(backoff_s=0.1, max_backoff_s=2.0, max_retry_after_s=30.0)
    assert policy.pause_s(0, 5.0, draw=lambda: 0.5) == 5.0
    assert policy.pause_s(6, 0.5, draw=lambda: 0.9) == pytest.approx(1.8)  # the backoff is longer: it wins
    assert policy.pause_s(0, 3600.0, draw=lambda: 0.5) == 30.0
    assert policy.pause_s(0, None, draw=lambda: 0.5) == pytest.approx(0.05)


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s(None, NOW_S) is None
    assert retry_after_s("120", NOW_S) == 120.0
    assert retry_after_s(" 0 ", NOW_S) == 0.0
    later = format_datetime(datetime.fromtimestamp(NOW_S + 90, UTC), usegmt=True)  # "Tue, 14 Nov 2023 22:14:50 GMT"
    assert retry_after_s(later, NOW_S) == pytest.approx(90.0)
    earlier = format_datetime(datetime.fromtimestamp(NOW_S - 90, UTC), usegmt=True)
    assert retry_after_s(earlier, NOW_S) == 0.0
    unknown_zone = format_datetime(datetime.fromtimestamp(NOW_S + 10, UTC)).replace("+0000", "-0000")
    assert retry_after_s(unknown_zone, NOW_S) == pytest.approx(10.0)
    for garbage in ("", "soon", "-5", "1.5", "١٢", "Wed, 99 Foo 2015"):
        assert retry_after_s(garbage, NOW_S) is None, garbage


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"retries": -1}, "retries must be >= 0"),
    ({"backoff_s": -0.1}, "backoff_s <= max_backoff_s"),
    ({"backoff_s": 3.0, "max_backoff_s": 2.0}, "backoff_s <= max_backoff_s"),
    ({"backoff_s": 1.0, "max_backoff_s": float("inf")}, "finite"),
    ({"backoff_s": float("nan")}, "backoff_s <= max_backoff_s"),
    ({"max_retry_after_s": -1.0}, "max_retry_after_s"),
])
def test_nonsense_settings_are_refused_in_a_sentence(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        RetryPolicy(**kwargs)


def test_repr_names_every_setting():
    assert repr(RetryPolicy()) == "RetryPolicy(retries=8, backoff_s=0.1, max_backoff_s=2.0, max_retry_after_s=60.0)"
