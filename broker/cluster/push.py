"""A cluster's push subscriptions (docs/api.md, "Push delivery"): kept in
the Raft group's replicated state (replication.election,
`set_subscription`), so a subscribe answered is on a majority and every
node that comes to lead reads it; only the leader pushes (broker.push.pusher's
`Pushers`, started when it starts leading and stopped when it stands
down). A delivery in flight when the leader goes is CONSUMING in the log:
the next leader delivers it again at its ack deadline (at least once)."""

from __future__ import annotations

import orjson

from replication.election import Election
from storage.errors import Unavailable

from ..push.rules import Subscription


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
        """Each topic whose subscription changed, replicated; Unavailable
        if a majority did not commit it in time."""
        current = self._election.subscriptions()
        for topic in sorted(set(current) | set(subscriptions)):
            new = subscriptions.get(topic)
            stored = None if new is None else orjson.dumps(new.stored())
            if current.get(topic) != stored and not await self._election.set_subscription(topic, stored):
                raise Unavailable("the push subscription did not reach a majority of the cluster in time; retry")
