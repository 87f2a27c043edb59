"""The flow endpoints (docs/api.md, "Flow"), beside camellia's under the
same prefix and answered the same way (broker.http.api: the outcome's code
in an HTTP 200):

    POST /camellia/delayQueue/setTopicConfig  -> data: the topic's settings
    GET  /camellia/delayQueue/getTopicConfig  -> data: the topic's settings
    POST /camellia/delayQueue/pauseTopic      -> data: the topic's settings
    POST /camellia/delayQueue/resumeTopic     -> data: the topic's settings

Bad parameters, and settings this build does not carry out yet: code 400
naming the parameter, nothing stored (broker.flow.settings); past
--max-topics or --max-paused-keys: 429; no broker serving here: 503.
"""

from __future__ import annotations

import dataclasses

from storage.errors import InvalidRequest, LimitReached, Unavailable

from ..core import params
from ..core.bodies import BodyLimits
from ..http.api import answer
from ..http.commands import EVERY_SHARD, HERE, CommandTable, ErrorTable
from ..http.http_types import Request, Response
from ..http.paths import PREFIX
from .keeper import TopicFlow
from .settings import TopicSettings, parse_config, parse_pause

FLOW_ERRORS: ErrorTable = (
    (InvalidRequest, 400, 200),
    (LimitReached, 429, 429),
    (Unavailable, 503, 503),
)


class FlowApi:
    """The flow calls over the node's `TopicFlow` (no backend serving it
    yet: 503)."""

    def __init__(self, flow: TopicFlow, bodies: BodyLimits, max_msg_bytes: int) -> None:
        self._flow = flow
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes

    def add_routes(self, table: CommandTable) -> None:
        table.add("POST", PREFIX + "setTopicConfig", self.set_config, where=EVERY_SHARD, errors=FLOW_ERRORS)
        table.add("GET", PREFIX + "getTopicConfig", self.get_config, where=HERE, errors=FLOW_ERRORS)  # (alike on all)
        table.add("POST", PREFIX + "pauseTopic", self.pause, where=EVERY_SHARD, errors=FLOW_ERRORS)
        table.add("POST", PREFIX + "resumeTopic", self.resume, where=EVERY_SHARD, errors=FLOW_ERRORS)

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type,
                                     self._bodies, self._max_msg_bytes)

    async def set_config(self, request: Request) -> Response:
        given = self._params(request)
        flow = self._flow
        config = parse_config(given, await flow.fresh(params.parse_topic(given).topic))
        return answer(200, "success", data=(await flow.set_config(config)).public())

    async def get_config(self, request: Request) -> Response:
        topic = params.parse_topic(self._params(request)).topic
        return answer(200, "success", data=(await self._flow.fresh(topic)).public())

    async def pause(self, request: Request) -> Response:
        pause = dataclasses.replace(parse_pause(self._params(request)), at_ms=request.at_ms)
        return answer(200, "success", data=_public(await self._flow.pause(pause), pause.key))

    async def resume(self, request: Request) -> Response:
        pause = dataclasses.replace(parse_pause(self._params(request)), at_ms=request.at_ms)
        return answer(200, "success", data=_public(await self._flow.resume(pause), pause.key))


def _public(settings: TopicSettings, key: str | None) -> dict[str, object]:
    """A pause's or resume's answer: the topic's settings, or with a key, that key's (TopicSettings.public_of_key)."""
    return settings.public() if key is None else settings.public_of_key(key)
