"""broker.metrics: getMonitorData's per-interval counts (camellia's monitor)."""

from broker.metrics import Metrics


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
    m.roll(180_000)
    assert stats(m, "t") is None  # a topic with nothing in the interval is not listed
    assert m.topic("t").sends == 2  # the hourglass_* counters never reset


def test_counters_of_topics_the_node_does_not_have_are_not_published():
    m = Metrics()
    m.roll(0)
    m.topic("nowhere", exists=False).gets += 1
    m.roll(1)
    assert m.monitor_data()["requestStatsList"] == []
