"""What crosses between a node's shards, and how their answers become the
node's (docs/internals.md, "Shards"): the wire forms of the engine's
records and of /metrics' families (a NamedTuple as its fields), and the
merges of the views every shard answers a part of (topic infos, monitor
data, pages, cursors, /metrics' topic ranks and families)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from storage.entry import Location, Message, Status
from storage.errors import InvalidRequest, Unavailable
from storage.store import NewMessage

from ..core.bulk_params import BulkFilter, Cursor, ListMsgRequest
from ..core.params import Fenced, FencedRequest, NewSend
from ..core.transitions import Fencing, Refusal
from ..http.scrape import Rank
from ..observe.metrics import MAX, MEAN, MIN, Family, Labels, Number, Sample

# -- what travels: a NamedTuple as its fields ------------------------------------------

def message_fields(m: Message) -> list[Any]:
    return list(m)


def message_of(f: Sequence[Any]) -> Message:
    return Message(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], Status(f[9]), f[10], Location(*f[11]),
                   f[12], f[13], f[14], f[15] if len(f) > 15 else 0, f[16] if len(f) > 16 else "",
                   f[17] if len(f) > 17 else "", f[18] if len(f) > 18 else 0)


def messages_of(rows: Iterable[Sequence[Any]]) -> list[Message]:
    return [message_of(row) for row in rows]


def send_of(fields: Sequence[Any]) -> NewSend:
    return NewSend(NewMessage(*fields[0]), fields[1], fields[2],
                   kept=None if fields[3] is None else (int(fields[3][0]), int(fields[3][1])))


def fenced_fields(r: FencedRequest) -> list[Any]:
    return [r.topic, list(r.msg_ids), list(r.deliveries), r.kind.value, r.many, r.ack_timeout_ms, r.max_lease_ms]


def fenced_of(f: Sequence[Any]) -> FencedRequest:
    return FencedRequest(f[0], tuple(f[1]), tuple(f[2]), Fenced(f[3]), f[4], f[5], f[6])


def fencings_fields(outcomes: Sequence[Fencing]) -> list[Any]:
    """A fenced call's outcomes as they travel: each run of one shared
    outcome (a call's changed messages share theirs, by status) sent once,
    then each id's place among them -- an int an id, not a row an id.
    Example: [a, a, a, b] -> [[a's fields, b's fields], [0, 0, 0, 1]]."""
    rows: list[list[Any]] = []
    at: list[int] = []
    last: Fencing | None = None
    for outcome in outcomes:
        if outcome is not last:
            status, refusal, deadline_ms = last = outcome
            rows.append([None if status is None else int(status), None if refusal is None else refusal.value,
                         deadline_ms])
        at.append(len(rows) - 1)
    return [rows, at]


def fencings_of(f: Sequence[Any]) -> list[Fencing]:
    """`fencings_fields` undone: each run's outcome made once, shared by its ids."""
    distinct = [Fencing(None if row[0] is None else Status(row[0]), None if row[1] is None else Refusal(row[1]), row[2])
                for row in f[0]]
    return [distinct[i] for i in f[1]]


def filter_fields(f: BulkFilter) -> list[Any]:
    return [f.key, f.tag, f.msg_id_prefix, sorted(int(s) for s in f.statuses), f.trigger_from_ms, f.trigger_to_ms]


def filter_of(fields: Sequence[Any]) -> BulkFilter:
    return BulkFilter(fields[0], fields[1], fields[2], frozenset(Status(s) for s in fields[3]), fields[4], fields[5])


def list_fields(r: ListMsgRequest) -> list[Any]:
    return [r.topic, filter_fields(r.filter), None if r.cursor is None else list(r.cursor), r.limit, r.count_only,
            r.max_bytes]


def list_of(fields: Sequence[Any]) -> ListMsgRequest:
    cursor = None if fields[2] is None else Cursor(*fields[2])
    return ListMsgRequest(fields[0], filter_of(fields[1]), cursor, fields[3], fields[4], fields[5])


# -- merging views ------------------------------------------------------------------------

def merge_topic_infos(infos: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """camellia's TopicInfo of a topic over shards: every size summed, the oldest due age and the longest
    held the largest."""
    merged: dict[str, Any] | None = None
    for info in infos:
        if merged is None:
            merged = {**info, "waitingQueueInfo": dict(info["waitingQueueInfo"])}
            continue
        for field in ("waitingQueueSize", "readyQueueSize", "ackQueueSize", "dueUndelivered"):
            merged[field] += info[field]
        merged["oldestDueAgeMillis"] = max(merged["oldestDueAgeMillis"], info["oldestDueAgeMillis"])
        if "longestHeldMillis" in info:
            merged["longestHeldMillis"] = max(merged.get("longestHeldMillis", 0), info["longestHeldMillis"])
        buckets = merged["waitingQueueInfo"]
        for name, n in info["waitingQueueInfo"].items():
            buckets[name] = buckets.get(name, 0) + n
    if merged is None:
        raise Unavailable("no shard answered; retry")
    return merged


def merge_gaps(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Gap stats per topic over shards: counts summed, averages weighted, maxima the largest."""
    by_topic: dict[str, dict[str, Any]] = {}
    for row in rows:
        have = by_topic.get(row["topic"])
        if have is None:
            by_topic[row["topic"]] = dict(row)
            continue
        count = have["count"] + row["count"]
        have["avg"] = round((have["avg"] * have["count"] + row["avg"] * row["count"]) / count, 2) if count else 0.0
        have["count"] = count
        have["max"] = max(have["max"], row["max"])
    return [by_topic[t] for t in sorted(by_topic)]


def merge_monitor_data(recent: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """getMonitorData over shards, from each shard's recent intervals
    (oldest first): the newest interval every shard has closed (none
    until each has closed one), each topic's counts summed, its gap stats
    merged. Shards close an interval at the same wall-clock boundary but
    not at the same instant: merging one shard's newest with another's
    previous would count the one twice and lose the other."""
    closed = [[p for p in parts if "intervalEndTime" in p] for parts in recent]
    if not all(closed):
        return {"requestStatsList": [], "pullMsgTimeGapStatsList": [], "readyQueueTimeGapStatsList": []}
    ends = [{p["intervalEndTime"] for p in parts} for parts in closed]
    common = set.intersection(*ends)
    end = max(common) if common else min(max(e) for e in ends)
    parts = [p for shard in closed for p in shard if p["intervalEndTime"] == end]
    stats: dict[str, dict[str, Any]] = {}
    for part in parts:
        for row in part["requestStatsList"]:
            have = stats.setdefault(row["topic"], {"topic": row["topic"]})
            for name, value in row.items():
                if name != "topic":
                    have[name] = have.get(name, 0) + value
    return {
        "requestStatsList": [stats[t] for t in sorted(stats)],
        "pullMsgTimeGapStatsList": merge_gaps([r for p in parts for r in p["pullMsgTimeGapStatsList"]]),
        "readyQueueTimeGapStatsList": merge_gaps([r for p in parts for r in p["readyQueueTimeGapStatsList"]]),
        "intervalStartTime": min(p["intervalStartTime"] for p in parts), "intervalEndTime": end,
    }


def merge_ranks(parts: Iterable[Mapping[str, Sequence[Any]]]) -> dict[str, Rank]:
    """Each topic's rank for /metrics over shards (broker.http.scrape's
    `topic_ranks` of each, as they travel): backlogs summed (None: no shard
    has the topic, only counters of it), requests summed."""
    ranks: dict[str, Rank] = {}
    for part in parts:
        for topic, rank in part.items():
            backlog: int | None = rank[0]
            requests: int = rank[1]
            have = ranks.get(topic)
            if have is not None:
                mine = have[0]
                if mine is not None:
                    backlog = mine if backlog is None else mine + backlog
                requests += have[1]
            ranks[topic] = (backlog, requests)
    return ranks


def node_topics(ranks: Mapping[str, Rank]) -> int:
    """How many topics the node has: those of `ranks` some shard has (hourglass_topics)."""
    return sum(1 for backlog, _ in ranks.values() if backlog is not None)


def family_fields(f: Family) -> list[Any]:
    return [f.name, f.help_text, f.kind, [[s.name, s.labels, s.value, s.merge] for s in f.samples], f.float_format]


def families_of(rows: Iterable[Sequence[Any]]) -> list[Family]:
    return [Family(f[0], f[1], f[2], [Sample(s[0], tuple((label, text) for label, text in s[1]), s[2], s[3])
                                      for s in f[3]], f[4]) for f in rows]


def merge_families(parts: Iterable[Sequence[Family]]) -> list[Family]:
    """One /metrics of every shard's families (broker.observe.metrics): a
    series several shards have (its name and labels alike) made of theirs
    as its `Sample.merge` says -- summed, the largest, the smallest, or an
    average weighted by its count; each family's HELP, TYPE and float
    format the first shard's, its samples in the order the shards give
    them. No text is read: a label is compared as the value it is."""
    heads: dict[str, Family] = {}
    merged: dict[str, dict[tuple[str, Labels], Sample]] = {}
    for part in parts:
        for family in part:
            samples = merged.get(family.name)
            if samples is None:
                heads[family.name] = family
                merged[family.name] = {(s.name, s.labels): s for s in family.samples}
                continue
            merged_counts, counts = _counts(samples.values()), _counts(family.samples)  # an average's weights
            for s in family.samples:
                key = (s.name, s.labels)
                have = samples.get(key)
                if have is None:
                    samples[key] = s
                    continue
                value: Number  # (not a float: an int stays one)
                if s.merge == MEAN:
                    weight = _count_of(s)
                    value = _mean(have.value, merged_counts.get(weight, 0), s.value, counts.get(weight, 0))
                elif s.merge == MAX:
                    value = max(have.value, s.value)
                elif s.merge == MIN:
                    value = min(have.value, s.value)
                else:
                    value = have.value + s.value
                samples[key] = have._replace(value=value)
    return [family._replace(samples=list(merged[name].values())) for name, family in heads.items()]


def _counts(samples: Iterable[Sample]) -> dict[tuple[str, Labels], Number]:
    """The counts among `samples` (type="count"), by series: what an average is weighted by."""
    return {(s.name, s.labels): s.value for s in samples if ("type", "count") in s.labels}


def _count_of(s: Sample) -> tuple[str, Labels]:
    """The series an average (MEAN) is weighted by: its family's of the same labels but type="count"."""
    return s.name, tuple((label, "count" if label == "type" else text) for label, text in s.labels)


def _mean(a: Number, a_count: Number, b: Number, b_count: Number) -> float:
    """Two averages of `a_count` and `b_count` values as one, to 2 places
    as getMonitorData's are (`merge_gaps`)."""
    count = a_count + b_count
    return round((a * a_count + b * b_count) / count, 2) if count else 0.0


def merge_pages(pages: Sequence[tuple[list[Message], str | None]], limit: int) -> tuple[list[Message], str | None]:
    """listMsg over shards: each shard's page after the same cursor, merged
    in page order ((trigger time, msgId): no two shards hold one msgId),
    kept up to the earliest place a shard's page stopped short of its end
    (what that shard holds after it is not read yet) and cut to `limit`;
    the cursor after the last one kept, if any shard has more."""
    bound: tuple[int, str] | None = None
    for _, cursor in pages:
        if cursor is not None:
            trigger, _, msg_id = cursor.partition(":")
            stop = (int(trigger), msg_id)
            bound = stop if bound is None or stop < bound else bound
    merged = sorted((m for got, _ in pages for m in got), key=lambda m: (m.trigger_ms, m.msg_id))
    more = bound is not None
    if bound is not None:
        merged = [m for m in merged if (m.trigger_ms, m.msg_id) <= bound]
    if len(merged) > limit:
        merged, more = merged[:limit], True
    if not more:
        return merged, None
    if merged:
        return merged, Cursor(merged[-1].trigger_ms, merged[-1].msg_id).text()
    assert bound is not None
    return merged, Cursor(*bound).text()


def walk_cursor(shard: int, inner: str | None) -> str:
    """The cursor of a walk shard by shard (listDeadMsg, exportMsg): "s<shard>.<that shard's cursor>"."""
    return f"s{shard}.{inner or ''}"


def parse_walk_cursor(cursor: str | None, count: int, command: str) -> tuple[int, str | None]:
    """(shard, that shard's cursor) of a `command` cursor of a node of
    `count` shards (`walk_cursor`)."""
    if cursor is None:
        return 0, None
    shard_text, dot, inner = cursor.partition(".")
    index = shard_text[1:]  # ASCII digits only ("²".isdigit() is true, and int() refuses it)
    if not dot or not shard_text.startswith("s") or not (0 < len(index) <= 6 and index.isascii() and index.isdigit()) \
            or int(index) >= count:
        raise InvalidRequest("cursor", f"must be a cursor a {command} page answered, got {cursor[:40]!r}")
    return int(index), inner or None
