"""What crosses between a node's shards, and how their answers become the
node's (docs/internals.md, "Shards"): the wire forms of the engine's
records (a NamedTuple as its fields), and the merges of the views every
shard answers a part of (topic infos, monitor data, pages, cursors,
/metrics)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from storage.entry import Location, Message, Status
from storage.errors import InvalidRequest, Unavailable
from storage.store import NewMessage

from ..core.bulk_params import BulkFilter, Cursor, ListMsgRequest
from ..core.params import NewSend

# -- what travels: a NamedTuple as its fields ------------------------------------------

def message_fields(m: Message) -> list[Any]:
    return list(m)


def message_of(f: Sequence[Any]) -> Message:
    return Message(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], Status(f[9]), f[10], Location(*f[11]),
                   f[12], f[13], f[14], f[15] if len(f) > 15 else 0, f[16] if len(f) > 16 else "",
                   f[17] if len(f) > 17 else "")


def messages_of(rows: Iterable[Sequence[Any]]) -> list[Message]:
    return [message_of(row) for row in rows]


def send_of(fields: Sequence[Any]) -> NewSend:
    return NewSend(NewMessage(*fields[0]), fields[1], fields[2])


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
    """camellia's TopicInfo of a topic over shards: every size summed, the oldest due age the largest."""
    merged: dict[str, Any] | None = None
    for info in infos:
        if merged is None:
            merged = {**info, "waitingQueueInfo": dict(info["waitingQueueInfo"])}
            continue
        for field in ("waitingQueueSize", "readyQueueSize", "ackQueueSize", "dueUndelivered"):
            merged[field] += info[field]
        merged["oldestDueAgeMillis"] = max(merged["oldestDueAgeMillis"], info["oldestDueAgeMillis"])
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


def merge_monitor_data(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """getMonitorData over shards: each topic's counts summed, its gap stats merged."""
    stats: dict[str, dict[str, Any]] = {}
    for part in parts:
        for row in part.get("requestStatsList", ()):
            have = stats.setdefault(row["topic"], {"topic": row["topic"]})
            for name, value in row.items():
                if name != "topic":
                    have[name] = have.get(name, 0) + value
    merged: dict[str, Any] = {
        "requestStatsList": [stats[t] for t in sorted(stats)],
        "pullMsgTimeGapStatsList": merge_gaps([r for p in parts for r in p.get("pullMsgTimeGapStatsList", ())]),
        "readyQueueTimeGapStatsList": merge_gaps([r for p in parts for r in p.get("readyQueueTimeGapStatsList", ())]),
    }
    starts = [p["intervalStartTime"] for p in parts if "intervalStartTime" in p]
    if starts:
        merged["intervalStartTime"] = min(starts)
        merged["intervalEndTime"] = max(p["intervalEndTime"] for p in parts if "intervalEndTime" in p)
    return merged


# Gauges of a process rather than of messages: the node's is the largest of its shards'.
PER_PROCESS_GAUGE_ENDS = ("_limit", "_seconds", "_info", "_lease")


def merge_metrics(texts: Sequence[str], most: int, topics: int) -> str:
    """One Prometheus scrape of every shard's: a series the shards share
    summed (counters; gauges of messages, bytes, files), or the largest
    for a gauge of one process (PER_PROCESS_GAUGE_ENDS: limits, lags, ages);
    each family's HELP and TYPE once, its samples together, in the order
    the first shard that has it gives. Of the topics the shards show, the
    `most` with the largest backlogs summed (a topic's series are the sums
    of the shards that show it: each shows its own largest); `topics`, the
    node's count of topics (hourglass_topics)."""
    heads: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    samples: dict[str, dict[str, float]] = {}
    for text in texts:
        family = ""
        for line in text.split("\n"):  # (the format's only line end: splitlines() also cuts at CR, U+2028, ...)
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    head = heads.setdefault(family, [])
                    samples.setdefault(family, {})
                    if line not in head:
                        head.append(line)
                    if parts[1] == "TYPE" and len(parts) == 4:
                        kinds[family] = parts[3]
                continue
            series, _, value = line.rpartition(" ")
            name = series.partition("{")[0]
            if not name.startswith(family) or family == "":
                family = name
                heads.setdefault(family, [])
                samples.setdefault(family, {})
            try:
                number = float(value)
            except ValueError:
                continue
            have = samples[family].get(series)
            if have is None:
                samples[family][series] = number
            elif kinds.get(family) == "gauge" and name.endswith(PER_PROCESS_GAUGE_ENDS):
                samples[family][series] = max(have, number)
            else:
                samples[family][series] = have + number
    if "hourglass_topics" in samples:
        samples["hourglass_topics"] = {"hourglass_topics": float(topics)}
    kept = _largest_backlogs(samples, most)
    if "hourglass_topics_shown" in samples:
        shown = {_topic_of(series) for values in samples.values() for series in values} - {None}
        count = len(shown) if kept is None else len(kept) - 1
        samples["hourglass_topics_shown"] = {"hourglass_topics_shown": float(count)}
    out = []
    for family, values in samples.items():
        out.extend(heads[family])
        out.extend(f"{name} {int(v) if v.is_integer() and abs(v) < 2 ** 53 else v}" for name, v in values.items()
                   if kept is None or _topic_of(name) in kept)
    return "\n".join(out) + "\n"


def _topic_of(series: str) -> str | None:
    """A series' topic label, its text as written (None: none)."""
    at = series.find('topic="')
    if at < 0:
        return None
    end = at + 7
    while True:
        end = series.find('"', end)
        if end < 0:
            return series[at + 7:]
        slashes = end - len(series[at + 7:end].rstrip("\\")) - at - 7
        if slashes % 2 == 0:  # (an odd run of backslashes escapes the quote; an even one is backslashes)
            return series[at + 7:end]
        end += 1


def _largest_backlogs(samples: dict[str, dict[str, float]], most: int) -> set[str | None] | None:
    """The topics whose series are shown: the `most` largest backlogs
    (waiting + ready + consuming, then the name); None: all there are."""
    backlog: dict[str, float] = {}
    shown: set[str] = set()
    for values in samples.values():
        for series in values:
            topic = _topic_of(series)
            if topic is not None:
                shown.add(topic)
    if len(shown) <= most:
        return None
    for state in ("waiting", "ready", "consuming"):
        for series, value in samples.get(f"hourglass_{state}_messages", {}).items():
            topic = _topic_of(series)
            if topic is not None:
                backlog[topic] = backlog.get(topic, 0.0) + value
    ranked = sorted(shown, key=lambda t: (-backlog.get(t, 0.0), t))
    return {None, *ranked[:most]}


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


def dead_cursor(shard: int, inner: str | None) -> str:
    return f"s{shard}.{inner or ''}"


def parse_dead_cursor(cursor: str | None, count: int) -> tuple[int, str | None]:
    """(shard, that shard's cursor) of a listDeadMsg cursor of a node of
    `count` shards: the walk goes shard by shard."""
    if cursor is None:
        return 0, None
    shard_text, dot, inner = cursor.partition(".")
    index = shard_text[1:]  # ASCII digits only ("²".isdigit() is true, and int() refuses it)
    if not dot or not shard_text.startswith("s") or not (0 < len(index) <= 6 and index.isascii() and index.isdigit()) \
            or int(index) >= count:
        raise InvalidRequest("cursor", f"must be a cursor a listDeadMsg page answered, got {cursor[:40]!r}")
    return int(index), inner or None
