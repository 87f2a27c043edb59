"""The HTTP API (docs/api.md): camellia-delay-queue's paths, parameter
names and answers, over a `broker.backend.Backend` (the disk broker or Redis).

    POST /camellia/delayQueue/sendMsg          -> delayMsg
    POST /camellia/delayQueue/sendMsgBatch     -> delayMsgList (JSON body)
    POST /camellia/delayQueue/deleteMsg
    POST /camellia/delayQueue/pullMsg          -> delayMsgList
    POST /camellia/delayQueue/longPollingMsg   -> delayMsgList
    POST /camellia/delayQueue/ackMsg           (ack=false: nack; msgIds: many -> results;
                                                deliveryId(s): fenced, 409 when stale)
    POST /camellia/delayQueue/extendMsg        -> deadline (msgIds: results; 409 when stale)
    POST /camellia/delayQueue/getMsg           -> delayMsg
    GET  /camellia/delayQueue/getMonitorData   -> data
    GET  /camellia/delayQueue/getTopicInfo     -> data
    GET  /camellia/delayQueue/getTopicInfoList -> data
    GET  /camellia/delayQueue/getMonitorString -> text: JSON (broker.observe.camellia_metrics)
    GET|POST /camellia/delayQueue/listMsg      -> delayMsgList, cursor; or count (broker.core.bulk_params)
    POST /camellia/delayQueue/deleteMsgs       -> deleted, more
    POST /camellia/delayQueue/rescheduleMsgs   -> rescheduled, more

Parameters: a form body (application/x-www-form-urlencoded) or a JSON
object body for POST, the query string for GET; validated by
`broker.core.params`. Every answer is a JSON object with `code` and `msg`. As
camellia's server, the API's outcomes come with HTTP 200 and the code in
the body: 200; 400 (a bad parameter, named in `msg`); 404 (no such
message); 413 (`msg` above --max-msg-bytes). Other HTTP statuses are for
what a client should take as the node's problem: 401 (token), 404 (no
such path), 405, 413 (a body above its cap, refused before it is read, or
above its form pairs, JSON structure or --max-batch-msgs, refused before
it is decoded: `broker.core.bodies`), 429 (a limit: the body budget, a new
topic past --max-topics), 503 (stopping, no leader),
500 (a bug, logged). An answer other than code 200 stores nothing.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Protocol, TypeVar

import orjson

from storage.entry import Fields, Message, Status
from storage.errors import BodyTooLarge, Conflict, InvalidRequest, InvariantError, LimitReached, NotFound, Unavailable

from ..backend import Backend, new_msg_id
from ..core import bulk_params, params
from ..core.bodies import MAX_SEND_BATCH, BodyLimits
from ..core.delay_msg import delay_msg
from ..core.leases import delivery_id
from ..core.transitions import Fencing, Refusal
from ..core.turns import Turns
from ..observe import camellia_metrics
from ..observe.tracing import Spans
from .commands import NODE, CommandTable, ErrorTable
from .health import ServingStatus
from .http_types import Handler, Request, Response, StreamResponse
from .paths import PREFIX
from .sessions import CONSOLE, LOGIN_PATH, LOGIN_PATHS, ConsoleSessions, session_cookie

log = logging.getLogger("hourglass.api")


# Codes answered with HTTP 200, the code in the body, as camellia does: its
# SDK takes any other HTTP status for a failed server (throws, tries another).
IN_BODY_CODES = frozenset((200, 400, 404, 409, 413))


def _status(status: Status | None) -> int | None:
    return None if status is None else int(status)


def _refused(request: params.FencedRequest, at: int, outcome: Fencing) -> str:
    """The 409 of a fenced call's msgId, naming what was refused."""
    given = delivery_id(request.deliveries[at])
    if outcome.refusal is Refusal.LEASE_CAP:
        return (f"ackTimeoutMillis: would hold message {request.msg_ids[at]!r} past --max-lease-ms "
                f"({request.max_lease_ms} ms) since its hand-over {given}")
    why = ("no such message" if outcome.status is None else "it is not consuming" if outcome.status is not
           Status.CONSUMING else "it was handed over again since")
    return f"deliveryId: {given} is not the current delivery of message {request.msg_ids[at]!r} ({why})"


def answer(code: int, msg: str, **extra: object) -> Response:
    """Every answer is a JSON object with `code` and `msg`. HTTP status 200
    for the API's outcomes (IN_BODY_CODES); the code itself for what the
    client should treat as the node's problem (401, 404 no such path, 405,
    429, 503, 500)."""
    return Response(200 if code in IN_BODY_CODES else code, orjson.dumps({"code": code, "msg": msg, **extra}))


# What the API's handlers raise, answered as `answer` would (the code in the
# body, HTTP 200 for IN_BODY_CODES), by the frame that runs them
# (broker.http.httpd). The first row an error is an instance of answers it.
API_ERRORS: ErrorTable = (
    (params.MessageTooLarge, 413, 200),  # (an InvalidRequest: before it)
    (InvalidRequest, 400, 200),
    (BodyTooLarge, 413, 413),  # HTTP 413 as for a body over its byte cap: too large for this node
    (NotFound, 404, 200),
    (Conflict, 409, 200),
    (Unavailable, 503, 503),
    (LimitReached, 429, 429),
)


def console_auth(sessions: ConsoleSessions) -> Callable[[Request], bool]:
    """Whether a console path (/console, /console/*) without the bearer
    token is let in, decided on the head (broker.http.gate): with a live console
    session in the cookie `hg_console` (broker.http.sessions; never the
    token itself). The login and logout (broker.console.login) check for
    themselves, and `GET /console` is console_entry's to answer."""
    def valid(request: Request) -> bool:
        path = request.path
        if path in LOGIN_PATHS or (path == CONSOLE and request.method == "GET"):
            return True
        return sessions.valid(session_cookie(request.headers.get("cookie", "")))
    return valid


def console_entry(token: str | None, sessions: ConsoleSessions | None, handler: Handler) -> Handler:
    """`GET /console` without a session (or the bearer token):
    `?token=<token>` trades the token for a new session once (303 to
    /console with the cookie set, the token gone from the address), a
    wrong one is 401, and none sends the browser to the login form."""
    if token is None or sessions is None:
        return handler
    expected = token.encode()

    def matches(given: str) -> bool:
        return hmac.compare_digest(given.strip().encode("latin-1", "replace"), expected)

    async def entry(request: Request) -> Response | StreamResponse:
        if sessions.valid(session_cookie(request.headers.get("cookie", ""))):
            return await handler(request)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and matches(given):
            return await handler(request)
        query = params.parse_form(request.query).get("token") if request.query else None
        if query is None:
            return Response(303, b"", headers={"Location": LOGIN_PATH, "Cache-Control": "no-store"})
        if isinstance(query, str) and matches(query):
            return Response(303, b"", headers={"Location": CONSOLE, "Cache-Control": "no-store",
                                               "Set-Cookie": sessions.set_cookie(sessions.create())})
        return answer(401, "missing or wrong bearer token")
    return entry


# The text of the sends one turn of the loop joins at most (one record: far
# below storage.types.MAX_RECORD_CHARS; a send larger goes alone).
TURN_CHARS = 4 * 1024 * 1024


def _send_chars(send: params.NewSend) -> int:
    return len(send.message.msg)


def _msg_id_of_send(send: params.NewSend) -> str:
    return send.message.msg_id


_SUCCESS = answer(200, "success")  # (a Response is not changed once made: one serves every such answer)

Parsed = TypeVar("Parsed")


async def in_runs(requests: list[Request], parse: Callable[[Request], Parsed],
                  key: Callable[[Parsed], Hashable | None],
                  together: Callable[[list[Parsed]], Awaitable[list[Response]]],
                  alone: Callable[[Parsed], Awaitable[Response]],
                  ident: Callable[[Parsed], Hashable] | None = None) -> list[Response | Exception]:
    """A pipelined run of one command's requests (broker.http.commands.Command.batch),
    each answered as it would be alone, one after the other: each parsed
    alone (what its parsing raises is its own answer, and changes nothing);
    those in a row of one `key` carried out `together` (a key None: `alone`;
    an `ident` seen already in the group starts the next, as a batch stores
    a repeated id otherwise than two requests in turn); a group the backend
    refuses whole carried out again one at a time, so that each request
    meets what it alone would have met."""
    outcomes: list[Response | Exception | None] = []
    group: list[tuple[int, Parsed]] = []
    group_key: Hashable | None = None
    idents: set[Hashable] = set()

    async def one(at: int, item: Parsed) -> None:
        try:
            outcomes[at] = await alone(item)
        except Exception as error:
            outcomes[at] = error

    async def carry_out() -> None:
        if len(group) > 1:
            try:
                answers = await together([item for _, item in group])
            except Exception:  # (nothing of a refused batch is kept: each goes alone)
                for at, item in group:
                    await one(at, item)
            else:
                for (at, _), response in zip(group, answers):
                    outcomes[at] = response
        elif group:
            await one(*group[0])
        group.clear()
        idents.clear()

    for at, request in enumerate(requests):
        try:
            item = parse(request)
        except Exception as error:
            outcomes.append(error)
            continue
        outcomes.append(None)  # (its place, answered below)
        item_key = key(item)
        item_ident = None if ident is None else ident(item)
        if group and (item_key is None or item_key != group_key or item_ident in idents):
            await carry_out()
        group.append((at, item))
        group_key = item_key
        if item_ident is not None:
            idents.add(item_ident)
    await carry_out()
    return [InvariantError("a request of a run left unanswered") if o is None else o for o in outcomes]


class NodeViews(Protocol):
    """What a node of many shards answers for all of them (broker.shards.backend.ShardedBackend)."""

    async def monitor_data(self) -> dict[str, object]: ...

    async def all_topics(self) -> list[str]: ...


class Api:
    """camellia's endpoints over a backend. `broker` may be None (a cluster
    node that does not lead yet, broker.node.cluster): requests are then
    answered 503 by `backend`, though such a node forwards them instead.
    A cluster node hands it the broker it runs while it leads
    (`serve_with`) and takes it back when it stands down (`stop_serving`)."""

    def __init__(self, broker: Backend | None, max_msg_bytes: int, bodies: BodyLimits | None = None,
                 serving: ServingStatus | None = None, page_bytes: int = bulk_params.DEFAULT_PAGE_BYTES,
                 spans: Spans | None = None) -> None:
        self._broker = broker
        # A span of each send and each message a pull answers (broker.observe.tracing);
        # None: off, and the requests make no call more.
        self.spans = spans
        self.serving = serving  # going offline ends the long polls held (broker.http.health)
        self.max_msg_bytes = max_msg_bytes
        self.page_bytes = page_bytes  # a listMsg page's answer at most (--max-page-bytes)
        self.bodies = bodies or BodyLimits()  # what decoding a body may cost (broker.core.bodies)
        self.single_cap = BodyLimits.body_bytes(max_msg_bytes)
        self.batch_cap = self.bodies.batch_body_bytes(max_msg_bytes)
        # Which of these scheduleIds are schedules of the topic (the node's:
        # broker.node.base); a send under one's run msgId is refused. None:
        # no schedules here.
        self.scheduled: Callable[[str, Sequence[str]], Awaitable[set[str]]] | None = None
        # A new msgId for a send without one (a node of many shards: one this shard owns).
        self.make_id: Callable[[], str] = new_msg_id
        # The node's whole views where the backend is one shard's engine of many (broker.shards.backend).
        self.views: NodeViews | None = None
        # A topic's `paused` for getTopicInfo (the node's pauses: broker.flow); None: none kept.
        self.paused: Callable[[str], bool | list[str] | None] = lambda topic: None
        # The sends of a topic, and its acks (or nacks), that start in one
        # turn of the loop -- from any connections -- carried out as one
        # (broker.core.turns: one record, one commit).
        # Only on a backend whose calls are one commit however many they
        # carry (the disk broker: `add_routes`' `inline`); the Redis
        # backend's acks are a script each, best run side by side.
        self._joins = False
        self._sends: Turns[str, params.NewSend, Message] = Turns(
            self._send_together, MAX_SEND_BATCH, _send_chars, TURN_CHARS)
        self._acks: Turns[tuple[str, bool], str, Status | None] = Turns(self._ack_together, params.MAX_ACK_BATCH)

    def __repr__(self) -> str:
        return f"Api({self._broker!r}, max_msg_bytes={self.max_msg_bytes})"

    @property
    def broker(self) -> Backend | None:
        """The backend requests go to (None: none runs on this node now)."""
        return self._broker

    def serve_with(self, broker: Backend) -> None:
        """Send requests to `broker` from now on."""
        self._broker = broker

    def stop_serving(self) -> None:
        """Answer requests 503 from now on: no backend runs on this node."""
        self._broker = None

    def wake_long_polls(self) -> None:
        """Answer every long poll held now (going offline, broker.http.health)."""
        if self._broker is not None:
            self._broker.wake_all()

    @property
    def backend(self) -> Backend:
        """The backend serving requests now; Unavailable (503) if none."""
        if self._broker is None:
            raise Unavailable("no broker runs on this node yet; retry")
        return self._broker

    def add_routes(self, table: CommandTable, inline: bool) -> None:
        """camellia's paths, answered with API_ERRORS. `inline`: the
        backend's calls ask for no current Task before they first wait (the
        disk broker's; not redis-py's), so a request may start in the
        connection's frame (broker.http.commands.Command), and the sends
        and acks of one turn of the loop are joined (broker.core.turns)."""
        self._joins = inline
        post = {"sendMsg": self.send, "sendMsgBatch": self.send_batch, "importMsgBatch": self.import_batch,
                "deleteMsg": self.delete,
                "pullMsg": self.pull, "longPollingMsg": self.long_poll, "ackMsg": self.ack, "getMsg": self.get,
                "rescheduleMsg": self.reschedule, "redriveMsg": self.redrive, "listMsg": self.list_msgs,
                "deleteMsgs": self.delete_msgs, "rescheduleMsgs": self.reschedule_msgs, "extendMsg": self.extend}
        get = {"getMonitorData": self.monitor_data, "getTopicInfo": self.topic_info,
               "getTopicInfoList": self.topic_info_list, "getMonitorString": self.monitor_string,
               "listDeadMsg": self.list_dead, "listMsg": self.list_msgs, "exportMsg": self.export_msgs}
        runs = {"sendMsg": self.send_run, "ackMsg": self.ack_run}
        for method, handlers in (("POST", post), ("GET", get)):
            for name, handle in handlers.items():
                table.add(method, PREFIX + name, handle, where=NODE, errors=API_ERRORS, inline=inline,
                          body_cap=self.batch_cap if name in ("sendMsgBatch", "importMsgBatch") else self.single_cap,
                          batch=runs.get(name) if method == "POST" else None)

    # -- reading parameters: broker.core.params turns a request's bytes into them -----------

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type, self.bodies,
                                     self.max_msg_bytes)

    # -- endpoints --------------------------------------------------------------------

    # The message requests (send ... get) call the backend's part that
    # serves them (`requests`), not the backend's methods that forward to it.

    async def send(self, request: Request) -> Response:
        backend = self._broker or self.backend  # (the property raises Unavailable when none)
        now_ms = backend.clock.now_ms()
        return await self._send_one(self._parse_send(backend, request, now_ms), now_ms)

    def _parse_send(self, backend: Backend, request: Request, now_ms: int) -> params.NewSend:
        given = self._params(request)
        headers = request.headers
        if "traceparent" in headers or "tracestate" in headers:  # W3C trace context as headers
            given = params.with_trace_headers(given, headers)
        return params.parse_send(given, now_ms=now_ms, make_id=self.make_id,
                                 defaults=backend.defaults, max_msg_bytes=self.max_msg_bytes)

    async def _send_one(self, send: params.NewSend, now_ms: int, join: bool = True) -> Response:
        """One send: joined with the topic's sends of this turn of the loop
        (`join`, on a backend that joins), else stored alone."""
        if "@" in send.message.msg_id:
            await self._refuse_run_ids([send], batch=False)
        if join and self._joins:
            stored, = await self._sends.join(send.message.topic, (send,))
        else:
            stored, = await self._send_together(send.message.topic, [send], now_ms)
        return answer(200, "success", delayMsg=delay_msg(stored))

    async def _send_together(self, topic: str, sends: list[params.NewSend], now_ms: int | None = None) -> list[Message]:
        """Sends of a topic as one batch: those that joined one turn of the
        loop (`_sends`: stored at the turn's time, never before any was
        read), or one request's."""
        backend = self.backend
        if now_ms is None:
            now_ms = backend.clock.now_ms()
        stored = await backend.requests.send(sends, now_ms)
        if self.spans is not None:
            self.spans.sent(stored, now_ms)
        return stored

    async def _ack_together(self, kind: tuple[str, bool], msg_ids: list[str]) -> list[Status | None]:
        """The acks (or nacks) of a topic that joined one turn of the loop (`_acks`): one `ack_many`."""
        topic, ack = kind
        return await self.backend.requests.ack_many(topic, msg_ids, ack)

    async def send_run(self, requests: list[Request]) -> list[Response | Exception]:
        """sendMsg's pipelined run (broker.http.commands.Command.batch): each
        request parsed alone (a bad one answers its own 400), the sends of
        one topic in a row stored as one batch (one record, one commit),
        each answered as sendMsg answers it."""
        backend = self._broker or self.backend
        clock = backend.clock

        def parse(request: Request) -> params.NewSend:
            return self._parse_send(backend, request, clock.now_ms())

        def topic_of(send: params.NewSend) -> str | None:  # (a schedule's run id is checked alone)
            return None if "@" in send.message.msg_id else send.message.topic

        async def together(sends: list[params.NewSend]) -> list[Response]:
            topic = sends[0].message.topic
            stored = await (self._sends.join(topic, sends) if self._joins else self._send_together(topic, sends))
            return [answer(200, "success", delayMsg=delay_msg(m)) for m in stored]

        return await in_runs(requests, parse, topic_of, together,
                             lambda send: self._send_one(send, clock.now_ms(), join=False),
                             _msg_id_of_send)

    async def send_batch(self, request: Request) -> Response:
        backend = self.backend
        now_ms = backend.clock.now_ms()
        batch = params.parse_send_batch_body(request.body, request.content_type, limits=self.bodies,
                                             now_ms=now_ms, make_id=self.make_id,
                                             defaults=backend.defaults, max_msg_bytes=self.max_msg_bytes)
        await self._refuse_run_ids(batch, batch=True)
        stored = await backend.requests.send(batch, now_ms)
        if self.spans is not None:
            self.spans.sent(stored, now_ms)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in stored])

    async def import_batch(self, request: Request) -> Response:
        """importMsgBatch: sendMsgBatch's, each message's status and retry kept (an import's)."""
        backend = self.backend
        now_ms = backend.clock.now_ms()
        batch = params.parse_import_batch_body(request.body, limits=self.bodies, now_ms=now_ms,
                                               make_id=self.make_id, defaults=backend.defaults,
                                               max_msg_bytes=self.max_msg_bytes)
        await self._refuse_run_ids(batch, batch=True)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in await backend.requests.send(batch, now_ms)])

    async def _refuse_run_ids(self, sends: Sequence[params.NewSend], batch: bool) -> None:
        """InvalidRequest (400, nothing stored) if a send's msgId is a run's
        of one of the topic's schedules (docs/api.md, "Recurring schedules")."""
        found = params.run_schedule_ids(sends)
        if not found or self.scheduled is None:
            return
        scheduled = await self.scheduled(sends[0].message.topic, [sid for _, sid in found])
        refusal = params.run_id_taken(sends, found, scheduled, batch)
        if refusal is not None:
            raise refusal

    async def delete(self, request: Request) -> Response:
        await self.backend.requests.delete(params.parse_delete(self._params(request)))
        return answer(200, "success")

    async def pull(self, request: Request) -> Response:
        backend = self._broker or self.backend
        pull = params.parse_pull(self._params(request), backend.defaults)
        pulled = await backend.requests.pull(pull)
        if self.spans is not None:
            self.spans.received(pulled)
        return answer(200, "success", delayMsgList=list(map(delay_msg, pulled)))

    async def long_poll(self, request: Request) -> Response:
        backend = self.backend
        poll = params.parse_long_poll(self._params(request), backend.defaults)
        gone = request.gone
        if self.serving is not None:  # going offline answers it now, as if the client had gone
            ended = self.serving.ends_long_poll()
            gone = lambda: request.gone() or ended()  # noqa: E731
        pulled = await backend.requests.long_poll(poll, gone)
        if self.spans is not None:
            self.spans.received(pulled)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in pulled])

    async def ack(self, request: Request) -> Response:
        backend = self._broker or self.backend
        return await self._ack_one(backend, params.parse_ack(self._params(request)))

    async def ack_run(self, requests: list[Request]) -> list[Response | Exception]:
        """ackMsg's pipelined run (broker.http.commands.Command.batch): each
        request parsed alone, the acks (or nacks) of one topic in a row
        carried out as one `ack_many` (one record, one commit)."""
        backend = self._broker or self.backend

        def parse(request: Request) -> params.AckRequest | params.AckManyRequest | params.FencedRequest:
            return params.parse_ack(self._params(request))

        def kind(ack: params.AckRequest | params.AckManyRequest | params.FencedRequest) -> tuple[str, bool] | None:
            return (ack.topic, ack.ack) if isinstance(ack, params.AckRequest) else None

        async def together(acks: list[params.AckRequest | params.AckManyRequest | params.FencedRequest]
                           ) -> list[Response]:
            first = acks[0]
            if not isinstance(first, params.AckRequest):
                raise InvariantError("a run of acks joins single acks only")  # (`kind`)
            ids = [a.msg_id for a in acks if isinstance(a, params.AckRequest)]
            await (self._acks.join((first.topic, first.ack), ids) if self._joins
                   else backend.requests.ack_many(first.topic, ids, first.ack))
            return [_SUCCESS] * len(acks)

        return await in_runs(requests, parse, kind, together, lambda ack: self._ack_one(backend, ack, join=False))

    async def _ack_one(self, backend: Backend, ack: params.AckRequest | params.AckManyRequest | params.FencedRequest,
                       join: bool = True) -> Response:
        """One ackMsg: a single ack joined with the topic's acks of this turn
        of the loop (`join`, on a backend that joins), else alone; one with
        deliveryIds fenced (`_fenced`)."""
        if isinstance(ack, params.FencedRequest):
            return await self._fenced(backend, ack)
        if isinstance(ack, params.AckManyRequest):
            after = await backend.requests.ack_many(ack.topic, ack.msg_ids, ack.ack)
            return answer(200, "success", results=[
                {"msgId": msg_id, "status": None if status is None else int(status)}
                for msg_id, status in zip(ack.msg_ids, after)])
        if join and self._joins:
            await self._acks.join((ack.topic, ack.ack), (ack.msg_id,))
        else:
            await backend.requests.ack(ack)
        return _SUCCESS

    async def extend(self, request: Request) -> Response:
        backend = self.backend
        return await self._fenced(backend, params.parse_extend(self._params(request), backend.defaults))

    async def _fenced(self, backend: Backend, request: params.FencedRequest) -> Response:
        """An ackMsg with deliveryIds, or an extendMsg (docs/api.md, "Leases"):
        one msgId's answered 200, or 409 naming its deliveryId; msgIds' a
        result per id."""
        outcomes = await backend.requests.fenced(request)
        extend = request.kind is params.Fenced.EXTEND
        if not request.many:
            outcome = outcomes[0]
            if outcome.refusal is not None:
                return answer(409, _refused(request, 0, outcome), status=_status(outcome.status))
            return answer(200, "success", deadline=outcome.deadline_ms) if extend else _SUCCESS
        results: list[dict[str, object]] = []
        for at, (msg_id, outcome) in enumerate(zip(request.msg_ids, outcomes)):
            result: dict[str, object] = {"msgId": msg_id, "status": _status(outcome.status)}
            if outcome.refusal is not None:
                result["code"], result["msg"] = 409, _refused(request, at, outcome)
            else:
                result["code"] = 200
                if extend:
                    fields: Fields = outcome  # (by index: its int as it is, not boxed anew a row)
                    result["deadline"] = fields[2]
            results.append(result)
        return answer(200, "success", results=results)

    async def get(self, request: Request) -> Response:
        get = params.parse_get(self._params(request))
        return answer(200, "success", delayMsg=delay_msg(await self.backend.requests.get(get.topic, get.msg_id)))

    async def reschedule(self, request: Request) -> Response:
        backend = self.backend
        r = params.parse_reschedule(self._params(request), backend.clock.now_ms())
        return answer(200, "success", delayMsg=delay_msg(await backend.reschedule(r.topic, r.msg_id, r.trigger_ms)))

    async def list_dead(self, request: Request) -> Response:
        r = params.parse_list_dead(self._params(request))
        messages, cursor = await self.backend.list_dead(r.topic, r.statuses, r.cursor, r.limit)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in messages], cursor=cursor)

    async def export_msgs(self, request: Request) -> Response:
        r = bulk_params.parse_export_msg(self._params(request))
        messages, cursor = await self.backend.export_msgs(r.topic, r.statuses, r.cursor, r.limit)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in messages], cursor=cursor)

    async def redrive(self, request: Request) -> Response:
        backend = self.backend
        r = params.parse_redrive(self._params(request))
        if r.msg_id is not None:
            return answer(200, "success", delayMsg=delay_msg(await backend.redrive(r.topic, r.msg_id)))
        count, more = await backend.redrive_all(r.topic, r.limit)
        return answer(200, "success", redriven=count, more=more)

    async def list_msgs(self, request: Request) -> Response:
        r = bulk_params.parse_list_msg(self._params(request), self.page_bytes)
        if r.count_only:
            return answer(200, "success", count=await self.backend.count_msgs(r.topic, r.filter))
        messages, cursor = bulk_params.cut_page(*await self.backend.list_msgs(r), self.page_bytes)
        return answer(200, "success", delayMsgList=[delay_msg(m) for m in messages], cursor=cursor)

    async def delete_msgs(self, request: Request) -> Response:
        deleted, more = await self.backend.delete_msgs(bulk_params.parse_delete_msgs(self._params(request)))
        return answer(200, "success", deleted=deleted, more=more)

    async def reschedule_msgs(self, request: Request) -> Response:
        backend = self.backend
        r = bulk_params.parse_reschedule_msgs(self._params(request), backend.clock.now_ms())
        rescheduled, more = await backend.reschedule_msgs(r)
        return answer(200, "success", rescheduled=rescheduled, more=more)

    async def monitor_data(self, request: Request) -> Response:
        return answer(200, "success", data=await self.monitor())

    async def monitor(self) -> dict[str, object]:
        """getMonitorData's `data`: the node's (every shard's, merged)."""
        if self.views is not None:
            return await self.views.monitor_data()
        return self.backend.metrics.monitor_data()

    async def topic_info(self, request: Request) -> Response:
        topic = params.parse_topic(self._params(request)).topic
        return answer(200, "success", data=self._with_paused(await self.backend.topic_info(topic)))

    async def topic_info_list(self, request: Request) -> Response:
        return answer(200, "success", data=await self.topic_infos())

    async def monitor_string(self, request: Request) -> Response:
        text = camellia_metrics.monitor_string(await self.monitor(), await self.topic_infos())
        return Response(200, text, "text/plain; charset=utf-8")

    async def topic_infos(self) -> list[dict[str, object]]:
        """getTopicInfo of every topic."""
        backend = self.backend
        topics = backend.topic_list() if self.views is None else await self.views.all_topics()
        return [self._with_paused(info) for info in await backend.topic_infos(topics)]

    def _with_paused(self, info: dict[str, object]) -> dict[str, object]:
        paused = self.paused(str(info["topic"]))
        if paused is not None:
            info["paused"] = paused
        return info
