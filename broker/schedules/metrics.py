"""/metrics' recurring schedules series (docs/operations.md): the node's
sums over every schedule, and one label set (topic, schedule) each for at
most --metrics-topics schedules, as the topics' and push series are bounded.

    hourglass_schedules                          gauge    schedules kept (--max-schedules)
    hourglass_schedules_paused                   gauge
    hourglass_schedules_shown                    gauge    schedules with series of their own
    hourglass_node_schedule_runs_total           counter  runs released, every schedule
    hourglass_node_schedule_missed_total         counter  runs missed, every schedule
    hourglass_node_schedule_runs_deleted_total   counter  pending runs deleted (the schedules went on)
    hourglass_node_schedule_run_conflicts_total  counter  runs whose msgId held a message not theirs
    hourglass_schedule_runs_total                counter  per shown schedule
    hourglass_schedule_missed_total              counter  per shown schedule
    hourglass_schedule_lateness_seconds_total    counter  release - nominal time, summed
    hourglass_schedule_last_lateness_seconds     gauge    the last run's

Shown: the schedules that missed most, then ran latest in all, then ran
most, then by (topic, scheduleId); counts are since the node started (on a
cluster: since it last started leading). Picking them is a heap of
--metrics-topics over the schedules with counts, SLICE schedules a turn of
the loop.
"""

from __future__ import annotations

import asyncio
import heapq

from ..observe.metrics import COUNTER, GAUGE, Family, Sample, render_text, topic_labels
from .file import Key
from .keeper import Schedules, ScheduleState

# Schedules looked at between two turns of the loop (10,000 at once held it
# some 25 ms a scrape).
SLICE = 1000


def _worst_first(s: ScheduleState) -> tuple[int, int, int, Key]:
    return -s.missed, -s.late_ms, -s.released, s.key


async def schedule_families(schedules: Schedules, most: int) -> list[Family]:
    """The series above for `schedules`, at most `most` of them labelled;
    SLICE schedules looked at a turn of the loop."""
    states = schedules.states()
    worst: list[ScheduleState] = []
    released = missed = paused = 0
    for at in range(0, len(states), SLICE):
        if at:
            await asyncio.sleep(0)
        part = states[at:at + SLICE]
        paused += sum(s.paused for s in part)
        counted = [s for s in part if s.released or s.missed]
        released += sum(s.released for s in counted)
        missed += sum(s.missed for s in counted)
        worst = heapq.nsmallest(max(0, most), [*worst, *counted], key=_worst_first)
    shown = sorted(worst, key=lambda s: s.key)
    families = [
        Family("hourglass_schedules", "recurring schedules the node keeps (--max-schedules)", GAUGE,
               [Sample("hourglass_schedules", (), len(states))]),
        Family("hourglass_schedules_paused", "", GAUGE, [Sample("hourglass_schedules_paused", (), paused)]),
        Family("hourglass_schedules_shown", "schedules with series of their own (--metrics-topics)", GAUGE,
               [Sample("hourglass_schedules_shown", (), len(shown))]),
        Family("hourglass_node_schedule_runs_total", "schedules' runs released", COUNTER,
               [Sample("hourglass_node_schedule_runs_total", (), released)]),
        Family("hourglass_node_schedule_missed_total", "schedules' runs missed (misfire)", COUNTER,
               [Sample("hourglass_node_schedule_missed_total", (), missed)]),
        Family("hourglass_node_schedule_runs_deleted_total", "pending runs deleted (deleteMsg, deleteMsgs, a "
               "purge): never delivered, their schedules went on", COUNTER,
               [Sample("hourglass_node_schedule_runs_deleted_total", (), schedules.runs_deleted)]),
        Family("hourglass_node_schedule_run_conflicts_total", "runs whose msgId held a message the schedule did "
               "not make: not made, their schedules went on", COUNTER,
               [Sample("hourglass_node_schedule_run_conflicts_total", (), schedules.run_conflicts)])]
    per_schedule = (("hourglass_schedule_runs_total", COUNTER, "runs released", "released", 1),
                    ("hourglass_schedule_missed_total", COUNTER, "runs missed: released past misfireGraceMillis, "
                     "or skipped over", "missed", 1),
                    ("hourglass_schedule_lateness_seconds_total", COUNTER, "released runs' lateness (release - "
                     "nominal time), summed", "late_ms", 1000),
                    ("hourglass_schedule_last_lateness_seconds", GAUGE, "the last released run's lateness",
                     "last_late_ms", 1000))
    if shown:
        labelled = [((*topic_labels(s.key[0]), ("schedule", s.key[1])), s) for s in shown]
        families += [Family(name, text, kind, [Sample(name, labels, getattr(s, attr) / per) for labels, s in labelled],
                            ".15g") for name, kind, text, attr, per in per_schedule]
    return families


async def render_metrics(schedules: Schedules, most: int) -> str:
    """The text of `schedule_families`."""
    return render_text(await schedule_families(schedules, most))
