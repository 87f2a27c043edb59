"""The runs recurring schedules will make, for the console's forecast
(broker.console.api): each schedule's pending run is a message already, which
the second tables count; the runs after it exist nowhere yet, and are
counted here, at their nominal times (a jitter is left out).

Schedules that fire at the same instants are worked out once, as a group:

    cron            same cron and time zone: its nominal times in the window
    everyMillis P   P a whole number of seconds: same P and second of the
                    pending run modulo P (times at the start of their
                    second: 100,000 every-minute schedules are 60 groups);
                    else the same P and pending run modulo P

and each schedule of a group takes the group's times after its pending run,
up to its endTime and the runs its limit leaves (a difference array over
the group's times: one bisect a schedule). The work is the groups' times,
bounded by MAX_TIMES in all (past it, the groups left are not counted and
the answer says so: the console's "scheduleRunsCut"), plus one bisect a
schedule. A cron's times come an hour of wall time at a time by arithmetic
(broker.core.recurrence.cron_times: 86,400 every-second times in a few ms, not
a walk of first_after each).

It runs on the event loop, as the console's request: `runs_by_slices`
does the work in slices of about SLICE_WORK (times made or counted,
schedules grouped or bisected) and yields between them, and `future_runs`
gives the loop a turn at each yield, so a forecast of many schedules (or
of every-second crons: 86,400 times a day each) never holds the loop
more than a few ms at a time.
"""

from __future__ import annotations

import asyncio
import bisect
import zoneinfo
from collections.abc import Generator, Iterable
from typing import NamedTuple

from storage.entry import MS_PER_SECOND

from ..core.recurrence import Cron, cron_times
from .keeper import ScheduleState

# Nominal times worked out for one forecast, every group's together (some
# 40 MB of times and counts at most, for the time the answer is built).
MAX_TIMES = 1_000_000
# Work one slice does before the loop has a turn: times made or counted,
# schedules grouped or bisected (a few ms of pure Python).
SLICE_WORK = 2000


class Group(NamedTuple):
    """Schedules that fire at the same instants (see the module docstring)."""

    kind: str  # "cron", "s" (every whole seconds, times at their second's start), "ms"
    cron: str = ""
    zone: str = ""
    every_ms: int = 0
    phase_ms: int = 0  # the times are phase_ms + k * every_ms


def _group(state: ScheduleState, pending_ms: int) -> Group:
    spec = state.spec
    if spec.cron is not None:
        return Group("cron", spec.cron, spec.time_zone)
    every = spec.every_ms
    assert every is not None
    if every % MS_PER_SECOND == 0:
        return Group("s", every_ms=every, phase_ms=pending_ms // MS_PER_SECOND * MS_PER_SECOND % every)
    return Group("ms", every_ms=every, phase_ms=pending_ms % every)


def _times(group: Group, after_ms: int, until_ms: int, budget: int) -> Generator[list[int], None, None]:
    """The group's nominal times in (after_ms, until_ms], at most `budget`,
    in pieces of at most SLICE_WORK (a cron's: an hour of its wall time)."""
    if group.kind == "cron":
        yield from cron_times(Cron.parse(group.cron), zoneinfo.ZoneInfo(group.zone), after_ms, until_ms, budget)
        return
    every, phase = group.every_ms, group.phase_ms
    # the first phase + k * every after after_ms
    at = phase + (max(0, after_ms - phase) // every + 1) * every
    count = min(budget, max(0, (until_ms - at) // every + 1))
    for k in range(0, count, SLICE_WORK):
        yield [at + j * every for j in range(k, min(count, k + SLICE_WORK))]


async def future_runs(states: Iterable[ScheduleState], after_ms: int, until_ms: int) -> tuple[dict[int, int], bool]:
    """`runs_by_slices`' answer, the loop given a turn between its slices."""
    steps = runs_by_slices(states, after_ms, until_ms)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


def runs_by_slices(states: Iterable[ScheduleState], after_ms: int,
                   until_ms: int) -> Generator[None, None, tuple[dict[int, int], bool]]:
    """Runs the schedules will make after their pending ones, in
    (after_ms, until_ms]: nominal ms (of an every-whole-seconds schedule:
    the start of its second) -> runs, and whether MAX_TIMES cut it short
    (some groups not counted). Yields after each slice of about SLICE_WORK
    (a cron's hour of every-second times: 3,600) and returns the answer."""
    work = 0
    groups: dict[Group, list[tuple[int, int | None, int | None]]] = {}
    for state in states:
        work += 1
        if work >= SLICE_WORK:
            yield
            work = 0
        pending = state.pending
        if state.paused or pending is None:
            continue
        left = state.runs_left()
        if left == 0:
            continue
        groups.setdefault(_group(state, pending), []).append((pending, state.spec.end_ms, left))
    runs: dict[int, int] = {}
    budget = MAX_TIMES
    for group, members in groups.items():
        if budget <= 0:
            return runs, True
        earliest = min(p for p, _, _ in members)
        # times from the earliest pending run (it may be due already) to the window's end
        times: list[int] = []
        for piece in _times(group, min(earliest, after_ms) - MS_PER_SECOND, until_ms, budget):
            times += piece
            work += len(piece)
            if work >= SLICE_WORK:
                yield
                work = 0
        budget -= len(times)
        if not times:
            continue
        diff = [0] * (len(times) + 1)
        for pending, end, left in members:
            work += 1
            if work >= SLICE_WORK:
                yield
                work = 0
            # an "s" group's times are their second's start: each member's are its own ms later
            offset = pending % MS_PER_SECOND if group.kind == "s" else 0
            lo = max(bisect.bisect_right(times, pending - offset), bisect.bisect_right(times, after_ms - offset))
            hi = bisect.bisect_right(times, until_ms - offset)
            if end is not None:
                hi = min(hi, bisect.bisect_right(times, end - offset))
            if left is not None:
                hi = min(hi, bisect.bisect_right(times, pending - offset) + left)
            if lo < hi:
                diff[lo] += 1
                diff[hi] -= 1
        current = 0
        for start in range(0, len(times), SLICE_WORK):
            for at, change in zip(times[start:start + SLICE_WORK], diff[start:start + SLICE_WORK]):
                current += change
                if current:
                    runs[at] = runs.get(at, 0) + current
            yield
        work = 0
    return runs, budget <= 0
