"""The node's budgets, shared by its shards (docs/configuration.md, "--shards").

A flag that bounds the node holds for a node of many shards too: each
shard keeps a fixed share of it, `split(total, index, count)`, the shares
summing to the flag's value. A share is fixed at start: no shard borrows
what another leaves unused, so a node whose load falls on few shards meets
a limit before the flag's value, never after it.

    --ready-window-total    READY messages held in RAM, over all topics
    --ready-window          ... of one topic
    --max-inflight-total    CONSUMING messages, over all topics
    --max-inflight          ... of one topic
    --max-schedules         schedules (each lives on its scheduleId's shard)
    --max-schedule-bytes    their messages' UTF-8 bytes
    --index-resident-mb     index pages kept resident (each shard's store
                            shares its share over its indexes; at least
                            4 MB a shard: past 2 shards the node's may
                            pass the flag's value)

The windows keep at least one message a shard (a shard with none could
hand out nothing). Not split, because every shard already counts the
node's: --max-jobs (a job is made on every shard), --max-paused-keys and
--max-subscriptions (every shard carries out a pause and keeps a subscription),
--max-topics (a topic lives on every shard), and --key-window (a serial
key's messages all live on its shard). --max-connections is neither split
nor counted apart: the shards count the node's connections on one board
(broker.shards.connections).
"""

from __future__ import annotations

import dataclasses

from storage.config import StoreConfig

from ..disk.ready import QueueLimits
from ..schedules.keeper import ScheduleLimits


def split(total: int, index: int, count: int) -> int:
    """Shard `index`'s share of `total` over `count` shards: the shares sum
    to `total` exactly (the first `total % count` shards one more)."""
    return total // count + (1 if index < total % count else 0)


def shard_queues(queues: QueueLimits, index: int, count: int) -> QueueLimits:
    """The windows a shard keeps: its share of the node's totals."""
    return dataclasses.replace(queues, window_total=max(1, split(queues.window_total, index, count)),
                               window=max(1, split(queues.window, index, count)),
                               inflight_total=max(1, split(queues.inflight_total, index, count)),
                               inflight=max(1, split(queues.inflight, index, count)))


def shard_schedules(limits: ScheduleLimits, index: int, count: int) -> ScheduleLimits:
    """The schedules a shard holds: its share of the node's caps."""
    return dataclasses.replace(limits, max_schedules=split(limits.max_schedules, index, count),
                               max_bytes=split(limits.max_bytes, index, count), shards=count)


# A shard store's resident index pages at least (when the node's are at least
# this): an empty store's id and key indexes take some 2 MB, which a share of
# 8 MB over many cores would not hold (each shard's indexes paged from the start).
MIN_SHARD_RESIDENT_BYTES = 4 << 20


def shard_store(store: StoreConfig, index: int, count: int) -> StoreConfig:
    """The store a shard opens: its share of the node's resident index pages
    (at least MIN_SHARD_RESIDENT_BYTES, or the node's when less)."""
    total = store.index_resident_bytes
    return dataclasses.replace(store, index_resident_bytes=max(split(total, index, count),
                                                               min(total, MIN_SHARD_RESIDENT_BYTES)))
