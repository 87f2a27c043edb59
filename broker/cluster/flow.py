"""A cluster's topic settings and pauses (docs/api.md, "Flow"): kept in
the Raft group's replicated state (replication.election,
`set_topic_settings`), as the push subscriptions are, so a change
answered is on a majority and every node that comes to lead reads it
(broker.cluster.lead starts the node's TopicFlow on its broker before it
serves: a paused topic stays paused across a failover).

The entries are broker.flow.settings': one per topic with settings, one
per paused serial key (a key is at most 1 KiB), so a change is a few
entries; they go COMMAND_BYTES at most a command (the frame bound of
broker.cluster.schedules), in order.
"""

from __future__ import annotations

from replication.election import Election
from storage.errors import Unavailable

from ..flow.settings import Changes, TopicSettings, rows
from .schedules import COMMAND_BYTES


class RaftTopicSettings:
    """broker.flow.keeper's SettingsStore over the Raft group's state."""

    def __init__(self, election: Election) -> None:
        self._election = election

    def __repr__(self) -> str:
        return f"RaftTopicSettings({len(self._election.topic_settings())} entries)"

    def load(self) -> dict[str, TopicSettings]:
        return rows(self._election.topic_settings())

    async def save(self, settings: dict[str, TopicSettings], changes: Changes) -> None:
        """The entries that changed (`changes`: those of one change),
        replicated; Unavailable if a majority did not commit them in time."""
        current = self._election.topic_settings()
        changed = [(k, v) for k, v in sorted(changes.items()) if current.get(k) != v]
        command: list[tuple[str, bytes | None]] = []
        size = 0
        for key, value in changed:
            cost = len(key) + (0 if value is None else len(value))
            if command and size + cost > COMMAND_BYTES:
                await self._send(command)
                command, size = [], 0
            command.append((key, value))
            size += cost
        if command:
            await self._send(command)

    async def _send(self, command: list[tuple[str, bytes | None]]) -> None:
        if not await self._election.set_topic_settings(command):
            raise Unavailable("the topic settings did not reach a majority of the cluster in time; retry")
