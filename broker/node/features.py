"""The features a node runs beside its messages, built the same way on
every kind of node: topic settings and pauses (broker.flow), push
subscriptions (broker.push), recurring schedules (broker.schedules) and
redriveMsgs jobs (broker.jobs).

What differs between the kinds is only where the features' small records
are kept, the node's one seam (`Records`):

    kind        records                                  by
    standalone  files in the data directory (shard 0's   `DiskRecords`, broker.node.standalone
                settings on a node of shards)
    cluster     the Raft group's replicated state        `RaftRecords`, broker.cluster.records
    Redis       Redis (settings), the data directory     `RedisRecords`, broker.node.standalone
                (subscriptions); the schedules and jobs
                are each run by the node holding their
                lease (broker.redis.lease), not attached

and a broker's run goes through the same steps on every kind:

    Features(...)   the flow and the pushers, built with the node
    attach(broker)  a run begins (a standalone node's start, a cluster
                    leader's term), before the broker starts: the schedules
                    read from their records and hooked to its releases, its
                    pauses carried out, the jobs read from theirs
    start(broker)   after it started: the pushers push, the schedules make
                    runs, running jobs resume from their cursors
    stop()          the reverse, the pushers first (what they have in
                    flight is delivered again at its ack deadline); what the
                    schedules and jobs leave undone the next run does
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from wheel.clock import Clock

from ..backend import Backend
from ..flow.keeper import SettingsStore, SharedSettings, TopicFlow
from ..jobs.runner import JobStore, RedriveJobs
from ..push.rules import PushAllow
from ..schedules.keeper import ScheduleLimits, Schedules, ScheduleStore
from .config import ServeConfig

if TYPE_CHECKING:
    from ..disk.backend import Broker
    from ..http.descriptors import DescriptorBudget
    from ..observe.tracing import Spans
    from ..push.pusher import Pushers, SubscriptionStore


class Records(Protocol):
    """Where a kind of node keeps its features' small records."""

    def settings(self) -> SettingsStore:
        """Topic settings and pauses (read at each `TopicFlow.start`)."""

    def subscriptions(self) -> SubscriptionStore:
        """Push subscriptions (asked only of a node that pushes)."""

    def schedules(self) -> ScheduleStore:
        """Recurring schedules, read afresh: asked at each `attach`."""

    def jobs(self) -> JobStore:
        """redriveMsgs jobs' records, read afresh: asked at each `attach`."""


class Features:
    """A node's features (see the module docstring). `schedules` and
    `jobs` are None until a run is attached (a cluster follower has none;
    a Redis node has them while it holds their lease)."""

    def __init__(self, config: ServeConfig, clock: Clock, records: Records, descriptors: DescriptorBudget,
                 spans: Spans | None, *, schedule_limits: ScheduleLimits | None = None, shares: int = 1,
                 shared: SharedSettings | None = None,
                 pushes_here: Callable[[str], bool] = lambda topic: True) -> None:
        self._config = config
        self._clock = clock
        self._records = records
        self._schedule_limits = schedule_limits or config.schedules
        # carried out before anything is handed out (`attach`; a Redis node's, once read: RedisNode.open_flow)
        self.flow = TopicFlow(records.settings(), clock.now_ms, config.queues.topics, config.max_paused_keys, shares,
                              max_paused_keys_total=config.max_paused_keys_total, shared=shared)
        self.pushers: Pushers | None = None
        if config.push_allow:  # pushers load aiohttp's client: only on a node that pushes
            from ..push.pusher import Pushers
            self.pushers = Pushers(clock, PushAllow.parse(config.push_allow), records.subscriptions(),
                                   config.max_subscriptions, limits=config.push, descriptors=descriptors,
                                   spans=spans, pushes_here=pushes_here)
        self.schedules: Schedules | None = None
        self.jobs: RedriveJobs | None = None

    def __repr__(self) -> str:
        return f"Features({self._records!r}, schedules={self.schedules!r}, jobs={self.jobs!r})"

    def attach(self, broker: Broker) -> None:
        """A run of `broker` begins, before it starts (see the module docstring)."""
        schedules = Schedules(self._records.schedules(), self._clock, self._schedule_limits)
        broker.on_release, broker.on_cancel = schedules.on_release, schedules.on_cancel
        broker.on_hold, schedules.holds = schedules.on_hold, broker  # (runs a pause holds back)
        self.flow.start(broker, schedules)
        self.schedules = schedules
        self.jobs = RedriveJobs(self._records.jobs(), self._clock, self._config.jobs)

    def start(self, broker: Broker, pushed_through: Backend | None = None) -> None:
        """The attached run's broker has started: the pushers push through
        `pushed_through` (a node of shards': every shard's messages; by
        default the broker's), the schedules make runs, jobs resume."""
        if self.pushers is not None:
            self.pushers.start(broker if pushed_through is None else pushed_through)
        if self.schedules is not None:
            self.schedules.start(broker)
        if self.jobs is not None:
            self.jobs.start(broker)

    async def stop_pushing(self) -> None:
        """The pushers stop (first, at any stop: what they have in flight is
        delivered again at its ack deadline)."""
        if self.pushers is not None:
            await self.pushers.stop()

    async def stop(self) -> None:
        """The run ends: nothing pushed, no schedule's run made, no job's
        slice run; the pauses no longer carried out on its broker."""
        await self.stop_pushing()
        jobs, self.jobs = self.jobs, None
        if jobs is not None:
            await jobs.stop()
        schedules, self.schedules = self.schedules, None
        if schedules is not None:
            await schedules.stop()
            schedules.close()
        self.flow.stop()
