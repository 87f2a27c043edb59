"""Recurring schedules (docs/api.md, "Recurring schedules") over HTTP, the
same on both backends: putSchedule with cron and with everyMillis, each
run one message (msgId `<scheduleId>@<nominal ms>`, `scheduledTime`), the
pending run the one message waiting, getSchedule's lastRuns and next fire
times, the version's compare-and-set (409), pause and resume, pages of
listSchedules, deleteSchedule, and bad parameters refused naming them
with nothing stored. A schedule owns its progress: a purge, a deleteMsg
and a filtered deleteMsgs of pending runs do not stop it (the next run on
time, the deleted one never delivered); a send under one of its runs'
msgIds is refused (400 naming msgId), and a message sent under one before
the schedule existed never stands in for the run. The DST, misfire and restart rules are tested where
they can be on a fake clock (tests/unit/test_schedules_model.py,
tests/property/test_recurrence_reference.py) and with SIGKILL in
tests/integration/test_schedules.py (disk) and test_redis_schedules.py."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def served(api):
    """On Redis every node answers the calls, and the node holding the
    schedules lease makes the runs: the shared node takes it within a
    lease time of its start, or of a node that other tests killed holding it."""
    wait_served(api)


def ok(answer):
    code, body = answer
    assert code == 200, body
    return body


def put(api, topic, schedule_id, **params):
    return ok(api.post("putSchedule", topic=topic, scheduleId=schedule_id, **{"msg": "run", **params}))["schedule"]


def drain(api, topic, count, timeout_s=8.0):
    """Pull (and ack) until `count` messages came or the timeout."""
    got = api.pull_until(topic, count, timeout_s=timeout_s, ackTimeoutMillis=60_000)
    if got:
        ok(api.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in got)))
    return got


def test_every_millis_makes_one_message_a_run(api, topic):
    schedule = put(api, topic, "tick", everyMillis=1000, msg="tick", tag="hb", priority=3)
    assert schedule["version"] == 1 and schedule["paused"] is False and schedule["runs"] == 1
    assert schedule["misfire"] == "once" and schedule["timeZone"] == "UTC" and schedule["everyMillis"] == 1000
    first = schedule["nextFireTimes"][0]
    assert schedule["nextFireTimes"] == [first + 1000 * k for k in range(5)]
    pending = api.message(topic, f"tick@{first}")  # the first run exists, WAITING, before its time
    assert pending["status"] == 1 and pending["scheduledTime"] == first and pending["scheduleId"] == "tick"
    runs = drain(api, topic, 3)
    assert [m["scheduledTime"] for m in runs] == [first, first + 1000, first + 2000]  # each once, in order
    for m in runs:
        assert m["msgId"] == f"tick@{m['scheduledTime']}" and m["scheduleId"] == "tick"
        assert m["triggerTime"] == m["scheduledTime"] and m["msg"] == "tick"
        assert m["tag"] == "hb" and m["priority"] == 3
        assert m["produceTime"] < m["scheduledTime"]  # made ahead as the pending run, released on time
    deadline = time.monotonic() + 2
    while True:  # the run after a release is made just after it (on Redis, once the holder saw the release)
        got = ok(api.get("getSchedule", topic=topic, scheduleId="tick", next=2))["schedule"]
        released = {r["scheduledTime"] for r in got["lastRuns"]}
        if (got["nextFireTimes"][0] > first + 2000 and first + 2000 in released) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(got["nextFireTimes"]) == 2 and got["nextFireTimes"][0] > first + 2000
    assert got["nextFireTimes"][1] == got["nextFireTimes"][0] + 1000 and got["runs"] >= 4
    last = {r["scheduledTime"]: r for r in got["lastRuns"]}
    assert [r["scheduledTime"] for r in got["lastRuns"]] == sorted(last, reverse=True)  # newest first
    for m in runs:
        if m["scheduledTime"] not in last:  # only when the newest runs (10) have pushed it out, on a slow machine
            assert len(last) == 10 and m["scheduledTime"] < min(last), (m["scheduledTime"], sorted(last))
            continue
        r = last[m["scheduledTime"]]
        assert r["msgId"] == m["msgId"] and r["status"] == 4 and r["missed"] is False  # acked
        assert r["triggerTime"] == m["triggerTime"] and 0 <= r["latenessMillis"] < 1000
    waiting = api.message(topic, f"tick@{got['nextFireTimes'][0]}")
    assert waiting["status"] == 1
    ok(api.post("deleteSchedule", topic=topic, scheduleId="tick"))
    assert api.message(topic, waiting["msgId"]) == 404  # the pending run deleted, its id released
    assert api.get("getSchedule", topic=topic, scheduleId="tick")[0] == 404
    time.sleep(1.2)
    assert api.pull(topic, batch=10) == []  # no more runs


def test_a_cron_with_seconds_makes_its_runs(api, topic):
    schedule = put(api, topic, "c", cron="* * * * * *", timeZone="Europe/London", jitterMillis=500,
                   misfireGraceMillis=5000)
    assert schedule["cron"] == "* * * * * *" and schedule["timeZone"] == "Europe/London"
    first = schedule["nextFireTimes"][0]
    assert first % 1000 == 0 and schedule["nextFireTimes"] == [first + 1000 * k for k in range(5)]
    runs = drain(api, topic, 2)
    assert [m["scheduledTime"] for m in runs] == [first, first + 1000]
    for m in runs:  # jitter: the same on every node, in [0, jitterMillis)
        assert m["msgId"] == f"c@{m['scheduledTime']}"
        assert m["scheduledTime"] <= m["triggerTime"] < m["scheduledTime"] + 500
    ok(api.post("deleteSchedule", topic=topic, scheduleId="c"))


def wait_served(node, timeout_s=20.0):
    """Until the node makes the schedules' runs (on Redis: holds their
    lease, /metrics' hourglass_schedules_lease)."""
    if node.backend != "redis":
        return
    deadline = time.monotonic() + timeout_s
    while b"\nhourglass_schedules_lease 1" not in node.get("/metrics")[1] and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_skip_run_missed_while_the_node_was_down_is_ended_unseen(serve, topic):
    """misfire=skip, the only node down past the run's grace: at the
    restart the run's release ends it unseen (status 5, never delivered),
    it counts as missed, and the next run is the first nominal time after
    the release, delivered as usual. On Redis its own database, so no other
    node releases the run or holds the lease meanwhile."""
    node = serve(own_state=True)
    wait_served(node)
    schedule = put(node, topic, "s", everyMillis=3000, misfire="skip", misfireGraceMillis=200)
    first = schedule["nextFireTimes"][0]
    assert schedule["misfire"] == "skip" and node.message(topic, f"s@{first}")["status"] == 1
    assert node.server.stop() == 0  # (SIGTERM: on Redis the lease is let go at once)
    time.sleep(max(0.0, (first + 1000) / 1000 - time.time()))  # past nominal + grace, nobody up
    restarted_ms = int(time.time() * 1000)
    node = serve(own_state=True)
    wait_served(node)
    missed = node.wait_status(topic, f"s@{first}", {2, 3, 4, 5}, timeout_s=10)
    assert missed["status"] == 5 and missed["retry"] == 0  # ended unseen in its release
    deadline = time.monotonic() + 10
    while True:  # its next run made once the release is followed
        got = ok(node.get("getSchedule", topic=topic, scheduleId="s", next=2))["schedule"]
        if got["nextFireTimes"][0] > first or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    following = got["nextFireTimes"][0]
    assert following > restarted_ms and (following - first) % 3000 == 0  # skip's: the first after the release
    # (getSchedule shows the next run once decided, a moment before it is recorded and sent)
    assert got["runs"] == 2 and node.wait_status(topic, f"s@{following}", {1}, timeout_s=5)["status"] == 1
    [run] = [r for r in got["lastRuns"] if r["scheduledTime"] == first]
    assert run["missed"] is True and run["status"] == 5 and run["latenessMillis"] > 200
    delivered = drain(node, topic, 1, timeout_s=following / 1000 - time.time() + 5)
    assert [m["msgId"] for m in delivered] == [f"s@{following}"]  # the missed run never, the next one on time
    ok(node.post("deleteSchedule", topic=topic, scheduleId="s"))


def test_version_compare_and_set(api, topic):
    base = {"everyMillis": 60_000, "msg": "x"}
    assert put(api, topic, "v", **base, version=0)["version"] == 1
    code, refused = api.post("putSchedule", topic=topic, scheduleId="v", **base, version=0)
    assert code == 409 and refused["code"] == 409 and "version 1" in refused["msg"], refused
    code, refused = api.post("putSchedule", topic=topic, scheduleId="v", **{**base, "msg": "y"}, version=5)
    assert code == 409 and "version 1" in refused["msg"]
    assert ok(api.get("getSchedule", topic=topic, scheduleId="v"))["schedule"]["msg"] == "x"  # unchanged
    replaced = put(api, topic, "v", **{**base, "msg": "y"}, version=1)
    assert replaced["version"] == 2 and replaced["msg"] == "y"
    assert put(api, topic, "v", **{**base, "msg": "z"})["version"] == 3  # no version: replaced whatever it was
    got = ok(api.get("getSchedule", topic=topic, scheduleId="v"))["schedule"]
    assert got["msg"] == "z" and got["version"] == 3
    pending = api.message(topic, f"v@{got['nextFireTimes'][0]}")
    assert pending["status"] == 1 and pending["msg"] == "z"  # the replacement's run, one message
    ok(api.post("deleteSchedule", topic=topic, scheduleId="v"))


def test_pause_deletes_the_pending_run_and_resume_makes_it_again(api, topic):
    schedule = put(api, topic, "p", cron="0 0 * * *", timeZone="America/New_York", msg="nightly")
    pending = f"p@{schedule['nextFireTimes'][0]}"
    assert api.message(topic, pending)["status"] == 1
    paused = ok(api.post("pauseSchedule", topic=topic, scheduleId="p"))["schedule"]
    assert paused["paused"] is True and paused["nextFireTimes"] == [] and paused["version"] == 2
    assert api.message(topic, pending) == 404
    assert ok(api.post("pauseSchedule", topic=topic, scheduleId="p"))["schedule"]["version"] == 2  # no change
    resumed = ok(api.post("resumeSchedule", topic=topic, scheduleId="p"))["schedule"]
    assert resumed["paused"] is False and resumed["version"] == 3
    assert resumed["nextFireTimes"] == schedule["nextFireTimes"]
    assert api.message(topic, pending)["status"] == 1
    ok(api.post("deleteSchedule", topic=topic, scheduleId="p"))
    for call in ("pauseSchedule", "resumeSchedule", "deleteSchedule"):
        code, body = api.post(call, topic=topic, scheduleId="p")
        assert code == 404 and body["code"] == 404
    assert api.get("getSchedule", topic=topic, scheduleId="p")[0] == 404
    assert api.message(topic, pending) == 404


def test_list_schedules_pages_by_cursor(api, topic):
    for sid in ("c", "a", "e", "b", "d"):
        put(api, topic, sid, everyMillis=3_600_000)
    seen, cursor, pages = [], None, 0
    while True:
        page = ok(api.get("listSchedules", topic=topic, limit=2, **({} if cursor is None else {"cursor": cursor})))
        seen += [s["scheduleId"] for s in page["schedules"]]
        pages += 1
        assert all(s["topic"] == topic and len(s["nextFireTimes"]) == 5 for s in page["schedules"])
        cursor = page["cursor"]
        if cursor is None:
            break
        assert cursor == seen[-1]
    assert seen == ["a", "b", "c", "d", "e"] and pages == 3
    assert ok(api.get("listSchedules", topic=topic + "-none"))["schedules"] == []
    assert api.get("listSchedules", topic=topic, limit=0)[0] == 400
    for sid in seen:
        ok(api.post("deleteSchedule", topic=topic, scheduleId=sid))
    assert ok(api.get("listSchedules", topic=topic))["schedules"] == []


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
    ({"everyMillis": 1000, "delayMillis": 5}, "delayMillis"),
    ({"everyMillis": 1000, "version": -1}, "version"),
    ({"everyMillis": 1000, "scheduleId": "x" * 49}, "scheduleId"),
    ({"everyMillis": 1000, "msg": ""}, "msg"),
])
def test_bad_parameters_are_refused_naming_them_and_nothing_is_stored(api, topic, params, named):
    code, refused = api.post("putSchedule", **{"topic": topic, "scheduleId": "bad", "msg": "x", **params})
    assert code == 400 and refused["code"] == 400 and refused["msg"].startswith(named), refused
    assert ok(api.get("listSchedules", topic=topic))["schedules"] == []
    assert api.get("getSchedule", topic=topic, scheduleId="bad")[0] == 404
    assert api.is_empty(topic) or api.info(topic) == 404


def test_refs_are_checked(api, topic):
    for call in ("deleteSchedule", "pauseSchedule", "resumeSchedule"):
        code, refused = api.post(call, topic=topic)
        assert code == 400 and refused["msg"].startswith("scheduleId"), refused
    code, refused = api.get("getSchedule", topic=topic, scheduleId="s", next=101)
    assert code == 400 and refused["msg"].startswith("next"), refused
    code, refused = api.get("getSchedule", scheduleId="s")
    assert code == 400 and refused["msg"].startswith("topic"), refused


# -- a schedule owns its progress: deletes and squatters never stop it ---------------------------


def now_ms():
    return int(time.time() * 1000)


def drain_timed(api, topic, count, until_ms):
    """Long-poll (and ack) until `count` messages came or `until_ms` (+5 s)
    passed; each with the wall-clock ms it was answered at."""
    got, deadline = [], time.monotonic() + max(0.0, until_ms / 1000 - time.time()) + 5
    while len(got) < count and time.monotonic() < deadline:
        status, body = api.post("longPollingMsg", topic=topic, batch=count - len(got), longPollingTimeoutMillis=300,
                                ackTimeoutMillis=60_000)
        assert status == 200, body
        got += [(m, now_ms()) for m in body["delayMsgList"]]
    if got:
        ok(api.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m, _ in got)))
    return got


def gone(api, topic, msg_id):
    """Deleted (7), or no such message any more (404)."""
    m = api.message(topic, msg_id)
    return m == 404 or m["status"] == 7


def assert_goes_on(api, topic, schedule_ids, first):
    """Each schedule's run of `first` never delivered nor released (not in
    lastRuns); its next two runs (first + 1000, first + 2000) delivered, in
    order, none before its time."""
    got = drain_timed(api, topic, 2 * len(schedule_ids), first + 2000)
    for sid in schedule_ids:
        runs = [(m, at) for m, at in got if m["scheduleId"] == sid]
        assert [m["scheduledTime"] for m, _ in runs] == [first + 1000, first + 2000], (sid, got)
        assert all(at >= m["triggerTime"] for m, at in runs), runs  # never early
        assert gone(api, topic, f"{sid}@{first}")
        deadline = time.monotonic() + 5
        while True:  # the run after the last released is made just after it (on Redis, once the holder saw it)
            schedule = ok(api.get("getSchedule", topic=topic, scheduleId=sid))["schedule"]
            if schedule["nextFireTimes"][0] > first + 2000 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert schedule["paused"] is False and schedule["nextFireTimes"][0] > first + 2000
        assert first not in [r["scheduledTime"] for r in schedule["lastRuns"]]  # never released
    for sid in schedule_ids:
        ok(api.post("deleteSchedule", topic=topic, scheduleId=sid))


def test_a_purge_does_not_stop_the_topics_schedules(api, topic):
    """deleteMsgs all=true deletes the schedules' pending runs: those are
    never delivered, and each schedule goes on with its next run, on time."""
    start = now_ms() + 2000
    for sid in ("a", "b"):
        assert put(api, topic, sid, everyMillis=1000, startTime=start)["nextFireTimes"][0] == start + 1000
    purged = ok(api.post("deleteMsgs", topic=topic, all="true"))
    assert purged["deleted"] == 2 and purged["more"] is False
    assert_goes_on(api, topic, ("a", "b"), start + 1000)


def test_a_deleted_pending_run_is_skipped_and_the_schedule_goes_on(api, topic):
    """deleteMsg of one pending run, deleteMsgs by a filter (tag) of another."""
    start = now_ms() + 2000
    put(api, topic, "one", everyMillis=1000, startTime=start)
    put(api, topic, "tagged", everyMillis=1000, startTime=start, tag="nightly")
    first = start + 1000
    ok(api.post("deleteMsg", topic=topic, msgId=f"one@{first}"))
    filtered = ok(api.post("deleteMsgs", topic=topic, tag="nightly"))
    assert filtered["deleted"] == 1
    assert_goes_on(api, topic, ("one", "tagged"), first)


def test_a_send_under_a_schedules_run_id_is_refused(api, topic):
    """sendMsg and sendMsgBatch with a msgId `<scheduleId>@<digits>` of a
    schedule of the topic: 400 naming msgId, nothing stored (the batch
    whole); the schedule's runs come as ever."""
    start = now_ms() + 2000
    times = put(api, topic, "sq", everyMillis=1000, startTime=start)["nextFireTimes"]
    code, refused = api.post("sendMsg", topic=topic, msgId=f"sq@{times[1]}", msg="mine", delayMillis=60_000)
    assert code == 400 and refused["msg"].startswith("msgId"), refused
    code, refused = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msgId": "fine", "msg": "x", "delayMillis": 60_000},
        {"msgId": f"sq@{times[2]}", "msg": "mine", "delayMillis": 60_000}]})
    assert code == 400 and refused["msg"].startswith("msgs[1].msgId"), refused
    assert api.message(topic, "fine") == 404 and api.message(topic, f"sq@{times[2]}") == 404  # nothing stored
    for msg_id in (f"other@{times[1]}", "sq@soon"):  # no such schedule; not a run's form
        assert api.send(topic, msgId=msg_id, delayMillis=60_000)["msgId"] == msg_id
    got = drain_timed(api, topic, 2, times[1])
    assert [(m["msgId"], m["msg"]) for m, _ in got] == [(f"sq@{times[0]}", "run"), (f"sq@{times[1]}", "run")]
    ok(api.post("deleteSchedule", topic=topic, scheduleId="sq"))
    ok(api.post("deleteMsgs", topic=topic, all="true"))


def test_a_message_sent_under_a_run_id_before_the_schedule_never_stands_in(api, topic):
    """A client's message under a run's msgId, sent before the schedule
    existed (and so not refused), holds the first run's id with a later
    trigger time: that run is counted as a conflict, not waited for; the
    client's message stays the client's, and the schedule's next runs come
    on time."""
    start = now_ms() + 2000
    first = start + 1000
    mine = api.send(topic, msgId=f"early@{first}", msg="mine", delayMillis=60_000)
    assert mine["status"] == 1
    schedule = put(api, topic, "early", everyMillis=1000, startTime=start)
    assert schedule["nextFireTimes"][0] in (first, first + 1000)  # (the conflict may be seen already)
    got = drain_timed(api, topic, 2, first + 2000)
    assert [m["scheduledTime"] for m, _ in got] == [first + 1000, first + 2000], got
    assert all(m["msg"] == "run" for m, _ in got) and all(at >= m["triggerTime"] for m, at in got)
    held = api.message(topic, f"early@{first}")
    assert held["status"] == 1 and held["msg"] == "mine"  # the client's, untouched
    ok(api.post("deleteSchedule", topic=topic, scheduleId="early"))
    ok(api.post("deleteMsgs", topic=topic, all="true"))


def drain_each(api, topic, count, timeout_s):
    """Pull until `count` messages came or the timeout, each batch acked
    at once (a serial key's next message waits for its ack)."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        batch = api.pull_until(topic, count - len(got), timeout_s=0.5, ackTimeoutMillis=60_000)
        if batch:
            ok(api.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in batch)))
        got += batch
    return got


def schedule_settled(api, topic, schedule_id, after_ms, timeout_s=5.0):
    """getSchedule once its next run is after `after_ms` (the release followed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = ok(api.get("getSchedule", topic=topic, scheduleId=schedule_id, next=2))["schedule"]
        if (got["nextFireTimes"] and got["nextFireTimes"][0] > after_ms) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize(("misfire", "on_resume", "delivered", "key"), [
    ("skip", "hold", 0, None), ("once", "hold", 1, None), ("all", "hold", 3, None),
    ("once", "shift", 1, None), ("once", "expire", 1, None), ("skip", "expire", 0, None),
    ("once", "hold", 1, "k"), ("all", "shift", 3, "k"),
])
def test_a_paused_topics_schedule_follows_its_misfire_rule(api, topic, misfire, on_resume, delivered, key):
    """A schedule every second on a topic paused ~4 s: the run that falls
    due is held back, waiting, and no later run is made meanwhile (runs
    stays 1); on resume it is judged by `misfire` against the resume time
    (grace 1 s: missed), whatever `onResume`: skip delivers none of the
    pause's runs (ended unseen, counted missed), once one, all
    `maxCatchUp` (3) oldest first; then the next run is the first nominal
    time after the resume. The same for a pause of the schedule's serial key."""
    keyed = {} if key is None else {"key": key}
    schedule = put(api, topic, "s", everyMillis=1000, misfire=misfire, misfireGraceMillis=1000, maxCatchUp=3,
                   **keyed)
    first = schedule["nextFireTimes"][0]
    ok(api.post("pauseTopic", topic=topic, onResume=on_resume, **keyed))
    time.sleep(max(0.0, (first + 3300) / 1000 - time.time()))  # 3 nominal times and more past the first
    held = ok(api.get("getSchedule", topic=topic, scheduleId="s"))["schedule"]
    assert held["runs"] == 1 and held["nextFireTimes"][0] == first, held  # no run piled up behind it
    assert api.message(topic, f"s@{first}")["status"] == 1  # held back, waiting
    assert api.pull(topic, batch=10) == []
    resumed_ms = now_ms()
    ok(api.post("resumeTopic", topic=topic, **keyed))
    got = schedule_settled(api, topic, "s", resumed_ms)
    following = got["nextFireTimes"][0]
    assert following > resumed_ms and (following - first) % 1000 == 0, (got, resumed_ms)
    runs = drain_each(api, topic, delivered + 1, timeout_s=following / 1000 - time.time() + 5)
    paused_runs = [m["scheduledTime"] for m in runs if m["scheduledTime"] < resumed_ms]
    assert paused_runs == [first + 1000 * k for k in range(delivered)], (runs, resumed_ms)
    assert following in [m["scheduledTime"] for m in runs]  # the next one delivered on time
    assert first in {r["scheduledTime"] for r in got["lastRuns"]}, (got["lastRuns"], resumed_ms, first, api.message(topic, f"s@{first}"))
    judged = {r["scheduledTime"]: r for r in got["lastRuns"]}[first]
    assert judged["missed"] is True and judged["latenessMillis"] >= resumed_ms - first
    run = api.message(topic, f"s@{first}")
    assert run["status"] == (5 if misfire == "skip" else 4) and "endReason" not in run, run
    assert run["triggerTime"] == first  # never moved by a shift
    ok(api.post("deleteSchedule", topic=topic, scheduleId="s"))
