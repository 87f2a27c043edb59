"""redriveMsgs, getJob, cancelJob (extensions: docs/api.md, "Re-driving by
filter"), on every backend (see conftest): the parameters are checked whole
(code 400 naming the parameter, no job made) everywhere; on the disk
backend, one shard or two, and on Redis, a job puts back the dead letters its filter
matches -- each keeps its msgId, gets a fresh retry budget and its
redriveCount one more, due now or at the job's trigger time -- and the
others stay dead; getJob lists and shows the job, cancelJob stops it."""

import time

import pytest

pytestmark = pytest.mark.slow

def make_dead(api, topic, ids_and_tags):
    """Messages that end after their one delivery (status 6; their ttl,
    the default, long), each (msgId, tag)."""
    for msg_id, tag in ids_and_tags:
        api.send(topic, msgId=msg_id, maxRetry=0, **({"tag": tag} if tag else {}))
    assert len(api.pull_until(topic, len(ids_and_tags), ackTimeoutMillis=100)) == len(ids_and_tags)
    for msg_id, _ in ids_and_tags:
        assert api.wait_status(topic, msg_id, {5, 6})["status"] == 6


def wait_job(api, job_id, states=("done", "cancelled", "failed"), timeout_s=10):
    deadline = time.monotonic() + timeout_s
    while True:
        code, body = api.get("getJob", jobId=job_id)
        assert code == 200, body
        if body["job"]["state"] in states or time.monotonic() > deadline:
            return body["job"]
        time.sleep(0.05)


def job_count(api) -> int | None:
    code, body = api.get("getJob")
    return len(body["jobs"]) if code == 200 else None


@pytest.mark.parametrize(("bad", "parameter"), [
    ({}, "topic"),
    ({"status": "2"}, "status"),
    ({"status": "5,7"}, "status"),
    ({"endedFrom": "200", "endedTo": "100"}, "endedFrom"),
    ({"endedTo": "-1"}, "endedTo"),
    ({"delayMillis": "1000", "triggerTime": "1"}, "delayMillis"),
    ({"delayMillis": "soon"}, "delayMillis"),
    ({"rate": "-1"}, "rate"),
    ({"rate": "99999999"}, "rate"),
    ({"limit": "0"}, "limit"),
    ({"limit": "100000001"}, "limit"),
    ({"tag": "a,b"}, "tag"),
])
def test_bad_parameters_answer_400_naming_them_and_start_nothing(api, topic, bad, parameter):
    before = job_count(api)
    params = ({"topic": topic} if parameter != "topic" else {}) | bad
    code, body = api.post("redriveMsgs", **params)
    assert code == 400 and parameter in body["msg"], body
    assert job_count(api) == before


def test_a_job_redrives_the_tag_it_names_keeping_ids_with_a_fresh_budget(api, topic):
    make_dead(api, topic, [(f"a{i}", "red") for i in range(6)] + [(f"b{i}", "blue") for i in range(4)])
    dead_a = api.message(topic, "a0")
    code, body = api.post("redriveMsgs", topic=topic, tag="red")
    assert code == 200 and body["jobId"] and body["job"]["state"] in ("running", "done"), body
    job = wait_job(api, body["jobId"])
    assert (job["state"], job["matched"], job["redriven"], job["skipped"]) == ("done", 6, 6, 0), job
    assert job["filter"]["tag"] == "red" and job["filter"]["status"] == [5, 6] and job["endTime"] is not None
    for i in range(6):
        m = api.message(topic, f"a{i}")
        assert (m["msgId"], m["status"], m["retry"], m["redriveCount"], m["tag"]) == (f"a{i}", 2, 0, 1, "red"), m
    assert api.message(topic, "a0")["expireTime"] > dead_a["expireTime"]  # its ttl counts again
    for i in range(4):
        m = api.message(topic, f"b{i}")
        assert m["status"] == 6 and "redriveCount" not in m, m
    got = api.pull_until(topic, 6, ackTimeoutMillis=60_000)
    assert sorted(m["msgId"] for m in got) == [f"a{i}" for i in range(6)]
    assert {m["retry"] for m in got} == {1}
    code, body = api.post("redriveMsgs", topic=topic, status="5")  # none expired: none matches
    assert wait_job(api, body["jobId"])["matched"] == 0
    code, body = api.post("redriveMsgs", topic=topic, msgIdPrefix="b", status="6")
    job = wait_job(api, body["jobId"])
    assert (job["state"], job["redriven"]) == ("done", 4), job
    assert api.message(topic, "b3")["redriveCount"] == 1


def test_a_job_with_a_delay_files_them_waiting_until_then(api, topic):
    make_dead(api, topic, [(f"d{i}", "") for i in range(3)])
    before_ms = int(time.time() * 1000)
    code, body = api.post("redriveMsgs", topic=topic, delayMillis=60_000, endedTo=before_ms + 3_600_000)
    assert code == 200, body
    job = wait_job(api, body["jobId"])
    assert (job["state"], job["redriven"]) == ("done", 3), job
    assert job["triggerTime"] >= before_ms + 60_000
    for i in range(3):
        m = api.message(topic, f"d{i}")
        assert (m["status"], m["retry"], m["redriveCount"], m["triggerTime"]) == (1, 0, 1, job["triggerTime"]), m
    assert api.pull(topic) == []
    # endedFrom after their expireTime: none matches
    code, body = api.post("redriveMsgs", topic=topic, endedFrom=before_ms + 3_600_000)
    assert wait_job(api, body["jobId"])["matched"] == 0


def test_get_job_lists_and_cancel_job_stops_a_paced_job(api, topic):
    make_dead(api, topic, [(f"c{i}", "") for i in range(12)])
    code, body = api.post("redriveMsgs", topic=topic, rate=1)  # one a second (a shard): slices of one
    assert code == 200, body
    job_id = body["jobId"]
    code, body = api.get("getJob")
    assert code == 200 and job_id in [j["jobId"] for j in body["jobs"]], body
    code, body = api.post("cancelJob", jobId=job_id)
    assert code == 200 and body["job"]["state"] == "cancelled", body
    redriven = body["job"]["redriven"]
    assert 1 <= redriven < 12, body
    time.sleep(1.5)  # a cancelled job re-drives no more
    job = wait_job(api, job_id)
    assert (job["state"], job["redriven"]) == ("cancelled", redriven), job
    code, body = api.get("listDeadMsg", topic=topic, limit=100)
    assert len(body["delayMsgList"]) == 12 - redriven, body
    code, body = api.post("cancelJob", jobId=job_id)  # ended: answered as it is
    assert code == 200 and body["job"]["state"] == "cancelled", body
    assert api.get("getJob", jobId="0123456789abcdef")[0] == 404
    assert api.post("cancelJob", jobId="0123456789abcdef")[0] == 404
    assert api.post("cancelJob")[0] == 400


def test_an_ended_job_makes_room_oldest_first(serve, topic):
    """--max-jobs 3 and three jobs ended: each new one drops the oldest
    ended record (getJob 404 saying so), the newer ones still answered."""
    api = serve("--max-jobs", "3", own_state=True)
    made = []
    for _ in range(5):
        code, body = api.post("redriveMsgs", topic=topic + "-empty")
        assert code == 200, body
        made.append(body["jobId"])
        wait_job(api, made[-1])
        kept, dropped = made[-3:], made[:-3]
        for job_id in kept:
            code, body = api.get("getJob", jobId=job_id)
            assert code == 200 and body["job"]["state"] == "done", body
        for job_id in dropped:
            code, body = api.get("getJob", jobId=job_id)
            assert code == 404 and "dropped" in body["msg"], body


def test_max_jobs_bounds_the_running_jobs_and_an_ended_one_makes_room(serve, topic):
    """--max-jobs 1: a job that ended does not lock out the next (its
    record makes room, and getJob says it was dropped); while one runs, a
    job more is refused 429 naming the flag, no job made; once it is
    cancelled, the next is made."""
    api = serve("--max-jobs", "1", own_state=True)  # (on Redis: no other test's jobs counted)
    code, body = api.post("redriveMsgs", topic=topic + "-empty")
    assert code == 200, body
    first = body["jobId"]
    wait_job(api, first)
    code, body = api.post("redriveMsgs", topic=topic + "-empty")
    assert code == 200, body
    wait_job(api, body["jobId"])
    code, body = api.get("getJob", jobId=first)
    assert code == 404 and "dropped" in body["msg"] and "--max-jobs" in body["msg"], body
    assert job_count(api) == 1
    make_dead(api, topic, [(f"d{i}", None) for i in range(8)])
    code, body = api.post("redriveMsgs", topic=topic, rate=1)  # some seconds: 8 at one a second
    assert code == 200, body
    running = body["jobId"]
    code, body = api.post("redriveMsgs", topic=topic)
    assert code == 429 and "--max-jobs" in body["msg"], body
    assert [j["jobId"] for j in api.get("getJob")[1]["jobs"]] == [running]
    assert api.post("cancelJob", jobId=running)[0] == 200
    code, body = api.post("redriveMsgs", topic=topic)
    assert code == 200, body
    assert job_count(api) == 1
