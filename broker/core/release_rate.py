"""A topic's release rate (docs/api.md, "Flow": `releaseRate`): a token
bucket at the point due messages are handed out -- pulls, long polls and
push deliveries all take from the topic's one bucket -- and the smoothing
lateness it adds, reported apart from lateness under load.

The bucket fills at `per_s` tokens a second up to `burst` (a tenth of a
second's worth, at least 1): a pull of batch N takes min(N, tokens) whole
tokens, so a topic hands out at most per_s * t + burst messages in any t
seconds, and never anything before it is due (the bucket only holds
messages back). Worked example, per_s 50 (burst 5): 200 messages due at
once; a consumer pulling in a loop takes 5 at t=0, then about one each
20 ms: the last at about t=3.9 s.

Smoothing lateness: while the bucket refuses due messages of the topic
(a pull took fewer than it asked for and the window held more), the topic
is *held back* since `held_since_ms`; a message handed out at `now_ms`
that was due at `due_ms` then has smoothing lateness now - max(due,
held_since) -- the part of its lateness the bucket added -- and load
lateness the rest. A pull the bucket did not limit ends the holding back.

Pure: no clock, no I/O; `now_ms` is the caller's (broker.disk.windows').
"""

from __future__ import annotations

import math

from storage.errors import ContractError

# The burst, in seconds of the rate: a pull may take this much at once
# after the topic was idle.
BURST_S = 0.1
# Added before a count of tokens is floored: refills of a fraction each
# (0.1 a 10 ms turn at 10/s) sum to 0.9999... in floats, a token short.
_EPSILON = 1e-6


class ReleaseRate:
    """One topic's bucket. Who calls: the part that hands the topic's
    messages out, on the event loop, in time order."""

    __slots__ = ("at_ms", "burst", "held_since_ms", "per_s", "tokens")

    def __init__(self, per_s: float, now_ms: int) -> None:
        if per_s <= 0:
            raise ContractError(f"a release rate is above 0 a second, got {per_s}")
        self.per_s = per_s
        self.burst = max(1.0, per_s * BURST_S)
        self.tokens = self.burst  # (full: an idle topic hands its first burst out at once)
        self.at_ms = now_ms  # when `tokens` was counted
        self.held_since_ms: int | None = None  # since when the bucket holds due messages back

    def __repr__(self) -> str:
        return (f"ReleaseRate({self.per_s:g}/s, burst={self.burst:g}, tokens={self.tokens:.2f}, "
                f"held_since={self.held_since_ms})")

    def available(self, now_ms: int) -> int:
        """Whole tokens at `now_ms`: messages a pull may take now."""
        if now_ms > self.at_ms:
            self.tokens = min(self.burst, self.tokens + (now_ms - self.at_ms) * self.per_s / 1000)
            self.at_ms = now_ms
        return int(self.tokens + _EPSILON)

    def took(self, count: int, limited: bool, now_ms: int) -> None:
        """A pull at `now_ms` took `count` (at most `available`); `limited`:
        the bucket held some due messages back (it gave fewer than the pull
        would have taken), else the holding back ends."""
        self.tokens -= count
        if limited:
            if self.held_since_ms is None:
                self.held_since_ms = now_ms
        else:
            self.held_since_ms = None

    def set_rate(self, per_s: float, now_ms: int) -> None:
        """Fill at `per_s` from `now_ms` on (a shard's share of a node's
        rate, moved: broker.shards.rates): the tokens counted at the old
        rate kept, up to the new burst."""
        if per_s <= 0:
            raise ContractError(f"a release rate is above 0 a second, got {per_s}")
        self.available(now_ms)
        self.per_s = per_s
        self.burst = max(1.0, per_s * BURST_S)
        self.tokens = min(self.tokens, self.burst)

    def next_token_ms(self, now_ms: int) -> int:
        """Milliseconds from `now_ms` until a whole token is there (0: now)."""
        self.available(now_ms)
        missing = 1 - self.tokens - _EPSILON
        return 0 if missing <= 0 else math.ceil(missing * 1000 / self.per_s)


def smoothing_ms(due_ms: int, held_since_ms: int | None, now_ms: int) -> int:
    """The smoothing lateness of a message due at `due_ms` handed out at
    `now_ms` by a topic whose bucket held it back since `held_since_ms`
    (None: it did not; module docstring): now - max(due, held_since), at
    most its lateness, never below 0."""
    if held_since_ms is None:
        return 0
    return max(0, now_ms - max(due_ms, held_since_ms))
