"""Spark sink: a PySpark data source `hourglass` that sends a DataFrame's rows
to a broker as delay messages, in batch and in streaming, exactly once in
effect.

    from broker.spark import register
    register(spark)                      # once per SparkSession
    (df.write.format("hourglass")
       .option("url", "http://127.0.0.1:8080").option("topic", "orders")
       .mode("append").save())
    (df.writeStream.format("hourglass")
       .option("url", "http://127.0.0.1:8080").option("topic", "orders")
       .option("checkpointLocation", "/data/ckpt/orders").start())

It needs pyspark >= 4.1 (the Python Data Source API, with the Arrow stream
writer) and pyarrow: `pip install 'hourglass[spark]'`; importing it without
them raises ImportError saying so.

Columns (names are case-sensitive; any other column is refused, because a
misspelt `delaymillis` would silently send messages due now):

    column       Spark type                   wire key
    msg          string (required)            msg
    msgId        string                       msgId      (null or "": generated, see below)
    delayMillis  tinyint..bigint              delayMillis
    triggerTime  tinyint..bigint | timestamp  triggerTime (ms since the epoch; wins over delayMillis)
    ttlMillis    tinyint..bigint              ttlMillis
    priority     tinyint..bigint              priority
    maxRetry     tinyint..bigint              maxRetry
    tag          string                       tag
    key          string                       key        (serial key, docs/api.md)
    topic        string                       the request's topic (null: the `topic` option)

A null value means "not given": the broker's default applies (docs/api.md, Sending).
Types are checked when Spark plans the write, on the driver, so a wrong
type fails `save()`/`start()` naming the column before any row is sent;
values are checked by the broker, and a refused batch fails the task.

Options (Spark lower-cases their names; unknown ones are refused):

    url             base URL of a node, http(s)://host:port[/path] (required)
    topic           topic of every row, or of rows whose `topic` is null
                    (required unless there is a `topic` column)
    batchsize       messages per sendMsgBatch request, 1..1000 (500)
    token           bearer token (`--auth-token-file` on the server)
    timeoutseconds  socket timeout of one request (30)
    retries         retries of a request after a 429/502/503/504, a refused
                    or reset connection or a timeout (5)
    backoffmillis   the longest pause before the first retry; it doubles
                    each retry, up to 10 s (200)
    idprefix        the prefix of generated ids (see below)

Exactly once in effect. The broker keeps one message per (topic, msgId) and
answers a repeated id with the stored message, unchanged (docs/api.md, Sending), so a
sink whose every row has an id that is the same each time the row is sent
again may send as often as it likes. A row without a msgId gets

    batch write:  {prefix}-{partition}-{row}          prefix: idprefix, else a random
                                                      id made once per write, on the driver
    stream:       {prefix}-{batch}-{partition}-{row}  prefix: idprefix, else the query id

where `partition` is the task's partition id, `row` the row's position in
that partition (from 0) and `batch` the micro-batch id. A retried task
(Spark re-sends its whole partition) or a speculative copy makes the same
ids: the prefix is generated once in `DataSource.writer()` and shipped to
every task inside the pickled writer. A stream restarted from its checkpoint
re-runs the batches that were planned but not committed, with the same batch
ids, and its query id (`StreamingQuery.id`, kept in the checkpoint's
metadata) is the same, so it makes the same ids too. Running the same batch
write again is a new write with a new prefix unless `idprefix` names it
(e.g. "orders-2024-06-01"); two writes of different rows must not share an
idprefix, or the second one's rows are dropped as duplicates.

This holds when a partition holds the same rows in the same order each time
it is computed: true for file, range and rate sources, and for Kafka offset
ranges; not after an unordered shuffle whose order varies between runs.
There, give each row its own `msgId` (an order id, a hash of the row).

Sending. Each task sends its rows, grouped by topic and by the shard that
owns them, in sendMsgBatch requests of `batchsize` messages. A node of
many shards names each shard's own port (getShardMap, docs/api.md
"Shards"); the task reads that map before its first request and sends each
row on its owner's port (its key's shard when it has one, else its
msgId's: every row has its id, given or generated, before it is placed),
so the node forwards none of them. A node of one shard, a cluster or Redis
node, or a map that cannot be read: every request goes to `url`. Each
destination (a shard's port, or `url`) has a thread of the task and
kept-alive connections of its own, sending its requests in order, one at
a time, while the task makes the next ones: the shards store a task's
rows side by side (a destination holds two requests at most: the one it
sends and the next). When a shard's port fails (refused, reset, a timeout,
429, 502, 503, 504) the request goes on at once through `url`, which
stores any message, and so do the task's later requests; the map is read
again 60 s later (`broker.shard_map`, as `broker.client` does): a shard
that restarted listens on a new port. Each request is validated whole by
the shard that takes it, as a batch sent to `url` is by the node: one
refused row stores nothing of its request and fails the task, which
sends nothing more; its requests to other shards, as its earlier ones,
may have been stored by then (the task's retry re-sends them harmlessly,
below).

A request answered 429, 502, 503 or 504, or failing with a refused or
reset connection or a timeout, is retried `retries` times by the clients'
one policy (`broker.retry`: exponential backoff with full jitter,
honouring Retry-After; every request of the sink may be repeated, as
every row has its id), so a failover's few seconds are covered; a
shard's port that fails costs one of those retries, without a pause. A 413
splits the batch in halves; any other error fails the task (as it hands
over its next request, or at its end) with a `SinkError` naming the
partition (and stream batch), the topic, the first row, the URL, the HTTP
status and the broker's `msg`. Spark retries a failed task
(`spark.task.maxFailures`) and the ids make that harmless. A failed job
leaves what it sent in the broker: there is no rollback.

Modes: batch writes take `mode("append")` only (`overwrite` is refused by the
sink, `errorifexists` and `ignore` by Spark); streams take
`outputMode("append")` only (`complete` is refused by the sink: a delay queue
cannot be truncated, and a result re-sent each batch would be new messages
each batch; Spark refuses `update` for Python data sources). A stream needs a
`checkpointLocation`, as for any non-built-in sink.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import http.client
import itertools
import json
import struct
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql import types as T
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"broker.spark needs pyspark>=4.1 and pyarrow: pip install 'hourglass[spark]' ({e})") from e

from broker.core.bodies import MAX_SEND_BATCH
from broker.http.paths import PREFIX
from broker.retry import Failure, RetryPolicy, retry_after_s, status_failure
from broker.shard_map import ShardMap
from storage.errors import HourglassError, InvariantError

SEND_BATCH_PATH = PREFIX + "sendMsgBatch"
SHARD_MAP_PATH = PREFIX + "getShardMap"
# The cap of the backoff between retries.
MAX_BACKOFF_MS = 10_000
# Requests a destination's lane holds at once, the one it sends and those
# waiting for it: the task makes the next ones meanwhile, and the lane's
# next is at hand the moment an answer comes. 1 and 2 measured alike into
# a node of 2 shards on 2 cores, Spark on the same cores (docs/benchmarks.md,
# "Spark into a node"); 2 keeps a round trip off the shard's time.
LANE_DEPTH = 2
# Options Spark itself may pass along with ours.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation"})
# Local properties Spark sets on a streaming query's tasks.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

_SparkTypes = tuple[type[T.DataType], ...]
_INTEGERS: _SparkTypes = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_STRING: _SparkTypes = (T.StringType,)
# column -> accepted Spark types; the wire key is the column's name.
COLUMN_TYPES: dict[str, _SparkTypes] = {
    "msg": _STRING,
    "msgId": _STRING,
    "delayMillis": _INTEGERS,
    "triggerTime": (*_INTEGERS, T.TimestampType),
    "ttlMillis": _INTEGERS,
    "priority": _INTEGERS,
    "maxRetry": _INTEGERS,
    "tag": _STRING,
    "key": _STRING,
    "topic": _STRING,
}
_TYPE_WORDS: dict[_SparkTypes, str] = {_STRING: "string", _INTEGERS: "an integer (tinyint, smallint, int or bigint)",
               (*_INTEGERS, T.TimestampType): "an integer (ms since the epoch) or a timestamp"}


class SinkConfigError(HourglassError, ValueError):
    """A bad option, a missing or unknown column or a column of the wrong
    type; raised on the driver when Spark plans the write, before any row
    is sent."""


class SinkError(HourglassError):
    """A batch of rows could not be stored: the broker refused it, or could
    not be reached within the retries. Fails the Spark task."""


@dataclass(frozen=True)
class SinkOptions:
    """The data source's options, parsed and checked (`from_options`)."""

    # Base URL of a node: scheme http or https, host, port, optional path
    # prefix (the API's /camellia/delayQueue/ goes after it).
    url: str
    # Topic of rows without a topic column, or whose topic is null.
    topic: str | None = None
    # Messages per sendMsgBatch request; the server takes 1..MAX_SEND_BATCH.
    batch_size: int = 500
    # Bearer token, when the server runs with --auth-token-file.
    token: str | None = None
    # Socket timeout of one request (connect, send, answer).
    timeout_s: float = 30.0
    # Retries of one request after a retryable failure (0: none).
    retries: int = 5
    # Longest pause before the first retry; doubled each retry up to MAX_BACKOFF_MS.
    backoff_ms: int = 200
    # Prefix of generated msgIds; None: per write (batch) or the query id (stream).
    id_prefix: str | None = None

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SinkConfigError(f"option url must be http(s)://host:port, got {self.url!r}")
        if parts.query or parts.fragment:
            raise SinkConfigError(f"option url may not have a query or fragment, got {self.url!r}")
        if not 1 <= self.batch_size <= MAX_SEND_BATCH:
            raise SinkConfigError(f"option batchsize must be in 1..{MAX_SEND_BATCH}, got {self.batch_size}")
        if not self.timeout_s > 0:
            raise SinkConfigError(f"option timeoutseconds must be > 0, got {self.timeout_s}")
        if self.retries < 0:
            raise SinkConfigError(f"option retries must be >= 0, got {self.retries}")
        if self.backoff_ms < 0:
            raise SinkConfigError(f"option backoffmillis must be >= 0, got {self.backoff_ms}")
        if self.topic == "" or self.id_prefix == "" or self.token == "":
            raise SinkConfigError("options topic, idprefix and token may not be empty")

    @property
    def retry(self) -> RetryPolicy:
        """The clients' retry policy (`broker.retry`) with this sink's
        retries and backoff; a backoff above the cap starts at the cap."""
        return RetryPolicy(retries=self.retries, backoff_s=min(self.backoff_ms, MAX_BACKOFF_MS) / 1000,
                           max_backoff_s=MAX_BACKOFF_MS / 1000)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkOptions:
        """From Spark's (lower-cased, string) options."""
        known = {"url", "topic", "batchsize", "token", "timeoutseconds", "retries", "backoffmillis", "idprefix"}
        unknown = sorted(k for k in options if k.lower() not in known | SPARK_OPTIONS)
        if unknown:
            raise SinkConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        opts = {k.lower(): v for k, v in options.items()}
        if not opts.get("url"):
            raise SinkConfigError("option url is required, e.g. .option('url', 'http://127.0.0.1:8080')")
        return cls(url=opts["url"], topic=opts.get("topic"),
                   batch_size=_number(opts, "batchsize", int, cls.batch_size),
                   token=opts.get("token"),
                   timeout_s=_number(opts, "timeoutseconds", float, cls.timeout_s),
                   retries=_number(opts, "retries", int, cls.retries),
                   backoff_ms=_number(opts, "backoffmillis", int, cls.backoff_ms),
                   id_prefix=opts.get("idprefix"))


_Number = TypeVar("_Number", int, float)


def _number(opts: Mapping[str, str], name: str, kind: Callable[[str], _Number], default: _Number) -> _Number:
    text = opts.get(name)
    if text is None:
        return default
    try:
        return kind(text)
    except ValueError:
        raise SinkConfigError(f"option {name} must be a number, got {text!r}") from None


def check_columns(schema: T.StructType, options: SinkOptions) -> tuple[str, ...]:
    """The columns to send, in schema order, once every column is known and
    of an accepted type; else SinkConfigError naming the first bad one."""
    names = []
    for f in schema.fields:
        accepted = COLUMN_TYPES.get(f.name)
        if accepted is None:
            near = [c for c in COLUMN_TYPES if c.lower() == f.name.lower()]
            hint = f" (did you mean {near[0]!r}? names are case-sensitive)" if near else ""
            raise SinkConfigError(f"unknown column {f.name!r}{hint}; the hourglass sink takes only "
                                  f"{', '.join(COLUMN_TYPES)}")
        if not isinstance(f.dataType, accepted):
            raise SinkConfigError(f"column {f.name!r} must be {_TYPE_WORDS[accepted]}, "
                                  f"got {f.dataType.simpleString()}")
        names.append(f.name)
    if "msg" not in names:
        raise SinkConfigError("column 'msg' is required (a string)")
    if options.topic is None and "topic" not in names:
        raise SinkConfigError("option topic is required when there is no topic column")
    return tuple(names)


def _refuse_overwrite(overwrite: bool, what: str) -> None:
    if overwrite:
        raise SinkConfigError(f"the hourglass sink only appends ({what}): messages already sent cannot be "
                              "truncated; use mode('append') / outputMode('append')")


class HourglassDataSource(DataSource):
    """`format("hourglass")`: write-only, batch and streaming (see the module
    docstring). Both writers check the schema and options here, on the driver."""

    @classmethod
    def name(cls) -> str:
        return "hourglass"

    def writer(self, schema: T.StructType, overwrite: bool) -> HourglassWriter:
        _refuse_overwrite(overwrite, "mode overwrite")
        options = SinkOptions.from_options(self.options)
        return HourglassWriter(options, check_columns(schema, options), options.id_prefix or uuid.uuid4().hex[:16])

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> HourglassStreamWriter:
        _refuse_overwrite(overwrite, "output mode complete")
        options = SinkOptions.from_options(self.options)
        return HourglassStreamWriter(options, check_columns(schema, options))


def register(spark: SparkSession) -> None:
    """Make `format("hourglass")` known to this SparkSession (idempotent)."""
    spark.dataSource.register(HourglassDataSource)


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task sent: rows, requests and retried requests."""

    partition: int
    rows: int
    requests: int
    retries: int


class HourglassWriter(DataSourceArrowWriter):
    """Batch writes: made on the driver by `HourglassDataSource.writer()` and
    pickled to every task, so all attempts of a task share `id_prefix`."""

    def __init__(self, options: SinkOptions, columns: tuple[str, ...], id_prefix: str) -> None:
        self.options = options
        self.columns = columns
        self.id_prefix = id_prefix

    def __repr__(self) -> str:
        return f"HourglassWriter(url={self.options.url!r}, columns={self.columns}, id_prefix={self.id_prefix!r})"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        partition = _task_context().partitionId()
        where = f"partition {partition}"
        return send_partition(iterator, self.options, self.columns, f"{self.id_prefix}-{partition}", partition, where)


class HourglassStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: the id prefix is `idprefix` or the query id, and the
    micro-batch id comes from the task's local properties."""

    def __init__(self, options: SinkOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns

    def __repr__(self) -> str:
        return f"HourglassStreamWriter(url={self.options.url!r}, columns={self.columns})"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = _task_context()
        partition = context.partitionId()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = self.options.id_prefix or context.getLocalProperty(QUERY_ID_PROPERTY)
        if batch_id is None or query_id is None:
            raise SinkError(f"no streaming batch id ({BATCH_ID_PROPERTY}) or query id ({QUERY_ID_PROPERTY}) "
                            "in the task's local properties: is this a micro-batch query?")
        where = f"stream batch {batch_id}, partition {partition}"
        return send_partition(iterator, self.options, self.columns, f"{query_id}-{batch_id}-{partition}",
                              partition, where)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every row is stored by the time its task succeeds

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        pass  # nothing to undo: the re-run batch re-sends the same ids


def _task_context() -> TaskContext:
    """The context of the Spark task running a writer's write()."""
    context = TaskContext.get()
    if context is None:
        raise SinkError("hourglass sink: write() runs only inside a Spark task (no TaskContext)")
    return context


# == rows to requests ==========================================================
#
# Rows become JSON text inside Arrow, column by column (pyarrow.compute): a
# row's item is `{"msgId":"p-0-7","msg":"..",...},`, and a request's body is
# `{"topic":"t","msgs":[` + a run of items, read straight out of the Arrow
# data buffer, less its last comma, + `]}`. Only strings holding `"`, `\`
# or a control character go through json.dumps; others are quoted as they
# are (raw UTF-8 is valid JSON). About 3x cheaper than dicts and json.dumps.
# The rows of a request are of one topic and one shard: each row's owner is
# found from its id (and key) in Python, the sink's one loop over rows.

_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


@dataclass
class _Pending:
    """Items of one topic and shard waiting to fill a request, with their
    row numbers in the partition (for error messages)."""

    items: list[pa.Array] = field(default_factory=list)
    rows: list[pa.Array] = field(default_factory=list)
    count: int = 0

    def add(self, items: pa.Array, rows: pa.Array) -> None:
        self.items.append(items)
        self.rows.append(rows)
        self.count += len(items)

    def send(self, sender: _Sender, topic: str, shard: str | None, size: int, *, all_: bool) -> None:
        """Send every full request of `size` items (and the rest if `all_`)."""
        items, rows = pa.concat_arrays(self.items), pa.concat_arrays(self.rows)
        end = self.count if all_ else self.count - self.count % size
        for start in range(0, end, size):
            sender.send(topic, shard, items.slice(start, size), rows.slice(start, min(size, end - start)))
        self.items, self.rows, self.count = [items.slice(end)], [rows.slice(end)], self.count - end


def send_partition(batches: Iterator[pa.RecordBatch], options: SinkOptions, columns: tuple[str, ...],
                   id_prefix: str, partition: int, where: str) -> SinkCommit:
    """Send one partition's rows, `{id_prefix}-{row}` being a row's id when
    it has none; return what was sent. Raises SinkError (see `_Sender`)."""
    pending: dict[tuple[str, str | None], _Pending] = {}  # (topic, shard's base URL or None: the node's)
    row = 0
    with _Sender(options, where) as sender:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rows = pa.array(range(row, row + batch.num_rows), pa.int64())
            ids = row_ids(batch, columns, id_prefix, rows)
            items = item_texts(batch, columns, ids)
            owners = _owners(sender.shard_map(), ids, batch.column("key") if "key" in columns else None)
            for topic, in_topic in _topics(batch, columns, options.topic, row, where):
                for shard, on_shard in owners:
                    mask = _both(in_topic, on_shard)
                    part_items, part_rows = (items, rows) if mask is None else (items.filter(mask), rows.filter(mask))
                    if len(part_items) == 0:
                        continue
                    slot = pending.setdefault((topic, shard), _Pending())
                    slot.add(part_items, part_rows)
                    if slot.count >= options.batch_size:
                        slot.send(sender, topic, shard, options.batch_size, all_=False)
            row += batch.num_rows
        for (topic, shard), slot in pending.items():
            if slot.count:
                slot.send(sender, topic, shard, options.batch_size, all_=True)
        sender.finish()
        return SinkCommit(partition, row, sender.requests, sender.retried)


def row_ids(batch: pa.RecordBatch, columns: tuple[str, ...], id_prefix: str, rows: pa.Array) -> pa.Array:
    """Each row's msgId: its msgId column's, else (null or empty)
    `{id_prefix}-{row}`, `rows` being the rows' numbers in the partition."""
    generated = pc.binary_join_element_wise(id_prefix + "-", pc.cast(rows, pa.string()), "")
    if "msgId" not in columns:
        return generated
    given = batch.column("msgId")
    return pc.if_else(pc.fill_null(pc.greater(pc.utf8_length(given), 0), False), given, generated)


def item_texts(batch: pa.RecordBatch, columns: tuple[str, ...], ids: pa.Array) -> pa.Array:
    """Each row's sendMsgBatch item as JSON text followed by a comma, `ids`
    its msgIds (`row_ids`)."""
    parts: list[str | pa.Array] = ['{"msgId":', _json_strings(ids)]
    for name in columns:
        if name not in ("msgId", "topic"):
            parts += [f',"{name}":', _json_values(batch.column(name))]
    return pc.binary_join_element_wise(*parts, "},", "")


def _owners(shard_map: ShardMap, ids: pa.Array, keys: pa.Array | None) -> list[tuple[str | None, pa.Array | None]]:
    """Where a batch's rows go: (a shard's base URL, None for the node's
    port; the mask of the rows it owns, None for all of them), as
    `shard_map` places each row by its key, else its msgId."""
    if not shard_map.shards:
        return [(None, None)]
    key_list: Iterable[str | None] = keys.to_pylist() if keys is not None else itertools.repeat(None)
    owners = [shard_map.owner(msg_id, key or "") for msg_id, key in zip(ids.to_pylist(), key_list)]
    encoded = pa.array(owners, pa.string()).dictionary_encode()
    if len(encoded.dictionary) == 1:
        return [(owners[0], None)]
    return [(shard, pc.equal(encoded.indices, n)) for n, shard in enumerate(encoded.dictionary.to_pylist())]


def _both(mask: pa.Array | None, other: pa.Array | None) -> pa.Array | None:
    """The rows both masks take (None: all rows)."""
    if mask is None or other is None:
        return other if mask is None else mask
    return pc.and_(mask, other)


def _json_strings(array: pa.Array) -> pa.Array:
    """JSON text of each string of `array`; nulls stay null."""
    quoted = pc.binary_join_element_wise('"', array, '"', "")
    needs = pc.fill_null(pc.match_substring_regex(array, _NEEDS_ESCAPE), False)
    if not pc.any(needs).as_py():
        return quoted
    escaped = [json.dumps(v, ensure_ascii=False) for v in array.filter(needs).to_pylist()]
    return pc.replace_with_mask(quoted, needs, pa.array(escaped, quoted.type))


_UNITS_PER_MS = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}


def _json_values(array: pa.Array) -> pa.Array:
    """JSON text of a column's values, `null` for nulls; timestamps as ms
    since the epoch (floored, as Spark does)."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        text = _json_strings(array)
    elif pa.types.is_timestamp(array.type):
        raw = array.cast(pa.int64())
        per_ms = _UNITS_PER_MS[array.type.unit]
        if per_ms is None:
            millis = pc.multiply(raw, 1000)
        else:
            millis = pc.divide(raw, per_ms)  # truncates toward zero: one less for negative non-multiples
            millis = pc.if_else(pc.and_(pc.less(raw, 0), pc.not_equal(pc.multiply(millis, per_ms), raw)),
                                pc.subtract(millis, 1), millis)
        text = pc.cast(millis, pa.string())
    else:
        text = pc.cast(array, pa.string())
    return pc.fill_null(text, "null")


def _topics(batch: pa.RecordBatch, columns: tuple[str, ...], default: str | None, first_row: int,
            where: str) -> list[tuple[str, pa.Array | None]]:
    """(topic, mask of its rows, or None for all rows) for each topic of the batch."""
    if "topic" not in columns:
        if default is None:
            raise InvariantError("check_columns lets no write without a topic column or option through")
        return [(default, None)]
    topics = batch.column("topic")
    missing = pc.fill_null(pc.equal(topics, ""), True)
    if pc.any(missing).as_py():
        if default is None:
            index = pc.index(missing, True).as_py()
            raise SinkError(f"hourglass sink, {where}: row {first_row + index} has a null or empty topic and "
                            "there is no topic option")
        topics = pc.if_else(missing, default, topics)
    distinct = pc.unique(topics).to_pylist()
    if len(distinct) == 1:
        return [(distinct[0], None)]
    return [(topic, pc.equal(topics, topic)) for topic in distinct]


# == HTTP =======================================================================


class _Sender:
    """A task's sendMsgBatch requests, each to the node's `url` or to the
    shard that owns its rows, with retries.

    Each destination has a lane (`_Lane`): a thread with kept-alive
    connections of its own that sends that destination's requests in
    order, one at a time, while the task turns its next rows into
    requests; so a node's shards store a task's rows side by side. `send`
    hands a request to its lane once the lane holds fewer than LANE_DEPTH,
    and raises the first failure of any lane; `finish` waits for them all.
    The node's shard map (getShardMap, `broker.shard_map`) is read at the
    first `shard_map()`.

    A request is retried as `broker.retry` says after a 429, 502, 503 or
    504 answer or an OSError or HTTPException (refused, reset, timed out),
    `retries` times, pausing up to backoff_ms, then up to twice that, ...
    up to MAX_BACKOFF_MS; on a shard's port such a failure sends the
    request on at once through the node's `url`, and the map is given up
    (the task's later requests go there too until it is read again).
    Every request is idempotent: a retry re-sends the same ids, so it
    cannot duplicate. A 413 for more than one message splits the request in
    halves. Anything else raises SinkError, and the task sends nothing
    more: the lanes end their retries and drop what they hold. Leaving the
    `with` block waits until every request handed over is sent (or
    dropped so).
    """

    def __init__(self, options: SinkOptions, where: str) -> None:
        self.options = options
        self.where = where
        parts = urllib.parse.urlsplit(options.url)
        self.node = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"  # SinkOptions: no query, fragment
        self.retry = options.retry
        self.headers = {"Content-Type": "application/json"}
        if options.token:
            self.headers["Authorization"] = f"Bearer {options.token}"
        self.map = ShardMap()  # read and used by the task's thread; a lane may give it up
        self.lanes: dict[str | None, _Lane] = {}  # destination (a shard's base URL; None: the node) -> its lane
        self.stopping = threading.Event()  # set when a request failed: the lanes send nothing more

    def __repr__(self) -> str:
        return (f"_Sender({self.node!r}, {self.where}, shards={len(self.map.shards)}, lanes={len(self.lanes)}, "
                f"requests={self.requests}, retried={self.retried})")

    @property
    def requests(self) -> int:
        """Requests made, retries included."""
        return sum(lane.requests for lane in self.lanes.values())

    @property
    def retried(self) -> int:
        return sum(lane.retried for lane in self.lanes.values())

    def __enter__(self) -> _Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        for lane in self.lanes.values():  # what was handed over is sent (unless a request failed)
            lane.close()

    def shard_map(self) -> ShardMap:
        """The node's shard map, read first when it is due (one attempt: a
        failure sends every request through the node's `url`)."""
        if self.map.due(self.node, time.monotonic()):
            self._read_shard_map()
        return self.map

    def send(self, topic: str, shard: str | None, items: pa.Array, rows: pa.Array) -> None:
        """Hand `items` (item_texts) of `topic` to the lane of `shard` (a
        base URL of the map; None, or a shard given up: the node's); `rows`
        are their row numbers. Raises the SinkError of any lane that failed."""
        for lane in self.lanes.values():
            lane.raise_failure()
        destination = shard if shard in self.map.shards else None
        if destination not in self.lanes:
            self.lanes[destination] = _Lane(destination or self.node)
        lane = self.lanes[destination]
        lane.hand(functools.partial(self._run, lane, topic, destination, items, rows))

    def finish(self) -> None:
        """Wait until every request handed over is answered; raise the first SinkError."""
        for lane in self.lanes.values():
            lane.wait()

    def _run(self, lane: _Lane, topic: str, shard: str | None, items: pa.Array, rows: pa.Array) -> None:
        """A request in `lane`'s thread: nothing once a request of the task
        failed (the task fails), and its SinkError stops the others."""
        if self.stopping.is_set():
            return
        try:
            self._store(lane, topic, shard, items, rows)
        except BaseException:
            self.stopping.set()
            raise

    def _store(self, lane: _Lane, topic: str, shard: str | None, items: pa.Array, rows: pa.Array) -> None:
        """Store `items` in `topic`; SinkError when they are not."""
        # strictIdempotence: a retried task's resend of an id whose message has
        # ended meanwhile answers the stored one rather than storing it again
        body = b"".join((b'{"topic":', json.dumps(topic).encode(), b',"strictIdempotence":true,"msgs":[',
                         _joined(items), b"]}"))
        status, answer, attempts, base = self._post(lane, shard if shard in self.map.shards else None, body)
        kind = "HTTP"
        if status == 200:  # the API's own outcome is the code in the body (camellia)
            kind, status = "code", _code(answer)
        if status == 200:
            return
        if status == 413 and len(items) > 1:
            half = len(items) // 2
            self._store(lane, topic, shard, items.slice(0, half), rows.slice(0, half))
            self._store(lane, topic, shard, items.slice(half), rows.slice(half))
            return
        what = (f"hourglass sink, {self.where}: sendMsgBatch of {len(items)} rows (from row {rows[0].as_py()}) to "
                f"topic {topic!r} at {base}{SEND_BATCH_PATH}")
        if status is None:
            error = answer if isinstance(answer, str) else answer.decode("utf-8", "replace")
            raise SinkError(f"{what}: broker unreachable after {attempts} attempts: {error}")
        msg = _broker_msg(answer)
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        raise SinkError(f"{what}: {kind} {status}{tries}: {msg}{_failing_row(msg, rows)}")

    def _post(self, lane: _Lane, shard: str | None, body: bytes) -> tuple[int | None, bytes | str, int, str]:
        """(status or None when unreachable, answer body or the last error,
        attempts made, the base URL of the last attempt); the first attempt
        goes to `shard` (None: the node), the others to the node."""
        attempt = 0
        while True:
            base = shard or self.node
            connection = lane.connection(base, self.options.timeout_s)
            lane.requests += 1
            status: int | None
            result: bytes | str
            retry_after: float | None = None
            try:
                connection.request("POST", _path(base, SEND_BATCH_PATH), body, self.headers)
                response = connection.getresponse()
                status, result = response.status, response.read()
                failure = status_failure(status)
                if failure is Failure.FINAL:
                    return status, result, attempt + 1, base
                retry_after = retry_after_s(response.getheader("Retry-After"), time.time())
            except (OSError, http.client.HTTPException) as e:
                connection.close()  # a half-read answer leaves it unusable
                status, result = None, f"{type(e).__name__}: {e}"
                failure = Failure.MAYBE_APPLIED  # at worst; the sink's requests may all be repeated
            if not self.retry.may_retry(attempt, failure, idempotent=True) or self.stopping.is_set():
                return status, result, attempt + 1, base
            lane.retried += 1
            if shard is not None:  # the shard's port failed: the node's from now on, this request at once
                shard = None
                self.map.give_up(time.monotonic())
            elif self.stopping.wait(self.retry.pause_s(attempt, retry_after)):
                return status, result, attempt + 1, base
            attempt += 1

    def _read_shard_map(self) -> None:
        """getShardMap of the node, once: kept as `broker.client` keeps it
        (a 404: a node without one; any other failure: again later)."""
        connection = _connect(self.node, self.options.timeout_s)
        try:
            connection.request("GET", _path(self.node, SHARD_MAP_PATH), headers=self.headers)
            response = connection.getresponse()
            status, answer = response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.map.give_up(time.monotonic())
            return
        finally:
            connection.close()
        if status == 200:
            status = _code(answer)
        if status == 404:
            self.map.read(self.node, None)
        elif status == 200:
            self.map.read(self.node, _json_or_none(answer))
        else:
            self.map.give_up(time.monotonic())


class _Lane:
    """One destination's requests of a task: sent in order, one at a time,
    by a thread of its own over kept-alive connections of its own (the
    destination's, and the node's when a shard's port fails). The task's
    thread hands requests over (`hand`), at most LANE_DEPTH at once."""

    def __init__(self, name: str) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"hourglass-sink {name}")
        self.connections: dict[str, http.client.HTTPConnection] = {}  # base URL -> connection; the lane's thread's
        self.handed: collections.deque[concurrent.futures.Future[None]] = collections.deque()  # oldest first
        self.requests = 0
        self.retried = 0

    def __repr__(self) -> str:
        return f"_Lane({list(self.connections)}, requests={self.requests}, retried={self.retried})"

    def connection(self, base: str, timeout_s: float) -> http.client.HTTPConnection:
        """The kept-alive connection to `base` (made at its first use)."""
        connection = self.connections.get(base)
        if connection is None:
            connection = self.connections[base] = _connect(base, timeout_s)
        return connection

    def hand(self, store: Callable[[], None]) -> None:
        """`store` run in the lane's thread after those handed before, once
        fewer than LANE_DEPTH are held; raises the SinkError of one waited for."""
        while len(self.handed) >= LANE_DEPTH:
            self.handed.popleft().result()
        self.handed.append(self.pool.submit(store))

    def wait(self) -> None:
        """Until every request handed over is answered; the first SinkError raised."""
        while self.handed:
            self.handed.popleft().result()

    def raise_failure(self) -> None:
        """The SinkError of a request answered, if one failed."""
        while self.handed and self.handed[0].done():
            self.handed.popleft().result()

    def close(self) -> None:
        """Wait for what was handed over, close the connections."""
        self.pool.shutdown(wait=True)
        for connection in self.connections.values():
            connection.close()


def _connect(base: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(base)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname or "", parts.port, timeout=timeout_s)  # SinkOptions: a host


def _path(base: str, endpoint: str) -> str:
    return urllib.parse.urlsplit(base).path + endpoint


def _code(answer: bytes | str) -> int:
    """The `code` of an HTTP 200 answer's JSON body (200 when it has none)."""
    try:
        code = json.loads(answer).get("code", 200)
    except (ValueError, AttributeError):
        return 200
    return code if isinstance(code, int) else 200


def _json_or_none(answer: bytes) -> object:
    """The JSON an answer holds; None when it is not JSON."""
    try:
        decoded: object = json.loads(answer)
    except ValueError:
        return None
    return decoded


def _broker_msg(answer: bytes | str) -> str:
    """The `msg` of a JSON answer, else the start of the body."""
    try:
        decoded = json.loads(answer)
        if isinstance(decoded, dict) and "msg" in decoded:
            return str(decoded["msg"])
    except ValueError:
        pass
    text = answer.decode("utf-8", "replace") if isinstance(answer, bytes) else answer
    return text[:300]


# Arrow's offsets of string and large_string arrays: little-endian int32, int64.
_OFFSET, _LARGE_OFFSET = struct.Struct("<i"), struct.Struct("<q")


def _joined(items: pa.Array) -> memoryview:
    """The texts of `items` back to back, less the last one's comma: a view
    of the Arrow data buffer, no copy."""
    _, offsets, data = items.buffers()
    offset = _LARGE_OFFSET if pa.types.is_large_string(items.type) else _OFFSET
    start, = offset.unpack_from(offsets, items.offset * offset.size)
    end, = offset.unpack_from(offsets, (items.offset + len(items)) * offset.size)
    return memoryview(data)[start:end - 1]


def _failing_row(msg: str, rows: pa.Array) -> str:
    """' (row N of the partition)' when the broker's msg names `msgs[i]`."""
    if msg.startswith("msgs["):
        index = msg[5:msg.find("]")]
        if index.isascii() and index.isdigit() and int(index) < len(rows):
            return f" (row {rows[int(index)].as_py()} of the partition)"
    return ""
