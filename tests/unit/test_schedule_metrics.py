"""broker.schedules.metrics: the schedules shown are those that missed
most, then ran latest, then most (at most --metrics-topics of them); the
node's sums count every schedule. Each schedule's counts are its state's
(`ScheduleState.released`, `missed`, `late_ms`; the last run's lateness
from its last runs)."""

from __future__ import annotations

from typing import Any

from broker.core.recurrence import Misfire
from broker.schedules.keeper import ScheduleState
from broker.schedules.metrics import render_metrics
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

    def paused_count(self) -> int:
        return sum(s.paused for s in self._states)


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
    page = render_metrics(schedules, 2)
    assert 'hourglass_schedule_missed_total{topic="u",schedule="missing"} 7' in page
    assert 'hourglass_schedule_last_lateness_seconds{topic="t",schedule="late"} 30' in page
    assert 'hourglass_schedule_runs_total{topic="t",schedule="late"} 5' in page
    assert 'schedule="ok"' not in page and 'schedule="idle"' not in page
    assert "hourglass_node_schedule_runs_total 57" in page and "hourglass_node_schedule_missed_total 7" in page
    assert "hourglass_node_schedule_runs_deleted_total 3" in page
    assert "hourglass_node_schedule_run_conflicts_total 1" in page
    assert "hourglass_schedules_shown 2" in page and "hourglass_schedules 4" in page
    none = render_metrics(schedules, 0)
    assert "hourglass_schedule_runs_total" not in none and "hourglass_schedules_shown 0" in none
