"""Writes hourglass.json beside it: the Grafana dashboard of hourglass
nodes, from the panels listed here (edit them here, then run
`python deploy/grafana/dashboard.py`; tests/integration/test_prometheus.py
checks that the JSON is this file's and that every query returns data
from real nodes scraped by a real Prometheus).

Every query reads names a node's GET /metrics exports (docs/operations.md,
"GET /metrics"), filtered by the dashboard's variables: $datasource (a
Prometheus), $job, $instance (nodes) and $topic (the topics /metrics shows:
--metrics-topics of them on each node, the largest backlogs). Per-topic
panels cover the shown topics; the per-node panels count every topic.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

NODE = 'job=~"$job",instance=~"$instance"'
TOPIC = f'{NODE},topic=~"$topic"'
RATE = "[$__rate_interval]"

# (title, unit, kind, [(expr, legend), ...], description); kind: timeseries, stat, bargauge
Panel = tuple[str, str, str, list[tuple[str, str]], str]


def rate(metric: str, by: str, labels: str = NODE) -> str:
    return f"sum by ({by}) (rate({metric}{{{labels}}}{RATE}))"


def quantiles(metric: str, by: str = "instance", labels: str = NODE) -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{labels}}}{RATE})))",
             f"p{q * 100:g} {{{{{by}}}}}") for q in (0.5, 0.99, 0.999)]


ROWS: list[tuple[str, list[Panel]]] = [
    ("Traffic, per node", [
        ("Sends /s", "ops", "timeseries", [(rate("hourglass_node_sends_total", "instance"), "{{instance}}")],
         "Messages stored by sendMsg and sendMsgBatch, every topic."),
        ("Pulls /s", "ops", "timeseries", [(rate("hourglass_node_pulls_total", "instance"), "{{instance}}")],
         "Messages handed out by pullMsg and longPollingMsg (and to push deliveries), every topic."),
        ("Acks /s", "ops", "timeseries", [(rate("hourglass_node_acks_total", "instance"), "{{instance}}"),
                                          (rate("hourglass_node_nacks_total", "instance"), "nacks {{instance}}")],
         "Messages acked, and nacked, every topic."),
        ("Push deliveries /s", "ops", "timeseries",
         [(rate("hourglass_node_push_deliveries_total", "instance"), "delivered {{instance}}"),
          (rate("hourglass_node_push_failures_total", "instance"), "failed {{instance}}")],
         "Messages POSTed to push subscribers and answered 2xx, and failed deliveries, every subscription."),
    ]),
    ("Traffic, per topic", [
        ("Sends /s by topic", "ops", "timeseries", [(rate("hourglass_sends_total", "topic", TOPIC), "{{topic}}")], ""),
        ("Pulls /s by topic", "ops", "timeseries", [(rate("hourglass_pulls_total", "topic", TOPIC), "{{topic}}")], ""),
        ("Acks /s by topic", "ops", "timeseries", [(rate("hourglass_acks_total", "topic", TOPIC), "{{topic}}")], ""),
        ("Pushes /s by topic", "ops", "timeseries",
         [(rate("hourglass_push_deliveries_total", "topic", TOPIC), "{{topic}}")], ""),
    ]),
    ("Messages", [
        ("Messages by state, per node", "short", "timeseries",
         [(f"sum by (instance) (hourglass_node_{state}_messages{{{NODE}}})", f"{state} {{{{instance}}}}")
          for state in ("waiting", "ready", "consuming", "dead")],
         "Waiting for their time, ready to pull, being consumed (pulled, not yet acked), and dead letters "
         "(status 5 or 6) kept until retention removes them (disk backend)."),
        ("Messages by state, per topic", "short", "timeseries",
         [(f"sum by (topic) (hourglass_{state}_messages{{{TOPIC}}})", f"{state} {{{{topic}}}}")
          for state in ("waiting", "ready", "consuming", "dead")], ""),
        ("Due forecast", "short", "bargauge",
         [(f'sum by (type) (topic_info{{{TOPIC},type=~"size_.*"}})', "{{type}}")],
         "Waiting messages of the shown topics by when they are due: in the next minute, 1-10 min, ... "
         "(camellia's topic_info buckets)."),
        ("Dead letters made /s by topic", "ops", "timeseries",
         [(rate("hourglass_ended_total", "topic", TOPIC), "{{topic}}")],
         "Messages ended without an ack (status 5 or 6): ttl passed, or retries exhausted."),
    ]),
    ("Due and held", [
        ("Due, not handed out, by topic", "short", "timeseries",
         [(f"sum by (topic) (hourglass_topic_due_undelivered{{{TOPIC}}})", "{{topic}}")],
         "Messages due and not handed out (getTopicInfo's dueUndelivered): a paused topic's held backlog, or "
         "what its consumers have not pulled yet."),
        ("Oldest due message by topic", "s", "timeseries",
         [(f"max by (topic) (hourglass_topic_oldest_due_age_seconds{{{TOPIC}}})", "{{topic}}")],
         "How long ago the oldest message due and not handed out fell due (getTopicInfo's oldestDueAgeMillis): "
         "grows while a topic is paused or nobody pulls it (alert: HourglassOldestDueMessage)."),
        ("Release lateness p99 by cause", "s", "timeseries",
         [(f"histogram_quantile(0.99, sum by (le, cause) (rate(hourglass_release_lateness_seconds_bucket{{{NODE}}}"
           f"{RATE})))", "{{cause}}")],
         "load: ready time minus due time (the wheel behind: a restart's backlog, a slow disk, a saturated CPU); "
         "smoothing: the delay a topic's releaseRate added on purpose (docs/operations.md, Lateness)."),
        ("Dwell", "s", "timeseries", quantiles("hourglass_dwell_seconds"),
         "Ack time minus trigger time of the messages acked once due: how long a message waits and is worked on "
         "before its consumer is done with it."),
    ]),
    ("Dispatch", [
        ("Release lateness under load", "s", "timeseries",
         quantiles("hourglass_release_lateness_seconds", labels=f'{NODE},cause="load"'),
         "Ready time minus due time of the messages made ready (docs/operations.md, Lateness)."),
        ("Wheel lag", "s", "timeseries", [(f"max by (instance) (hourglass_wheel_lag_seconds{{{NODE}}})", "{{instance}}")],
         "How long ago the earliest message the wheel has not yet released was due: 0 on time; growing while "
         "the wheel catches up (a leader or a standalone node)."),
        ("Push latency p99 by topic", "s", "timeseries",
         [(f"histogram_quantile(0.99, sum by (le, topic) (rate(hourglass_push_latency_seconds_bucket{{{TOPIC}}}{RATE})))",
           "{{topic}}")], "Trigger time to the subscriber's 2xx."),
        ("In flight against the caps", "percentunit", "timeseries",
         [(f"max by (instance) (hourglass_node_consuming_messages{{{NODE}}} / hourglass_inflight_total_limit{{{NODE}}})",
           "node {{instance}}"),
          (f"max by (instance) (max by (instance) (hourglass_consuming_messages{{{NODE}}}) / on (instance) "
           f"hourglass_inflight_limit{{{NODE}}})", "fullest topic {{instance}}")],
         "Messages being consumed over --max-inflight-total, and the fullest topic's over --max-inflight: at 1 "
         "pulls hand out nothing until acks make room."),
    ]),
    ("Disk", [
        ("fsync", "s", "timeseries", quantiles("hourglass_fsync_seconds"), "The group commit's fsyncs."),
        ("Commit round", "s", "timeseries", quantiles("hourglass_commit_round_seconds"),
         "A group commit round: its fsync and applying its records (what a send waits for, beside a quorum)."),
        ("Disk used", "bytes", "timeseries", [(f"max by (instance) (hourglass_disk_used_bytes{{{NODE}}})", "{{instance}}")],
         "Bytes the node's data directory holds."),
        ("Disk room left", "percentunit", "timeseries",
         [(f"max by (instance) (hourglass_disk_free_bytes{{{NODE}}} / hourglass_disk_size_bytes{{{NODE}}})",
           "{{instance}}")], "Room left on the data directory's file system, for the node's user."),
    ]),
    ("Push", [
        ("Push failures /s by reason", "ops", "timeseries",
         [(f"sum by (topic, reason) (rate(hourglass_push_failures_total{{{TOPIC}}}{RATE}))", "{{topic}} {{reason}}")],
         "Failed deliveries: status (a non-2xx answer), timeout, connect, ..."),
        ("Push in flight and backing off", "short", "timeseries",
         [(f"sum by (topic) (hourglass_push_in_flight{{{TOPIC}}})", "in flight {{topic}}"),
          (f"sum by (topic) (hourglass_push_backing_off{{{TOPIC}}})", "backing off {{topic}}")], ""),
    ]),
    ("Cluster", [
        ("Up", "short", "stat", [(f"up{{{NODE}}}", "{{instance}}")], "1: Prometheus scrapes the node."),
        ("Leader", "short", "stat", [(f"max by (instance) (hourglass_is_leader{{{NODE}}})", "{{instance}}")],
         "1 on the node that leads its cluster (cluster nodes only)."),
        ("Term", "short", "stat", [(f"max by (instance) (hourglass_term{{{NODE}}})", "{{instance}}")],
         "The Raft term each node knows (cluster nodes only)."),
        ("Replication lag", "bytes", "timeseries",
         [(f"max by (follower) (hourglass_replication_lag_bytes{{{NODE}}})", "{{follower}}")],
         "Each follower's distance behind the leader's durable log, as the leader sees it."),
    ]),
]

VARIABLES = [
    ("job", "label_values(hourglass_node_sends_total, job)"),
    ("instance", 'label_values(hourglass_node_sends_total{job=~"$job"}, instance)'),
    ("topic", 'label_values(hourglass_sends_total{job=~"$job",instance=~"$instance"}, topic)'),
]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def panel(panel_id: int, spec: Panel, x: int, y: int, width: int) -> dict[str, Any]:
    title, unit, kind, targets, description = spec
    out: dict[str, Any] = {
        "id": panel_id, "type": kind, "title": title, "description": description, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
    }
    if kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    elif kind == "bargauge":
        out["options"] = {"displayMode": "basic", "orientation": "horizontal",
                          "reduceOptions": {"calcs": ["lastNotNull"]}}
        out["targets"][0]["instant"] = True
    else:
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    return out


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row_title, specs in ROWS:
        panels.append({"id": next_id, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        width = 24 // min(len(specs), 4) if len(specs) < 4 else 6
        for i, spec in enumerate(specs):
            panels.append(panel(next_id, spec, (i * width) % 24, y + (i * width) // 24 * 8, width))
            next_id += 1
        y += (len(specs) * width + 23) // 24 * 8
    templating = [{"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                   "current": {}, "hide": 0}]
    for name, query in VARIABLES:
        templating.append({"name": name, "type": "query", "datasource": DATASOURCE, "query": query,
                           "definition": query, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
                           "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1,
                           "hide": 0})
    return {
        "title": "hourglass", "uid": "hourglass-nodes", "tags": ["hourglass", "delay-queue"],
        "description": "hourglass nodes: traffic, messages, due and held, dispatch, disk, push and cluster "
                       "(deploy/grafana)",
        "editable": True, "schemaVersion": 39, "version": 1, "refresh": "30s", "timezone": "",
        "time": {"from": "now-1h", "to": "now"}, "graphTooltip": 1,
        "templating": {"list": templating}, "annotations": {"list": []}, "links": [], "panels": panels,
    }


def text() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> None:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hourglass.json")
    with open(path, "w") as f:
        f.write(text())
    print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
