"""Every command of the node's table, walked on nodes of 1, 2 and 3 shards
(3 catches what an even split hides): the same script of requests gets
the same answers, reduced to what does not depend on time or on which
shard took a message, from each. Each command declares where it runs on a
node of shards (broker.http.commands.Where); this is the proof that what
it declares makes the node answer as one.

The script covers the table: a command added without a step here fails
`test_the_walk_covers_every_command_of_the_table`."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from serving import PREFIX, Server, request

from broker.node.config import ServeConfig
from broker.node.standalone import DiskNode

pytestmark = pytest.mark.slow

T = "walk"
HOUR_MS = 3_600_000
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

Step = tuple[str, str, dict[str, Any], Callable[[int, Any], Any]]


def code(status: int, body: Any) -> Any:
    """The answer's code only."""
    return status if not isinstance(body, dict) else (status, body.get("code"))


def ids_of(rows: list[dict[str, Any]] | None) -> list[str]:
    return sorted(m["msgId"] for m in rows or ())


def pulled(status: int, body: Any) -> Any:
    """Pull order: the priorities in order, the ids of each priority."""
    rows = body.get("delayMsgList") or []
    by_priority: dict[int, list[str]] = {}
    for m in rows:
        by_priority.setdefault(m.get("priority", 0), []).append(m["msgId"])
    return (body.get("code"), [m.get("priority", 0) for m in rows],
            {p: sorted(v) for p, v in by_priority.items() if p > 0}, len(rows))


def message(status: int, body: Any) -> Any:
    m = body.get("delayMsg") or {}
    return body.get("code"), m.get("msgId"), m.get("status"), m.get("priority")


def info(status: int, body: Any) -> Any:
    data = body.get("topicInfo") or body.get("data") or body
    keep = ("waitingQueueSize", "readyQueueSize", "ackQueueSize", "dueUndelivered")
    return body.get("code"), {k: data.get(k) for k in keep if isinstance(data, dict)}


def infos(status: int, body: Any) -> Any:
    rows = body.get("topicInfoList") or body.get("data") or []
    return body.get("code"), sorted((r.get("topic"), r.get("readyQueueSize"), r.get("waitingQueueSize"),
                                     r.get("ackQueueSize")) for r in rows)


def without(*volatile: str) -> Callable[[int, Any], Any]:
    """The whole answer less the named keys, wherever they are."""
    def reduce(status: int, body: Any) -> Any:
        def strip(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: strip(v) for k, v in value.items() if k not in volatile}
            if isinstance(value, list):
                return [strip(v) for v in value]
            return value
        return status, strip(body)
    return reduce


def schedule(status: int, body: Any) -> Any:
    s = body.get("schedule") or {}
    return body.get("code"), s.get("scheduleId"), s.get("paused"), s.get("everyMillis")


def backup_ends(status: int, body: Any) -> Any:
    """A backup stream (storage.backup's frames): its status, and whether its last frame is the end."""
    from storage.backup import FRAME

    last: dict[str, Any] = {}
    at = 0
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    while at + FRAME.size <= len(raw):
        head, data = FRAME.unpack_from(raw, at)
        last = json.loads(raw[at + FRAME.size:at + FRAME.size + head])
        at += FRAME.size + head + data
    return status, at == len(raw) and bool(last.get("end"))


class Walker:
    """One node's walk: each step's answer, reduced."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.answers: list[tuple[str, Any]] = []
        self.walked: set[tuple[str, str]] = set()

    def call(self, method: str, path: str, params: dict[str, Any] | None = None) -> tuple[int, Any]:
        path = path if path.startswith("/") else PREFIX + path
        self.walked.add((method, path))
        query = urllib.parse.urlencode({k: str(v) for k, v in (params or {}).items()})
        headers = {"x-hourglass-console": "1"} if path.startswith("/console") else {}
        if method == "GET":
            status, raw = request(self.server.base + path + (("?" + query) if query else ""), headers=headers)
        else:
            status, raw = request(self.server.base + path, data=query.encode(), headers={**FORM, **headers})
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        return status, body

    def step(self, method: str, path: str, reduce: Callable[[int, Any], Any], **params: Any) -> Any:
        status, body = self.call(method, path, params)
        reduced = reduce(status, body)
        named = {k: ("..." if k in ("jobId", "startTime", "deliveryId") else v) for k, v in params.items()}
        self.answers.append((f"{method} {path} {named}", reduced))
        return body

    def pages(self, method: str, path: str, rows: str, *, ordered: bool = True, **params: Any) -> list[str]:
        """Every page of a paged view, cursor by cursor: the ids (or
        scheduleIds) in order (not `ordered`: sorted, each as often as met)."""
        seen: list[str] = []
        cursor = None
        for _ in range(100):
            given = dict(params, **({"cursor": cursor} if cursor else {}))
            status, body = self.call(method, path, given)
            assert status == 200 and body.get("code") == 200, body
            seen += [r.get("msgId") or r.get("scheduleId") for r in body.get(rows) or ()]
            cursor = body.get("cursor")
            if not cursor:
                break
        self.answers.append((f"{method} {path} pages {params}", seen if ordered else sorted(seen)))
        return seen


def walk(server: Server, shards: int) -> Walker:
    w = Walker(server)
    ok = code
    # -- health, the switch, the map
    w.step("GET", "/health", ok)
    for name in ("status", "check"):
        for method in ("GET", "POST"):
            w.step(method, f"/camellia/health/{name}", ok)
    w.step("POST", "/camellia/health/offline", ok)
    w.step("GET", "/camellia/health/status", ok)
    w.step("POST", "/camellia/health/online", ok)
    w.step("GET", "/camellia/health/status", ok)
    shard_map = w.step("GET", "getShardMap", ok)
    assert shard_map["shards"] == shards and len(shard_map["ports"]) == shards
    w.step("GET", "backupShard", backup_ends)  # (the shard reached: its own store's backup)
    w.step("POST", "backupShard", code, have="x")  # (not the files an earlier backup holds: 400)
    # -- sends: ten due now over every shard (two of priority 5), five in an hour
    batch = [{"topic": T, "msgId": f"m{i}", "msg": f"body {i}", "delayMillis": 0, "priority": 5 if i in (3, 7) else 0}
             for i in range(10)]
    status, body = w.call("POST", "sendMsgBatch", {})  # (no body: the error it is)
    w.answers.append(("sendMsgBatch empty", code(status, body)))
    raw = json.dumps({"topic": T, "msgs": batch}).encode()
    status, answer = request(server.base + PREFIX + "sendMsgBatch", data=raw,
                             headers={"Content-Type": "application/json"})
    assert status == 200 and json.loads(answer)["code"] == 200, answer
    for i in range(5):
        w.step("POST", "sendMsg", ok, topic=T, msgId=f"later{i}", msg="x", delayMillis=HOUR_MS)
    # -- an import's: dead ones dead, a pending one with its retry count (each on its shard)
    status, body = w.call("POST", "importMsgBatch", {})  # (no body: the error it is)
    w.answers.append(("importMsgBatch empty", code(status, body)))
    imported = [{"msgId": "imp-dead", "msg": "x", "delayMillis": 0, "maxRetry": 1, "status": 6, "retry": 2},
                {"msgId": "imp-expired", "msg": "x", "delayMillis": 0, "status": 5},
                {"msgId": "imp-later", "msg": "x", "delayMillis": HOUR_MS, "maxRetry": 3, "retry": 2}]
    w.walked.add(("POST", PREFIX + "importMsgBatch"))
    status, answer = request(server.base + PREFIX + "importMsgBatch", headers={"Content-Type": "application/json"},
                             data=json.dumps({"topic": "imports", "msgs": imported}).encode())
    w.answers.append(("importMsgBatch", sorted((m["msgId"], m["status"], m["retry"])
                                               for m in json.loads(answer)["delayMsgList"])))
    w.pages("GET", "listDeadMsg", "delayMsgList", ordered=False, topic="imports")
    w.step("POST", "sendMsg", ok, topic=T, msgId="later0", msg="x", delayMillis=HOUR_MS)  # (a repeat: deduped)
    time.sleep(0.3)  # (due now: READY within the wheel's tick, on every shard)
    w.step("GET", "getTopicInfo", info, topic=T)
    w.step("GET", "getTopicInfoList", infos)
    # -- pull: the node's order (priority 5 first, whichever shard holds them)
    first = w.step("POST", "pullMsg", pulled, topic=T, batch=3, ackTimeoutMillis=60_000)
    handed = {m["msgId"]: m["deliveryId"] for m in first["delayMsgList"]}
    # -- leases: the holder's extension, a stale one (each on the msgId's shard, wherever it was asked)
    w.step("POST", "extendMsg", ok, topic=T, msgId="m3", deliveryId=handed["m3"], ackTimeoutMillis=60_000)
    w.step("POST", "extendMsg", ok, topic=T, msgId="m3", deliveryId="1", ackTimeoutMillis=60_000)
    w.step("POST", "longPollingMsg", pulled, topic=T, batch=2, ackTimeoutMillis=60_000, longPollingTimeoutMillis=500)
    w.step("GET", "getTopicInfo", info, topic=T)
    w.step("POST", "ackMsg", ok, topic=T, msgId="m3")
    w.step("POST", "ackMsg", ok, topic=T, msgId="m7", ack="false")
    w.step("POST", "ackMsg", ok, topic=T, msgId="nosuch")
    w.step("POST", "getMsg", message, topic=T, msgId="m3")
    w.step("POST", "getMsg", message, topic=T, msgId="later1")
    w.step("POST", "getMsg", message, topic=T, msgId="nosuch")
    w.step("POST", "rescheduleMsg", message, topic=T, msgId="later1", delayMillis=0)
    w.step("POST", "deleteMsg", ok, topic=T, msgId="later2")
    w.step("POST", "deleteMsg", ok, topic=T, msgId="later2")
    # -- bulk: pages over every shard, one cursor
    w.pages("GET", "listMsg", "delayMsgList", topic=T, limit=3)
    w.pages("POST", "listMsg", "delayMsgList", topic=T, limit=4, status="1,2,3,4")
    w.step("POST", "rescheduleMsgs", without(), topic=T, msgIdPrefix="later", delayMillis=2 * HOUR_MS)
    w.step("POST", "deleteMsgs", without(), topic=T, msgIdPrefix="later3")
    w.pages("GET", "listMsg", "delayMsgList", topic=T, limit=2, msgIdPrefix="later")
    # -- dead letters: a ttl that has passed (ends at once, status 5)
    for i in range(4):
        w.step("POST", "sendMsg", ok, topic=T, msgId=f"dead{i}", msg="x", delayMillis=0, ttlMillis=1)
    time.sleep(0.5)
    w.step("POST", "pullMsg", pulled, topic=T, batch=20, ackTimeoutMillis=60_000)
    w.pages("GET", "listDeadMsg", "delayMsgList", topic=T, limit=1)
    w.pages("GET", "exportMsg", "delayMsgList", ordered=False, topic=T, limit=3)  # (in the order each shard holds them)
    w.step("GET", "exportMsg", code, topic=T, cursor="s0.x")  # (a cursor no page answered: 400)
    w.step("POST", "redriveMsg", lambda s, b: message(s, b)[:2], topic=T, msgId="dead0")  # (its ttl, 1 ms, may pass)
    w.step("POST", "redriveMsg", ok, topic=T, msgId="m0")  # (not dead: 409)
    job = w.step("POST", "redriveMsgs", ok, topic=T, msgIdPrefix="dead", delayMillis=HOUR_MS)
    job_id = job.get("jobId")
    for _ in range(100):
        got = w.call("GET", "getJob", {"jobId": job_id})[1]
        if got.get("job", {}).get("state") not in ("running", "queued"):
            break
        time.sleep(0.05)
    w.step("GET", "getJob", without("triggerTime", "createTime", "startTime", "endTime", "updateTime", "jobId", "createdTime", "endedTime",
                                    "lastSliceTime", "elapsedMillis", "etaMillis", "rateNow"), jobId=job_id)
    w.step("POST", "getJob", ok, jobId=job_id)
    one = w.step("POST", "redriveMsgs", ok, topic=T, msgIdPrefix="dead", limit=1)  # (the node's limit: 1 in all)
    for _ in range(100):
        got = w.call("GET", "getJob", {"jobId": one.get("jobId")})[1]
        if got.get("job", {}).get("state") not in ("running", "queued"):
            break
        time.sleep(0.05)
    w.answers.append(("redriveMsgs limit 1", (got["job"]["state"], got["job"]["redriven"], got["job"]["limit"])))
    w.step("POST", "cancelJob", ok, jobId=job_id)
    w.step("POST", "cancelJob", ok, jobId="nosuch")
    w.step("GET", "getTopicInfo", info, topic=T)
    # -- flow
    w.step("POST", "setTopicConfig", ok, topic=T, releaseRate=1000)
    w.step("GET", "getTopicConfig", without("updateTime", "changedTime"), topic=T)
    w.step("POST", "pauseTopic", ok, topic=T)
    w.step("POST", "pullMsg", pulled, topic=T, batch=5, ackTimeoutMillis=60_000)
    w.step("POST", "resumeTopic", ok, topic=T)
    w.step("POST", "pullMsg", pulled, topic=T, batch=5, ackTimeoutMillis=60_000)
    # -- schedules: six ids over every shard, one page walk
    for i in range(6):
        w.step("POST", "putSchedule", schedule, topic=T, scheduleId=f"s{i}", everyMillis=HOUR_MS, msg="run",
               startTime=int(time.time() * 1000) + HOUR_MS)
    w.step("GET", "getSchedule", schedule, topic=T, scheduleId="s4")
    w.step("POST", "pauseSchedule", schedule, topic=T, scheduleId="s4")
    w.step("POST", "resumeSchedule", schedule, topic=T, scheduleId="s4")
    w.step("POST", "deleteSchedule", ok, topic=T, scheduleId="s5")
    w.step("GET", "getSchedule", ok, topic=T, scheduleId="s5")
    w.pages("GET", "listSchedules", "schedules", topic=T, limit=2)
    # -- push
    w.step("POST", "subscribe", ok, topic="pushed", url="http://127.0.0.1:9/hook", concurrency=3)
    w.step("GET", "getSubscription", without("deliveries", "failures", "inFlight", "backingOff", "lastError",
                                             "lastErrorTime", "createdTime", "updateTime"), topic="pushed")
    w.step("POST", "unsubscribe", ok, topic="pushed")
    w.step("GET", "getSubscription", ok, topic="pushed")
    # -- the node's views
    monitor = w.call("GET", "getMonitorData")
    w.answers.append(("getMonitorData", code(*monitor)))
    w.step("GET", "getMonitorString", lambda s, b: s)
    status, text = w.call("GET", "/metrics")
    ready = re.search(rb'^hourglass_ready_messages\{topic="walk"\} (\S+)$', text if isinstance(text, bytes) else b"", re.M)
    w.answers.append(("metrics ready", (status, ready and float(ready.group(1)))))
    # -- the console: its page, its login (an open node: none needed), its views, its API calls
    w.step("GET", "/console", lambda s, b: s)
    w.step("GET", "/console/login", lambda s, b: s)
    w.step("POST", "/console/login", lambda s, b: s)
    w.step("POST", "/console/logout", lambda s, b: s)
    w.step("GET", "/console/api/topics", without("oldestDueAgeMillis", "longestHeldMillis"))
    w.step("GET", "/console/api/node", lambda s, b: s)
    w.step("GET", "/console/api/stats", lambda s, b: s)
    w.step("GET", "/console/api/forecast", lambda s, b: s)
    w.step("GET", "/console/api/subscriptions", without())
    w.step("GET", "/console/api/schedules", without("nextFireTime", "nextFireTimes", "startTime", "updateTime"),
           topic=T)
    for method, name in (("GET", "listDeadMsg"), ("POST", "redriveMsg"), ("POST", "getMsg"), ("GET", "listMsg"),
                         ("POST", "deleteMsgs"), ("POST", "rescheduleMsgs"), ("POST", "redriveMsgs"),
                         ("GET", "getJob"), ("POST", "cancelJob"), ("GET", "getTopicConfig"), ("POST", "pauseTopic"),
                         ("POST", "resumeTopic")):
        w.step(method, f"/console/api/{name}", ok, topic="other", msgId="nosuch", jobId="nosuch")
    return w


def table_commands(tmp_path: Any) -> set[tuple[str, str]]:
    node = DiskNode(ServeConfig(data_dir=str(tmp_path / "table"), port=0))
    try:
        return set(node.app().table.commands)
    finally:
        node.store.close()


@pytest.fixture(scope="module")
def walks(tmp_path_factory: Any) -> dict[int, Walker]:
    done = {}
    for shards in (1, 2, 3):
        path = tmp_path_factory.mktemp(f"walk{shards}")
        server = Server.start(path / "data", "--shards", str(shards), "--push-allow", "127.0.0.1")
        try:
            done[shards] = walk(server, shards)
        finally:
            assert server.stop() == 0
    return done


def test_the_walk_covers_every_command_of_the_table(walks, tmp_path):
    missing = table_commands(tmp_path) - walks[1].walked
    assert not missing, f"commands the walk does not take: {sorted(missing)}"


@pytest.mark.parametrize("shards", [2, 3])
def test_a_node_of_shards_answers_every_command_as_a_node_of_one(walks, shards):
    one, many = walks[1].answers, walks[shards].answers
    assert [name for name, _ in one] == [name for name, _ in many]
    differ = [(name, a, b) for (name, a), (_, b) in zip(one, many) if a != b]
    assert not differ, "\n".join(f"{name}:\n  1 shard:  {a}\n  {shards} shards: {b}" for name, a, b in differ)
