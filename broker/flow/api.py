"""The flow endpoints (docs/api.md, "Flow"), beside camellia's under the
same prefix and answered the same way (broker.http.api: the outcome's code
in an HTTP 200):

    POST /camellia/delayQueue/setTopicConfig  -> data: the topic's settings
    GET  /camellia/delayQueue/getTopicConfig  -> data: the topic's settings
    POST /camellia/delayQueue/pauseTopic      -> data: the topic's settings
    POST /camellia/delayQueue/resumeTopic     -> data: the topic's settings

Bad parameters, and settings this build does not carry out yet: code 400
naming the parameter, nothing stored (broker.flow.settings); a setting
the node's backend does not carry out (Redis: fairness=fairKey): code 400
saying so, nothing stored; past --max-topics or
--max-paused-keys: 429; no broker serving here: 503.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from storage.errors import HourglassError, InvalidRequest, LimitReached, Unavailable

from ..core import params
from ..core.bodies import BodyLimits
from ..http.api import answer
from ..http.commands import EVERY_SHARD, HERE, CommandTable, ErrorTable
from ..http.http_types import Request, Response
from ..http.paths import PREFIX
from .keeper import TopicFlow
from .settings import TopicConfig, TopicSettings, parse_config, parse_pause


class NotSupported(HourglassError):
    """This kind of node does not carry the call out (code 400, nothing stored)."""


FLOW_ERRORS: ErrorTable = (
    (InvalidRequest, 400, 200),
    (NotSupported, 400, 200),
    (LimitReached, 429, 429),
    (Unavailable, 503, 503),
)


class FlowApi:
    """The flow calls over the node's `TopicFlow` (None: none here, with
    `refusal` saying why, or no backend serving yet: 503)."""

    def __init__(self, flow: Callable[[], TopicFlow | None], bodies: BodyLimits, max_msg_bytes: int,
                 refusal: str | None = None, unsupported: Callable[[TopicConfig], str | None] | None = None) -> None:
        self._flow = flow
        # Why this node refuses a setting (code 400, nothing stored): one its
        # backend does not carry out (Redis: broker.nodes.RedisNode); None: none.
        self._unsupported = unsupported
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes
        self._refusal = refusal

    def add_routes(self, table: CommandTable) -> None:
        table.add("POST", PREFIX + "setTopicConfig", self.set_config, where=EVERY_SHARD, errors=FLOW_ERRORS)
        table.add("GET", PREFIX + "getTopicConfig", self.get_config, where=HERE, errors=FLOW_ERRORS)  # (alike on all)
        table.add("POST", PREFIX + "pauseTopic", self.pause, where=EVERY_SHARD, errors=FLOW_ERRORS)
        table.add("POST", PREFIX + "resumeTopic", self.resume, where=EVERY_SHARD, errors=FLOW_ERRORS)

    def flow(self, call: str) -> TopicFlow:
        flow = self._flow()
        if flow is None:
            if self._refusal is not None:
                raise NotSupported(f"{call} {self._refusal}")
            raise Unavailable("no broker runs on this node yet; retry")
        return flow

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type,
                                     self._bodies, self._max_msg_bytes)

    async def set_config(self, request: Request) -> Response:
        given = self._params(request)
        flow = self.flow("setTopicConfig")
        config = parse_config(given, await flow.fresh(params.parse_topic(given).topic))
        if self._unsupported is not None:
            refused = self._unsupported(config)
            if refused is not None:
                raise NotSupported(refused)
        return answer(200, "success", data=(await flow.set_config(config)).public())

    async def get_config(self, request: Request) -> Response:
        topic = params.parse_topic(self._params(request)).topic
        return answer(200, "success", data=(await self.flow("getTopicConfig").fresh(topic)).public())

    async def pause(self, request: Request) -> Response:
        pause = dataclasses.replace(parse_pause(self._params(request)), at_ms=request.at_ms)
        return answer(200, "success", data=_public(await self.flow("pauseTopic").pause(pause), pause.key))

    async def resume(self, request: Request) -> Response:
        pause = dataclasses.replace(parse_pause(self._params(request)), at_ms=request.at_ms)
        return answer(200, "success", data=_public(await self.flow("resumeTopic").resume(pause), pause.key))


def _public(settings: TopicSettings, key: str | None) -> dict[str, object]:
    """A pause's or resume's answer: the topic's settings, or with a key, that key's (TopicSettings.public_of_key)."""
    return settings.public() if key is None else settings.public_of_key(key)
