"""Node-wide rates over a node's shards (docs/internals.md, "Shards"): a
topic's releaseRate and a redriveMsgs job's rate hold for the node,
whichever shards its messages lie on.

Each shard hands out of its own messages through its own bucket (a
topic's: broker.core.release_rate; a job's part: its pace,
broker.jobs.runner), which fills at the shard's *share* of the rate. The
shares start even (rate / N) and are moved by demand: every TICK_S each
shard tells shard 0 (the board) what it holds, one `rates` call over the
link, and the reply moves its shares.

    a report entry  [key, rate, demand, share]: "t:<topic>" (demand: its
                    READY messages here, in the pull order) or "j:<jobId>"
                    (1 while the job's part runs here); a topic whose
                    share is even and which has no demand is left out,
                    and so is a job's part that ended (a shard heard from
                    within STALE_S without the job: its part ended, the
                    others may take its share)
    the board       keeps each shard's last report (one older than
                    STALE_S is of a shard gone: dropped, the shard counted
                    at a topic's floor and out of a job until it reports
                    again); for every key
                    any shard reported, `split` gives the targets and
                    `grant` the reporting shard's new share
    split           every shard FLOOR of the rate / N (a topic's message
                    that comes due on an idle shard goes at once: its
                    bucket holds a token), the rest by demand; no demand
                    anywhere: even. A job's part that ended gets nothing
    grant           a share that falls is lowered at once; one that rises
                    only into what the others' shares (as they last
                    reported them, or were granted since) leave of the
                    rate: the shares never sum over it, a share given up
                    is taken at the taker's next report

Worked example, releaseRate 2,000 on 2 shards, 20,000 messages due on
shard 1 alone: both start at 1,000/s. Shard 1 reports demand 20,000: its
target is 1,980 (shard 0's 20 floor), granted 1,000 (shard 0 holds
1,000). Shard 0 reports no demand: lowered to 20. Shard 1's next report
is granted 1,980: within 2 ticks (0.2 s) the node hands out 2,000/s (the
floor idle). When shard 1's demand ends, its share falls back to 1,000
and shard 0's rises again.

Cost: one call a tick from each shard but the board while any topic has
a rate or a paced job runs (else an empty one every KEEPALIVE_S: the
board then knows the shard runs no part of any job); a report holds the
busy keys only; the board works O(keys reported) a call (each key's
demands and shares kept summed over the shards). A board that does not
answer (shard 0 restarting) leaves every share as it is; a board new
again takes each shard's share from its next report, and raises none
until it heard every shard once (or STALE_S passed). A shard that comes back
after it was counted gone starts at the even share: the shares may sum
over the rate by that much until its first report (0.1 s).

Who calls what: the router serves `rates` calls (`RateBoard.report`) on
shard 0; `RateShares.run` is a task of every shard, on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from storage.errors import Unavailable

from ..disk.backend import Broker
from ..jobs.runner import RedriveJobs

log = logging.getLogger("hourglass.shards")

# Seconds between two reports of a shard: a share follows demand within two.
TICK_S = 0.1
# A report older than this is of a shard gone: its shares are freed (but its floor).
STALE_S = 2.0
# A shard with nothing to share reports this often (an empty report): the
# board counts a job's part it does not hear of as ended, not as unknown.
KEEPALIVE_S = 0.5
# Of a rate, what idle shards keep in all (each FLOOR / N): a message that
# comes due on one goes at once, and a busy shard alone gets 1 - FLOOR.
FLOOR = 0.01
# Shares that differ by less are the same (floats of one split).
SAME = 1e-9
TOPIC, JOB = "t", "j"

class Links(Protocol):
    """What the shares need of the shard's links (broker.shards.router.ShardRouter)."""

    index: int
    count: int

    def call(self, shard: int, op: str, args: list[Any]) -> Awaitable[Any]: ...


# (rate, demand, share) of a key a shard reported
Entry = tuple[float, float, float]


def split(rate: float, demands: Sequence[float | None]) -> list[float]:
    """Each shard's target share of `rate` (module docstring): `demands[i]`
    shard i's demand (0: idle; None: out, it gets nothing). The shares of
    the shards in sum to `rate`, each at least FLOOR * rate / N."""
    inside = [d for d in demands if d is not None]
    if not inside:
        return [0.0] * len(demands)
    floor = rate * FLOOR / len(demands)
    rest = rate - floor * len(inside)
    wanted = sum(inside)
    return [0.0 if d is None else floor + (rest * d / wanted if wanted > 0 else rest / len(inside))
            for d in demands]


def grant(rate: float, target: float, share: float, others: float) -> float:
    """The share a shard holding `share` is given towards `target` while
    the other shards hold `others` of `rate` in all: lowered at once,
    raised only into what the others leave (the sum never over `rate`)."""
    if target <= share:
        return target
    return min(target, max(share, rate - others))


class _Key:
    """What the board sums of one key over the shards that reported it."""

    __slots__ = ("demand", "rate", "reporters", "shares")

    def __init__(self, rate: float) -> None:
        self.rate = rate  # (the last reported)
        self.reporters = 0
        self.demand = 0.0  # the reporters' demands, summed
        self.shares = 0.0  # the reporters' shares (as reported, or granted since), summed

    def __repr__(self) -> str:
        return f"_Key(rate={self.rate:g}, reporters={self.reporters}, demand={self.demand:g}, shares={self.shares:g})"


class RateBoard:
    """Shard 0's board: the shards' last reports and the shares it grants
    from them (module docstring). Each key's demands and shares are kept
    summed over the shards that reported it, so a report costs its own
    rows and the previous ones of its shard, and one step a key any shard
    reported (not a step a shard: `split` and `grant` for one shard, in
    closed form; tests/property/test_node_rate_split.py holds the board
    written plainly, against which this one is checked). On the event
    loop of shard 0."""

    def __init__(self, count: int) -> None:
        self.count = count
        # shard -> (when its report came, monotonic s; key -> its entry)
        self._reports: dict[int, tuple[float, dict[str, Entry]]] = {}
        self._keys: dict[str, _Key] = {}
        # shards whose last report went stale (gone, or their loop held): counted
        # at the floor of a topic, out of a job, until they report again
        self._gone: set[int] = set()
        self._since_s: float | None = None  # the first report's time
        self.granted = 0  # shares moved (tests, logs)

    def __repr__(self) -> str:
        return (f"RateBoard({self.count} shards, reports={len(self._reports)}, keys={len(self._keys)}, "
                f"granted={self.granted})")

    def _add(self, entries: dict[str, Entry], sign: int) -> None:
        keys = self._keys
        for key, (rate, demand, share) in entries.items():
            summed = keys.get(key)
            if summed is None:
                summed = keys[key] = _Key(rate)
            summed.reporters += sign
            if summed.reporters == 0:
                del keys[key]
                continue
            if sign > 0:
                summed.rate = rate
            summed.demand += sign * demand
            summed.shares += sign * share

    def report(self, shard: int, rows: Sequence[Sequence[Any]], now_s: float) -> list[list[Any]]:
        """Shard `shard`'s report (rows of [key, rate, demand, share]) kept;
        its shares that move: [key, share] rows."""
        entries: dict[str, Entry] = {str(r[0]): (float(r[1]), float(r[2]), float(r[3])) for r in rows}
        before = self._reports.get(shard)
        if before is not None:
            self._add(before[1], -1)
        self._reports[shard] = (now_s, entries)
        self._add(entries, 1)
        self._gone.discard(shard)
        if self._since_s is None:
            self._since_s = now_s
        # a new board raises no share until it heard every shard once (or
        # STALE_S passed): one not heard from may hold more than the even share
        raising = len(self._reports) + len(self._gone) >= self.count or now_s - self._since_s >= STALE_S
        for other in [s for s, (at_s, _) in self._reports.items() if now_s - at_s > STALE_S]:
            self._add(self._reports.pop(other)[1], -1)
            self._gone.add(other)
        count = self.count
        heard, gone = len(self._reports), len(self._gone)
        unknown = count - heard - gone
        moved: list[list[Any]] = []
        for key, summed in self._keys.items():
            entry = entries.get(key)
            if key[0] == JOB:
                if entry is None:
                    continue  # (a job's part that ended here: nothing to grant)
                rate = entry[0]
                inside = summed.reporters  # (the others: ended, or not heard from at the even share)
                shares = summed.shares + unknown * rate / count
            else:
                rate = summed.rate if entry is None else entry[0]
                inside = count  # (idle at the even share; a shard gone, its floor)
                shares = summed.shares + (count - summed.reporters - gone) * rate / count + gone * rate * FLOOR / count
            floor = rate * FLOOR / count
            rest = rate - floor * inside
            demand = 0.0 if entry is None else entry[1]
            target = floor + (rest * demand / summed.demand if summed.demand > 0 else rest / inside)
            mine = rate / count if entry is None else entry[2]
            new = grant(rate, target, mine, shares - mine)
            if new > mine and not raising:
                continue
            if abs(new - mine) > SAME * max(1.0, rate):
                moved.append([key, new])
                self.granted += 1
                if entry is None:
                    summed.reporters += 1
                else:
                    summed.shares -= mine
                summed.shares += new
                entries[key] = (rate, demand, new)
        return moved


class RateShares:
    """A shard's side: every TICK_S, its report to the board and the moved
    shares carried out on its buckets and jobs (module docstring)."""

    def __init__(self, router: Links, broker: Callable[[], Broker | None],
                 jobs: Callable[[], RedriveJobs | None], monotonic_s: Callable[[], float]) -> None:
        self._router = router
        self._broker = broker
        self._jobs = jobs
        self._monotonic_s = monotonic_s
        self.board = RateBoard(router.count) if router.index == 0 else None
        self.reports = 0  # reports answered (tests)
        self._sent_s = float("-inf")  # when this shard last reported

    def __repr__(self) -> str:
        return f"RateShares(shard {self._router.index}, reports={self.reports}, board={self.board!r})"

    def entries(self) -> tuple[list[list[Any]], bool]:
        """This shard's report, and whether it has anything to share (a
        topic with a rate, a paced job's part running)."""
        broker, jobs = self._broker(), self._jobs()
        rows: list[list[Any]] = []
        rated = False
        count = self._router.count
        if broker is not None:
            rated = broker.rated_topics() > 0
            for topic, demand, share, even in broker.release_shares():
                rows.append([TOPIC + ":" + topic, even * count, demand, share])
        if jobs is not None:
            for job_id, node_rate, pace in jobs.paces():
                rows.append([JOB + ":" + job_id, node_rate, 1, pace])
        return rows, rated or bool(rows)

    async def tick(self) -> None:
        """One report (with nothing to share, one every KEEPALIVE_S: the
        board knows this shard runs no job's part), its answer carried out."""
        rows, sharing = self.entries()
        now_s = self._monotonic_s()
        if self.board is not None:
            moved = self.board.report(self._router.index, rows, now_s)
        elif sharing or now_s - self._sent_s >= KEEPALIVE_S:
            self._sent_s = now_s
            moved = await self._router.call(0, "rates", [self._router.index, rows])
        else:
            return
        self.reports += 1
        self.carry_out(moved)

    def carry_out(self, moved: Sequence[Sequence[Any]]) -> None:
        broker, jobs = self._broker(), self._jobs()
        for key, share in moved:
            kind, name = key[0], key[2:]
            if kind == TOPIC and broker is not None:
                broker.set_release_share(name, share)
            elif kind == JOB and jobs is not None:
                jobs.set_pace(name, share)

    async def run(self) -> None:
        """Report every TICK_S until cancelled; a board that does not
        answer leaves the shares as they are."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.tick()
            except Unavailable:
                pass
            except Exception:  # (a bug: the shares stay, the shard serves on)
                log.exception("a report of the node's rates failed")
