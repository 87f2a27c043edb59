"""hourglass's JSON lines (docs/operations.md, "Export and import"): one
message a line, exactly as getMsg and listMsg answer it (`delayMsg`: every
field, the times absolute, ms since the epoch).

`export` pages each topic (getTopicInfoList's, or those named) out with
exportMsg, 1,000 a page, in the order the node holds them (each shard's
part from its own port): the live messages (1, 2, 3) and the dead ones
listDeadMsg would show (5, 6), or the statuses asked. A message the node
moved during the walk may be written twice; an import stores it once.
What a line becomes on import (`pending`):

    waiting, ready           due at its triggerTime (at once if past)
    consuming                due at its triggerTime, so at once: its
                             holder's ack goes to the old node (at least
                             once)
    acked, deleted           not sent
    dead (5, 6)              stored dead, as listDeadMsg shows it (it can
                             be re-driven there)
    live, past expireTime    not sent
    live, no delivery left   stored dead (6): retry > maxRetry, as the old
                             node ends it

kept (importMsgBatch): msgId, msg, triggerTime, expireTime (as ttlMillis
from the trigger time), maxRetry, retry, priority, tag, key, and the
status as above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import orjson

from ..client import DelayQueueClient, NewMsg
from .sending import Outgoing

EXPORTED = (1, 2, 3, 5, 6)
# What a line of each status becomes if it is not sent.
NOT_SENT = {4: "acked", 7: "deleted"}


async def export(client: DelayQueueClient, out: TextIO, topics: Sequence[str] = (),
                 statuses: Iterable[int] = EXPORTED) -> Counter[str]:
    """Every message of `topics` (all the node's when none) in `statuses`,
    a line each; the count written a topic."""
    if not topics:
        topics = sorted(info["topic"] for info in await client.topic_info_list())
    wanted = sorted(set(statuses))
    written: Counter[str] = Counter()
    for topic in topics:
        async for page in client.export_rows(topic, wanted):
            out.write(b"".join(orjson.dumps(row) + b"\n" for row in page).decode())
            written[topic] += len(page)
    out.flush()
    return written


def pending(line: bytes, now_ms: int) -> Outgoing | str:
    """(topic, the send) of one exported line, or why it is not sent (module docstring)."""
    try:
        row: Any = orjson.loads(line)
        topic, msg_id, body, status = row["topic"], row["msgId"], row["msg"], int(row["status"])
        trigger, expire = int(row["triggerTime"]), int(row["expireTime"])
        max_retry, retry = int(row["maxRetry"]), int(row["retry"])
        priority = int(row.get("priority") or 0)
        tag, key = row.get("tag") or None, row.get("key") or None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return "unreadable"
    if not all(isinstance(v, str) for v in (topic, msg_id, body)) or not all(
            v is None or isinstance(v, str) for v in (tag, key)):
        return "unreadable"
    if status in NOT_SENT:
        return NOT_SENT[status]
    if status not in (1, 2, 3, 5, 6) or expire <= trigger or not retry >= 0 or not max_retry >= 0:
        return "unreadable"
    dead = status in (5, 6)
    if not dead and expire <= now_ms:
        return "expired"
    if not dead and retry > max_retry:
        status, dead = 6, True  # (its last delivery under way or done: the old node ends it)
    return Outgoing(topic, NewMsg(body, msg_id=msg_id, trigger_time_ms=trigger, ttl_ms=expire - trigger,
                                  max_retry=max_retry, priority=priority, tag=tag, key=key),
                    status if dead else 1, min(retry, max_retry + 1))
