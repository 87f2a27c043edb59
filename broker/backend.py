"""What every backend of the HTTP API shares: camellia's names for the
waiting queue's delay buckets, the shape of a TopicInfo, and the bounds of a
dead-letter page. Neutral ground: the disk broker (broker.service) and the
Redis backend both import it, neither imports the other."""

from __future__ import annotations

# getTopicInfo's waitingQueueInfo buckets, as camellia names them: upper
# bounds of time-until-trigger, in ms.
WAITING_BUCKETS = (
    ("sizeOf0To1min", 60_000),
    ("sizeOf1minTo10min", 600_000),
    ("sizeOf10minTo30min", 1_800_000),
    ("sizeOf30minTo1hour", 3_600_000),
    ("sizeOf1hourTo6hour", 6 * 3_600_000),
    ("sizeOf6hourTo1day", 24 * 3_600_000),
    ("sizeOf1dayTo7day", 7 * 24 * 3_600_000),
    ("sizeOf7dayTo30day", 30 * 24 * 3_600_000),
    ("sizeOf30dayToInfinite", None),
)


# listDeadMsg and redriveMsg all=true read at most this many index entries
# (Redis: members) per page or step; a re-drive moves at most REDRIVE_STEP
# messages a record (Redis: a script).
DEAD_SCAN = 65536
REDRIVE_STEP = 1000


def waiting_bucket(until_trigger_ms: int) -> int:
    """The index in WAITING_BUCKETS of a message triggering in `until_trigger_ms`."""
    for i, (_, upper) in enumerate(WAITING_BUCKETS):
        if upper is None or until_trigger_ms < upper:
            return i
    raise AssertionError("the last bucket is unbounded")


def topic_info_json(topic: str, waiting: int, buckets: list[int], ready: int, consuming: int) -> dict:
    """camellia's TopicInfo: queue sizes and the waiting queue by delay
    bucket (`buckets` counts per WAITING_BUCKETS entry)."""
    return {
        "topic": topic,
        "waitingQueueSize": waiting,
        "waitingQueueInfo": {name: n for (name, _), n in zip(WAITING_BUCKETS, buckets)},
        "readyQueueSize": ready,
        "ackQueueSize": consuming,
    }
