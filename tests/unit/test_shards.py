"""A node's shards in process: placement, the count a data directory
keeps, and how the shards' answers are merged (broker.shards)."""

from __future__ import annotations

import asyncio
import os
import re
import zlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.bodies import BodyLimits
from broker.http.scrape import Choice, largest, select_topics, topic_ranks
from broker.observe import camellia_metrics
from broker.observe.camellia_metrics import ProcessStats
from broker.observe.metrics import (
    MAX,
    MIN,
    REQUEST_STATS,
    SUM,
    Backlog,
    Family,
    Metrics,
    Sample,
    TopicSelection,
    render_text,
)
from broker.shards import layout, placement
from broker.shards.router import ShardRouter
from broker.shards.views import (
    families_of,
    family_fields,
    merge_families,
    merge_monitor_data,
    merge_pages,
    merge_ranks,
    merge_topic_infos,
    node_topics,
    parse_walk_cursor,
    walk_cursor,
)
from storage.entry import Location, Message, Status
from storage.errors import ConfigError, InvalidRequest, Unavailable

ids = st.text(min_size=1, max_size=40)


# -- placement ---------------------------------------------------------------------------

def test_placement_is_crc32_of_the_name_not_pythons_salted_hash():
    for name in ("a", "order-17", "ünïcode", "x" * 200):
        assert placement.owner(name, 7) == zlib.crc32(name.encode()) % 7
    assert placement.owner("anything", 1) == 0


@given(ids, st.integers(1, 64))
def test_every_name_has_one_owner_within_the_count(name, count):
    owner = placement.owner(name, count)
    assert 0 <= owner < count and placement.owner(name, count) == owner


@given(st.text(min_size=1, max_size=20).filter(lambda s: "@" not in s), st.integers(0, 10 ** 13), st.integers(1, 16))
def test_a_schedules_runs_live_on_its_shard(schedule_id, at_ms, count):
    assert placement.owner(f"{schedule_id}@{at_ms}", count) == placement.owner(schedule_id, count)


@given(ids, ids, st.integers(1, 16))
def test_a_keyed_message_lives_on_its_keys_shard_whatever_its_id(msg_id, key, count):
    assert placement.message_owner(msg_id, key, count) == placement.owner(key, count)
    assert placement.message_owner(msg_id, "", count) == placement.owner(msg_id, count)


@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
@settings(max_examples=50)
def test_a_new_id_lands_on_the_shard_that_asked(shard_of):
    count, shard = shard_of
    msg_id = placement.new_id_on(shard, count)
    assert len(msg_id) == 32 and int(msg_id, 16) >= 0
    assert placement.owner(msg_id, count) == shard


# -- the count a data directory keeps ------------------------------------------------------

def test_a_new_directory_takes_auto_as_the_cores_and_keeps_it(tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    assert layout.resolve(data, "auto") == layout.cores()
    assert (tmp_path / "data" / "shards").read_text() == f"{layout.cores()}\n"
    assert layout.resolve(data, "auto") == layout.cores()


def test_a_kept_count_refuses_another_with_a_sentence(tmp_path):
    data = str(tmp_path)
    assert layout.resolve(data, "3") == 3
    assert layout.resolve(data, "3") == 3 and layout.resolve(data, "auto") == 3
    with pytest.raises(ConfigError, match=r"keeps 3 shards and --shards 2 was given"):
        layout.resolve(data, "2")


def test_a_directory_an_older_release_made_opens_as_one_shard(tmp_path):
    (tmp_path / "commitlog").mkdir()  # a store, no count
    assert layout.resolve(str(tmp_path), "auto") == 1
    assert layout.resolve(str(tmp_path), "1") == 1
    assert sorted(os.listdir(tmp_path)) == ["commitlog"]  # nothing written: a refusal later leaves it as it was
    with pytest.raises(ConfigError, match="keeps 1 shard and --shards 4"):
        layout.resolve(str(tmp_path), "4")


def test_a_directory_of_shards_without_its_count_is_refused_naming_the_file_and_the_shards(tmp_path):
    """A restore that missed `shards`: refused with a sentence, not opened
    as one new, empty shard beside shard-0/ and shard-1/."""
    data = str(tmp_path)
    assert layout.resolve(data, "2") == 2
    (tmp_path / "shards").unlink()
    before = sorted(os.listdir(tmp_path))
    for asked in ("auto", "1", "2"):
        with pytest.raises(ConfigError, match=r"shards is missing, but the data directory holds shard-0/, shard-1/"):
            layout.resolve(data, asked)
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


@pytest.mark.parametrize(("count", "shards"), [("2", ["shard-0", "shard-1", "shard-2"]), ("3", ["shard-0", "shard-1"]),
                                               ("1", ["shard-0"]), ("2", ["shard-1", "shard-2"])])
def test_a_count_its_shard_directories_contradict_is_refused(tmp_path, count, shards):
    (tmp_path / "shards").write_text(count + "\n")
    for name in shards:
        (tmp_path / name).mkdir()
    with pytest.raises(ConfigError, match=rf"keeps {count} shards?, but the data directory holds {shards[0]}/"):
        layout.resolve(str(tmp_path), "auto")


def test_a_directory_holding_other_files_only_is_new(tmp_path):
    """Judged by a store's own files: a log beside nothing else is no
    one-shard store; the directory is new, and takes the count asked."""
    (tmp_path / "hourglass.log").write_text("a line\n")
    assert layout.resolve(str(tmp_path), "2") == 2
    assert sorted(os.listdir(tmp_path)) == ["hourglass.log", "shard-0", "shard-1", "shards"]
    assert layout.resolve(str(tmp_path), "auto") == 2


@pytest.mark.parametrize("asked", ["0", "65", "two", "-1", ""])
def test_a_bad_count_names_the_flag(tmp_path, asked):
    with pytest.raises(ConfigError, match="--shards"):
        layout.resolve(str(tmp_path), asked)
    assert not (tmp_path / "shards").exists()  # nothing kept


def test_a_shards_store_is_its_own_directory_and_one_shard_the_data_directory():
    assert layout.shard_path("/d", 0, 1) == "/d"
    assert layout.shard_path("/d", 1, 4) == os.path.join("/d", "shard-1")


# -- merging ------------------------------------------------------------------------------

def message(trigger_ms: int, msg_id: str) -> Message:
    return Message("t", msg_id, "m", 0, trigger_ms, 1000, 3, 0, "", Status.WAITING, 0, Location(0, 0))


def shard_page(held: list[Message], after: tuple[int, str] | None, limit: int) -> tuple[list[Message], str | None]:
    """A shard's listMsg page (broker.core.bulk_params's order): up to
    `limit` after the cursor (fewer when --max-page-bytes cuts it), and the
    cursor if it holds more."""
    rest = [m for m in sorted(held, key=lambda m: (m.trigger_ms, m.msg_id))
            if after is None or (m.trigger_ms, m.msg_id) > after]
    page = rest[:limit]
    return page, (f"{page[-1].trigger_ms}:{page[-1].msg_id}" if len(rest) > limit else None)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), max_size=60, unique_by=lambda x: x),
       st.integers(1, 7), st.integers(1, 4), st.lists(st.integers(1, 7), min_size=4, max_size=4))
@settings(max_examples=300)
def test_one_cursor_walks_every_message_of_every_shard_once_in_order(rows, limit, shards, cuts):
    """(`cuts`: how many each shard's page holds at most, as --max-page-bytes
    makes a page shorter than the limit.)"""
    held: list[list[Message]] = [[] for _ in range(shards)]
    for i, (trigger, _) in enumerate(rows):
        msg_id = f"id{i:03d}"
        held[placement.owner(msg_id, shards)].append(message(trigger, msg_id))
    seen: list[Message] = []
    after: tuple[int, str] | None = None
    for _ in range(len(rows) + 2):
        page, cursor = merge_pages([shard_page(h, after, min(limit, cut)) for h, cut in zip(held, cuts)], limit)
        assert len(page) <= limit
        seen.extend(page)
        if cursor is None:
            break
        trigger, _, msg_id = cursor.partition(":")
        after = (int(trigger), msg_id)
    else:
        pytest.fail("the walk did not end")
    everything = sorted((m for h in held for m in h), key=lambda m: (m.trigger_ms, m.msg_id))
    assert seen == everything


@given(st.integers(0, 3), st.text(alphabet="0123456789abcdef-", max_size=20) | st.none())
def test_a_dead_letter_cursor_names_its_shard_and_that_shards_cursor(shard, inner):
    cursor = walk_cursor(shard, inner)
    assert parse_walk_cursor(cursor, 4, "listDeadMsg") == (shard, inner or None)


@pytest.mark.parametrize("cursor", ["s9.x", "x1.", "s.", "1-2", "s1", "s\u00b2.x", "s\u0661.x", "s" + "9" * 5000 + ".x"])
def test_a_dead_letter_cursor_no_page_answered_is_400(cursor):
    with pytest.raises(InvalidRequest, match="cursor"):
        parse_walk_cursor(cursor, 4, "listDeadMsg")


@given(st.text(max_size=30))
def test_any_dead_letter_cursor_is_a_shard_of_the_node_or_a_400(cursor):
    """Whatever a stranger sends as a cursor: a shard of the node and its
    own cursor, or InvalidRequest (the 400 naming `cursor`), never another
    exception (the 500 a cursor of non-ASCII digits once made)."""
    try:
        shard, _ = parse_walk_cursor(cursor, 4, "listDeadMsg")
    except InvalidRequest:
        return
    assert 0 <= shard < 4


def test_topic_infos_sum_every_size():
    def info(waiting, ready, consuming, first_bucket, oldest_due_age_ms):
        return {"topic": "t", "waitingQueueSize": waiting, "readyQueueSize": ready, "ackQueueSize": consuming,
                "waitingQueueInfo": {"sizeOf0To1min": first_bucket, "sizeOf1minTo10min": 0},
                "dueUndelivered": ready, "oldestDueAgeMillis": oldest_due_age_ms}
    merged = merge_topic_infos([info(3, 1, 0, 2, 700), info(4, 2, 5, 1, 900), info(0, 0, 0, 0, 0)])
    assert merged == {"topic": "t", "waitingQueueSize": 7, "readyQueueSize": 3, "ackQueueSize": 5,
                      "waitingQueueInfo": {"sizeOf0To1min": 3, "sizeOf1minTo10min": 0},
                      "dueUndelivered": 3, "oldestDueAgeMillis": 900}


def test_monitor_data_sums_counts_and_weighs_gaps():
    a = {"requestStatsList": [{"topic": "t", "sendMsg": 2, "pullMsg": 1}],
         "pullMsgTimeGapStatsList": [{"topic": "t", "count": 1, "avg": 10.0, "max": 10}],
         "readyQueueTimeGapStatsList": [], "intervalStartTime": 1000, "intervalEndTime": 2000}
    b = {"requestStatsList": [{"topic": "t", "sendMsg": 3, "pullMsg": 0}, {"topic": "u", "sendMsg": 1, "pullMsg": 0}],
         "pullMsgTimeGapStatsList": [{"topic": "t", "count": 3, "avg": 2.0, "max": 4}],
         "readyQueueTimeGapStatsList": [], "intervalStartTime": 1000, "intervalEndTime": 2000}
    merged = merge_monitor_data([[a], [b]])
    assert merged["requestStatsList"] == [{"topic": "t", "sendMsg": 5, "pullMsg": 1},
                                          {"topic": "u", "sendMsg": 1, "pullMsg": 0}]
    assert merged["pullMsgTimeGapStatsList"] == [{"topic": "t", "count": 4, "avg": 4.0, "max": 10}]
    assert (merged["intervalStartTime"], merged["intervalEndTime"]) == (1000, 2000)


def interval(start_ms: int, sends: int) -> dict[str, Any]:
    return {"requestStatsList": [{"topic": "t", "sendMsg": sends}] if sends else [],
            "pullMsgTimeGapStatsList": [], "readyQueueTimeGapStatsList": [],
            "intervalStartTime": start_ms, "intervalEndTime": start_ms + 1000}


def test_monitor_data_of_shards_is_the_newest_interval_every_shard_closed():
    """One shard has closed the interval ending at 3000, the other not yet:
    the node answers the one ending at 2000, each shard's own count of it,
    and the one ending at 3000 once both have closed it."""
    leading = [interval(1000, 1), interval(2000, 4)]
    lagging = [interval(0, 7), interval(1000, 2)]
    merged = merge_monitor_data([leading, lagging])
    assert merged["requestStatsList"] == [{"topic": "t", "sendMsg": 3}]
    assert (merged["intervalStartTime"], merged["intervalEndTime"]) == (1000, 2000)
    merged = merge_monitor_data([leading, [interval(1000, 2), interval(2000, 5)]])
    assert merged["requestStatsList"] == [{"topic": "t", "sendMsg": 9}]
    assert merged["intervalEndTime"] == 3000


def test_monitor_data_of_shards_waits_for_every_shard_to_close_one():
    unclosed = {"requestStatsList": [], "pullMsgTimeGapStatsList": [], "readyQueueTimeGapStatsList": []}
    assert "intervalEndTime" not in merge_monitor_data([[interval(1000, 1)], [unclosed]])


# -- /metrics of a node: families merged by their labels ----------------------------------

def through_the_link(families: list[Family]) -> list[Family]:
    """`families` as another shard's answer reaches the one merging: their
    wire form packed and unpacked as broker.shards.link does."""
    packed = msgpack.packb([family_fields(f) for f in families])
    return families_of(msgpack.unpackb(packed, raw=False, use_list=False, strict_map_key=False))


def shard_metrics(counts: dict[str, int]) -> Metrics:
    m = Metrics()
    for topic, sends in counts.items():
        m.topic(topic).sends += sends
    return m


def part_of(m: Metrics, backlogs: dict[str, Backlog], choice: Choice) -> list[Family]:
    """A shard's families of the node's `choice` of topics, as it sends them."""
    selection = asyncio.run(select_topics(m, backlogs, 100, choice))
    return through_the_link(m.families(selection))


def sample_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line and not line.startswith("#")]


def test_the_nodes_series_are_the_shards_summed_or_the_largest_or_the_smallest_as_each_says():
    a = [Family("x_total", "xs", "counter", [Sample("x_total", (("topic", "t"),), 1),
                                             Sample("x_total", (("topic", "u"),), 2)]),
         Family("x_limit", "", "gauge", [Sample("x_limit", (), 100, MAX)]),
         Family("x_lag_seconds", "", "gauge", [Sample("x_lag_seconds", (), 0.5, MAX)], ".15g"),
         Family("x_start", "", "gauge", [Sample("x_start", (), 1_000, MIN)])]
    b = [Family("x_total", "xs", "counter", [Sample("x_total", (("topic", "t"),), 10),
                                             Sample("x_total", (("topic", "v"),), 3)]),
         Family("x_lag_seconds", "", "gauge", [Sample("x_lag_seconds", (), 0.25, MAX)], ".15g"),
         Family("x_start", "", "gauge", [Sample("x_start", (), 900, MIN)]),
         Family("x_only_here", "", "gauge", [Sample("x_only_here", (), 7)])]
    lines = render_text(merge_families([through_the_link(a), through_the_link(b)])).split("\n")
    assert lines[:5] == ["# HELP x_total xs", "# TYPE x_total counter", 'x_total{topic="t"} 11', 'x_total{topic="u"} 2',
                         'x_total{topic="v"} 3']  # one head, the samples in the order the shards give them
    assert "x_limit 100" in lines and "x_lag_seconds 0.5" in lines and "x_start 900" in lines
    assert lines[-3:] == ["# TYPE x_only_here gauge", "x_only_here 7", ""]


def test_the_node_sums_due_messages_and_histograms_and_takes_the_oldest_due_age_of_the_shards():
    def shard(due: dict[str, tuple[int, int | None]], late_s: float, dwell_ms: int) -> list[Family]:
        m = Metrics()
        m.load_lateness_seconds.observe(late_s)
        m.smoothing_lateness_seconds.observe(late_s)
        m.acked([0], dwell_ms)
        return through_the_link(m.families(TopicSelection(
            shown=["a", "b"], backlogs={t: (0, n, 0, 0) for t, (n, _) in due.items()}, topics=2,
            counter_totals=(0,) * 12, backlog_totals=(0, 0, 0), due=due)))

    text = render_text(merge_families([shard({"a": (3, 1_500), "b": (1, 200)}, 0.003, 2_000),
                                       shard({"a": (4, 9_250)}, 7.0, 20)]))
    lines = text.splitlines()
    assert 'hourglass_topic_due_undelivered{topic="a"} 7' in lines  # summed
    assert 'hourglass_topic_due_undelivered{topic="b"} 1' in lines
    assert 'hourglass_topic_oldest_due_age_seconds{topic="a"} 9.25' in lines  # the largest
    assert 'hourglass_topic_oldest_due_age_seconds{topic="b"} 0.2' in lines
    assert 'hourglass_ready_messages{topic="a"} 7' in lines
    assert "hourglass_topics 2" in lines and "hourglass_topics_shown 2" in lines  # the node's, which each shard tells
    for cause in ("load", "smoothing"):
        assert f'hourglass_release_lateness_seconds_bucket{{cause="{cause}",le="0.005"}} 1' in lines
        assert f'hourglass_release_lateness_seconds_bucket{{cause="{cause}",le="+Inf"}} 2' in lines
        assert f'hourglass_release_lateness_seconds_count{{cause="{cause}"}} 2' in lines
        assert f'hourglass_release_lateness_seconds_sum{{cause="{cause}"}} 7.003000' in lines
    assert 'hourglass_dwell_seconds_bucket{le="0.05"} 1' in lines and "hourglass_dwell_seconds_count 2" in lines
    assert lines.count("# TYPE hourglass_release_lateness_seconds histogram") == 1


def test_camellias_time_gaps_of_the_node_weigh_each_shards_average_by_its_count():
    """As getMonitorData's merge does (merge_monitor_data): counts summed,
    the max the largest, the average weighted; the process families as a
    node of processes has them."""
    def shard(count: int, avg: float, most: int, memory: int) -> list[Family]:
        process = ProcessStats()
        monitor = {"requestStatsList": [{"topic": "t", **dict.fromkeys(REQUEST_STATS, count)}],
                   "pullMsgTimeGapStatsList": [{"topic": "t", "count": count, "avg": avg, "max": most}],
                   "readyQueueTimeGapStatsList": []}
        families = camellia_metrics.families(process, monitor, [], frozenset({"t"}))
        return through_the_link([f._replace(samples=[s._replace(value=memory) for s in f.samples])
                                 if f.name == "memory_info" else f for f in families])

    lines = render_text(merge_families([shard(1, 10.0, 10, 100), shard(3, 30.0, 50, 200),
                                        shard(0, 0.0, 0, 300)])).split("\n")
    assert 'pull_msg_time_gap{topic="t",type="count"} 4' in lines
    assert 'pull_msg_time_gap{topic="t",type="avg"} 25.000000' in lines  # (10 * 1 + 30 * 3) / 4
    assert 'pull_msg_time_gap{topic="t",type="max"} 50' in lines
    assert 'request{topic="t",type="sendMsg"} 4' in lines
    assert 'memory_info{type="total_memory"} 600' in lines  # the node's processes' memory
    assert f'cpu{{type="cpu_num"}} {ProcessStats().cpu_count}' in lines  # the CPUs they share, not 3 times them
    assert sum(line.startswith(("uptime ", "start_time ")) for line in lines) == 2


# Series a node merges: a family each way to merge, its samples from a few label sets.
MERGE_RULES = {"s_total": SUM, "s_max": MAX, "s_min": MIN}
shard_parts = st.lists(st.tuples(st.sampled_from(sorted(MERGE_RULES)), st.sampled_from(["", "a", "b", "c\n"]),
                                 st.integers(-10**6, 10**6)), max_size=12)


def as_families(rows: list[tuple[str, str, int]]) -> list[Family]:
    """One shard's families of `rows` (family, topic label or none, value); a series once."""
    series = {(name, topic): value for name, topic, value in rows}
    return [Family(name, "", "gauge", [Sample(name, (("topic", topic),) if topic else (), value, MERGE_RULES[name])
                                       for (family, topic), value in series.items() if family == name])
            for name in MERGE_RULES if any(family == name for family, _ in series)]


def values(families: list[Family]) -> dict[tuple[str, tuple], int | float]:
    return {(s.name, s.labels): s.value for f in families for s in f.samples}


@given(shard_parts, shard_parts, shard_parts)
def test_merging_shards_families_is_commutative_and_associative(a, b, c):
    a, b, c = as_families(a), as_families(b), as_families(c)
    assert values(merge_families([a, b])) == values(merge_families([b, a]))
    together = values(merge_families([a, b, c]))
    assert values(merge_families([merge_families([a, b]), c])) == together
    assert values(merge_families([a, merge_families([b, c])])) == together
    assert values(merge_families([through_the_link(a)])) == values(a)


# Topic names holding what a reader of the text may take for a line end, a label's end or an escape.
hostile_topics = st.text(alphabet=st.sampled_from(['\r', '\n', '\u2028', '\u0085', '"', '\\', '{', '}', '=', ',', ' ',
                                                   'a', 'b', '1']), min_size=1, max_size=8)
FAMILY_LINE = re.compile(r'(?P<name>[a-z_]+)(\{([a-z_]+="([^"\\]|\\[\\"n])*",?)*\})? -?[0-9.e+]+')


@given(st.lists(hostile_topics, max_size=5, unique=True), st.lists(hostile_topics, max_size=5, unique=True))
def test_topics_named_with_line_ends_quotes_and_backslashes_forge_no_series_of_the_node(mine, theirs):
    """Two shards with topics named to break a text format: the node's
    /metrics holds one series of each topic a family, no series its
    name spells, and every line parses (no reader splitting lines at CR,
    U+2028 or NEL cuts one)."""
    shown = sorted(set(mine) | set(theirs))
    choice = Choice(shown, len(shown))
    parts = [part_of(shard_metrics(dict.fromkeys(topics, 1)), {t: (1, 0, 0, 0) for t in topics}, choice)
             for topics in (mine, theirs)]
    text = render_text(merge_families(parts))
    assert len(text.splitlines()) == len(text.split("\n")) - 1
    lines = sample_lines(text)
    assert all(FAMILY_LINE.fullmatch(line) for line in lines), text
    names = {FAMILY_LINE.fullmatch(line)["name"] for line in lines}
    assert names <= {sample.name for part in parts for f in part for sample in f.samples}
    sends = [line for line in lines if line.startswith("hourglass_sends_total{")]
    assert len(sends) == len(shown) and sum(int(line.rpartition(" ")[2]) for line in sends) == len(mine) + len(theirs)
    assert f"hourglass_node_sends_total {len(mine) + len(theirs)}" in lines


def test_the_node_shows_its_largest_backlogs_not_each_shards():
    """--metrics-topics 1 on two shards: each shard's largest backlog
    alone (b here, c there) is not the node's (a, on both)."""
    backlogs = [{"a": (3, 0, 0, 0), "b": (5, 0, 0, 0)}, {"a": (2, 1, 0, 0), "c": (5, 0, 0, 0)}]
    metrics = [shard_metrics({"a": 1, "b": 1}), shard_metrics({"a": 1, "c": 1, "gone": 4})]
    shards = [asyncio.run(select_topics(m, b, 1)).shown for m, b in zip(metrics, backlogs)]
    assert shards == [["b"], ["c"]]
    ranks = merge_ranks([{t: list(r) for t, r in asyncio.run(topic_ranks(m, b)).items()}
                         for m, b in zip(metrics, backlogs)])
    assert ranks["a"] == (6, 0) and ranks["gone"] == (None, 0)
    choice = Choice(asyncio.run(largest(ranks, 1)), node_topics(ranks))
    assert choice == Choice(["a"], 3)  # ("gone": counters, no topic)
    text = render_text(merge_families([part_of(m, b, choice) for m, b in zip(metrics, backlogs)]))
    assert {line.partition('topic="')[2].partition('"')[0] for line in sample_lines(text) if 'topic="' in line} == {"a"}
    lines = text.split("\n")
    assert 'hourglass_waiting_messages{topic="a"} 5' in lines and 'hourglass_ready_messages{topic="a"} 1' in lines
    assert "hourglass_topics 3" in lines and "hourglass_topics_shown 1" in lines
    assert "hourglass_node_waiting_messages 15" in lines and "hourglass_node_sends_total 8" in lines


@given(st.text(max_size=12), st.text(max_size=12))
def test_a_label_value_is_one_line_and_one_value_a_topic(a, b):
    from broker.observe.metrics import escape_label

    assert len(f"x{{t=\"{escape_label(a)}\"}} 1".splitlines()) == 1
    assert (escape_label(a) == escape_label(b)) == (a == b)


# -- the links ----------------------------------------------------------------------------

def test_a_restarted_shard_is_dialled_back_at_once_not_after_the_failed_dials_backoff(tmp_path):
    """Shard 0 found shard 1 down (a dial failed: calls fail fast for a
    while). Shard 1 starts and dials shard 0: shard 0 dials it back then, so
    its link is up and a call forwarded to shard 1 is not answered 503."""
    async def run() -> None:
        links = str(tmp_path / "links")
        zero = ShardRouter(0, 2, links, BodyLimits(), 1024)
        one = ShardRouter(1, 2, links, BodyLimits(), 1024)
        await zero.start()
        try:
            assert await zero.connect_all() == [1]  # shard 1 is down
            with pytest.raises(Unavailable):
                await zero.peers[1].connect()  # within the backoff: no dial
            await one.start()
            assert await one.connect_all() == []
            for _ in range(1000):  # the hello and the dial back, a few turns of the loop
                if zero.peers[1].up:
                    break
                await asyncio.sleep(0.005)
            assert zero.down() == []
            assert one.down() == []
        finally:
            await zero.stop()
            await one.stop()
    asyncio.run(run())


# -- the node's budgets, shared by its shards ---------------------------------------------

@given(st.integers(0, 10**9), st.integers(1, 64))
def test_the_shards_shares_of_a_budget_sum_to_it_and_differ_by_one_at_most(total, count):
    from broker.shards.budgets import split

    shares = [split(total, i, count) for i in range(count)]
    assert sum(shares) == total and max(shares) - min(shares) <= 1


def test_a_shards_windows_and_schedule_caps_are_its_share_of_the_nodes():
    from broker.disk.ready import QueueLimits
    from broker.schedules.keeper import ScheduleLimits
    from broker.shards.budgets import shard_queues, shard_schedules

    queues = [shard_queues(QueueLimits(window_total=10, inflight_total=2), i, 3) for i in range(3)]
    assert [q.window_total for q in queues] == [4, 3, 3]
    assert [q.inflight_total for q in queues] == [1, 1, 1]  # at least one a shard: a shard with none hands out nothing
    assert sum(q.window for q in queues) == QueueLimits().window  # a topic's window: the node's, split too
    assert [shard_queues(QueueLimits(inflight=2), i, 3).inflight for i in range(3)] == [1, 1, 1]
    limits = [shard_schedules(ScheduleLimits(max_schedules=5, max_bytes=1000), i, 3) for i in range(3)]
    assert sum(s.max_schedules for s in limits) == 5 and sum(s.max_bytes for s in limits) == 1000


def test_a_shards_store_keeps_its_share_of_the_nodes_resident_index_pages():
    from broker.shards.budgets import shard_store
    from storage.config import StoreConfig

    stores = [shard_store(StoreConfig(index_resident_bytes=16 << 20), i, 3) for i in range(3)]
    assert sum(s.index_resident_bytes for s in stores) == 16 << 20
    # at least 4 MB a shard (an empty store's indexes take 2): 8 MB over 8 cores is 4 MB each
    assert [shard_store(StoreConfig(index_resident_bytes=8 << 20), i, 8).index_resident_bytes
            for i in range(8)] == [4 << 20] * 8
    assert shard_store(StoreConfig(index_resident_bytes=0), 1, 8).index_resident_bytes == 0  # 0: paged from the start
    assert stores[0].fsync == StoreConfig().fsync  # the rest as the node's


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.tuples(st.integers(-5, 5), st.integers(0, 10**6)))),
                min_size=1, max_size=12), st.randoms())
def test_a_head_said_earlier_and_heard_later_does_not_replace_a_newer_one(tmp_path_factory, heads, rnd):
    """The heads one shard says (its pull answers, its notices, its tells)
    are numbered in the order said; another shard that hears them in any
    order keeps the last said (they travel on two connections)."""
    links = str(tmp_path_factory.mktemp("links"))
    speaker = ShardRouter(1, 2, links, BodyLimits(), 1024)
    listener = ShardRouter(0, 2, links, BodyLimits(), 1024)
    said = [speaker.say(head) for (head,) in heads]
    heard = list(said)
    rnd.shuffle(heard)
    for saying in heard:
        listener.heard_head(1, "t", saying)
    assert listener.head_of(1, "t") == heads[-1][0]


# -- a batch answered 503: what it takes back ---------------------------------------------

part_outcomes = st.sampled_from(["stored", "refused", "lost, stored", "lost, not stored"])


@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=12), st.data())
def test_a_batch_answered_503_leaves_nothing_its_retry_would_store_twice(batch, data):
    """A model of one failed sendMsgBatch split over 3 shards: each part
    stored, refused (nothing stored), or lost with its answer (stored or
    not: the asking shard cannot tell). After what owed_back takes back,
    no message whose id the node made is left (the client's retry gets new
    ids and would store them again); every id of the client's a part stored
    stays (the retry finds it)."""
    from broker.core.params import NewSend
    from broker.shards.backend import owed_back
    from storage.store import NewMessage

    sends = [NewSend(NewMessage("t", f"m{at}", "x", 0, 0, 60_000, 3, 0, ""), False, made_id=made)
             for at, (_, made) in enumerate(batch)]
    owners = [shard for shard, _ in batch]
    parts: dict[int, list[int]] = {}
    for at, shard in enumerate(owners):
        parts.setdefault(shard, []).append(at)
    outcomes = {shard: data.draw(part_outcomes) for shard in parts}
    errors = {"refused": InvalidRequest("msgs", "a bad one"), "lost, stored": Unavailable("link lost"),
              "lost, not stored": Unavailable("link lost")}
    answers = [[] if outcomes[shard] == "stored" else errors[outcomes[shard]] for shard in parts]
    stored = {(owners[at], sends[at].message.msg_id) for shard, ats in parts.items() for at in ats
              if outcomes[shard] in ("stored", "lost, stored")}
    taken = owed_back(sends, owners, parts, answers)
    assert all(topic == "t" for _, topic, _ in taken)
    left = stored - {(shard, msg_id) for shard, _, msg_id in taken}
    assert all(not sends[int(msg_id[1:])].made_id for _, msg_id in left), left
    assert {m for m in stored if not sends[int(m[1][1:])].made_id} <= left
