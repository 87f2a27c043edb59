"""The Redis backend's configuration and key names.

Keys of topic T (P = "<prefix>:{T'}:", T' = T with % { } : percent-escaped,
so the braces hold a Redis Cluster hash tag: every key of a topic is in one
slot, and escaping keeps a topic from forging another topic's keys):

    P waiting  zset  msgId -> triggerTime ms                          status 1
    P ready    zset  rk, all scores 0 (ordered by the member's bytes):     2
                     the READY messages a pull may take (see keyready)
    P tagged   zset  "<tag>,<rk>", scores 0: those of `ready` with a tag    2
    P expire   zset  msgId -> expireTime ms, of READY messages             2
    P ack      zset  msgId -> ack deadline ms                              3
    P meta     hash  msgId -> JSON of strings: produce trigger ttl expire
                     maxRetry priority tag rk status retry, key (if it has
                     one), node (while a pusher's delivery of it is held),
                     delivery (while CONSUMING: the pull's deliveryId, 16
                     hex digits, that a fenced ack, nack or extension must
                     name: lua/backend/lease.lua; none in a message pulled
                     before leases, which no fenced call matches),
                     redrives (its redriveCount, once a redriveMsgs job put
                     it back: lua/backend/redrive_slice.lua)
    P body     hash  msgId -> msg
    P retire   zset  msgId -> when a final (4..7) message is purged
    P tags     zset  "<tag>,<msgId>", scores 0: every stored message with a
                     tag, until it is purged (the bulk calls' tag filter);
                     and "" once a send found the topic empty: from then
                     on every tagged message of it is here
    P bulk     list  the changes of the bulk call being applied, not yet
                     made ("D<retire_at> <msgId>", "R<now> <trigger>
                     <expire> <rk>"); while it exists every other script of
                     the topic refuses to run (HGBULK): broker.redis.bulk
    P bulkinfo hash  "call": the id of the call being applied; "n:<call>":
                     how many messages each call changed (expires an hour
                     after the topic's last bulk step)
    P staging:<call>  list  a call's changes while they are gathered
                     (expire STAGING_TTL_MS after the last push unless
                     committed: renamed to `bulk`)
    P busy     hash  key -> msgId of the key's CONSUMING message (a serial
                     key is busy while one of its messages is consuming)   3
    P keyready zset  "<key>\\0<rk>", scores 0: every READY keyed message;
                     only a free key's best one is in `ready` (and
                     `tagged`) too, so pulls pass over busy keys            2
    P keyed    zset  "<key>\\0<msgId>", scores 0: every stored keyed message,
                     until it is purged (the bulk calls' key filter)
    P held     zset  msgId -> push timeout ms, of CONSUMING messages a
                     pusher took (the node that did is `node` in meta)     3
    P leases   zset  node id -> until when the node counts as alive
                     (renewed by a pusher's pull, and by its node's TICKs
                     of the topic while `held` is not empty)
    P flow     hash  the topic's settings and pauses (broker.redis.flow):
                     "c" -> its entry (broker.flow.settings), "k:<key>" ->
                     a paused serial key's entry, "paused" -> "1" while the
                     topic is paused; pull.lua hands nothing out of a
                     paused topic, and a paused key's READY messages are
                     parked as a busy key's are; "fair" -> "1" while the
                     topic's fairness is fairKey; "turn" -> the fairKey
                     (group) a fair pull served last
    P fair     zset  "<fairKey>\\0<rk>", scores 0: while the topic's fairness
                     is fairKey, every member of `ready` (a fairKey holds no
                     NUL; "" for those without one), so a group's range is
                     ordered as `ready` is and the groups by their names
    <prefix>:flowtopics  set of the topics with a `flow` hash (not
                      hash-tagged: read by each node to reload them)
    <prefix>:topics   set of topic names (not hash-tagged; in no script of
                      a topic's, only in register.lua, alone)
    <prefix>:wake:<T> pub/sub channel: "a message of T became READY"

rk = "%05d%015d:msgId" % (32767 - priority, triggerTime): ready order is
the bytes of rk, i.e. (-priority, trigger, msgId), exact with no float
arithmetic. A pull filtered by tags reads the head of each tag's range of
`tagged` (ZRANGEBYLEX "[tag," "(tag-": a tag holds no comma, and "-"
follows ","), and takes the smallest rk, compared bytewise; a bulk call
filtered by a tag reads that tag's range of `tags` the same way, and one
filtered by a key its range of `keyed` ("[key\\0" "(key\\1": a key holds no
NUL), as the scripts read a key's READY messages from `keyready`. Every
script receives all eighteen keys in KEYS and builds no key name itself, as Redis
Cluster requires (tests/integration/test_redis_cluster.py checks it by
running the scripts with every undeclared key access made an error).

Scripts never print a time (a Lua number printed by an old Redis loses
digits past 14): the caller passes `now_ms`, deadlines and purge times as
strings, the expire time is stored at send, and times are compared (exact
below 2^53), not computed.

The URL of `--backend redis://...` is checked here too (`split_cluster_flag`:
`?cluster=1` selects Redis Cluster), and shown only with its password
hidden (`redact`).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from storage.entry import Location, Message, Status
from storage.errors import ConfigError
from storage.store import MAX_PRIORITY

# Every message read from Redis gets this Location: there is no disk entry.
NO_LOCATION = Location(0, 0)

# The type each key of a topic must have, in the order scripts get them as KEYS.
KEY_TYPES = {"waiting": "zset", "ready": "zset", "tagged": "zset", "expire": "zset", "ack": "zset",
             "meta": "hash", "body": "hash", "retire": "zset", "tags": "zset", "bulk": "list", "bulkinfo": "hash",
             "busy": "hash", "keyready": "zset", "keyed": "zset", "held": "zset", "leases": "zset",
             "flow": "hash", "fair": "zset"}


@dataclass(frozen=True)
class RedisConfig:
    # First part of every key and channel name.
    key_prefix: str = "hg"
    # How long a final (4..7) message stays readable by getMsg.
    retention_ms: int = 24 * 3_600_000
    # Longest the mover sleeps with nothing due: it also rereads the topic set,
    # so a topic only another process sends to is swept within this.
    poll_ms: int = 1000
    # Most messages one step of a TICK script handles (a script blocks Redis).
    script_batch: int = 1000
    # Most messages one step of a bulk call changes (lua/backend/bulk_apply.lua):
    # Redis answers nobody while a script runs, so each step is kept well
    # under 10 ms (docs/redis.md, "Bulk calls in bounded steps").
    bulk_batch: int = 100
    # Longest wait for a connection, and for any answer, before the request
    # fails with 503 (a stopped Redis must not hang requests).
    connect_timeout_ms: int = 2000
    command_timeout_ms: int = 5000
    # Quick retries of a failed connection (backoff 50 ms doubling, at most
    # 500 ms) before the request fails: they bridge a Redis restart.
    retries: int = 3
    # How long a node counts as alive after its mover's last TICK of a
    # topic: a push delivery it held past its timeoutMillis is handed back
    # once this lapses (lua/backend/tick.lua), not at its ack deadline.
    lease_ms: int = 10_000

    def __post_init__(self) -> None:
        check_key_prefix(self.key_prefix)
        at_least(self, 1, "retention_ms", "poll_ms", "script_batch", "bulk_batch",
                 "connect_timeout_ms", "command_timeout_ms", "lease_ms")
        at_least(self, 0, "retries")


def check_key_prefix(key_prefix: str) -> None:
    """For a config's __post_init__: braces in the prefix would move the
    Redis Cluster hash tag."""
    if not key_prefix or any(c in key_prefix for c in "{}"):
        raise ConfigError(f"key_prefix must be non-empty without braces, got {key_prefix!r}")


def at_least(config: object, low: int, *fields: str) -> None:
    """For a config's __post_init__: each named field must be >= low."""
    for name in fields:
        if getattr(config, name) < low:
            raise ConfigError(f"{name} must be at least {low}, got {getattr(config, name)}")


def escape_topic(topic: str) -> str:
    """Injective, and free of the characters that delimit keys and hash tags."""
    return topic.replace("%", "%25").replace("{", "%7B").replace("}", "%7D").replace(":", "%3A")


def message_of(topic: str, msg_id: str, f: dict[str, str], body: str) -> Message:
    """The message of a `meta` entry (decoded) and its body."""
    return Message(topic=topic, msg_id=msg_id, msg=body, produce_ms=int(f["produce"]),
                   trigger_ms=int(f["trigger"]), ttl_ms=int(f["ttl"]), max_retry=int(f["maxRetry"]),
                   priority=int(f["priority"]), tag=f["tag"], status=Status(int(f["status"])),
                   retry=int(f["retry"]), location=NO_LOCATION, key=f.get("key", ""),
                   traceparent=f.get("traceparent", ""), tracestate=f.get("tracestate", ""),
                   fair_key=f.get("fairKey", ""), end_reason=f.get("endReason", ""),
                   redrive_count=int(f.get("redrives", 0)))


def ready_member(priority: int, trigger_ms: int, msg_id: str) -> str:
    """rk: its bytes order ready messages by (-priority, trigger, msgId)."""
    return f"{MAX_PRIORITY - priority:05d}{trigger_ms:015d}:{msg_id}"


@dataclass(frozen=True)
class TopicKeys:
    """The keys of one topic, all in one Redis Cluster slot."""

    waiting: str
    ready: str
    tagged: str
    expire: str
    ack: str
    meta: str
    body: str
    retire: str
    tags: str
    bulk: str
    bulkinfo: str
    busy: str
    keyready: str
    keyed: str
    held: str
    leases: str
    flow: str
    fair: str

    @classmethod
    def of(cls, key_prefix: str, topic: str) -> TopicKeys:
        p = f"{key_prefix}:{{{escape_topic(topic)}}}:"
        return cls(*(p + name for name in KEY_TYPES))

    @property
    def all(self) -> list[str]:
        """KEYS of every script, in KEY_TYPES order."""
        return [getattr(self, name) for name in KEY_TYPES]

    def staging(self, call: str) -> str:
        """The list bulk call `call` gathers its changes in (the topic's slot)."""
        return self.bulk.removesuffix("bulk") + "staging:" + call

    @property
    def sizes(self) -> tuple[str, str, str]:
        """The zsets whose sizes are the topic's waiting, ready and consuming
        counts (`expire` holds every READY message; `ready` only the pullable)."""
        return self.waiting, self.expire, self.ack


def split_cluster_flag(url: str) -> tuple[str, bool]:
    """(the URL for redis-py, whether it asks for Redis Cluster): the query
    parameter `cluster=1` (or true, yes) selects RedisCluster, which knows
    only database 0."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    flags = [v for k, v in query if k == "cluster"]
    if flags and flags[-1].lower() not in ("1", "true", "yes", "0", "false", "no"):
        raise ConfigError(f"--backend {redact(url)}: cluster must be 1 or 0, got {flags[-1]!r}")
    cluster = bool(flags) and flags[-1].lower() in ("1", "true", "yes")
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "cluster"])
    if cluster and parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"--backend {redact(url)}: Redis Cluster has only database 0, got {parts.path!r}")
    return urllib.parse.urlunsplit(parts._replace(query=rest)), cluster


def redact(url: str) -> str:
    """The URL with its password replaced by ***, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
