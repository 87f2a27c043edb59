"""The console's forecast (broker/console/api.py) counts what was sent: for
random trigger times over the next two days, its per-second counts for
the next hour and per-minute counts for the next 24 h equal the
histogram of those triggers, `later` counts the messages of hours after
them, and a topic's per-hour forecast equals that topic's histogram."""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import given, settings

from broker.console.api import forecast, topic_forecast
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store

NOW = 500_000 * MS_PER_HOUR + 1_234_567


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 48 * MS_PER_HOUR), st.sampled_from(["a", "b"])), max_size=300),
       st.integers(0, MS_PER_HOUR - 1))
def test_forecast_counts_what_was_sent(sends, shift_ms):
    now = NOW + shift_ms
    directory = tempfile.mkdtemp()
    try:
        store = Store.open(directory, now_ms=now)
        store.send([NewMessage(topic, f"m{i}", "x", now, now + ahead, 0, 0) for i, (ahead, topic) in
                    enumerate(sends)], now)
        store.commit()
        got = forecast(store, now)
        first_s, minute0 = got["secondStartMs"] // 1000, got["minuteStartMs"] // 60_000
        last_hour = (now + 24 * MS_PER_HOUR) // MS_PER_HOUR
        per_second, per_minute, later = [0] * 3600, [0] * 1440, 0
        for ahead, _ in sends:
            trigger_s = (now + ahead) // 1000
            if 0 <= trigger_s - first_s < 3600:
                per_second[trigger_s - first_s] += 1
            if 0 <= trigger_s // 60 - minute0 < 1440:
                per_minute[trigger_s // 60 - minute0] += 1
            if (now + ahead) // MS_PER_HOUR > last_hour:
                later += 1
        assert got["perSecond"] == per_second
        assert got["perMinute"] == per_minute
        assert got["later"] == later and got["overdue"] == 0
        for topic in ("a", "b"):
            mine = topic_forecast(store, topic, now)
            per_hour = [0] * 24
            for ahead, t in sends:
                h = (now + ahead) // MS_PER_HOUR - now // MS_PER_HOUR
                if t == topic and h < 24:
                    per_hour[h] += 1
            assert mine["perHour"] == per_hour
            assert mine["later"] == sum(1 for ahead, t in sends if t == topic) - sum(per_hour)
        store.close()
    finally:
        shutil.rmtree(directory)
