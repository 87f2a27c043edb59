"""Spark ingest benchmark: rows generated in Spark and written with the
`hourglass` data source (broker/spark.py) into a real `hourglass serve`, or,
with --null-receiver, into a trivial local HTTP receiver, to see the sink's
own speed. Prints one JSON object on stdout, progress on stderr.

    .venv/bin/python bench/spark_ingest.py                  # 500,000 rows into hourglass serve
    .venv/bin/python bench/spark_ingest.py --null-receiver  # the sink alone
    .venv/bin/python bench/spark_ingest.py --rows 50000     # a quick check

Needs the spark extra (`pip install -e '.[spark]'`) and Java 17.

The server is `python -m broker.cli serve --fsync batch --shards auto` on a
free loopback port with a fresh data directory under --work-dir (default a
new temp dir, removed afterwards unless --keep), stopped by PID (SIGTERM):
serve's default node, one shard per core (--shards another count; the
tests' harness would start one); the sink reads its getShardMap and sends
each row on its shard's own port. The null receiver is a process of its
own (http.server, HTTP/1.1 keep-alive) that answers every sendMsgBatch 200
with a delayMsgList as long as the request's (answers cached by length)
and counts the messages it got.

Rows: spark.range(--rows) in --partitions partitions (2) on --master
(local[2]), columns msg (--payload-bytes, 100) and delayMillis (1 min ..
1 day, so every message waits), sent in sendMsgBatch requests of
--batch-size (500) messages, one kept-alive connection per task. A write of
--warmup-rows (2,000) to another topic first starts Spark's Python workers;
it is not timed. Then the timed write: `save()` wall time, so it includes
Spark's planning and task scheduling (tens of ms).

Reported: rows_per_s = rows / seconds; `counted` is what the receiver holds
afterwards (getTopicInfo's waitingQueueSize, or the null receiver's count),
which must equal rows; over the timed write, receiver_cpu_s (the server or
the null receiver), spark_cpu_s (this process, the JVM and its Python
workers), other_cpu_s (every other process on the machine: a busy machine
shows here) and cpu_capacity_s (seconds x cores), so a reader can tell
which side was the limit on this 2-core machine. A count that
differs from rows is listed under "problems" and the exit status is 1.
"""

from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request

from harness import ROOT, Server, free_port, machine_busy_cpu_s, request, tree_cpu_s, wait_until

MINUTE_MS = 60_000
DAY_MS = 24 * 60 * MINUTE_MS
TOPIC = "spark-ingest"

_started = time.monotonic()


def log(text: str) -> None:
    print(f"[{time.monotonic() - _started:8.1f} s] {text}", file=sys.stderr, flush=True)


# == the null receiver ===========================================================


class NullReceiver(http.server.ThreadingHTTPServer):
    """Answers sendMsgBatch with 200 and counts messages; GET /count tells."""

    daemon_threads = True

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), NullHandler)
        self.messages = 0
        self.answers: dict[int, bytes] = {}

    def answer(self, count: int) -> bytes:
        """A sendMsgBatch answer of `count` stub delayMsgs, made once per count."""
        if count not in self.answers:
            stub = {"topic": TOPIC, "msgId": "x", "msg": "", "produceTime": 0, "triggerTime": 0, "expireTime": 0,
                    "maxRetry": 10, "retry": 0, "status": 1, "priority": 0, "tag": ""}
            self.answers[count] = json.dumps({"code": 200, "msg": "success",
                                              "delayMsgList": [stub] * count}).encode()
        return self.answers[count]


class NullHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stalls

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        # The sink's JSON escapes every quote inside a string, so this key
        # pattern occurs once per message and nowhere else.
        count = body.count(b'"msgId":')
        self.server.messages += count
        self._reply(self.server.answer(count))

    def do_GET(self) -> None:
        self._reply(json.dumps({"code": 200, "msg": "success", "messages": self.server.messages}).encode())

    def _reply(self, answer: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


def run_null_receiver(port: int) -> None:
    NullReceiver(port).serve_forever()


# == the run ===================================================================


def rows_frame(spark, rows: int, partitions: int, payload_bytes: int):
    from pyspark.sql import functions as F

    return spark.range(0, rows, 1, partitions).select(
        F.rpad(F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit(" ")), payload_bytes, "x").alias("msg"),
        (F.lit(MINUTE_MS) + (F.col("id") * 7919) % (DAY_MS - MINUTE_MS)).alias("delayMillis"))


def write(df, url: str, topic: str, batch_size: int) -> None:
    (df.write.format("hourglass").option("url", url).option("topic", topic).option("batchsize", batch_size)
     .mode("append").save())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=500, help="messages per sendMsgBatch (500)")
    p.add_argument("--payload-bytes", type=int, default=100, help="length of msg (100)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--warmup-rows", type=int, default=2_000)
    p.add_argument("--null-receiver", action="store_true", help="send to a trivial local receiver, not the broker")
    p.add_argument("--shards", default="auto", help="serve's --shards (auto: one per core, serve's default)")
    p.add_argument("--work-dir", default=None, help="where the data dir goes (a fresh temp dir inside it)")
    p.add_argument("--keep", action="store_true", help="keep the data dir and the server log")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = tempfile.mkdtemp(prefix="hourglass-spark-bench-", dir=args.work_dir)
    # Spark's Python workers start in the working directory (first on their
    # sys.path): the work dir holds nothing they could import by mistake.
    os.chdir(work_dir)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    problems: list[dict] = []
    server = receiver = spark = None
    try:
        if args.null_receiver:
            port = free_port()
            receiver = multiprocessing.get_context("fork").Process(target=run_null_receiver, args=(port,),
                                                                   daemon=True)
            receiver.start()
            url, receiver_pid = f"http://127.0.0.1:{port}", receiver.pid
            wait_until(lambda: request(url + "/count", timeout=2)[0] == 200, 10, "the null receiver", every_s=0.02)
        else:
            data_dir = os.path.join(work_dir, "data")
            server = Server.start(data_dir, "--fsync", "batch", "--shards", args.shards, log_path=data_dir + ".log",
                                  wait_s=60)
            url, receiver_pid = server.base, server.proc.pid
        log(f"receiver: {'null receiver' if args.null_receiver else 'hourglass serve'} at {url}")

        from pyspark.sql import SparkSession

        from broker.spark import register

        spark = (SparkSession.builder.master(args.master).appName("hourglass-spark-ingest")
                 .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        log(f"spark {spark.version} on {args.master}; warm-up write of {args.warmup_rows} rows")
        write(rows_frame(spark, args.warmup_rows, args.partitions, args.payload_bytes), url, TOPIC + "-warmup",
              args.batch_size)
        counted_before = count(url, TOPIC, args.null_receiver)

        df = rows_frame(spark, args.rows, args.partitions, args.payload_bytes)
        log(f"timed write: {args.rows} rows, {args.partitions} partitions, batch size {args.batch_size}")
        cpu0 = cpu_split(receiver_pid)
        started = time.monotonic()
        write(df, url, TOPIC, args.batch_size)
        seconds = time.monotonic() - started
        receiver_cpu, spark_cpu, other_cpu = (after - before for after, before in zip(cpu_split(receiver_pid), cpu0))
        counted = count(url, TOPIC, args.null_receiver) - counted_before
        log(f"done: {seconds:.2f} s, counted {counted}")
        if counted != args.rows:
            problems.append({"problem": f"wrote {args.rows} rows but the receiver counts {counted}"})
        out = {
            "receiver": "null" if args.null_receiver else "hourglass serve --fsync batch",
            "shards": None if args.null_receiver else shard_count(url),
            "rows": args.rows,
            "seconds": round(seconds, 3),
            "rows_per_s": round(args.rows / seconds),
            "counted": counted,
            "partitions": args.partitions,
            "batch_size": args.batch_size,
            "payload_bytes": args.payload_bytes,
            "master": args.master,
            "receiver_cpu_s": round(receiver_cpu, 2),
            "spark_cpu_s": round(spark_cpu, 2),
            "other_cpu_s": round(other_cpu, 2),
            "cpu_capacity_s": round(seconds * (os.cpu_count() or 1), 2),
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "spark": spark.version, "platform": platform.platform()},
            "problems": problems,
        }
    finally:
        if spark is not None:
            spark.stop()
        if receiver is not None:
            receiver.terminate()
            receiver.join(10)
        if server is not None:
            code = server.stop()
            if code != 0:
                problems.append({"problem": f"serve exited {code} after SIGTERM", "log": server.log_path})
        os.chdir(ROOT)
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 1 if problems else 0


def cpu_split(receiver_pid: int) -> tuple[float, float, float]:
    """CPU seconds so far of the receiver, of this process with Spark (the
    JVM and its Python workers), and of everything else on the machine."""
    receiver = tree_cpu_s(receiver_pid, set())
    spark = tree_cpu_s(os.getpid(), {receiver_pid})
    return receiver, spark, machine_busy_cpu_s() - receiver - spark


def shard_count(url: str) -> int:
    """The node's shards, as its getShardMap says."""
    with urllib.request.urlopen(f"{url}/camellia/delayQueue/getShardMap", timeout=60) as answer:
        shards: int = json.load(answer)["shards"]
        return shards


def count(url: str, topic: str, null_receiver: bool) -> int:
    """Messages the receiver holds: the null receiver's total, or the
    broker's waiting messages of `topic` (0 before the first send)."""
    if null_receiver:
        with urllib.request.urlopen(url + "/count", timeout=30) as answer:
            return json.load(answer)["messages"]
    try:
        with urllib.request.urlopen(f"{url}/camellia/delayQueue/getTopicInfo?topic={topic}", timeout=60) as answer:
            return json.load(answer)["data"]["waitingQueueSize"]
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return 0
        raise


if __name__ == "__main__":
    sys.exit(main())
