"""What the Redis backend's parts share: `RedisState`, what this process
knows of the Redis it shares with other processes. RedisBroker
(broker.redis.backend) holds it, its mover and requests
(broker.redis.requests) read and change it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RedisState:
    # Topics this process knows of (its sends, the topic set as last read).
    topics: set[str] = field(default_factory=set)
    # Topics known to be in the topic set (forgotten when Redis was
    # unreachable: it may come back empty).
    registered: set[str] = field(default_factory=set)
    # Last problem reported per place (mover, listener, a topic), so that a
    # lasting outage is logged once, and its end too.
    problems: dict[str, str] = field(default_factory=dict)
