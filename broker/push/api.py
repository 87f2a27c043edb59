"""Push delivery's endpoints (docs/api.md, "Push delivery"), beside
camellia's under the same prefix and answered the same way (broker.http.api):

    POST /camellia/delayQueue/subscribe        -> data: the subscription
    POST /camellia/delayQueue/unsubscribe
    GET  /camellia/delayQueue/getSubscription  -> data: the subscription and its health

A subscription's secret is never in an answer: `signed` says whether it
has one. With --push-allow empty, or a URL it does not allow, subscribe
answers code 403 naming it, in an HTTP 200 as every API outcome (docs/api.md,
"Requests and answers"); past --max-subscriptions, code 429 (HTTP 429, a
limit, as --max-topics).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from storage.errors import Forbidden, InvalidRequest, LimitReached, NotFound, Unavailable

from ..core import params
from ..core.bodies import BodyLimits
from ..http.api import answer
from ..http.commands import EVERY_SHARD, CommandTable, ErrorTable, on_every
from ..http.http_types import Request, Response
from ..http.paths import PREFIX
from .rules import PushAllow, parse_subscribe

if TYPE_CHECKING:  # aiohttp's client loads only on a node that pushes
    from .pusher import Pushers

# What the push endpoints raise, answered as the API's (broker.http.api.API_ERRORS):
# (exception, code, HTTP status).
PUSH_ERRORS: ErrorTable = (
    (InvalidRequest, 400, 200),
    (NotFound, 404, 200),
    (Forbidden, 403, 200),  # the API's outcome: code 403 in an HTTP 200
    (LimitReached, 429, 429),
    (Unavailable, 503, 503),
)


class PushApi:
    """subscribe, unsubscribe, getSubscription over the node's `Pushers`
    (None: push is off, --push-allow being empty, or no backend serves
    on this node now, answered 503)."""

    def __init__(self, pushers: Callable[[], Pushers | None], allow: PushAllow, bodies: BodyLimits,
                 max_msg_bytes: int) -> None:
        self._pushers = pushers
        self._allow = allow
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes

    def add_routes(self, table: CommandTable) -> None:
        table.add("POST", PREFIX + "subscribe", self.subscribe, where=EVERY_SHARD, errors=PUSH_ERRORS)
        table.add("POST", PREFIX + "unsubscribe", self.unsubscribe, where=EVERY_SHARD, errors=PUSH_ERRORS)
        table.add("GET", PREFIX + "getSubscription", self.get_subscription, where=on_every("subscription"),
                  errors=PUSH_ERRORS)

    def pushers(self, topic: str) -> Pushers:
        pushers = self._pushers()
        if pushers is None:
            if not self._allow:
                raise NotFound(f"topic {topic!r} has no push subscription (push is off: no --push-allow)")
            raise Unavailable("no broker runs on this node yet; retry")
        return pushers

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type,
                                     self._bodies, self._max_msg_bytes)

    async def subscribe(self, request: Request) -> Response:
        subscription = parse_subscribe(self._params(request), self._allow)  # 403 with push off
        await self.pushers(subscription.topic).subscribe(subscription)
        return answer(200, "success", data=subscription.public())

    async def unsubscribe(self, request: Request) -> Response:
        topic = params.parse_topic(self._params(request)).topic
        if not await self.pushers(topic).unsubscribe(topic):
            raise NotFound(f"topic {topic!r} has no push subscription")
        return answer(200, "success")

    async def get_subscription(self, request: Request) -> Response:
        topic = params.parse_topic(self._params(request)).topic
        pushers = self.pushers(topic)
        described = pushers.describe(topic)
        if described is None:
            raise NotFound(f"topic {topic!r} has no push subscription")
        return answer(200, "success", data=described)
