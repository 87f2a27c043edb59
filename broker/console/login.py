"""The console's login: the token is given once and traded for a session
(broker.http.sessions), and the page's API calls are made for it.

    GET  /console/login      the form (LOGIN_PAGE)
    POST /console/login      token=<token> (a form body): right, 303 to
                             /console with a new session's cookie; wrong,
                             401 and the form again
    POST /console/logout     ends the cookie's session on the node, drops
                             the cookie, 303 to the form
    GET  /console/api/listDeadMsg, POST /console/api/redriveMsg,
    POST /console/api/getMsg, GET /console/api/listMsg,
    POST /console/api/deleteMsgs, POST /console/api/rescheduleMsgs,
    POST /console/api/redriveMsgs, GET /console/api/getJob,
    POST /console/api/cancelJob
                             the API call of the same name, made by the
                             node with its own token

The login paths are open (the gate lets them through: they check the
token themselves). The API calls sit under /console because the browser
sends the session cookie there only, never to the API, which a cookie does
not open; the node passes them on as API calls carrying its token, so on a
cluster follower they are forwarded to the leader as any call. A POST
among them needs `X-Hourglass-Console: 1`, which the page sends and which
a page of another origin cannot send without the node's consent (a CORS
preflight it never grants): SameSite=Strict keeps other sites' pages from
using the cookie, and this keeps other ports of the same host from it too.
On a node without --auth-token-file every console path is open and the
login sends the browser straight to /console.
"""

from __future__ import annotations

import hmac

from storage.errors import InvalidRequest

from ..core.params import parse_form
from ..http.api import API_ERRORS, answer
from ..http.commands import HERE, NODE, CommandTable
from ..http.http_types import Handler, Request, Response, StreamResponse, plain_answer
from ..http.paths import PREFIX
from ..http.sessions import CONSOLE, LOGIN_PATH, LOGOUT_PATH, ConsoleSessions, session_cookie
from .page import LOGIN_PAGE

# A login body larger than this is refused before it is parsed: the form is
# open to anyone, and a token is far shorter.
MAX_LOGIN_BODY_BYTES = 16 * 1024
# The API calls the page makes: (method, name).
API_CALLS = (("GET", "listDeadMsg"), ("POST", "redriveMsg"), ("POST", "getMsg"), ("GET", "listMsg"),
             ("POST", "deleteMsgs"), ("POST", "rescheduleMsgs"),
             ("POST", "redriveMsgs"), ("GET", "getJob"), ("POST", "cancelJob"), ("GET", "getTopicConfig"),
             ("POST", "pauseTopic"), ("POST", "resumeTopic"))
CONSOLE_HEADER = "x-hourglass-console"
LOGIN_HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                       "frame-ancestors 'none'"}


class ConsoleLogin:
    """The login, logout and API-call routes over one node's sessions.
    `token` is the node's --auth-token-file token (None: an open node);
    `api` runs an API request's command as the node serves it (a cluster
    node's forwards it to the leader when it does not lead): its errors
    are answered here as the API's (API_ERRORS), and a POST is counted as
    an API call (broker.http.health)."""

    def __init__(self, token: str | None, sessions: ConsoleSessions, api: Handler) -> None:
        self._token = token
        self.sessions = sessions
        self._api = api

    def add_routes(self, table: CommandTable) -> None:
        table.add("GET", LOGIN_PATH, self.form, where=HERE)
        table.add("POST", LOGIN_PATH, self.login, where=HERE)
        table.add("POST", LOGOUT_PATH, self.logout, where=HERE)
        for method, name in API_CALLS:
            table.add(method, f"{CONSOLE}/api/{name}", self.api_call, where=NODE, errors=API_ERRORS,
                      api_call=method == "POST")

    async def form(self, request: Request) -> Response:
        if self._token is None:
            return _see_other(CONSOLE)
        return _login_page(200, "")

    async def login(self, request: Request) -> Response:
        if self._token is None:
            return _see_other(CONSOLE)
        if len(request.body) > MAX_LOGIN_BODY_BYTES:
            return plain_answer(413, f"a login body is at most {MAX_LOGIN_BODY_BYTES} bytes")
        try:
            given = parse_form(request.body).get("token", "")
        except InvalidRequest:  # not UTF-8: no token of ours
            given = ""
        if not hmac.compare_digest(given.strip().encode(), self._token.encode()):
            return _login_page(401, '<p class="error">wrong token</p>')
        return _see_other(CONSOLE, self.sessions.set_cookie(self.sessions.create()))

    async def logout(self, request: Request) -> Response:
        self.sessions.end(session_cookie(request.headers.get("cookie", "")))
        return _see_other(LOGIN_PATH if self._token is not None else CONSOLE, self.sessions.clear_cookie())

    async def api_call(self, request: Request) -> Response | StreamResponse:
        if request.method == "POST" and request.headers.get(CONSOLE_HEADER) != "1":
            return answer(403, "a console POST needs the header X-Hourglass-Console: 1")
        headers = {k: v for k, v in request.headers.items() if k not in ("cookie", "authorization")}
        if self._token is not None:
            headers["authorization"] = "Bearer " + self._token
        name = request.path.rpartition("/")[2]
        return await self._api(Request(request.method, PREFIX + name, request.query, headers, request.body,
                                       request.transport))

    def __repr__(self) -> str:
        return f"ConsoleLogin(open={self._token is None}, {self.sessions!r})"


def _login_page(status: int, message: str) -> Response:
    return Response(status, LOGIN_PAGE.replace("<!--message-->", message).encode(), "text/html; charset=utf-8",
                    headers=LOGIN_HEADERS)


def _see_other(location: str, set_cookie: str | None = None) -> Response:
    headers = {"Location": location, "Cache-Control": "no-store"}
    if set_cookie is not None:
        headers["Set-Cookie"] = set_cookie
    return Response(303, b"", headers=headers)
