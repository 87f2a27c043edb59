"""deploy/'s dashboard and alert rules against real nodes scraped by a
real Prometheus (tests/prometheus_server.py; Debian's `prometheus` package,
which .ci/run installs; skipped where it is not installed):

- `promtool check rules` and `promtool test rules` pass, and every rule has
  a unit test that makes it fire;
- every query of every dashboard panel returns data once a standalone node
  and a 3-node cluster have done a little of everything (sends, pulls,
  acks, pushes to a real subscriber, a failing one, a dead letter), and
  the series with a topic label stay within --metrics-topics topics;
- "node down", "dispatch late" and "push failing" fire on a live node and
  resolve, with the real rules on a test's time scale (`fast_rules`);
- "oldest due message" fires on a topic whose due message nobody takes,
  on either backend, and resolves once it is taken; the topic's due
  gauges, the lateness split by cause and the dwell of its ack are
  scraped.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cluster import Cluster
from prometheus_server import Prometheus, binary, fast_rules
from serving import ROOT, PushSubscriber, Server

DEPLOY = Path(ROOT) / "deploy"
RULES = DEPLOY / "prometheus" / "hourglass-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "hourglass-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "hourglass.json"
SHOWN = 4  # --metrics-topics of the standalone node
# What the dashboard's variables stand for in the queries run here: every
# job, node and topic, and a rate window long enough to span the activity.
VARIABLES = {"$job": ".*", "$instance": ".*", "$topic": ".*", "$__rate_interval": "2m"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] if panel["type"] != "row"
            for target in panel["targets"]]


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_the_dashboard_json_is_what_its_script_writes():
    spec = importlib.util.spec_from_file_location("dashboard", DEPLOY / "grafana" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert DASHBOARD.read_text() == module.text(), "run python deploy/grafana/dashboard.py"
    queries = dashboard_queries()
    assert len(queries) >= 30
    assert all("$" not in substituted(expr) for _, expr in queries)


def test_the_rules_pass_promtool_check_and_every_rule_has_a_unit_test_that_fires_it():
    promtool = binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    unit = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, timeout=120,
                          cwd=RULE_TESTS.parent)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    rules = set(re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.MULTILINE))
    tested = RULE_TESTS.read_text()
    fired = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts:\n\s*- exp_labels", tested))
    quiet = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts: \[\]", tested))
    assert len(rules) == 13 and fired == rules and quiet == rules


def little_of_everything(node: Server, prom: Prometheus, tmp_path: Path) -> list[PushSubscriber]:
    """Sends, pulls, acks, a push delivered, pushes failing, a dead letter,
    and more topics than the node shows."""
    ok, failing = PushSubscriber(tmp_path, "ok"), PushSubscriber(tmp_path, "fail")
    assert node.post("subscribe", topic="p", url=ok.url)[0] == 200
    assert node.post("subscribe", topic="pf", url=failing.url)[0] == 200
    prom.wait_data('hourglass_push_subscriptions{job="hourglass"} == 2')  # scraped before any delivery: rates see them
    now = int(time.time() * 1000)
    later = now + 3_600_000
    assert node.post_json("sendMsgBatch", {"topic": "t", "msgs": [
        {"msg": f"later {i}", "triggerTime": later} for i in range(20)]})[0] == 200
    assert node.post_json("sendMsgBatch", {"topic": "d", "msgs": [
        {"msg": f"later {i}", "triggerTime": later} for i in range(10)]})[0] == 200
    for i in range(12):  # 12 more topics than shown, a message each
        assert node.post("sendMsg", topic=f"extra{i}", msg="x", triggerTime=later)[0] == 200
    for i in range(5):
        assert node.post("sendMsg", topic="t", msg=f"now {i}", triggerTime=now + 500)[0] == 200
        assert node.post("sendMsg", topic="p", msg=f"push {i}")[0] == 200
        assert node.post("sendMsg", topic="pf", msg=f"fails {i}")[0] == 200
    # past its ttl when it arrives: a dead letter (status 5)
    assert node.post("sendMsg", topic="d", msg="dead", triggerTime=now - 3_600_000, ttlMillis=1000)[0] == 200
    deadline = time.monotonic() + 20
    pulled: list[str] = []
    while len(pulled) < 5 and time.monotonic() < deadline:
        status, body = node.post("pullMsg", topic="t", batch=5, ackTimeoutMillis=60_000)
        assert status == 200
        pulled += [m["msgId"] for m in body["delayMsgList"]]
        time.sleep(0.2)
    assert len(pulled) == 5
    assert node.post("ackMsg", topic="t", msgIds=",".join(pulled[:4]))[0] == 200  # one stays consuming
    ok.wait_received(5)
    failing.wait_received(5)
    return [ok, failing]


@pytest.mark.slow
@pytest.mark.serial  # (a benchmark, and alert rules on a time scale: not beside another worker)
def test_every_dashboard_query_returns_data_and_topic_series_stay_bounded(tmp_path):
    binary("prometheus")
    node = Server.start(tmp_path / "standalone", "--push-allow", "127.0.0.1", "--monitor-interval-s", "1",
                        "--metrics-topics", str(SHOWN), log_path=tmp_path / "standalone.log")
    cluster = None
    subscribers: list[PushSubscriber] = []
    prom = None
    try:
        cluster = Cluster.start(tmp_path / "cluster", "--monitor-interval-s", "1")
        leader = cluster.nodes[cluster.wait_leader()]
        cluster.wait_known(cluster.wait_leader())
        standalone = node.base.removeprefix("http://")
        prom = Prometheus.start(tmp_path / "prometheus", {
            "hourglass": [standalone],
            "hourglass-cluster": [url.removeprefix("http://") for url in cluster.urls]})
        prom.wait_data('count(up{job=~"hourglass.*"} == 1) == 4')
        subscribers = little_of_everything(node, prom, tmp_path)
        assert leader.post("sendMsg", topic="c", msg="x")[0] == 200
        assert leader.post("sendMsg", topic="c", msg="y", delayMillis=600_000)[0] == 200
        status, body = leader.post("pullMsg", topic="c", batch=1)
        assert status == 200 and len(body["delayMsgList"]) == 1
        assert leader.post("ackMsg", topic="c", msgId=body["delayMsgList"][0]["msgId"])[0] == 200

        empty = []
        for title, expr in dashboard_queries():
            try:
                prom.wait_data(substituted(expr), timeout_s=30)
            except AssertionError:
                empty.append((title, expr))
        assert not empty, f"panel queries with no data: {empty}"

        # what the nodes did, as Prometheus has it
        assert prom.wait_data('hourglass_node_dead_messages{job="hourglass"} == 1')
        assert prom.wait_data('hourglass_push_failures_total{job="hourglass",topic="pf",reason="status"} >= 5')
        assert prom.wait_data('sum(hourglass_is_leader{job="hourglass-cluster"}) == 1')
        assert prom.wait_data('count(hourglass_replication_lag_bytes{job="hourglass-cluster"}) == 2')

        # cardinality: 16 topics on the node, no family with more than SHOWN topics
        topics = prom.query('hourglass_topics{job="hourglass"}')
        assert [float(s["value"][1]) for s in topics] == [16.0]
        per_family = prom.query('count by (__name__, le, type, reason) ({job="hourglass",topic!=""})')
        assert per_family and max(float(s["value"][1]) for s in per_family) == SHOWN
        shown = {s["metric"]["topic"] for s in prom.query('{job="hourglass",topic!=""}')}
        assert "t" in shown and "d" in shown and len(shown) <= 2 * SHOWN  # (push series pick their own topics)
        series = float(prom.query('count({job="hourglass"})')[0]["value"][1])
        assert series < 200 + 45 * SHOWN, series  # node-wide families, and at most ~41 + push's a shown topic
    finally:
        if prom is not None:
            prom.stop()
        for subscriber in subscribers:
            subscriber.stop()
        if cluster is not None:
            cluster.stop()
        node.kill()


@pytest.mark.slow
@pytest.mark.serial  # (a benchmark, and alert rules on a time scale: not beside another worker)
def test_node_down_dispatch_late_and_push_failing_fire_and_resolve(tmp_path):
    binary("prometheus")
    rules = tmp_path / "rules.yml"
    rules.write_text(fast_rules(RULES.read_text()))
    data = tmp_path / "data"
    flags = ("--push-allow", "127.0.0.1")
    node = Server.start(data, *flags, log_path=tmp_path / "serve.log")
    port = int(node.base.rsplit(":", 1)[1])
    instance = f"127.0.0.1:{port}"
    subscriber = PushSubscriber(tmp_path, "fail")
    prom = Prometheus.start(tmp_path / "prometheus", {"hourglass": [instance]}, rule_files=[str(rules)])
    try:
        prom.wait_data(f'up{{instance="{instance}"}} == 1')
        assert not prom.alerts("HourglassPushFailing") and not prom.alerts("HourglassNodeDown")

        # push failing: every delivery answered 500, then all 200
        assert node.post("subscribe", topic="hook", url=subscriber.url)[0] == 200
        for i in range(3):
            assert node.post("sendMsg", topic="hook", msg=f"m{i}")[0] == 200
        firing = prom.wait_alert("HourglassPushFailing", instance=instance, topic="hook")
        assert firing["labels"]["severity"] == "warning"
        subscriber.mode("ok")
        prom.wait_resolved("HourglassPushFailing", timeout_s=90)

        # dispatch late: the node stopped (SIGSTOP) while messages fall due; down meanwhile
        assert not prom.alerts("HourglassDispatchLate")
        due = int(time.time() * 1000) + 1_000
        assert node.post_json("sendMsgBatch", {"topic": "late", "msgs": [
            {"msg": f"late {i}", "triggerTime": due} for i in range(20)]})[0] == 200
        node.proc.send_signal(signal.SIGSTOP)
        try:
            prom.wait_alert("HourglassNodeDown", instance=instance, timeout_s=30)
            while time.time() * 1000 < due + 6_000:  # 6 s late at least
                time.sleep(0.2)
        finally:
            node.proc.send_signal(signal.SIGCONT)
        prom.wait_alert("HourglassDispatchLate", instance=instance)
        prom.wait_resolved("HourglassNodeDown", instance=instance)
        prom.wait_resolved("HourglassDispatchLate", instance=instance, timeout_s=90)
        late = prom.query(f'hourglass_release_lateness_seconds_bucket{{instance="{instance}",cause="load",le="5.0"}}')
        total = prom.query(f'hourglass_release_lateness_seconds_count{{instance="{instance}",cause="load"}}')
        assert float(total[0]["value"][1]) - float(late[0]["value"][1]) >= 20  # the 20, over 5 s late

        # node down: SIGKILL, and back on the same port
        node.kill()
        prom.wait_alert("HourglassNodeDown", instance=instance, timeout_s=30)
        node = Server.start(data, *flags, port=port, log_path=tmp_path / "serve.log")
        prom.wait_resolved("HourglassNodeDown", instance=instance)
        assert math.isfinite(float(prom.wait_data(f'up{{instance="{instance}"}} == 1')[0]["value"][1]))
    finally:
        prom.stop()
        subscriber.stop()
        node.kill()


@pytest.mark.slow
@pytest.mark.serial  # (a benchmark, and alert rules on a time scale: not beside another worker)
@pytest.mark.parametrize("backend", ["disk", "redis"])
def test_oldest_due_message_fires_on_a_topic_nobody_takes_and_resolves_once_taken(tmp_path, request, backend):
    binary("prometheus")
    rules = tmp_path / "rules.yml"
    fast = fast_rules(RULES.read_text())
    threshold = "(hourglass_topic_oldest_due_age_seconds{job=~\"hourglass.*\"}) > 60"
    assert threshold in fast
    rules.write_text(fast.replace(threshold, threshold.replace("> 60", "> 2")))  # due over 2 s, on a test's scale
    flags = ("--backend", request.getfixturevalue("redis_url")) if backend == "redis" else ()
    node = Server.start(tmp_path / "data", *flags, log_path=tmp_path / "serve.log")
    instance = node.base.removeprefix("http://")
    prom = Prometheus.start(tmp_path / "prometheus", {"hourglass": [instance]}, rule_files=[str(rules)])
    try:
        prom.wait_data(f'up{{instance="{instance}"}} == 1')
        assert node.post("sendMsg", topic="fresh", msg="x", delayMillis=600_000)[0] == 200  # not due: no alert
        now = int(time.time() * 1000)
        for i in range(3):
            assert node.post("sendMsg", topic="held", msg=f"m{i}", msgId=f"m{i}", triggerTime=now - i)[0] == 200
        prom.wait_data(f'hourglass_topic_due_undelivered{{instance="{instance}",topic="held"}} == 3')
        firing = prom.wait_alert("HourglassOldestDueMessage", instance=instance, topic="held")
        assert firing["labels"]["severity"] == "warning" and float(firing["value"]) > 2
        assert not prom.alerts("HourglassOldestDueMessage", topic="fresh")
        assert prom.wait_data(f'hourglass_topic_oldest_due_age_seconds{{instance="{instance}",topic="fresh"}} == 0')

        pulled: list[str] = []
        deadline = time.monotonic() + 20
        while len(pulled) < 3 and time.monotonic() < deadline:
            status, body = node.post("pullMsg", topic="held", batch=3)
            assert status == 200
            pulled += [m["msgId"] for m in body["delayMsgList"]]
        assert sorted(pulled) == ["m0", "m1", "m2"]
        assert node.post("ackMsg", topic="held", msgIds=",".join(pulled))[0] == 200
        prom.wait_resolved("HourglassOldestDueMessage", instance=instance, topic="held")
        prom.wait_data(f'hourglass_topic_due_undelivered{{instance="{instance}",topic="held"}} == 0')
        # three acks of due messages, each over 2 s after its trigger time; the lateness of their release
        prom.wait_data(f'hourglass_dwell_seconds_count{{instance="{instance}"}} == 3')
        assert prom.wait_data(f'hourglass_dwell_seconds_bucket{{instance="{instance}",le="1.0"}} == 0')
        load = prom.wait_data(f'hourglass_release_lateness_seconds_count{{instance="{instance}",cause="load"}} >= 3')
        assert len(load) == 1
        smoothing = prom.query(f'hourglass_release_lateness_seconds_count{{instance="{instance}",cause="smoothing"}}')
        assert [float(s["value"][1]) for s in smoothing] == [0.0]  # no topic has a releaseRate
    finally:
        prom.stop()
        node.kill()
