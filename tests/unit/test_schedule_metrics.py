"""broker.schedules.metrics: the schedules shown are those that missed
most, then ran latest, then most (at most --metrics-topics of them); the
node's sums count every schedule. Each schedule's counts are its state's
(`ScheduleState.released`, `missed`, `late_ms`; the last run's lateness
from its last runs)."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.core.recurrence import Misfire
from broker.schedules.keeper import ScheduleState
from broker.schedules.metrics import SLICE, render_metrics
from broker.schedules.params import ScheduleSpec


class Held:
    """What render_metrics reads of broker.schedules.keeper.Schedules: its states."""

    def __init__(self, states: list[ScheduleState]) -> None:
        self._states = states
        self.runs_deleted = 3
        self.run_conflicts = 1

    def __len__(self) -> int:
        return len(self._states)

    def states(self) -> list[ScheduleState]:
        return list(self._states)


def counted(topic: str, schedule_id: str, released: int, missed: int, late_ms: int, last_late_ms: int) -> ScheduleState:
    """A schedule with these counts, its last run `last_late_ms` late."""
    spec = ScheduleSpec(topic, schedule_id, None, 60_000, "UTC", "m", 60_000, 0, 0, "", "", 0, None, None, 0,
                        Misfire.ONCE, 60_000, 10)
    state = ScheduleState(spec, spec.recurrence(), 1, released=released, missed=missed, late_ms=late_ms)
    if released:
        state.note_release(0, last_late_ms, False)
    return state


def test_the_worst_schedules_are_shown_and_every_one_is_summed() -> None:
    schedules: Any = Held([counted("t", "ok", 50, 0, 10, 1), counted("t", "late", 5, 0, 90_000, 30_000),
                           counted("u", "missing", 2, 7, 5, 2), counted("u", "idle", 0, 0, 0, 0)])
    page = asyncio.run(render_metrics(schedules, 2))
    assert 'hourglass_schedule_missed_total{topic="u",schedule="missing"} 7' in page
    assert 'hourglass_schedule_last_lateness_seconds{topic="t",schedule="late"} 30' in page
    assert 'hourglass_schedule_runs_total{topic="t",schedule="late"} 5' in page
    assert 'schedule="ok"' not in page and 'schedule="idle"' not in page
    assert "hourglass_node_schedule_runs_total 57" in page and "hourglass_node_schedule_missed_total 7" in page
    assert "hourglass_node_schedule_runs_deleted_total 3" in page
    assert "hourglass_node_schedule_run_conflicts_total 1" in page
    assert "hourglass_schedules_shown 2" in page and "hourglass_schedules 4" in page
    none = asyncio.run(render_metrics(schedules, 0))
    assert "hourglass_schedule_runs_total" not in none and "hourglass_schedules_shown 0" in none


def test_schedules_past_a_slice_are_summed_and_the_worst_of_every_slice_shown() -> None:
    """More schedules than SLICE (looked at a turn of the loop each): the
    sums count all of them, and the worst is found whichever slice holds it."""
    states = [counted("t", f"s{i:05d}", 1, 0, 1, 1) for i in range(2 * SLICE + 5)]
    states[SLICE + 3] = counted("t", "worst", 1, 9, 1, 1)
    page = asyncio.run(render_metrics(Held(states), 1))
    assert f"hourglass_node_schedule_runs_total {2 * SLICE + 5}" in page
    assert "hourglass_node_schedule_missed_total 9" in page
    assert 'hourglass_schedule_missed_total{topic="t",schedule="worst"} 9' in page
    assert f"hourglass_schedules {2 * SLICE + 5}" in page and "hourglass_schedules_shown 1" in page
