"""The HTTP API (SPEC.md section 2): camellia-delay-queue's paths, parameter
names and answers, over `broker.service.Broker`.

    POST /camellia/delayQueue/sendMsg          -> delayMsg
    POST /camellia/delayQueue/sendMsgBatch     -> delayMsgList (JSON body)
    POST /camellia/delayQueue/deleteMsg
    POST /camellia/delayQueue/pullMsg          -> delayMsgList
    POST /camellia/delayQueue/longPollingMsg   -> delayMsgList
    POST /camellia/delayQueue/ackMsg           (ack=false: nack)
    POST /camellia/delayQueue/getMsg           -> delayMsg
    GET  /camellia/delayQueue/getMonitorData   -> data
    GET  /camellia/delayQueue/getTopicInfo     -> data
    GET  /camellia/delayQueue/getTopicInfoList -> data

Parameters: a form body (application/x-www-form-urlencoded) or a JSON
object body for POST, the query string for GET; validated by
`broker.params`. Every answer is a JSON object with `code` and `msg`, HTTP
status = code: 200; 400 (a bad parameter, named in `msg`); 401; 404 (no
such message or topic, unknown path); 405; 413 (`msg` above
--max-msg-bytes, or a body above its cap, refused before it is read
whole); 503 (stopping); 500 (a bug, logged). A 4xx stores nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web

from storage.entry import Message
from storage.errors import InvalidRequest

from . import params
from .service import Broker, NotFound, Unavailable, new_msg_id

log = logging.getLogger("hourglass.api")

PREFIX = "/camellia/delayQueue/"
# Request bodies: %-encoding triples a message's bytes at most, JSON
# escaping (\u00XX for a control character) multiplies them by six.
BODY_SLACK_BYTES = 64 * 1024
BATCH_BODY_MIN_CAP_BYTES = 64 * 1024 * 1024


def answer(code: int, msg: str, **extra) -> web.Response:
    """Every answer is a JSON object with `code` and `msg`; status = code."""
    return web.json_response({"code": code, "msg": msg, **extra}, status=code)


def delay_msg(m: Message) -> dict:
    """camellia's DelayMsg, plus the extensions `priority` and `tag`."""
    return {"topic": m.topic, "msgId": m.msg_id, "msg": m.msg, "produceTime": m.produce_ms,
            "triggerTime": m.trigger_ms, "expireTime": m.expire_ms, "maxRetry": m.max_retry,
            "retry": m.retry, "status": int(m.status), "priority": m.priority, "tag": m.tag}


def bearer_auth(token: str | None):
    """Middleware: every path but /health needs `Authorization: Bearer
    <token>` (compared in constant time); no token configured: open."""
    expected = None if token is None else f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler):
        if expected is not None and request.path != "/health":
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                return answer(401, "missing or wrong bearer token")
        return await handler(request)
    return auth


class BodyTooLarge(Exception):
    pass


class Api:
    def __init__(self, broker: Broker, max_msg_bytes: int) -> None:
        self.broker = broker
        self.max_msg_bytes = max_msg_bytes
        self.single_cap = 6 * max_msg_bytes + BODY_SLACK_BYTES
        self.batch_cap = max(BATCH_BODY_MIN_CAP_BYTES, self.single_cap)

    def routes(self) -> list[web.RouteDef]:
        post = {"sendMsg": self.send, "sendMsgBatch": self.send_batch, "deleteMsg": self.delete,
                "pullMsg": self.pull, "longPollingMsg": self.long_poll, "ackMsg": self.ack, "getMsg": self.get}
        get = {"getMonitorData": self.monitor_data, "getTopicInfo": self.topic_info,
               "getTopicInfoList": self.topic_info_list}
        return ([web.post(PREFIX + name, self._handler(h)) for name, h in post.items()]
                + [web.get(PREFIX + name, self._handler(h)) for name, h in get.items()])

    def _handler(self, handle: Callable[[web.Request], Awaitable[web.Response]]):
        async def run(request: web.Request) -> web.Response:
            try:
                return await handle(request)
            except params.MessageTooLarge as e:
                return answer(413, str(e))
            except InvalidRequest as e:
                return answer(400, str(e))
            except BodyTooLarge as e:
                return answer(413, str(e))
            except NotFound as e:
                return answer(404, str(e))
            except Unavailable as e:
                return answer(503, str(e))
        return run

    # -- reading parameters ---------------------------------------------------------

    async def _body(self, request: web.Request, cap: int) -> bytes:
        if request.content_length is not None and request.content_length > cap:
            raise BodyTooLarge(f"request body is {request.content_length} bytes, more than {cap}")
        chunks, size = [], 0
        while chunk := await request.content.read(65536):
            size += len(chunk)
            if size > cap:
                raise BodyTooLarge(f"request body is more than {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _params(self, request: web.Request, cap: int | None = None) -> dict[str, object]:
        if request.method == "GET":
            return parse_form(request.rel_url.raw_query_string.encode("utf-8", "surrogateescape"))
        raw = await self._body(request, cap or self.single_cap)
        if request.content_type == "application/json":
            return parse_json(raw)
        return parse_form(raw)

    # -- endpoints --------------------------------------------------------------------

    async def send(self, request: web.Request) -> web.Response:
        p = await self._params(request)
        message = params.parse_send(p, now_ms=self.broker.clock.now_ms(), make_id=new_msg_id,
                                    defaults=self.broker.defaults, max_msg_bytes=self.max_msg_bytes)
        stored, = await self.broker.send([message])
        return answer(200, "success", delayMsg=delay_msg(stored))

    async def send_batch(self, request: web.Request) -> web.Response:
        raw = await self._body(request, self.batch_cap)
        body = parse_json(raw) if request.content_type == "application/json" else _batch_from_form(raw)
        batch = params.parse_send_batch(body, now_ms=self.broker.clock.now_ms(), make_id=new_msg_id,
                                        defaults=self.broker.defaults, max_msg_bytes=self.max_msg_bytes)
        stored = await self.broker.send(batch)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in stored])

    async def delete(self, request: web.Request) -> web.Response:
        await self.broker.delete(params.parse_delete(await self._params(request)))
        return answer(200, "success")

    async def pull(self, request: web.Request) -> web.Response:
        pull = params.parse_pull(await self._params(request), self.broker.defaults)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in await self.broker.pull(pull)])

    async def long_poll(self, request: web.Request) -> web.Response:
        poll = params.parse_long_poll(await self._params(request), self.broker.defaults)
        transport = request.transport

        def gone() -> bool:
            return transport is None or transport.is_closing()
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in await self.broker.long_poll(poll, gone)])

    async def ack(self, request: web.Request) -> web.Response:
        await self.broker.ack(params.parse_ack(await self._params(request)))
        return answer(200, "success")

    async def get(self, request: web.Request) -> web.Response:
        get = params.parse_get(await self._params(request))
        return answer(200, "success", delayMsg=delay_msg(await self.broker.get(get.topic, get.msg_id)))

    async def monitor_data(self, request: web.Request) -> web.Response:
        return answer(200, "success", data=self.broker.metrics.monitor_data())

    async def topic_info(self, request: web.Request) -> web.Response:
        topic = params.parse_topic(await self._params(request)).topic
        return answer(200, "success", data=await self.broker.topic_info(topic))

    async def topic_info_list(self, request: web.Request) -> web.Response:
        return answer(200, "success", data=[await self.broker.topic_info(t) for t in self.broker.topic_list()])


def parse_form(raw: bytes) -> dict[str, str]:
    """application/x-www-form-urlencoded, strictly UTF-8: a bad byte is a
    400 naming the parameter it is in. The first of a repeated key wins."""
    out: dict[str, str] = {}
    for pair in raw.split(b"&"):
        if not pair:
            continue
        key_raw, _, value_raw = pair.partition(b"=")
        key = params.decode_utf8(urllib.parse.unquote_to_bytes(key_raw.replace(b"+", b" ")), "parameter name")
        value = params.decode_utf8(urllib.parse.unquote_to_bytes(value_raw.replace(b"+", b" ")), key)
        out.setdefault(key, value)
    return out


def parse_json(raw: bytes) -> dict[str, object]:
    text = params.decode_utf8(raw, "body")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidRequest("body", f"is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body", "must be a JSON object")
    return body


def _batch_from_form(raw: bytes) -> dict[str, object]:
    """sendMsgBatch as a form: `topic` and `msgs` holding the JSON list."""
    form = parse_form(raw)
    msgs = form.get("msgs")
    if isinstance(msgs, str) and msgs:
        try:
            return {"topic": form.get("topic"), "msgs": json.loads(msgs)}
        except (ValueError, RecursionError) as e:
            raise InvalidRequest("msgs", f"is not valid JSON ({e})") from None
    return form


@web.middleware
async def json_errors(request: web.Request, handler):
    """aiohttp's own errors (unknown path, wrong method) as JSON answers;
    an unexpected exception as a logged 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return answer(e.status, e.reason)
    except Exception:
        log.exception("bug while serving %s %s", request.method, request.path)
        return answer(500, "internal error (logged)")
