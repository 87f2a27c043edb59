"""Settings of `hourglass serve`: one frozen dataclass, built by the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from replication.config import ClusterConfig
from storage.config import FsyncPolicy, StoreConfig
from storage.errors import ConfigError

from ..core.bodies import BodyLimits
from ..core.params import Defaults
from ..disk.ready import QueueLimits
from ..flow.settings import DEFAULT_MAX_PAUSED_KEYS, DEFAULT_MAX_PAUSED_KEYS_TOTAL
from ..http.httpd import Limits
from ..http.sessions import ConsoleConfig
from ..jobs.runner import JobLimits
from ..push.rules import DEFAULT_MAX_SUBSCRIPTIONS, PushAllow, PushLimits
from ..redis.keys import RedisConfig
from ..schedules.keeper import ScheduleLimits

# The shortest client token accepted: a short one is guessed.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class ServeConfig:
    # Address the HTTP API listens on (loopback by default).
    host: str = "127.0.0.1"
    port: int = 8080
    # Where the commit log, delay logs and indexes live.
    data_dir: str = "./hourglass-data"
    # Start on a data directory group or others have any permission on, with
    # a warning, instead of refusing it (storage.data_dir): for a directory
    # shared on purpose, e.g. with a backup user's group.
    allow_shared_data_dir: bool = False
    # "disk", or redis://HOST:PORT/DB: the state lives in that Redis
    # (broker.redis.backend), data_dir and store are then unused.
    backend: str = "disk"
    # On the Redis backend: most messages one script of a bulk call changes
    # (Redis answers nobody while a script runs; docs/redis.md, "Bulk calls
    # in bounded steps").
    redis_bulk_batch: int = RedisConfig().bulk_batch
    # Largest `msg`, in UTF-8 bytes; a message exactly this large is accepted.
    max_msg_bytes: int = 1024 * 1024
    # Bearer token required by every endpoint but /health (None: no auth,
    # and then only loopback Host names, `host` and `allowed_hosts` are
    # served, and cross-site state-changing requests refused: broker.http.gate).
    auth_token: str | None = None
    # Host names served without a token besides loopback and `host`
    # (--allowed-hosts), e.g. the name a reverse proxy forwards.
    allowed_hosts: tuple[str, ...] = ()
    # How often derived files are made durable and the commit log trimmed.
    checkpoint_interval_ms: int = 1000
    # getMonitorData's interval: its counts are of the last one (camellia's
    # monitorIntervalSeconds, 60 s).
    monitor_interval_s: int = 60
    # After /camellia/health/offline, the node counts as drained (offline
    # answers 200) once no API call has run for this long (camellia: 20 s).
    offline_idle_s: float = 20.0
    store: StoreConfig = field(default_factory=StoreConfig)
    # What requests get for parameters they leave out (camellia's values).
    defaults: Defaults = field(default_factory=Defaults)
    # What one client connection may hold: connections, deadlines, bodies.
    http: Limits = field(default_factory=Limits)
    # What decoding a request body may cost: form pairs, batch size, JSON.
    bodies: BodyLimits = field(default_factory=BodyLimits)
    # Ready messages held in RAM (the rest wait on disk) and messages in
    # flight, per topic and in all, and how many topics: broker.disk.ready.
    queues: QueueLimits = field(default_factory=QueueLimits)
    # The console's sessions: their lifetime and number, the cookie's
    # Secure flag (broker.http.sessions).
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    # Topics with series of their own in /metrics (--metrics-topics): those
    # with the largest backlogs; every topic counts in the node-level sums
    # (broker.http.scrape). 0: none.
    metrics_topics: int = 100
    # --node-id/--cluster: this node is one of a replicated cluster (None:
    # standalone). Its host and port then come from its --cluster entry.
    cluster: ClusterConfig | None = None
    # Where push subscriptions may POST (--push-allow): host names, host:port,
    # addresses and CIDRs (broker.push.rules.PushAllow). Empty: push is off,
    # subscribe answers 403.
    push_allow: tuple[str, ...] = ()
    # Push subscriptions the node keeps (--max-subscriptions); a subscribe
    # for one more topic answers 429 naming the flag (docs/api.md).
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    # Serial keys of one topic paused at once (--max-paused-keys); a
    # pauseTopic of one more answers 429 naming the flag (broker.flow).
    max_paused_keys: int = DEFAULT_MAX_PAUSED_KEYS
    # Serial keys of the node paused at once, all topics (--max-paused-keys-total); a pauseTopic of
    # one more answers 429 naming the flag.
    max_paused_keys_total: int = DEFAULT_MAX_PAUSED_KEYS_TOTAL
    # What a subscriber's answers may cost (--push-max-head-bytes and the
    # other --push-* limits), and the descriptors push connections may hold
    # (--push-max-fds): broker.push.rules.PushLimits.
    push: PushLimits = field(default_factory=PushLimits)
    # Recurring schedules the node keeps, and the bytes their messages hold
    # in RAM (--max-schedules, --max-schedule-bytes): broker.schedules.keeper.
    schedules: ScheduleLimits = field(default_factory=ScheduleLimits)
    # redriveMsgs jobs the node keeps, and how long an ended one stays
    # listed (--max-jobs, --job-retention-ms): broker.jobs.runner.
    jobs: JobLimits = field(default_factory=JobLimits)
    # The span exporters the standard OTEL_* variables name (the CLI reads
    # them: broker.observe.tracing.exporters_from_env); () is no spans, and then no
    # module of OpenTelemetry is loaded (docs/operations.md, "Traces").
    trace_exporters: tuple[str, ...] = ()
    # --shards: shard processes of a standalone disk node, a count or "auto"
    # (the cores; a data directory keeps the count it was made with:
    # broker.shards.layout).
    shards: str = "auto"
    # This process is shard (index, count) of a node of many (the node's
    # process starts each with it: broker.shards.supervisor); None: the node itself.
    shard: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.port}")
        if self.redis_bulk_batch < 1:
            raise ConfigError(f"--redis-bulk-batch must be at least 1, got {self.redis_bulk_batch}")
        if self.max_msg_bytes < 1:
            raise ConfigError(f"--max-msg-bytes must be at least 1, got {self.max_msg_bytes}")
        if self.backend != "disk" and not self.backend.startswith(("redis://", "rediss://")):
            raise ConfigError(f"--backend must be disk or redis://HOST:PORT/DB, got {self.backend!r}")
        if self.auth_token is not None and len(self.auth_token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"the auth token is {len(self.auth_token)} characters; at least {MIN_TOKEN_CHARS} "
                              f"are needed (e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
        if self.cluster is not None and self.backend != "disk":
            raise ConfigError("--cluster needs --backend disk (a Redis backend shares its state already)")
        if self.monitor_interval_s < 1:
            raise ConfigError(f"--monitor-interval-s must be at least 1, got {self.monitor_interval_s}")
        if self.metrics_topics < 0:
            raise ConfigError(f"--metrics-topics must be at least 0, got {self.metrics_topics}")
        if self.offline_idle_s < 0:
            raise ConfigError(f"--offline-idle-s must be at least 0, got {self.offline_idle_s}")
        if self.max_subscriptions < 0:
            raise ConfigError(f"--max-subscriptions must be at least 0, got {self.max_subscriptions}")
        if self.max_paused_keys < 0:
            raise ConfigError(f"--max-paused-keys must be at least 0, got {self.max_paused_keys}")
        if self.max_paused_keys_total < 0:
            raise ConfigError(f"--max-paused-keys-total must be at least 0, got {self.max_paused_keys_total}")
        PushAllow.parse(self.push_allow)  # a bad entry is a ConfigError now, not at the first subscribe
        if self.checkpoint_interval_ms < 10:
            raise ConfigError(f"checkpoint_interval_ms must be at least 10, got {self.checkpoint_interval_ms}")

    @property
    def node_path(self) -> str:
        """The data directory as given (a node of many shards keeps its count there)."""
        return os.path.abspath(self.data_dir)

    @property
    def data_path(self) -> str:
        """Where this process's store lives: the data directory, or its shard's in it."""
        if self.shard is None:
            return os.path.abspath(self.data_dir)
        return os.path.join(os.path.abspath(self.data_dir), f"shard-{self.shard[0]}")


def fsync_policy(text: str) -> FsyncPolicy:
    try:
        return FsyncPolicy(text)
    except ValueError:
        raise ConfigError(f"--fsync must be one of always, batch, never; got {text!r}") from None
