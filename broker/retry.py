"""When a client sends a failed request to a node again, and how long it
waits first: the one retry policy of `broker.client.DelayQueueClient`
(asyncio) and of the Spark sink (`broker.spark`, blocking, inside Spark's
executors), each over its own transport. Pure: no I/O, no clock, no
sleeping; the transport says what failed, asks `may_retry`, and sleeps
`pause_s`.

What failed decides which requests may go again (docs/api.md, "Clients:
retries"):

    failure                                   applied?  sent again
    HTTP 429 (a limit), 503 (stopping, no     no        any request
      leader, not ready)
    no connection made (refused, no route)    no        any request
    HTTP 502, 504 (a proxy lost the node),    maybe     idempotent requests only
      a timeout, a connection lost after
      the request went out
    any other answer: 400, 401, 404, 413,     -         never: a repeat gets the same
      500, ...

Idempotent: applying the request twice is applying it once. Reads are;
so are an ack, a nack or a delete of one msgId, and a send whose every
message carries a msgId (a node keeps one message per id and answers a
repeat with the stored one; both clients give each message an id before
the first attempt). A pull is not: a repeat of a pull the node applied
hands out more messages, which come back only after their ack timeout.

How long: before retry n (0 for the first) the pause is drawn uniformly
from [0, min(max_backoff_s, backoff_s * 2**n)] -- "full jitter", so that
clients failed by one event (a leader's failover) do not all come back in
the same instant -- and is at least what the answer's Retry-After asks,
up to max_retry_after_s. A call makes at most `retries` + 1 attempts.

    retry n   ceiling (defaults: 0.1 s doubling, cap 2 s)
    0         0.1 s
    3         0.8 s
    5..       2.0 s
"""

from __future__ import annotations

import email.utils
import enum
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC

from storage.errors import ConfigError


class Failure(enum.Enum):
    """What a failed attempt tells about its request."""

    NOT_APPLIED = "not applied"  # the node refused it or never got it: any request may go again
    MAYBE_APPLIED = "maybe applied"  # it may have been applied: only an idempotent request goes again
    FINAL = "final"  # an answer another attempt would not change


# The node says it did nothing: a limit (429), or it cannot serve now (503).
NOT_APPLIED_STATUSES = frozenset({429, 503})
# A proxy in front of the node lost it, perhaps after the node applied the request.
MAYBE_APPLIED_STATUSES = frozenset({502, 504})
RETRY_STATUSES = NOT_APPLIED_STATUSES | MAYBE_APPLIED_STATUSES
# 2**64 times any backoff is past every cap: a larger exponent only overflows.
_MAX_DOUBLINGS = 64


def status_failure(status: int) -> Failure:
    """What an HTTP status (or a code in a 200 answer's body) tells."""
    if status in NOT_APPLIED_STATUSES:
        return Failure.NOT_APPLIED
    if status in MAYBE_APPLIED_STATUSES:
        return Failure.MAYBE_APPLIED
    return Failure.FINAL


def retry_after_s(value: str | None, now_s: float) -> float | None:
    """The pause a Retry-After header asks for: delay-seconds, or an HTTP
    date less `now_s` (the wall clock, seconds since the epoch); 0 for a
    date past. None when there is no header or it is neither."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):  # what the stdlib raises for an unreadable date
        return None
    if when.tzinfo is None:  # "-0000": UTC, the local zone unknown
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now_s)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait; see the module docstring."""

    # Retries after the first attempt (0: none): at most retries + 1 attempts.
    retries: int = 8
    # The ceiling of the first pause; it doubles each retry.
    backoff_s: float = 0.1
    # The cap of the ceiling.
    max_backoff_s: float = 2.0
    # The longest pause a Retry-After header may ask for and get.
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if not 0 <= self.backoff_s <= self.max_backoff_s or not math.isfinite(self.max_backoff_s):
            raise ConfigError(f"need 0 <= backoff_s <= max_backoff_s (finite), got {self.backoff_s} and "
                              f"{self.max_backoff_s}")
        if not 0 <= self.max_retry_after_s < math.inf:
            raise ConfigError(f"max_retry_after_s must be >= 0 and finite, got {self.max_retry_after_s}")

    def may_retry(self, attempt: int, failure: Failure, idempotent: bool) -> bool:
        """Whether attempt number `attempt` (0 for the first), which failed
        so, is followed by another."""
        if attempt >= self.retries:
            return False
        return failure is Failure.NOT_APPLIED or (failure is Failure.MAYBE_APPLIED and idempotent)

    def ceiling_s(self, attempt: int) -> float:
        """The longest backoff before the retry that follows `attempt`."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** min(attempt, _MAX_DOUBLINGS))

    def pause_s(self, attempt: int, retry_after_s: float | None = None,
                draw: Callable[[], float] = random.random) -> float:
        """The pause before the retry that follows `attempt`: uniform in
        [0, ceiling_s(attempt)] (`draw` gives [0, 1)), and at least
        `retry_after_s`, up to max_retry_after_s."""
        pause = self.ceiling_s(attempt) * draw()
        if retry_after_s is not None:
            pause = max(pause, min(retry_after_s, self.max_retry_after_s))
        return pause
