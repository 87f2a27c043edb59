"""broker.observe.metrics: getMonitorData's per-interval counts (camellia's monitor);
the bounds of /metrics: topic labels and the topics shown (broker.http.scrape)."""

import asyncio
import re

from broker.http.scrape import select_topics
from broker.observe.metrics import (
    MAX_LABEL_CHARS,
    Backlog,
    Family,
    Metrics,
    Sample,
    TopicSelection,
    single_series,
    topic_label,
)


def stats(metrics: Metrics, topic: str) -> dict | None:
    return next((s for s in metrics.monitor_data()["requestStatsList"] if s["topic"] == topic), None)


def test_nothing_is_published_before_the_first_interval_ends():
    m = Metrics()
    m.topic("t").sends += 1
    assert m.monitor_data()["requestStatsList"] == []
    m.roll(1_000)  # starts the first interval: what came before it counts in none
    assert m.monitor_data()["requestStatsList"] == []


def test_each_interval_publishes_what_happened_in_it_and_no_more():
    m = Metrics()
    m.roll(0)
    t = m.topic("t")
    t.sends += 2
    t.duplicates += 1  # camellia counts a duplicate send as a sendMsg
    t.acks += 1
    t.nacks += 1  # and a nack as an ackMsg call
    t.pull_gap.observe(30)
    t.pull_gap.observe(10)
    m.roll(60_000)
    assert stats(m, "t") == {"topic": "t", "sendMsg": 3, "pullMsg": 0, "deleteMsg": 0, "ackMsg": 2, "getMsg": 0,
                             "triggerMsgReady": 0, "triggerMsgEndLife": 0, "triggerMsgTimeout": 0}
    assert m.monitor_data()["pullMsgTimeGapStatsList"] == [{"topic": "t", "count": 2, "avg": 20.0, "max": 30}]
    assert (m.monitor_data()["intervalStartTime"], m.monitor_data()["intervalEndTime"]) == (0, 60_000)
    assert m.monitor_data() is m.monitor_data()  # unchanged between rolls

    t.pulls += 1
    m.roll(120_000)
    assert stats(m, "t")["sendMsg"] == 0 and stats(m, "t")["pullMsg"] == 1
    assert m.monitor_data()["pullMsgTimeGapStatsList"] == []  # gaps reset with the interval
    assert [d["intervalEndTime"] for d in m.recent_monitor_data()] == [60_000, 120_000]
    m.roll(180_000)
    assert stats(m, "t") is None  # a topic with nothing in the interval is not listed
    assert m.topic("t").sends == 2  # the hourglass_* counters never reset


def test_counters_of_topics_the_node_does_not_have_are_not_published():
    m = Metrics()
    m.roll(0)
    m.topic("nowhere", exists=False).gets += 1
    m.roll(1)
    assert m.monitor_data()["requestStatsList"] == []


# -- /metrics bounded: labels and the topics shown (broker.http.scrape) ---------------------


def test_a_long_topic_label_is_cut_to_128_characters_with_a_hash_of_the_whole_name():
    assert topic_label("t") == "t" and topic_label("x" * MAX_LABEL_CHARS) == "x" * MAX_LABEL_CHARS
    a, b = "x" * 1000 + "a", "x" * 1000 + "b"  # the same first 1000 characters
    label_a, label_b = topic_label(a), topic_label(b)
    assert len(label_a) == len(label_b) == MAX_LABEL_CHARS
    assert label_a != label_b and label_a.startswith("x" * 90)
    assert topic_label(a) == label_a  # the same at every scrape
    quoted = topic_label('"' * 200)  # cut first, then escaped: 95 quotes, "~", 32 hex digits
    assert quoted.startswith('\\"' * 95 + "~") and len(quoted) == 2 * 95 + 1 + 32


def test_the_topics_shown_are_the_largest_backlogs_and_every_topic_counts_in_the_sums():
    m = Metrics()
    backlogs = {f"t{i}": (i, 0, 0, 1) for i in range(500)}  # t499 has the largest backlog
    for i in range(500):
        m.topic(f"t{i}").sends += 1
    m.topic("gone").sends += 7  # counters of a topic without messages any more
    m.roll(0)
    m.topic("busy").sends += 3  # no backlog, but requests in the last interval
    m.roll(1_000)
    selection = asyncio.run(select_topics(m, backlogs | {"busy": (0, 0, 0, 0)}, 10))
    assert selection.shown == sorted(f"t{i}" for i in range(490, 500))
    assert selection.topics == 501
    assert selection.counter_totals[0] == 500 + 7 + 3  # sends, every topic's
    assert selection.backlog_totals == (sum(range(500)), 0, 0) and selection.dead_total == 500
    text = m.render(selection, [])
    assert len(re.findall(r'^hourglass_dead_messages\{', text, re.MULTILINE)) == 10
    assert "hourglass_node_dead_messages 500\n" in text
    assert len(re.findall(r'^hourglass_sends_total\{', text, re.MULTILINE)) == 10
    assert "hourglass_node_sends_total 510\n" in text and "hourglass_topics 501\n" in text
    assert "hourglass_topics_shown 10\n" in text

    few: dict[str, Backlog] = {"a": (1, 0, 0, None), "b": (1, 0, 0, None)}  # dead letters not counted (Redis)
    selection = asyncio.run(select_topics(m, few | {"busy": (0, 0, 0, None)}, 2))
    assert selection.shown == ["a", "b"]  # larger backlogs first
    assert selection.dead_total is None and "dead_messages" not in m.render(selection, [])
    selection = asyncio.run(select_topics(m, {"a": (0, 0, 0, 0), "busy": (0, 0, 0, 0)}, 1))
    assert selection.shown == ["busy"]  # among equal backlogs, the most requests in the last interval
    assert asyncio.run(select_topics(m, few, 0)).shown == []


def test_a_commit_round_counts_its_fsync_and_its_whole_time_and_labelled_node_series_share_one_type_line():
    m = Metrics()
    m.committed(0.0004, 0.003)
    m.committed(0.2, 0.7)
    selection = TopicSelection(shown=[], backlogs={}, topics=0, counter_totals=(0,) * 12, backlog_totals=(0, 0, 0))
    lag = Family("hourglass_lag_bytes", "", "gauge", [Sample("hourglass_lag_bytes", (("follower", "n2"),), 5),
                                                      Sample("hourglass_lag_bytes", (("follower", "n3"),), 0.5)], ".15g")
    text = m.render(selection, [single_series("hourglass_a", "gauge", 1), lag,
                                single_series("hourglass_disk_free_bytes", "gauge", 80457613312.0)])
    assert 'hourglass_fsync_seconds_bucket{le="0.0005"} 1\n' in text and "hourglass_fsync_seconds_count 2\n" in text
    assert 'hourglass_commit_round_seconds_bucket{le="0.005"} 1\n' in text
    assert 'hourglass_commit_round_seconds_bucket{le="0.5"} 1\n' in text
    assert 'hourglass_commit_round_seconds_bucket{le="1.0"} 2\n' in text
    assert "hourglass_commit_round_seconds_sum 0.703000\n" in text
    assert text.count("# TYPE hourglass_lag_bytes gauge\n") == 1 and "# TYPE hourglass_a gauge\nhourglass_a 1\n" in text
    assert 'hourglass_lag_bytes{follower="n2"} 5\nhourglass_lag_bytes{follower="n3"} 0.5\n' in text
    assert "dead_messages" not in text  # no backend's count of them
    assert "hourglass_disk_free_bytes 80457613312\n" in text  # whole, as a float (a compiled build's values are)


def shown(*topics: str, due: dict[str, tuple[int, int | None]] | None = None) -> TopicSelection:
    return TopicSelection(shown=list(topics), backlogs={t: (0, due[t][0] if due else 0, 0, 0) for t in topics},
                          topics=len(topics), counter_totals=(0,) * 12, backlog_totals=(0, 0, 0), due=due or {})


def test_a_shown_topics_due_messages_and_the_age_of_the_oldest_are_gauges_of_it():
    m = Metrics()
    text = m.render(shown("a", "b", "r", due={"a": (3, 1_500), "b": (0, 0), "r": (2, None)}), [])
    lines = text.splitlines()
    assert 'hourglass_topic_due_undelivered{topic="a"} 3' in lines
    assert 'hourglass_topic_due_undelivered{topic="b"} 0' in lines
    assert 'hourglass_topic_due_undelivered{topic="r"} 2' in lines
    assert 'hourglass_topic_oldest_due_age_seconds{topic="a"} 1.5' in lines
    assert 'hourglass_topic_oldest_due_age_seconds{topic="b"} 0.0' in lines
    assert not any(line.startswith('hourglass_topic_oldest_due_age_seconds{topic="r"}') for line in lines)  # untold
    assert lines.count("# TYPE hourglass_topic_due_undelivered gauge") == 1
    assert lines.count("# TYPE hourglass_topic_oldest_due_age_seconds gauge") == 1


def test_release_lateness_is_one_family_split_by_cause_and_dwell_counts_from_the_trigger_time():
    m = Metrics()
    m.load_lateness_seconds.observe(0.003)
    m.load_lateness_seconds.observe(2.0)
    m.observe_release("t", load_ms=3_000, smoothing_ms=400)  # (releaseRate's hand-out: its smoothing part alone)
    m.acked([10_000, 9_000, 10_500], now_ms=10_000)  # dwelt 0, 1 s, and 0 (acked before its trigger time: none)
    text = m.render(shown(), [])
    lines = text.splitlines()
    assert lines.count("# TYPE hourglass_release_lateness_seconds histogram") == 1
    assert 'hourglass_release_lateness_seconds_bucket{cause="load",le="0.005"} 1' in lines
    assert 'hourglass_release_lateness_seconds_bucket{cause="load",le="+Inf"} 2' in lines
    assert 'hourglass_release_lateness_seconds_count{cause="load"} 2' in lines
    assert 'hourglass_release_lateness_seconds_bucket{cause="smoothing",le="0.1"} 0' in lines
    assert 'hourglass_release_lateness_seconds_bucket{cause="smoothing",le="0.5"} 1' in lines
    assert 'hourglass_release_lateness_seconds_sum{cause="smoothing"} 0.400000' in lines
    assert 'hourglass_dwell_seconds_bucket{le="0.01"} 2' in lines and 'hourglass_dwell_seconds_bucket{le="1.0"} 3' in lines
    assert "hourglass_dwell_seconds_count 3" in lines and "hourglass_dwell_seconds_sum 1.000000" in lines
    assert "dispatch_lateness" not in text  # the family it was (docs/operations.md)
