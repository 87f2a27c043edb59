"""Push delivery's endpoints (docs/api.md, "Push delivery"), beside
camellia's under the same prefix and answered the same way (broker.api):

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

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson

from storage.errors import Forbidden, InvalidRequest, LimitReached, NotFound, Unavailable

from . import params
from .api import Router, answer
from .bodies import BodyLimits
from .httpd import Request, Response, StreamResponse
from .paths import PREFIX
from .push_rules import PushAllow, parse_subscribe

if TYPE_CHECKING:  # aiohttp's client loads only on a node that pushes
    from .pusher import Pushers


class PushApi:
    """subscribe, unsubscribe, getSubscription over the node's `Pushers`
    (None: push is off, --push-allow being empty, or no backend serves
    on this node now, answered 503)."""

    def __init__(self, pushers: Callable[[], Pushers | None], allow: PushAllow, bodies: BodyLimits,
                 max_msg_bytes: int, refusal: str | None = None) -> None:
        self._pushers = pushers
        self._allow = allow
        self._refusal = refusal  # why this kind of node pushes nothing (403), if it does not
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes

    def add_routes(self, router: Router) -> None:
        router.add("POST", PREFIX + "subscribe", self._handler(self.subscribe))
        router.add("POST", PREFIX + "unsubscribe", self._handler(self.unsubscribe))
        router.add("GET", PREFIX + "getSubscription", self._handler(self.get_subscription))

    def _handler(self, handle: Callable[[Request], Awaitable[Response]]
                 ) -> Callable[[Request], Awaitable[Response | StreamResponse]]:
        async def run(request: Request) -> Response | StreamResponse:
            try:
                return await handle(request)
            except InvalidRequest as e:
                return answer(400, str(e))
            except NotFound as e:
                return answer(404, str(e))
            except Forbidden as e:  # the API's outcome: code 403 in an HTTP 200
                return Response(200, orjson.dumps({"code": 403, "msg": str(e)}))
            except LimitReached as e:
                return answer(429, str(e))
            except Unavailable as e:
                return answer(503, str(e))
        return run

    def pushers(self, topic: str) -> Pushers:
        pushers = self._pushers()
        if pushers is None:
            if self._refusal is not None:
                raise NotFound(f"topic {topic!r} has no push subscription ({self._refusal})")
            if not self._allow:
                raise NotFound(f"topic {topic!r} has no push subscription (push is off: no --push-allow)")
            raise Unavailable("no broker runs on this node yet; retry")
        return pushers

    def _params(self, request: Request) -> params.Params:
        if request.method == "GET":
            return params.query_params(request.query, self._bodies)
        return params.body_params(request.body, request.content_type, self._bodies, self._max_msg_bytes)

    async def subscribe(self, request: Request) -> Response:
        subscription = parse_subscribe(self._params(request), self._allow)  # 403 with push off
        if self._refusal is not None:
            raise Forbidden(self._refusal)
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
