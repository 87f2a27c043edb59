"""A cluster's records of the node's features (broker.node.features'
`Records`): kept in the Raft group's replicated state
(replication.election), so a change answered is on a majority and every
node that comes to lead reads it. Only the leader carries them out: the
features are attached to its broker for its term (broker.cluster.lead)
and stopped when it stands down.

    record               Raft state           written by
    topic settings and   `set_topic_settings`  `RaftTopicSettings`: one
    pauses (docs/api.md,                       entry per topic with settings,
    "Flow")                                    one per paused serial key (a
                                               key is at most 1 KiB)
    push subscriptions   `set_subscription`    `RaftSubscriptions`: one entry
                                               a topic
    recurring schedules  `set_schedules`       broker.cluster.schedules
    redriveMsgs jobs     `set_schedules`,      `RaftJobs`: one entry a job
                         ["j", "", jobId]      (passed over by the schedules)

Entries go COMMAND_BYTES at most a command (broker.cluster.schedules), in
order; a change a majority did not commit in time answers Unavailable.

A push delivery in flight when the leader goes is CONSUMING in the log:
the next leader delivers it again at its ack deadline (at least once). A
running job's progress is written at most every SAVE_EVERY_S (a Raft
command each), not every slice: a new leader resumes from the last cursor
written, passing the messages re-driven since (no longer dead: each
slice's moves are in the replicated log before its cursor is), and its
counts miss those of the slices since that write.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from replication.election import Election
from storage.errors import ContractError, InvalidRequest

from ..flow.settings import Changes, TopicSettings, rows
from ..push.rules import Subscription
from .schedules import COMMAND_BYTES, RaftScheduleStore, entry_key, not_committed, pack

# Seconds between two writes of a running job's progress.
SAVE_EVERY_S = 0.5
JOB_KIND = "j"


class RaftRecords:
    """The features' records of a cluster node, in its Raft group's state."""

    def __init__(self, election: Election) -> None:
        self._election = election

    def __repr__(self) -> str:
        return "RaftRecords()"

    def settings(self) -> RaftTopicSettings:
        return RaftTopicSettings(self._election)

    def subscriptions(self) -> RaftSubscriptions:
        return RaftSubscriptions(self._election)

    def schedules(self) -> RaftScheduleStore:
        return RaftScheduleStore(self._election)

    def jobs(self) -> RaftJobs:
        return RaftJobs(self._election)


class RaftTopicSettings:
    """broker.flow.keeper's SettingsStore over the Raft group's state."""

    def __init__(self, election: Election) -> None:
        self._election = election

    def __repr__(self) -> str:
        return f"RaftTopicSettings({len(self._election.topic_settings())} entries)"

    def load(self) -> dict[str, TopicSettings]:
        return rows(self._election.topic_settings())

    async def save(self, settings: dict[str, TopicSettings], changes: Changes) -> None:
        """The entries that changed (`changes`: those of one change), replicated, one command after another."""
        current = self._election.topic_settings()
        for command in pack([[(k, v)] for k, v in sorted(changes.items()) if current.get(k) != v]):
            if not await self._election.set_topic_settings(command):
                raise not_committed("the topic settings")


class RaftSubscriptions:
    """broker.push.pusher's SubscriptionStore over the Raft group's state."""

    def __init__(self, election: Election) -> None:
        self._election = election

    def __repr__(self) -> str:
        return f"RaftSubscriptions({sorted(self._election.subscriptions())})"

    def load(self) -> dict[str, Subscription]:
        return {topic: Subscription.from_stored(orjson.loads(raw))
                for topic, raw in self._election.subscriptions().items()}

    async def save(self, subscriptions: dict[str, Subscription]) -> None:
        """Each topic whose subscription changed, replicated."""
        current = self._election.subscriptions()
        for topic in sorted(set(current) | set(subscriptions)):
            new = subscriptions.get(topic)
            stored = None if new is None else orjson.dumps(new.stored())
            if current.get(topic) != stored and not await self._election.set_subscription(topic, stored):
                raise not_committed("the push subscription")


def job_key(job_id: str) -> str:
    return entry_key(JOB_KIND, ("", job_id))


class RaftJobs:
    """broker.jobs.runner's JobStore over the Raft group's state."""

    save_every_s = SAVE_EVERY_S

    def __init__(self, election: Election) -> None:
        self._election = election

    def __repr__(self) -> str:
        return "RaftJobs()"

    def load(self) -> list[dict[str, object]]:
        return [orjson.loads(value) for raw_key, value in self._election.schedules().items()
                if orjson.loads(raw_key)[0] == JOB_KIND]

    async def save(self, record: Mapping[str, object]) -> None:
        job_id = record["jobId"]
        assert isinstance(job_id, str)
        value = orjson.dumps(record)
        if len(value) > COMMAND_BYTES - 100:
            raise InvalidRequest("key", f"the job's filter is too long to replicate ({len(value)} bytes of record, "
                                 f"at most {COMMAND_BYTES - 100}); use shorter key, tag or msgIdPrefix")
        await self._write(job_key(job_id), value)

    async def remove(self, job_id: str) -> None:
        await self._write(job_key(job_id), None)

    async def fetch(self) -> tuple[list[dict[str, object]], set[str]] | None:
        return None  # only the leader writes them: its RAM is the truth

    async def ask_cancel(self, job_id: str) -> None:
        raise ContractError("RaftJobs is written by one node: its RedriveJobs cancels in RAM")

    async def _write(self, key: str, value: bytes | None) -> None:
        if not await self._election.set_schedules([(key, value)]):
            raise not_committed("the job's record")
