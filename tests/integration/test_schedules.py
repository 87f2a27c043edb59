"""Recurring schedules over HTTP against a real `hourglass serve` (disk,
standalone): every endpoint, each refusal naming its parameter with nothing
stored, versions, pause and resume, pages, the --max-schedules cap; and
SIGKILL of the node while an every-second schedule with misfire=once runs:
no run lost, none made twice; a purge of the schedules' pending runs and a
SIGKILL right after it: the schedules go on, and a send under a run's
msgId is refused."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from serving import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("schedules")
    s = Server.start(directory / "data", "--max-schedules", "3", log_path=directory / "serve.log")
    yield s
    s.stop()


def body(answer: tuple[int, Any]) -> dict[str, Any]:
    code, payload = answer
    assert code == 200, payload
    assert isinstance(payload, dict)
    return payload


def pull_all(server: Server, topic: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while True:
        batch = body(server.post("pullMsg", topic=topic, batch=100))["delayMsgList"]
        if not batch:
            return got
        got += batch
        body(server.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in batch)))


def test_an_every_second_schedule_makes_one_message_a_run(server: Server) -> None:
    put = body(server.post("putSchedule", topic="t1", scheduleId="tick", everyMillis=1000, msg="tick", tag="hb"))
    schedule = put["schedule"]
    assert schedule["version"] == 1 and schedule["paused"] is False and schedule["misfire"] == "once"
    assert schedule["misfireGraceMillis"] == 60_000 and schedule["maxCatchUp"] == 10 and schedule["timeZone"] == "UTC"
    first = schedule["nextFireTimes"][0]
    assert schedule["nextFireTimes"] == [first + 1000 * k for k in range(5)]
    time.sleep(3.6)
    runs = pull_all(server, "t1")
    assert len(runs) >= 3
    nominal = [m["scheduledTime"] for m in runs]
    assert nominal == [first + 1000 * k for k in range(len(runs))]  # each once, none missing, in order
    for m in runs:
        assert m["msgId"] == f"tick@{m['scheduledTime']}" and m["scheduleId"] == "tick"
        assert m["triggerTime"] == m["scheduledTime"] and m["msg"] == "tick" and m["tag"] == "hb"
    got = body(server.get("getSchedule", topic="t1", scheduleId="tick", next=2))["schedule"]
    assert len(got["nextFireTimes"]) == 2 and got["nextFireTimes"][0] > nominal[-1]
    last = got["lastRuns"]
    assert [r["scheduledTime"] for r in last][:3] == sorted(nominal, reverse=True)[:3]
    assert all(r["status"] == 4 for r in last if r["scheduledTime"] in nominal)  # acked
    # the pending run is the one message waiting
    pending = body(server.post("getMsg", topic="t1", msgId=f"tick@{got['nextFireTimes'][0]}"))["delayMsg"]
    assert pending["status"] == 1 and pending["scheduledTime"] == got["nextFireTimes"][0]
    body(server.post("deleteSchedule", topic="t1", scheduleId="tick"))
    assert server.post("getMsg", topic="t1", msgId=pending["msgId"])[0] == 404  # deleted, its id released


def test_pause_deletes_the_pending_run_and_resume_makes_runs_after_it(server: Server) -> None:
    schedule = body(server.post("putSchedule", topic="t2", scheduleId="p", cron="0 0 * * *",
                                timeZone="America/New_York", msg="nightly"))["schedule"]
    pending = f"p@{schedule['nextFireTimes'][0]}"
    assert body(server.post("getMsg", topic="t2", msgId=pending))["delayMsg"]["status"] == 1
    paused = body(server.post("pauseSchedule", topic="t2", scheduleId="p"))["schedule"]
    assert paused["paused"] is True and paused["nextFireTimes"] == [] and paused["version"] == 2
    assert server.post("getMsg", topic="t2", msgId=pending)[0] == 404
    resumed = body(server.post("resumeSchedule", topic="t2", scheduleId="p"))["schedule"]
    assert resumed["paused"] is False and resumed["version"] == 3
    assert resumed["nextFireTimes"] == schedule["nextFireTimes"]
    assert body(server.post("getMsg", topic="t2", msgId=pending))["delayMsg"]["status"] == 1
    body(server.post("deleteSchedule", topic="t2", scheduleId="p"))
    for call in ("pauseSchedule", "resumeSchedule", "deleteSchedule"):
        assert server.post(call, topic="t2", scheduleId="p")[0] == 404
    assert server.get("getSchedule", topic="t2", scheduleId="p")[0] == 404


def test_versions_compare_and_set(server: Server) -> None:
    base = {"topic": "t3", "scheduleId": "v", "everyMillis": 60_000, "msg": "x"}
    assert body(server.post("putSchedule", **base, version=0))["schedule"]["version"] == 1
    code, refused = server.post("putSchedule", **base, version=0)
    assert code == 409 and "version 1" in refused["msg"]
    assert server.post("putSchedule", **{**base, "msg": "y"}, version=5)[0] == 409
    replaced = body(server.post("putSchedule", **{**base, "msg": "y"}, version=1))["schedule"]
    assert replaced["version"] == 2 and replaced["msg"] == "y"
    assert body(server.get("getSchedule", topic="t3", scheduleId="v"))["schedule"]["msg"] == "y"
    body(server.post("deleteSchedule", topic="t3", scheduleId="v"))


@pytest.mark.parametrize(("params", "named"), [
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "* * * * 5#2"}, "cron"),
    ({"cron": "* * * * *", "everyMillis": 1000}, "cron"),
    ({}, "cron"),
    ({"everyMillis": 999}, "everyMillis"),
    ({"everyMillis": "soon"}, "everyMillis"),
    ({"everyMillis": 1000, "timeZone": "Mars/Olympus"}, "timeZone"),
    ({"everyMillis": 1000, "startTime": 2000, "endTime": 2000}, "endTime"),
    ({"everyMillis": 1000, "misfire": "sometimes"}, "misfire"),
    ({"everyMillis": 1000, "maxCatchUp": 0}, "maxCatchUp"),
    ({"everyMillis": 1000, "limit": 0}, "limit"),
    ({"everyMillis": 1000, "jitterMillis": 70_000}, "jitterMillis"),
    ({"everyMillis": 1000, "msgId": "mine"}, "msgId"),
    ({"everyMillis": 1000, "version": -1}, "version"),
    ({"everyMillis": 1000, "scheduleId": "x" * 49}, "scheduleId"),
    ({"everyMillis": 1000, "msg": ""}, "msg"),
])
def test_bad_parameters_are_refused_naming_them_and_nothing_is_stored(server: Server, params: dict[str, Any],
                                                                       named: str) -> None:
    code, refused = server.post("putSchedule", **{"topic": "t4", "scheduleId": "bad", "msg": "x", **params})
    assert code == 400 and refused["msg"].startswith(named), refused
    assert body(server.get("listSchedules", topic="t4"))["schedules"] == []
    assert server.get("getSchedule", topic="t4", scheduleId="bad")[0] == 404


def test_list_pages_and_the_cap(server: Server) -> None:
    for sid in ("c", "a", "b"):
        body(server.post("putSchedule", topic="t5", scheduleId=sid, everyMillis=3_600_000, msg=sid))
    first = body(server.get("listSchedules", topic="t5", limit=2))
    assert [s["scheduleId"] for s in first["schedules"]] == ["a", "b"] and first["cursor"] == "b"
    rest = body(server.get("listSchedules", topic="t5", limit=2, cursor=first["cursor"]))
    assert [s["scheduleId"] for s in rest["schedules"]] == ["c"] and rest["cursor"] is None
    code, refused = server.post("putSchedule", topic="t5", scheduleId="d", everyMillis=3_600_000, msg="d")
    assert code == 429 and "--max-schedules" in refused["msg"]
    body(server.post("putSchedule", topic="t5", scheduleId="a", everyMillis=7_200_000, msg="a2"))  # not one more
    assert server.get("listSchedules", topic="t5", limit=0)[0] == 400
    assert server.post("listSchedules", topic="t5")[0] == 405
    for sid in ("a", "b", "c"):
        body(server.post("deleteSchedule", topic="t5", scheduleId=sid))


def test_the_schedule_bytes_cap_counts_utf8_bytes_not_characters(tmp_path: Path) -> None:
    """--max-schedule-bytes 5000: a msg of 1,200 four-byte characters is
    4,800 UTF-8 bytes, refused as 4,800 ASCII bytes are (each 5,002 with the
    topic, the id and 200); by characters it was 1,402 and taken (33 MB of
    such msgs were held under an 8 MiB cap)."""
    s = Server.start(tmp_path / "data", "--max-schedule-bytes", "5000", log_path=tmp_path / "serve.log")
    try:
        for msg in ("\U0001F600" * 1200, "a" * 4800):
            code, refused = s.post("putSchedule", topic="t", scheduleId="u", everyMillis=3_600_000, msg=msg)
            assert code == 429 and "--max-schedule-bytes" in refused["msg"] and "5002 bytes" in refused["msg"], \
                refused
            assert s.get("getSchedule", topic="t", scheduleId="u")[0] == 404  # nothing stored
        put = body(s.post("putSchedule", topic="t", scheduleId="u", everyMillis=3_600_000, msg="\U0001F600" * 1000))
        assert put["schedule"]["msg"] == "\U0001F600" * 1000  # 4,202 bytes held
        code, refused = s.post("putSchedule", topic="t", scheduleId="v", everyMillis=3_600_000, msg="a" * 798)
        assert code == 429 and "would hold 5202 bytes" in refused["msg"], refused
        body(s.post("deleteSchedule", topic="t", scheduleId="u"))
        body(s.post("putSchedule", topic="t", scheduleId="v", everyMillis=3_600_000, msg="a" * 798))
    finally:
        s.stop()


def test_sigkill_loses_no_run_and_makes_none_twice(tmp_path: Path) -> None:
    """An every-second schedule (misfire=once, 60 s grace) and a consumer
    that pulls and acks all the while; the node is SIGKILLed three times and
    restarted at once on the same data dir. Every nominal second from the
    first run to the last is delivered (downtimes are far within the
    grace), each run's message was made once (one produce time per msgId),
    and no run is delivered after its ack was answered. A pull whose answer
    a kill cut off leaves its runs CONSUMING until their ack deadline: the
    consumer pulls with a 1 s ack timeout, so they come back within the
    test (with the default 30 s they would come back after it)."""
    data = tmp_path / "data"
    server = Server.start(data, log_path=tmp_path / "serve.log")
    body(server.post("putSchedule", topic="k", scheduleId="s", everyMillis=1000, msg="run"))
    seen: dict[str, set[int]] = {}  # msgId -> produce times
    acked: set[str] = set()
    after_ack: list[str] = []
    stop = threading.Event()
    current = [server]

    def consume() -> None:
        while not stop.is_set():
            s = current[0]
            try:
                code, answer = s.post("longPollingMsg", topic="k", batch=50, longPollingTimeoutMillis=500,
                                          ackTimeoutMillis=1000)
                if code != 200 or not isinstance(answer, dict):
                    time.sleep(0.05)
                    continue
                batch = answer["delayMsgList"]
                for m in batch:
                    seen.setdefault(m["msgId"], set()).add(m["produceTime"])
                    if m["msgId"] in acked:
                        after_ack.append(m["msgId"])
                if batch:
                    code, _ = s.post("ackMsg", topic="k", msgIds=",".join(m["msgId"] for m in batch))
                    if code == 200:
                        acked.update(m["msgId"] for m in batch)
            except OSError:
                time.sleep(0.05)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        for _ in range(3):
            time.sleep(2.5)
            current[0].kill()
            current[0] = Server.start(data, log_path=tmp_path / "serve.log", port=int(server.base.rsplit(":", 1)[1]))
        time.sleep(3)
        stop.set()
        consumer.join(timeout=10)
        for m in pull_all(current[0], "k"):
            seen.setdefault(m["msgId"], set()).add(m["produceTime"])
        pending = body(current[0].get("getSchedule", topic="k", scheduleId="s"))["schedule"]["nextFireTimes"][0]
        nominal = sorted(int(msg_id.split("@")[1]) for msg_id in seen)
        # runs released since the last pull wait READY, not lost
        since = [body(current[0].post("getMsg", topic="k", msgId=f"s@{t}"))["delayMsg"]["status"]
                 for t in range(nominal[-1] + 1000, pending, 1000)]
    finally:
        stop.set()
        current[0].stop()
    assert len(nominal) >= 8
    assert nominal == list(range(nominal[0], nominal[-1] + 1000, 1000)), "a run was lost"
    assert all(status == 2 for status in since), since
    assert all(len(times) == 1 for times in seen.values()), {k: v for k, v in seen.items() if len(v) > 1}
    assert after_ack == []


def metric(text: str, name: str) -> dict[str, float]:
    """Each sample of `name` in a /metrics answer: its labels -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line[len(name):].rpartition(" ")
            found[labels] = float(value)
    return found


def test_metrics_count_runs_per_schedule_bounded_by_metrics_topics(tmp_path: Path) -> None:
    """/metrics: every schedule's runs in the node's sums, runs, misses and
    lateness of --metrics-topics schedules only."""
    server = Server.start(tmp_path / "data", "--metrics-topics", "1", log_path=tmp_path / "serve.log")
    try:
        for sid in ("a", "b"):
            body(server.post("putSchedule", topic="m", scheduleId=sid, everyMillis=1000, msg="x"))
        body(server.post("putSchedule", topic="m", scheduleId="c", cron="0 0 1 1 *", msg="x"))
        body(server.post("pauseSchedule", topic="m", scheduleId="c"))
        time.sleep(3.5)
        code, text = server.get("/metrics")
        assert code == 200 and isinstance(text, bytes)
        page = text.decode()
        shown = metric(page, "hourglass_schedule_runs_total")
        assert len(shown) == 1 and next(iter(shown)) in ('{topic="m",schedule="a"}', '{topic="m",schedule="b"}')
        total = metric(page, "hourglass_node_schedule_runs_total")[""]
        assert total >= 5 and next(iter(shown.values())) >= 2
        assert metric(page, "hourglass_schedules")[""] == 3 and metric(page, "hourglass_schedules_paused")[""] == 1
        assert metric(page, "hourglass_schedules_shown")[""] == 1
        assert list(metric(page, "hourglass_schedule_missed_total").values()) == [0]
        assert metric(page, "hourglass_node_schedule_missed_total")[""] == 0
        assert len(metric(page, "hourglass_schedule_lateness_seconds_total")) == 1
        assert len(metric(page, "hourglass_schedule_last_lateness_seconds")) == 1
    finally:
        server.stop()


def test_a_purge_then_kill_9_the_schedules_go_on_and_a_run_id_is_refused(tmp_path: Path) -> None:
    """Two every-second schedules; a sendMsg and a sendMsgBatch under a
    run's msgId are refused (400 naming it, nothing stored); deleteMsgs
    all=true deletes both pending runs and the node is SIGKILLed at once
    (whether or not it recorded what followed), then restarted. The deleted
    runs are never delivered nor listed as released; both schedules go on
    with the next nominal second, each run once, none early, none missing."""
    data = tmp_path / "data"
    server = Server.start(data, log_path=tmp_path / "serve.log")
    port = int(server.base.rsplit(":", 1)[1])
    start = int(time.time() * 1000) + 5000  # the first runs well after the restart
    first = start + 1000
    try:
        for sid in ("a", "b"):
            put = body(server.post("putSchedule", topic="pk", scheduleId=sid, everyMillis=1000, msg=sid,
                                   startTime=start))
            assert put["schedule"]["nextFireTimes"][0] == first
        code, refused = server.post("sendMsg", topic="pk", msgId=f"a@{first + 1000}", msg="mine")
        assert code == 400 and isinstance(refused, dict) and refused["msg"].startswith("msgId"), refused
        code, refused = server.post_json("sendMsgBatch", {"topic": "pk", "msgs": [
            {"msgId": "fine", "msg": "x"}, {"msgId": f"b@{first + 2000}", "msg": "mine"}]})
        assert code == 400 and isinstance(refused, dict) and refused["msg"].startswith("msgs[1].msgId"), refused
        assert server.post("getMsg", topic="pk", msgId="fine")[0] == 404
        purged = body(server.post("deleteMsgs", topic="pk", all="true"))
        assert purged["deleted"] == 2
        deadline = time.monotonic() + 5
        while True:  # counted once the schedules followed the purge (a moment after its answer)
            text = server.get("/metrics")[1]
            assert isinstance(text, bytes)
            deleted = metric(text.decode(), "hourglass_node_schedule_runs_deleted_total")[""]
            if deleted == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert deleted == 2 and metric(text.decode(), "hourglass_node_schedule_run_conflicts_total")[""] == 0
    finally:
        server.kill()
    server = Server.start(data, log_path=tmp_path / "serve.log", port=port)
    try:
        last = first + 4000
        got: list[tuple[dict[str, Any], int]] = []
        while time.time() * 1000 < last + 1500:
            answer = body(server.post("longPollingMsg", topic="pk", batch=10, longPollingTimeoutMillis=300))
            got += [(m, int(time.time() * 1000)) for m in answer["delayMsgList"]]
            if answer["delayMsgList"]:
                body(server.post("ackMsg", topic="pk", msgIds=",".join(m["msgId"] for m in answer["delayMsgList"])))
        for sid in ("a", "b"):
            runs = [(m, at) for m, at in got if m["scheduleId"] == sid and m["scheduledTime"] <= last]
            assert [m["scheduledTime"] for m, _ in runs] == [first + 1000 * k for k in range(1, 5)], (sid, got)
            assert all(at >= m["triggerTime"] and m["msg"] == sid for m, at in runs)  # the runs, never early
            schedule = body(server.get("getSchedule", topic="pk", scheduleId=sid))["schedule"]
            assert first not in [r["scheduledTime"] for r in schedule["lastRuns"]]
            code, deleted = server.post("getMsg", topic="pk", msgId=f"{sid}@{first}")
            assert code == 404 or deleted["delayMsg"]["status"] == 7  # type: ignore[index]
    finally:
        server.stop()
