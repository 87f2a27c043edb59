"""The Spark sink (`broker/spark.py`): options and schema checks, the HTTP
sender's retries against a scripted local server, and real Spark jobs
(local[2,3], see conftest.py) writing into a real `hourglass serve`.

Exactly once is checked by counts: the broker keeps one message per id, so
a topic holding exactly N messages after N rows were written, some of them
sent twice by a retried task or a restarted stream, means every row is
there once and no retry made a new id.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import sys
import threading
import uuid
from datetime import UTC, datetime

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (CI installs it)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install -e '.[spark]' (CI installs it)")

import pyarrow as pa
from pyspark import TaskContext, cloudpickle
from pyspark.sql import functions as F
from pyspark.sql import types as T
from serving import Server, free_port, request

from broker.shards import placement
from broker.spark import (
    HourglassDataSource,
    HourglassStreamWriter,
    HourglassWriter,
    SinkConfigError,
    SinkError,
    SinkOptions,
    _Sender,
    check_columns,
    item_texts,
    row_ids,
    send_partition,
)

pytestmark = pytest.mark.spark

# Functions of this module that run inside Spark's Python workers are
# pickled whole: the workers cannot import a test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOUR_MS = 3_600_000


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def stored(broker, topic: str) -> int | None:
    """Live messages of `topic` (waiting, ready or consuming): 0 when the
    broker has never seen it (getTopicInfo answers zeros, as camellia)."""
    status, answer = broker.get("getTopicInfo", topic=topic)
    if status != 200:
        return None
    return sum(answer["data"][k] for k in ("waitingQueueSize", "readyQueueSize", "ackQueueSize"))


def write(df, broker, **options):
    writer = df.write.format("hourglass").option("url", broker.base).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def failure_text(excinfo) -> str:
    return str(excinfo.value)


# == options and schema (no Spark job) ==========================================


def test_options_defaults_and_refusals():
    opts = SinkOptions.from_options({"url": "http://127.0.0.1:8080", "topic": "t"})
    assert (opts.batch_size, opts.retries, opts.timeout_s, opts.id_prefix) == (500, 5, 30.0, None)
    spark_options = {"url": "http://h:1", "batchsize": "1000", "checkpointlocation": "/x"}
    assert SinkOptions.from_options(spark_options).batch_size == 1000
    for options, words in [({"topic": "t"}, "option url is required"),
                           ({"url": "ftp://h"}, "option url must be http(s)://host:port"),
                           ({"url": "http://h:1", "batchsize": "1001"}, "batchsize must be in 1..1000"),
                           ({"url": "http://h:1", "batchsize": "many"}, "batchsize must be a number"),
                           ({"url": "http://h:1", "retries": "-1"}, "retries must be >= 0"),
                           ({"url": "http://h:1", "id_prefix": "x"}, "unknown option(s) id_prefix")]:
        with pytest.raises(SinkConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            SinkOptions.from_options(options)


def test_schema_check_names_the_bad_column():
    opts = SinkOptions.from_options({"url": "http://h:1", "topic": "t"})
    good = T.StructType([T.StructField("msg", T.StringType()), T.StructField("delayMillis", T.IntegerType()),
                         T.StructField("triggerTime", T.TimestampType()), T.StructField("priority", T.ShortType()),
                         T.StructField("tag", T.StringType())])
    assert check_columns(good, opts) == ("msg", "delayMillis", "triggerTime", "priority", "tag")
    cases = [
        (T.StructType([T.StructField("msg", T.StringType()), T.StructField("delayMillis", T.StringType())]),
         "column 'delayMillis' must be an integer"),
        (T.StructType([T.StructField("msg", T.BinaryType())]), "column 'msg' must be string, got binary"),
        (T.StructType([T.StructField("msg", T.StringType()), T.StructField("delaymillis", T.LongType())]),
         "unknown column 'delaymillis' (did you mean 'delayMillis'?"),
        (T.StructType([T.StructField("msgId", T.StringType())]), "column 'msg' is required"),
        (T.StructType([T.StructField("msg", T.StringType()), T.StructField("triggerTime", T.DoubleType())]),
         "column 'triggerTime' must be an integer (ms since the epoch) or a timestamp, got double"),
    ]
    for schema, words in cases:
        with pytest.raises(SinkConfigError) as e:
            check_columns(schema, opts)
        assert words in str(e.value)
    no_topic = SinkOptions.from_options({"url": "http://h:1"})
    with pytest.raises(SinkConfigError, match="option topic is required"):
        check_columns(T.StructType([T.StructField("msg", T.StringType())]), no_topic)
    assert check_columns(T.StructType([T.StructField("msg", T.StringType()), T.StructField("topic", T.StringType())]),
                         no_topic) == ("msg", "topic")


def test_overwrite_is_refused():
    source = HourglassDataSource({"url": "http://h:1", "topic": "t"})
    schema = T.StructType([T.StructField("msg", T.StringType())])
    with pytest.raises(SinkConfigError, match="only appends"):
        source.writer(schema, True)
    with pytest.raises(SinkConfigError, match="output mode complete"):
        source.streamWriter(schema, True)
    first, second = source.writer(schema, False), source.writer(schema, False)
    assert first.id_prefix != second.id_prefix  # a new write, new ids


def test_item_texts_are_the_rows_as_json():
    names = ("msg", "msgId", "delayMillis", "triggerTime", "priority")
    batch = pa.RecordBatch.from_arrays([
        pa.array(["plain", 'quote " back \\ nl \n nul \x00', "ünï € 🕰", None, ""]),
        pa.array(["given", None, "", 'x"y', None]),
        pa.array([1, None, 3, 4, 5], pa.int64()),
        pa.array([0, 1_999, -1, None, 1_700_000_000_123_456], pa.timestamp("us", tz="UTC")),
        pa.array([1, 2, None, -4, 5], pa.int16()),
    ], names=list(names))
    texts = item_texts(batch, names, row_ids(batch, names, 'pre"fix', pa.array(range(10, 15), pa.int64())))
    assert all(t.endswith(",") for t in texts.to_pylist())
    decoded = json.loads("[" + "".join(texts.to_pylist())[:-1] + "]")
    assert decoded == [
        {"msgId": "given", "msg": "plain", "delayMillis": 1, "triggerTime": 0, "priority": 1},
        {"msgId": 'pre"fix-11', "msg": 'quote " back \\ nl \n nul \x00', "delayMillis": None, "triggerTime": 1,
         "priority": 2},
        {"msgId": 'pre"fix-12', "msg": "ünï € 🕰", "delayMillis": 3, "triggerTime": -1, "priority": None},
        {"msgId": 'x"y', "msg": None, "delayMillis": 4, "triggerTime": None, "priority": -4},
        {"msgId": 'pre"fix-14', "msg": "", "delayMillis": 5, "triggerTime": 1_700_000_000_123, "priority": 5},
    ]


def test_a_null_topic_without_a_topic_option_fails_naming_the_row():
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), pa.array(["t", None])], names=["msg", "topic"])
    opts = SinkOptions.from_options({"url": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(SinkError, match="partition 3: row 1 has a null or empty topic and there is no topic option"):
        send_partition(iter([batch]), opts, ("msg", "topic"), "p", 3, "partition 3")


# == the sender against a scripted server ========================================


class LocalServer(http.server.ThreadingHTTPServer):
    """An HTTP server on a free loopback port (`url`), serving from a thread of its own."""

    daemon_threads = True

    def __init__(self, handler):
        super().__init__(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.shutdown()
        self.server_close()


class JsonHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stalls

    def reply(self, status, answer: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


class Scripted(LocalServer):
    """Answers each sendMsgBatch with the next step of `script`: a status,
    or "reset" (close the connection without answering); 200 when done.
    getShardMap answers `shard_map` (None: 404, as a server without one)."""

    def __init__(self, script):
        self.script = list(script)
        self.bodies: list[dict] = []
        self.shard_map: dict | None = None
        super().__init__(ScriptedHandler)


class ScriptedHandler(JsonHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        step = self.server.script.pop(0) if self.server.script else 200
        if step == "reset":
            self.close_connection = True
            return
        msg = "success" if step == 200 else {400: "msgs[2].delayMillis: must be >= 0, got -1",
                                               413: "msg is larger than 10 bytes"}.get(step, "node is stopping")
        self.reply(step, json.dumps({"code": step, "msg": msg}).encode())

    def do_GET(self):
        shard_map = self.server.shard_map
        if shard_map is None:
            self.reply(404, b'{"code":404,"msg":"not found"}')
        else:
            self.reply(200, json.dumps({"code": 200, "msg": "success", **shard_map}).encode())


@pytest.fixture
def scripted():
    servers = []

    def start(*script):
        servers.append(Scripted(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def sender_for(url: str, **options) -> _Sender:
    return _Sender(SinkOptions.from_options({"url": url, "topic": "t", "backoffmillis": "1", **options}),
                   "partition 7")


def items(n: int) -> tuple[pa.Array, pa.Array]:
    """n items as the sender takes them (JSON texts, each with a comma), rows 100.."""
    texts = [json.dumps({"msgId": f"p-{i}", "msg": str(i)}) + "," for i in range(n)]
    return pa.array(texts), pa.array(range(100, 100 + n), pa.int64())


def sent(n: int) -> list[dict]:
    return [{"msgId": f"p-{i}", "msg": str(i)} for i in range(n)]


def test_sender_retries_503_and_resets_then_succeeds(scripted):
    server = scripted(503, "reset", 503)
    with sender_for(server.url) as sender:
        sender.send("t", None, *items(3))
        sender.finish()
    assert (sender.requests, sender.retried) == (4, 3)
    assert server.bodies[0] == server.bodies[3] == {"topic": "t", "strictIdempotence": True, "msgs": sent(3)}  # the same ids again


def test_sender_gives_up_after_its_retries(scripted):
    server = scripted(503, 503, 503)
    with sender_for(server.url, retries="2") as sender:
        sender.send("t", None, *items(3))
        with pytest.raises(SinkError) as e:
            sender.finish()
    assert sender.requests == 3
    text = str(e.value)
    for words in ("partition 7", "3 rows (from row 100)", "topic 't'", server.url + "/camellia/delayQueue/sendMsgBatch",
                  "HTTP 503 after 3 attempts", "node is stopping"):
        assert words in text


def test_sender_does_not_retry_a_400_and_names_the_row(scripted):
    server = scripted(400)
    with sender_for(server.url) as sender:
        sender.send("t", None, *items(5))
        with pytest.raises(SinkError) as e:
            sender.finish()
    assert sender.requests == 1
    assert "HTTP 400: msgs[2].delayMillis: must be >= 0, got -1 (row 102 of the partition)" in str(e.value)


def test_a_refused_request_ends_the_tasks_sending(scripted):
    """The task hands requests over ahead of their answers; once one is
    refused, those still held are not sent and the task fails naming it."""
    server = scripted(400)
    opts = SinkOptions.from_options({"url": server.url, "topic": "t", "batchsize": "5"})
    with pytest.raises(SinkError, match=r"sendMsgBatch of 5 rows \(from row 0\).*HTTP 400"):
        send_partition(iter([id_rows(30)]), opts, ("msg", "msgId", "key"), "p", 0, "partition 0")
    assert len(server.bodies) == 1


def test_sender_splits_a_batch_refused_as_too_large(scripted):
    server = scripted(413)
    with sender_for(server.url) as sender:
        sender.send("t", None, *items(5))
        sender.finish()
    assert [len(b["msgs"]) for b in server.bodies] == [5, 2, 3]


def test_sender_reports_an_unreachable_broker():
    url = f"http://127.0.0.1:{free_port()}"
    with sender_for(url, retries="2") as sender:
        sender.send("t", None, *items(1))
        with pytest.raises(SinkError) as e:
            sender.finish()
    assert f"{url}/camellia/delayQueue/sendMsgBatch: broker unreachable after 3 attempts: ConnectionRefusedError" \
        in str(e.value)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def id_rows(n: int, first: int = 0, keys: bool = False) -> pa.RecordBatch:
    """Rows with msgIds r-<first>.. r-<first + n - 1> and keys k-<i % 5> (or
    null keys), as Spark hands them to the sink."""
    numbers = range(first, first + n)
    return pa.RecordBatch.from_arrays([pa.array([f"m{i}" for i in numbers]), pa.array([f"r-{i}" for i in numbers]),
                                       pa.array([f"k-{i % 5}" if keys else None for i in numbers], pa.string())],
                                      names=["msg", "msgId", "key"])


def ids_sent(server) -> list[str]:
    return [m["msgId"] for body in server.bodies for m in body["msgs"]]


def test_each_row_goes_to_its_owners_port_by_its_msgid_or_key(scripted):
    """A node whose getShardMap names two shards: every row of a partition
    is sent on the port of the shard that owns it (placement: its key's,
    else its msgId's), in requests of batchsize rows of one shard; none
    through the node's port."""
    node, shards = scripted(), [scripted(), scripted()]
    node.shard_map = {"shards": 2, "ports": [port_of(s.url) for s in shards], "placement": "crc32"}
    opts = SinkOptions.from_options({"url": node.url, "topic": "t", "batchsize": "7"})
    commit = send_partition(iter([id_rows(30), id_rows(20, 30, keys=True)]), opts, ("msg", "msgId", "key"), "p", 0,
                            "partition 0")
    assert commit.rows == 50 and node.bodies == []
    expected: list[list[str]] = [[], []]
    for i in range(30):
        expected[placement.owner(f"r-{i}", 2)].append(f"r-{i}")
    for i in range(30, 50):
        expected[placement.owner(f"k-{i % 5}", 2)].append(f"r-{i}")
    for shard, ids in zip(shards, expected):
        assert sorted(ids_sent(shard)) == sorted(ids) and ids
        assert all(len(body["msgs"]) <= 7 for body in shard.bodies)
    assert commit.requests == len(shards[0].bodies) + len(shards[1].bodies)


def test_without_a_shard_map_every_row_goes_to_the_nodes_port(scripted):
    """A node of one shard, a server without getShardMap (404), a map that
    cannot be read: the node's url takes every request."""
    node = scripted()
    opts = SinkOptions.from_options({"url": node.url, "topic": "t", "batchsize": "7"})
    for shard_map in (None, {"shards": 1, "ports": [port_of(node.url)], "placement": "crc32"},
                      {"shards": 2, "ports": [1, 2], "placement": "another"}):
        node.shard_map, node.bodies = shard_map, []
        send_partition(iter([id_rows(30)]), opts, ("msg", "msgId", "key"), "p", 0, "partition 0")
        assert sorted(ids_sent(node)) == sorted(f"r-{i}" for i in range(30))
    dead = sender_for(f"http://127.0.0.1:{free_port()}")
    assert dead.shard_map().shards == [] and dead.shard_map().due(dead.node, 1e12)  # read again later


def test_a_shard_port_that_fails_sends_through_the_node_from_then_on(scripted):
    """A shard answering 503, and a shard's port refusing connections: the
    request goes on at once through the node's url, as do the partition's
    later requests (the map is read again a minute later); every row is
    sent, and no pause was taken for it."""
    for failing in ("503", "refused"):
        node, shard = scripted(), scripted(503) if failing == "503" else None
        ports = [port_of(shard.url) if shard else free_port()] * 2
        node.shard_map = {"shards": 2, "ports": ports, "placement": "crc32"}
        opts = SinkOptions.from_options({"url": node.url, "topic": "t", "batchsize": "7", "backoffmillis": "60000"})
        commit = send_partition(iter([id_rows(30)]), opts, ("msg", "msgId", "key"), "p", 0, "partition 0")
        assert sorted(ids_sent(node)) == sorted(f"r-{i}" for i in range(30)), failing
        assert len(shard.bodies) == 1 if shard else True  # the one that failed; none after it
        assert commit.retries == 1 and commit.requests == 1 + len(node.bodies)


# == Spark jobs into a real broker ================================================


def test_batch_write_stores_every_row_with_its_fields(spark, broker):
    topic = unique("batch")
    rows = 3000
    df = spark.range(0, rows, 1, 2).select(
        F.concat(F.lit("m-"), F.col("id").cast("string")).alias("msg"),
        (F.lit(HOUR_MS) + F.col("id")).alias("delayMillis"),
        (F.col("id") % 5).cast("int").alias("priority"),
        F.lit(2 * HOUR_MS).alias("ttlMillis"),
        F.lit(3).cast("int").alias("maxRetry"),
        F.when(F.col("id") % 2 == 0, F.lit("even")).alias("tag"),
        F.concat(F.lit("k"), (F.col("id") % 100).cast("string")).alias("key"))
    write(df, broker, topic=topic, idprefix="b1", batchsize=250)
    assert stored(broker, topic) == rows
    # ids are {idprefix}-{partition}-{row in partition}; range splits 0..2999 in halves
    status, answer = broker.post("getMsg", topic=topic, msgId="b1-1-1499")
    assert status == 200
    m = answer["delayMsg"]
    assert (m["msg"], m["priority"], m["maxRetry"], m["tag"], m["key"]) == ("m-2999", 4, 3, "", "k99")
    assert m["triggerTime"] - m["produceTime"] == HOUR_MS + 2999
    assert m["expireTime"] - m["triggerTime"] == 2 * HOUR_MS
    status, answer = broker.post("getMsg", topic=topic, msgId="b1-0-10")
    assert (answer["delayMsg"]["msg"], answer["delayMsg"]["tag"]) == ("m-10", "even")
    # the same write again, same idprefix: every id exists, nothing is added
    write(df, broker, topic=topic, idprefix="b1", batchsize=1000)
    assert stored(broker, topic) == rows


def test_msgid_column_and_generated_ids(spark, broker):
    topic = unique("ids")
    df = spark.createDataFrame([("a", "order-1"), ("b", None), ("c", ""), ("d", "order-4")], "msg string, msgId string")
    write(df.coalesce(1), broker, topic=topic, idprefix="g")
    assert stored(broker, topic) == 4
    for msg_id, msg in [("order-1", "a"), ("g-0-1", "b"), ("g-0-2", "c"), ("order-4", "d")]:
        status, answer = broker.post("getMsg", topic=topic, msgId=msg_id)
        assert (status, answer["delayMsg"]["msg"]) == (200, msg)


def test_topic_column_routes_rows(spark, broker):
    default, other = unique("route-default"), unique("route-other")
    data = [(f"m{i}", other if i % 3 == 0 else (default if i % 3 == 1 else None), HOUR_MS) for i in range(300)]
    df = spark.createDataFrame(data, "msg string, topic string, delayMillis bigint")
    write(df, broker, topic=default, batchsize=7)
    assert (stored(broker, other), stored(broker, default)) == (100, 200)


def test_trigger_time_as_millis_and_as_timestamp(spark, broker):
    topic = unique("trigger")
    due = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    due_ms = int(due.timestamp() * 1000)
    millis = spark.createDataFrame([("ms", "t-ms", due_ms)], "msg string, msgId string, triggerTime bigint")
    stamps = spark.createDataFrame([("ts", "t-ts", due)], "msg string, msgId string, triggerTime timestamp")
    write(millis, broker, topic=topic)
    write(stamps, broker, topic=topic)
    for msg_id in ("t-ms", "t-ts"):
        status, answer = broker.post("getMsg", topic=topic, msgId=msg_id)
        assert (status, answer["delayMsg"]["triggerTime"]) == (200, due_ms)


def test_wrong_column_type_is_refused_before_any_row_is_sent(spark, broker):
    topic = unique("badtype")
    df = spark.range(0, 100, 1, 2).select(F.col("id").cast("string").alias("msg"),
                                          F.col("id").cast("string").alias("delayMillis"))
    with pytest.raises(Exception) as e:
        write(df, broker, topic=topic)
    assert "column 'delayMillis' must be an integer" in failure_text(e)
    assert stored(broker, topic) == 0  # nothing was sent to the topic


# A sink whose input fails midway: the real one (same ids, same sending)
# reading partition 0 through `faulty`, which raises once `failafter` rows
# went by -- on the first attempt only, or on every attempt while the file
# named by `killswitch` exists. The sink sends every request it handed over
# before the task ends, so every full request of those rows is stored when
# it raises.


def faulty(batches, fail_after: int, kill_switch: str | None, seen: str | None):
    context = TaskContext.get()
    armed = context.partitionId() == 0 and (os.path.exists(kill_switch) if kill_switch
                                            else context.attemptNumber() == 0)
    yielded = 0
    for batch in batches:
        for start in range(0, batch.num_rows, 50):
            if armed and yielded >= fail_after:
                if seen:
                    with open(seen, "w") as f:
                        f.write(str(yielded))
                raise RuntimeError(f"injected failure after {yielded} rows of partition 0")
            piece = batch.slice(start, 50)
            yield piece
            yielded += piece.num_rows


class FaultyHourglass(HourglassDataSource):
    @classmethod
    def name(cls) -> str:
        return "hourglass_faulty"

    def _fault(self):
        fault = (int(self.options.pop("failafter")), self.options.pop("killswitch", None),
                 self.options.pop("seen", None))
        return fault

    def writer(self, schema, overwrite):
        fault = self._fault()
        inner = super().writer(schema, overwrite)
        return FaultyWriter(inner.options, inner.columns, inner.id_prefix, fault)

    def streamWriter(self, schema, overwrite):
        fault = self._fault()
        inner = super().streamWriter(schema, overwrite)
        return FaultyStreamWriter(inner.options, inner.columns, fault)


class FaultyWriter(HourglassWriter):
    def __init__(self, options, columns, id_prefix, fault):
        super().__init__(options, columns, id_prefix)
        self.fault = fault

    def write(self, iterator):
        return super().write(faulty(iterator, *self.fault))


class FaultyStreamWriter(HourglassStreamWriter):
    def __init__(self, options, columns, fault):
        super().__init__(options, columns)
        self.fault = fault

    def write(self, iterator):
        return super().write(faulty(iterator, *self.fault))


def test_task_failed_midway_is_retried_and_every_row_is_stored_once(spark, broker, tmp_path):
    """Partition 0's first attempt sends half its rows and fails; Spark
    (local[2,3]) runs it again, re-sending all of them. The write's generated
    ids (no idprefix) are the same in both attempts, so each row is stored once."""
    spark.dataSource.register(FaultyHourglass)
    per_partition, half = 1000, 500
    topic, seen = unique("retry"), str(tmp_path / "rows-before-failing")
    df = spark.range(0, 2 * per_partition, 1, 2).select(F.col("id").cast("string").alias("msg"),
                                                       F.lit(HOUR_MS).alias("delayMillis"))
    (df.write.format("hourglass_faulty").option("url", broker.base).option("topic", topic).option("batchsize", 100)
     .option("failafter", half).option("seen", seen).mode("append").save())
    with open(seen) as f:
        assert int(f.read()) == half  # the first attempt did send half, then failed
    assert stored(broker, topic) == 2 * per_partition


def test_stream_restarted_from_its_checkpoint_stores_every_row_once(spark, broker, tmp_path):
    """File 1: batch 0, fine. File 2: batch 1 sends half its rows, then its
    task fails on every attempt and the query dies. Restart from the
    checkpoint with file 3 added: batch 1 runs again (same query id, batch
    id, partitions: same ids) and batch 2 sends file 3."""
    spark.dataSource.register(FaultyHourglass)
    topic = unique("stream")
    source, checkpoint, kill = tmp_path / "in", str(tmp_path / "checkpoint"), str(tmp_path / "kill-switch")
    source.mkdir()
    rows_per_file = 300

    def add_file(index: int) -> None:
        lines = "".join(f"{n},m-{n}\n" for n in range(index * rows_per_file, (index + 1) * rows_per_file))
        staged = tmp_path / f"part-{index}.csv"
        staged.write_text(lines)
        os.rename(staged, source / staged.name)  # appears whole to the file source

    def run():
        stream = (spark.readStream.schema("n bigint, msg string").option("maxFilesPerTrigger", 1).csv(str(source))
                  .select("msg", F.lit(HOUR_MS).alias("delayMillis")))
        query = (stream.writeStream.format("hourglass_faulty").option("url", broker.base).option("topic", topic)
                 .option("batchsize", 50).option("failafter", rows_per_file // 2).option("killswitch", kill)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(120), "the stream did not finish within 120 s"
        finally:
            query.stop()
        return query

    add_file(0)
    first = run()
    assert stored(broker, topic) == rows_per_file

    add_file(1)
    open(kill, "w").close()
    with pytest.raises(Exception, match="injected failure after 150 rows"):
        run()
    assert stored(broker, topic) == rows_per_file + rows_per_file // 2  # batch 1 half sent

    os.remove(kill)
    add_file(2)
    again = run()
    assert again.id == first.id
    assert stored(broker, topic) == 3 * rows_per_file
    # ids are {query id}-{batch}-{partition}-{row}
    status, answer = broker.post("getMsg", topic=topic, msgId=f"{first.id}-1-0-{rows_per_file - 1}")
    assert (status, answer["delayMsg"]["msg"]) == (200, f"m-{2 * rows_per_file - 1}")


def test_unreachable_broker_fails_the_job_naming_the_url(spark):
    url = f"http://127.0.0.1:{free_port()}"
    df = spark.range(0, 10, 1, 1).select(F.col("id").cast("string").alias("msg"))
    with pytest.raises(Exception) as e:
        (df.write.format("hourglass").option("url", url).option("topic", "t").option("retries", 1)
         .option("backoffmillis", 10).mode("append").save())
    assert f"{url}/camellia/delayQueue/sendMsgBatch: broker unreachable after 2 attempts" in failure_text(e)


def test_broker_400_fails_the_job_with_the_brokers_msg(spark, broker):
    topic = unique("refused")
    # one key: every row on one shard, so the requests are the rows in order
    # whatever the node's shard count (each request is one shard's)
    df = spark.range(0, 20, 1, 1).select(F.when(F.col("id") == 13, "").otherwise(F.col("id").cast("string"))
                                         .alias("msg"), F.lit(1000).alias("delayMillis"), F.lit("k").alias("key"))
    with pytest.raises(Exception) as e:
        write(df, broker, topic=topic, batchsize=10)
    text = failure_text(e)
    assert "partition 0: sendMsgBatch of 10 rows (from row 10)" in text
    assert "code 400: msgs[3].msg: is required and may not be empty (row 13 of the partition)" in text
    assert stored(broker, topic) == 10  # the first request went through; the refused one stored nothing


# == a node of many shards =========================================================


def forwards(server) -> int:
    """The node's hourglass_shard_forwards_total: calls its shards made of
    each other (one scrape is one: it asks the other shard for its series)."""
    text = server.get("/metrics")[1].decode()
    return int(next(line.split()[-1] for line in text.split("\n")
                    if line.startswith("hourglass_shard_forwards_total")))


def keyed_rows(spark, rows: int):
    """`rows` rows in 2 partitions, every third one with a key (placed by its key, the others by their msgId)."""
    return spark.range(0, rows, 1, 2).select(
        F.col("id").cast("string").alias("msg"), F.lit(HOUR_MS).alias("delayMillis"),
        F.when(F.col("id") % 3 == 0, F.concat(F.lit("key-"), (F.col("id") % 11).cast("string"))).alias("key"))


def test_rows_are_sent_on_their_owner_shards_port_and_the_node_forwards_none(spark, tmp_path):
    """On a node of 2 shards the sink reads getShardMap and sends each row
    on the port of the shard that owns it: 400 requests of 10 rows, which
    through the node's port would each make a forward (a part for the other
    shard), make none. The forwards that remain are the node's own: the two
    scrapes, each partition's read of the map, each shard's first look at a
    new topic, and shard 1's rate report to shard 0 every 0.5 s."""
    server = Server.start(tmp_path / "data", "--shards", "2", log_path=tmp_path / "serve.log")
    try:
        topic, rows = unique("direct"), 4000
        before = forwards(server)
        write(keyed_rows(spark, rows), server, topic=topic, idprefix="d", batchsize=10)
        made = forwards(server) - before
        assert made < 40, f"{made} forwards for {rows // 10} requests"
        assert stored(server, topic) == rows
    finally:
        assert server.stop() == 0


def test_one_shard_is_sent_to_through_the_nodes_port(spark, tmp_path):
    """--shards 1: the map names the node's port alone; every row is stored."""
    server = Server.start(tmp_path / "data", "--shards", "1", log_path=tmp_path / "serve.log")
    try:
        assert server.get("getShardMap")[1]["ports"] == [int(server.base.rsplit(":", 1)[1])]
        topic = unique("one-shard")
        write(keyed_rows(spark, 1000), server, topic=topic, batchsize=50)
        assert stored(server, topic) == 1000
    finally:
        assert server.stop() == 0


class NodeProxy(LocalServer):
    """A proxy in front of a node whose getShardMap answers `shard_map`
    (None: 503, the map unavailable); everything else goes to the node.
    `relayed` counts the messages of the sendMsgBatch requests it relayed."""

    def __init__(self, node: str, shard_map: dict | None):
        self.node = node
        self.shard_map = shard_map
        self.relayed = 0
        self.lock = threading.Lock()
        super().__init__(NodeProxyHandler)
        self.base = self.url  # as a Server's, for write()


class NodeProxyHandler(JsonHandler):
    def do_GET(self):
        if self.path.endswith("/getShardMap"):
            shard_map = self.server.shard_map
            answer = {"code": 503, "msg": "a shard of the node is starting; retry"} if shard_map is None \
                else {"code": 200, "msg": "success", **shard_map}
            self.reply(503 if shard_map is None else 200, json.dumps(answer).encode())
        else:
            self._relay("GET", None)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("/sendMsgBatch"):
            with self.server.lock:
                self.server.relayed += len(json.loads(body)["msgs"])
        self._relay("POST", body)

    def _relay(self, method, body):
        status, answer = request(self.server.node + self.path, data=body,
                                 headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
        self.reply(status, answer)


def test_without_the_shard_map_or_with_its_ports_down_every_row_goes_through_the_node(spark, tmp_path):
    """A node of 2 shards behind a proxy whose getShardMap fails (503), then
    one whose map names ports nothing listens on: every request goes on
    through the node's url (the proxy) and every row is stored once."""
    server = Server.start(tmp_path / "data", "--shards", "2", log_path=tmp_path / "serve.log")
    try:
        for shard_map in (None, {"shards": 2, "ports": [free_port(), free_port()], "placement": "crc32"}):
            proxy = NodeProxy(server.base, shard_map)
            try:
                topic = unique("through-node")
                write(keyed_rows(spark, 1000), proxy, topic=topic, batchsize=50)
                assert (proxy.relayed, stored(server, topic)) == (1000, 1000)
            finally:
                proxy.close()
    finally:
        assert server.stop() == 0


def test_example_order_timeouts(spark, broker, tmp_path):
    spec = importlib.util.spec_from_file_location("order_timeouts", os.path.join(ROOT, "examples", "order_timeouts.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    topic = unique("orders")
    for path in (str(tmp_path / "orders.csv"), str(tmp_path / "orders.parquet")):
        example.make_sample(path, 200, now=datetime(2030, 1, 1, tzinfo=UTC))
        scheduled = example.schedule_timeouts(spark, path, broker.base, topic)
        orders = example.read_orders(spark, path).collect()
        pending = [o for o in orders if o.status == "pending"]
        assert scheduled == len(pending) and 0 < len(pending) < 200
        assert stored(broker, topic) == len(pending)  # the second file's orders are the same ids
    order = pending[0]
    status, answer = broker.post("getMsg", topic=topic, msgId=order.order_id)
    assert status == 200
    created_ms = int(order.created_at.timestamp() * 1000)  # pyspark gives naive local times
    assert answer["delayMsg"]["triggerTime"] == created_ms + example.PAYMENT_WINDOWS[order.payment_method]
    body = json.loads(answer["delayMsg"]["msg"])
    assert (body["orderId"], body["amountCents"]) == (order.order_id, order.amount_cents)
