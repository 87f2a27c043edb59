"""Order timeouts with Spark and hourglass: read a file of orders, compute each
unpaid order's payment deadline, and schedule one message per order, due at
its deadline, for a consumer that cancels the order if it is still unpaid.

    pip install -e '.[spark]'                # pyspark, pyarrow; Java 17 on PATH
    hourglass serve &                        # 127.0.0.1:8080
    python examples/order_timeouts.py --orders orders.csv --make-sample 100000 \\
        --url http://127.0.0.1:8080          # writes a sample, then schedules it
    python examples/order_timeouts.py --url http://127.0.0.1:8080 --orders orders.csv

`--orders` is a CSV file (with a header) or, ending in `.parquet`, a Parquet
file, with the columns

    order_id        string     "o-0000042"
    customer_id     string
    amount_cents    bigint
    payment_method  string     card | bank_transfer | invoice
    status          string     pending | paid
    created_at      timestamp  UTC

Each pending order becomes a message in `--topic` (order-timeouts) with
msgId = order_id, so running the pipeline twice, or Spark retrying a task,
schedules each order once; triggerTime = created_at + the method's payment
window (PAYMENT_WINDOWS); a deadline already past is due at once. The msg is
JSON a consumer can act on: {"orderId", "customerId", "amountCents",
"paymentMethod", "deadline"}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta

MINUTE_MS = 60_000
# How long a customer has to pay, by payment method.
PAYMENT_WINDOWS = {"card": 30 * MINUTE_MS, "bank_transfer": 3 * 24 * 60 * MINUTE_MS,
                   "invoice": 30 * 24 * 60 * MINUTE_MS}
# A due message waits this long for a consumer before it expires (docs/api.md, Pulling: ttlMillis).
TTL_MS = 7 * 24 * 60 * MINUTE_MS
SCHEMA = ("order_id STRING, customer_id STRING, amount_cents BIGINT, payment_method STRING, "
          "status STRING, created_at TIMESTAMP")


def make_sample(path: str, count: int, *, now: datetime | None = None, seed: int = 42) -> None:
    """Write `count` orders created in the last two hours, a fifth of them
    already paid; CSV, or Parquet when `path` ends in .parquet."""
    now = now or datetime.now(UTC)
    rnd = random.Random(seed)
    methods = list(PAYMENT_WINDOWS)
    rows = []
    for i in range(count):
        created = now - timedelta(seconds=rnd.randrange(2 * 3600))
        rows.append((f"o-{i:07d}", f"c-{rnd.randrange(count // 3 + 1):06d}", rnd.randrange(100, 100_000),
                     rnd.choice(methods), "paid" if rnd.random() < 0.2 else "pending", created))
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
        names = ["order_id", "customer_id", "amount_cents", "payment_method", "status", "created_at"]
        pq.write_table(pa.Table.from_pylist([dict(zip(names, r)) for r in rows]), path)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write("order_id,customer_id,amount_cents,payment_method,status,created_at\n")
        for order, customer, amount, method, status, created in rows:
            f.write(f"{order},{customer},{amount},{method},{status},"
                    f"{created.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z\n")


def read_orders(spark, path: str):
    if path.endswith(".parquet"):
        return spark.read.parquet(path)
    return spark.read.schema(SCHEMA).option("header", True).csv(path)


def timeout_messages(orders):
    """The hourglass sink's columns for every pending order."""
    from pyspark.sql import functions as F

    window_ms = F.coalesce(*[F.when(F.col("payment_method") == method, F.lit(ms))
                             for method, ms in PAYMENT_WINDOWS.items()])
    deadline = F.timestamp_millis(F.unix_millis("created_at") + window_ms)
    return (orders.where(F.col("status") == "pending")
            .where(window_ms.isNotNull())
            .select(F.col("order_id").alias("msgId"),
                    deadline.alias("triggerTime"),
                    F.lit(TTL_MS).alias("ttlMillis"),
                    F.to_json(F.struct(F.col("order_id").alias("orderId"),
                                       F.col("customer_id").alias("customerId"),
                                       F.col("amount_cents").alias("amountCents"),
                                       F.col("payment_method").alias("paymentMethod"),
                                       F.date_format(deadline, "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("deadline")))
                    .alias("msg")))


def schedule_timeouts(spark, orders_path: str, url: str, topic: str, *, batch_size: int = 500) -> int:
    """Send one timeout message per pending order; return how many."""
    messages = timeout_messages(read_orders(spark, orders_path)).cache()
    try:
        count = messages.count()
        (messages.write.format("hourglass").option("url", url).option("topic", topic)
         .option("batchsize", batch_size).mode("append").save())
        return count
    finally:
        messages.unpersist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", required=True, help="orders file: .csv (header) or .parquet")
    parser.add_argument("--url", help="hourglass node, e.g. http://127.0.0.1:8080 (none: only --make-sample)")
    parser.add_argument("--topic", default="order-timeouts")
    parser.add_argument("--make-sample", type=int, metavar="N", help="first write N sample orders to --orders")
    parser.add_argument("--master", default="local[2]", help="Spark master (local[2])")
    parser.add_argument("--batch-size", type=int, default=500, help="messages per sendMsgBatch (500)")
    args = parser.parse_args(argv)

    if args.make_sample:
        make_sample(args.orders, args.make_sample)
        print(f"wrote {args.make_sample} sample orders to {args.orders}", file=sys.stderr)
    if not args.url:
        if not args.make_sample:
            parser.error("--url is required (or --make-sample N to only write a sample)")
        return 0

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from broker.spark import register

    spark = (SparkSession.builder.master(args.master).appName("order-timeouts")
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    try:
        started = time.monotonic()
        count = schedule_timeouts(spark, args.orders, args.url, args.topic, batch_size=args.batch_size)
        seconds = time.monotonic() - started
    finally:
        spark.stop()
    info_url = f"{args.url.rstrip('/')}/camellia/delayQueue/getTopicInfo?topic={urllib.parse.quote(args.topic)}"
    with urllib.request.urlopen(info_url, timeout=30) as answer:
        info = json.load(answer)["data"]
    print(json.dumps({"scheduled": count, "seconds": round(seconds, 2), "topic": args.topic,
                      "waitingQueueSize": info["waitingQueueSize"], "readyQueueSize": info["readyQueueSize"],
                      "waitingQueueInfo": info["waitingQueueInfo"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
