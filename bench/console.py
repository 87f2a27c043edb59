"""The console's endpoints at scale, in process: prints one JSON object.

    .venv/bin/python bench/console.py [--topics 10000] [--messages 200000] [--days 3]

Stores --messages waiting messages of --topics topics, due uniformly over
--days, then times (ms) what /console/api/* computes per call: the
forecast (second tables of the next 25 hours, the hours' totals), one
topic's forecast, the sorted topic list, and the counts of a page of 50.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time

from broker.console.api import forecast, topic_forecast
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store, text_hash

NOW_MS = 500_000 * MS_PER_HOUR


def timed_ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return round((time.perf_counter() - started) * 1000, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--days", type=float, default=3)
    a = p.parse_args()
    directory = tempfile.mkdtemp(prefix="hourglass-console-")
    try:
        store = Store.open(directory, now_ms=NOW_MS)
        rnd = random.Random(1)
        spread = int(a.days * 24 * MS_PER_HOUR)
        for b in range(0, a.messages, 1000):
            store.send([NewMessage(f"topic-{(b + i) % a.topics}", str(b + i), "x", NOW_MS,
                                   NOW_MS + rnd.randrange(spread), 0, 0) for i in range(min(1000, a.messages - b))],
                       NOW_MS)
            store.commit()
        names = sorted(store.topic_names().values())
        out = {"topics": a.topics, "messages": a.messages, "files": len(store.hours()),
               "forecast_ms": timed_ms(lambda: forecast(store, NOW_MS)),
               "topic_forecast_ms": timed_ms(lambda: topic_forecast(store, names[0], NOW_MS)),
               "topic_list_ms": timed_ms(lambda: sorted(store.topic_names().values())),
               "topic_page_of_50_ms": timed_ms(lambda: [store.topic_counts(text_hash(n)) for n in names[:50]])}
        store.close()
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()  # as `hourglass serve` does, before any store opens
    main()
