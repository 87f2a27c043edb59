"""kill -9 of a real `hourglass serve` while a topic holds back its
schedule's run (docs/api.md, "Recurring schedules", "Flow"): the run that
fell due during the pause stays waiting across the restart -- the wheel's
tick passed it, the schedules find it at their start -- no later run is
made while paused, and the resume judges it by the misfire rule against
the resume time: skip ends it unseen (status 5), once delivers it alone,
all delivers maxCatchUp runs; the next run is the first after the resume.
On one shard and on a node of two (each shard keeps the pause)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from serving import Server

pytestmark = pytest.mark.slow


def body(answer: tuple[int, Any]) -> dict[str, Any]:
    code, payload = answer
    assert code == 200, payload
    assert isinstance(payload, dict)
    return payload


def schedule(server: Server, topic: str) -> dict[str, Any]:
    got = body(server.get("getSchedule", topic=topic, scheduleId="s", next=2))["schedule"]
    assert isinstance(got, dict)
    return got


def status(server: Server, topic: str, msg_id: str) -> int:
    return int(body(server.post("getMsg", topic=topic, msgId=msg_id))["delayMsg"]["status"])


@pytest.mark.parametrize("shards", ["1", "2"])
@pytest.mark.parametrize(("misfire", "delivered"), [("skip", 0), ("once", 1), ("all", 2)])
def test_a_held_run_survives_kill9_and_resume_applies_its_misfire_rule(tmp_path, shards, misfire, delivered):
    data, topic = tmp_path / "data", "ticks"
    flags = ("--fsync", "batch", "--shards", shards)
    server = Server.start(data, *flags, log_path=tmp_path / "serve.log")
    try:
        put = body(server.post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="tick",
                               misfire=misfire, misfireGraceMillis=1000, maxCatchUp=2))["schedule"]
        first = put["nextFireTimes"][0]
        body(server.post("pauseTopic", topic=topic))
        time.sleep(max(0.0, (first + 1500) / 1000 - time.time()))
        assert schedule(server, topic)["runs"] == 1 and status(server, topic, f"s@{first}") == 1
    finally:
        server.kill()

    again = Server.start(data, *flags, log_path=tmp_path / "serve2.log")
    try:
        time.sleep(max(0.0, (first + 3300) / 1000 - time.time()))  # more nominal times pass, still paused
        held = schedule(again, topic)
        assert held["runs"] == 1 and held["nextFireTimes"][0] == first, held
        assert status(again, topic, f"s@{first}") == 1
        assert body(again.post("pullMsg", topic=topic, batch=10))["delayMsgList"] == []
        resumed_ms = int(time.time() * 1000)
        body(again.post("resumeTopic", topic=topic))
        deadline = time.monotonic() + 10
        while (got := schedule(again, topic))["nextFireTimes"][0] <= resumed_ms and time.monotonic() < deadline:
            time.sleep(0.05)
        following = got["nextFireTimes"][0]
        assert following > resumed_ms and (following - first) % 1000 == 0, (got, resumed_ms)
        runs: list[dict[str, Any]] = []
        deadline = time.monotonic() + following / 1000 - time.time() + 5
        while following not in [m["scheduledTime"] for m in runs] and time.monotonic() < deadline:
            answer = body(again.post("longPollingMsg", topic=topic, batch=10, longPollingTimeoutMillis=300))
            runs += answer["delayMsgList"]
        nominal = [m["scheduledTime"] for m in runs]
        assert [n for n in nominal if n < resumed_ms] == [first + 1000 * k for k in range(delivered)], nominal
        assert following in nominal and len(nominal) == len(set(nominal))  # none twice
        assert status(again, topic, f"s@{first}") == (5 if misfire == "skip" else 3)
        judged = {r["scheduledTime"]: r for r in got["lastRuns"]}[first]
        assert judged["missed"] is True and judged["latenessMillis"] >= resumed_ms - first
    finally:
        again.kill()
