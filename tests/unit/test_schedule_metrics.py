"""broker.schedule_metrics: the schedules shown are those that missed
most, then ran latest, then most (at most --metrics-topics of them); the
node's sums count every schedule."""

from __future__ import annotations

from fakes import FakeClock

from broker.schedule_file import ScheduleFile
from broker.schedule_metrics import render_metrics
from broker.schedules import Schedules, ScheduleStats


def test_the_worst_schedules_are_shown_and_every_one_is_summed(tmp_path):
    file = ScheduleFile(str(tmp_path / "schedules"), fsync=False)
    schedules = Schedules(file, FakeClock(now_ms=1_000))
    try:
        schedules.stats.update({("t", "ok"): ScheduleStats(runs=50, late_ms=10, last_late_ms=1),
                                ("t", "late"): ScheduleStats(runs=5, late_ms=90_000, last_late_ms=30_000),
                                ("u", "missing"): ScheduleStats(runs=2, missed=7, late_ms=5, last_late_ms=2)})
        page = render_metrics(schedules, 2)
        assert 'hourglass_schedule_missed_total{topic="u",schedule="missing"} 7' in page
        assert 'hourglass_schedule_last_lateness_seconds{topic="t",schedule="late"} 30' in page
        assert 'schedule="ok"' not in page
        assert "hourglass_node_schedule_runs_total 57" in page and "hourglass_node_schedule_missed_total 7" in page
        assert "hourglass_schedules_shown 2" in page
        none = render_metrics(schedules, 0)
        assert "hourglass_schedule_runs_total" not in none and "hourglass_schedules_shown 0" in none
    finally:
        schedules.close()
