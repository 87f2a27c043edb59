"""camellia's health switch (/camellia/health/*), its /metrics names and
getMonitorString, on both backends (broker.http.health, broker.observe.camellia_metrics)."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from serving import request

pytestmark = pytest.mark.slow

HEALTH = "/camellia/health/"

# Every selector of camellia's Grafana dashboard
# (docs/camellia-delay-queue/grafana-conf.json at camellia 6b57ff3d): the
# metric name and, where the panel picks one, its `type` label.
DASHBOARD = [
    ("info", None), ("uptime", None), ("start_time", None), ("memory_info", None), ("gc", None),
    ("cpu", "cpu_num"), ("cpu", "usage"),
    *[("request", t) for t in ("sendMsg", "pullMsg", "deleteMsg", "ackMsg", "getMsg", "triggerMsgReady",
                               "triggerMsgTimeout", "triggerMsgEndLife")],
    ("pull_msg_time_gap", None), ("pull_msg_time_gap", "avg"),
    ("ready_queue_time_gap", None), ("ready_queue_time_gap", "avg"),
    *[("topic_info", t) for t in ("readyQueueSize", "waitingQueueSize", "size_0_1min", "size_1min_10min",
                                  "size_10min_30min", "size_30min_1hour", "size_1hour_6hour", "size_1day_7day",
                                  "size_7day_30day", "size_30day_infinite")],
]
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (-?[0-9.e+-]+|NaN|\+Inf)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format, strictly: every line a comment or a sample,
    each family's TYPE given once."""
    out, typed = [], set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert name not in typed, f"TYPE {name} given twice"
            typed.add(name)
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def health(server, name: str, method: str = "GET") -> tuple[int, dict]:
    data = b"" if method == "POST" else None
    status, body = request(server.base + HEALTH + name, data=data)
    return status, json.loads(body)


def test_health_endpoints_need_no_token_and_answer_as_camellias(serve, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o600)
    api = serve("--auth-token-file", str(token_file), "--offline-idle-s", "0")
    server = api.server
    for method in ("GET", "POST"):
        assert health(server, "check", method) == (200, {"code": 200, "msg": "success"})
        assert health(server, "status", method) == (200, {"code": 200, "msg": "success"})
    assert server.get("getTopicInfoList")[0] == 401  # the API still needs the token
    assert health(server, "offline")[0] == 405  # the switch changes state: POST only
    assert server.get("/health")[0] == 200
    assert health(server, "offline", "POST")[0] == 200  # idle (no API call ran): drained at once
    status, body = health(server, "status")
    assert status == 500 and body["code"] == 500
    assert health(server, "check")[0] == 200
    status, body = server.get("/health")
    assert status == 503 and body["status"] == "offline"
    assert health(server, "online", "POST") == (200, {"code": 200, "msg": "success"})
    assert health(server, "status")[0] == 200
    assert server.get("/health")[0] == 200


def test_offline_answers_held_long_polls_and_drains(serve, topic):
    api = serve("--offline-idle-s", "1")
    server = api.server
    held = {}

    def long_poll():
        started = time.monotonic()
        held["answer"] = server.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=60_000)
        held["took_s"] = time.monotonic() - started
    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)  # the poll is held by now
    status, body = health(server, "offline", "POST")
    assert status == 500 and body["code"] == 500, body  # a call in flight: not drained yet
    poller.join(30)
    assert not poller.is_alive()
    assert held["answer"] == (200, {"code": 200, "msg": "success", "delayMsgList": []})
    assert held["took_s"] < 30  # answered at the switch, not at its 60 s timeout

    # offline, the node still serves what reaches it; a new long poll waits as usual
    assert api.send(topic, msgId="a", delayMillis=0)["status"] == 2
    assert [m["msgId"] for m in api.pull(topic)] == ["a"]
    started = time.monotonic()
    assert api.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=300)[1]["delayMsgList"] == []
    assert time.monotonic() - started >= 0.25
    assert health(server, "status")[0] == 500

    deadline = time.monotonic() + 20  # idle once no API call ran for 1 s
    while (answer := health(server, "offline", "POST"))[0] != 200:
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    assert answer[1]["code"] == 200
    assert health(server, "online", "POST")[0] == 200
    assert server.get("/health")[0] == 200


def test_metrics_carry_camellias_names_for_its_dashboard(serve, topic):
    # a node of its own: on the shared one, a hundred other tests' topics with larger backlogs
    # may take every place --metrics-topics gives, and this topic's series are then not shown
    api = serve("--monitor-interval-s", "1", own_state=True)
    api.send(topic, msgId="w", delayMillis=600_000)
    api.send(topic, msgId="r")
    assert len(api.pull_until(topic, 1)) == 1
    deadline = time.monotonic() + 15  # the counts show once their interval (1 s here) is published
    seen: set[tuple[str, str | None]] = set()
    sends = 0.0
    while True:
        status, text = api.get("/metrics")
        assert status == 200
        found = samples(text.decode())
        # The interval families are of the last interval only: the send (and "r"'s ready
        # gap) and the pull may fall in two intervals, each shown a second; so every family
        # of the dashboard must show in some scrape, and the topic's sends in one.
        seen |= {(name, kind) for name, kind in DASHBOARD
                 if any(n == name and (kind is None or labels.get("type") == kind) for n, labels, _ in found)}
        sends = max([sends, *(v for n, labels, v in found
                              if n == "request" and labels.get("topic") == topic and labels.get("type") == "sendMsg")])
        missing = [family for family in DASHBOARD if family not in seen]
        if sends >= 1 and not missing:
            break
        assert time.monotonic() < deadline, f"the topic's sends ({sends}) or {missing} never showed in /metrics"
        time.sleep(0.1)
    mine = {(n, labels["type"]): v for n, labels, v in found if labels.get("topic") == topic and "type" in labels}
    assert mine[("topic_info", "waitingQueueSize")] == 1
    assert mine[("topic_info", "size_1min_10min")] == 1
    assert mine[("topic_info", "ackQueueSize")] == 1
    assert any(n.startswith("hourglass_") for n, _, _ in found)  # hourglass's own stay


def test_get_monitor_string_is_camellias_json(api, topic):
    api.send(topic, msgId="w", delayMillis=600_000)
    status, raw = request(api.server.base + "/camellia/delayQueue/getMonitorString")
    assert status == 200
    data = json.loads(raw)
    assert set(data) == {"requestStats", "pullMsgTimeGapStats", "readyQueueTimeGapStats", "topicInfoStats",
                         "waitingQueueStats"}
    assert {"topic": topic, "waitingQueueSize": 1, "ackQueueSize": 0, "readyQueueSize": 0} in data["topicInfoStats"]
    waiting = [w for w in data["waitingQueueStats"] if w["topic"] == topic]
    assert len(waiting) == 1 and waiting[0]["sizeOf1minTo10min"] == 1 and waiting[0]["sizeOf0To1min"] == 0
    deadline = time.monotonic() + 15
    while not any(s["topic"] == topic for s in data["requestStats"]):  # once its interval is published
        assert time.monotonic() < deadline
        time.sleep(0.1)
        data = json.loads(request(api.server.base + "/camellia/delayQueue/getMonitorString")[1])
    stats = next(s for s in data["requestStats"] if s["topic"] == topic)
    assert stats["sendMsg"] == 1 and set(stats) == {"topic", "sendMsg", "pullMsg", "deleteMsg", "ackMsg", "getMsg",
                                                    "triggerMsgReady", "triggerMsgEndLife", "triggerMsgTimeout"}
