"""broker.console.login, and the console's part of the gate (broker.http.gate
with broker.http.api.console_auth) and of broker.http.api.console_entry,
in process on a fake clock: the token buys a session once, the session and
never the token opens the console's paths, the page's API calls are made
with the node's token."""

import asyncio
import urllib.parse

import orjson
from fakes import FakeClock

from broker.console.login import ConsoleLogin
from broker.http.api import answer, console_auth, console_entry
from broker.http.commands import HERE, CommandTable
from broker.http.gate import Gate
from broker.http.http_types import Request, Response
from broker.http.sessions import ConsoleConfig, ConsoleSessions

TOKEN = "t0ken"
FORM = {"content-type": "application/x-www-form-urlencoded"}


class Node:
    """A command table with a console page (behind console_entry), one API
    path and the login, behind the gate, as broker.node.base builds them;
    `api_seen` keeps what the API path was called with."""

    def __init__(self, token: str | None = TOKEN, ttl_s: float = 60) -> None:
        self.clock = FakeClock(now_ms=5_000)
        self.sessions = ConsoleSessions(ConsoleConfig(session_ttl_s=ttl_s), self.clock)
        self.api_seen: list[Request] = []
        table = CommandTable(1 << 20)
        table.add("GET", "/console", console_entry(token, self.sessions, self.page), where=HERE)
        table.add("GET", "/console/api/topics", self.page, where=HERE)
        table.add("POST", "/camellia/delayQueue/getMsg", self.api, where=HERE)
        table.add("GET", "/camellia/delayQueue/listDeadMsg", self.api, where=HERE)
        self.table = table
        ConsoleLogin(token, self.sessions, table.call).add_routes(table)
        gate = Gate(table, token,
                    console_auth=None if token is None else console_auth(self.sessions))
        self.admit = gate.admit

    async def page(self, request: Request) -> Response:
        return answer(200, "success", path=request.path)

    async def api(self, request: Request) -> Response:
        self.api_seen.append(request)
        return answer(200, "success", path=request.path)

    def call(self, method: str, target: str, headers: dict | None = None, body: bytes = b"") -> Response:
        path, _, query = target.partition("?")
        request = Request(method, path, query.encode(), headers or {}, body, None)
        verdict = self.admit(request)  # on the head, as broker.http.httpd asks
        if isinstance(verdict, Response):
            return verdict
        return asyncio.run(verdict.handler(request))

    def login(self, token: str = TOKEN) -> Response:
        return self.call("POST", "/console/login", FORM, urllib.parse.urlencode({"token": token}).encode())


def cookie_of(response: Response) -> str:
    return response.headers["Set-Cookie"].split(";")[0].partition("=")[2]


def with_cookie(session: str) -> dict:
    return {"cookie": f"hg_console={session}"}


def test_the_login_form_trades_the_token_for_a_session():
    node = Node()
    form = node.call("GET", "/console/login")
    assert form.status == 200 and b'name="token"' in form.body and b'action="/console/login"' in form.body
    wrong = node.login("t0ke")
    assert wrong.status == 401 and b"wrong token" in wrong.body and "Set-Cookie" not in wrong.headers
    right = node.login()
    assert right.status == 303 and right.headers["Location"] == "/console"
    session = cookie_of(right)
    assert session and TOKEN not in right.headers["Set-Cookie"]
    assert node.call("GET", "/console/api/topics", with_cookie(session)).status == 200
    assert node.call("GET", "/console/api/topics", with_cookie(TOKEN)).status == 401  # the token is no session
    assert node.call("POST", "/camellia/delayQueue/getMsg", with_cookie(session)).status == 401  # nor the API's


def test_the_token_in_the_address_works_once_and_leaves_the_address():
    node = Node()
    answered = node.call("GET", "/console?token=" + TOKEN)
    assert answered.status == 303 and answered.headers["Location"] == "/console"
    assert node.sessions.valid(cookie_of(answered)) and TOKEN not in answered.headers["Set-Cookie"]
    assert node.call("GET", "/console?token=wrong").status == 401
    assert node.call("GET", "/console/api/topics?token=" + TOKEN).status == 401  # the page's address only


def test_without_a_session_the_page_sends_the_browser_to_the_form():
    node = Node()
    answered = node.call("GET", "/console")
    assert answered.status == 303 and answered.headers["Location"] == "/console/login"
    assert node.call("GET", "/console/api/topics").status == 401  # scripts get a 401


def test_an_expired_session_is_refused():
    node = Node(ttl_s=30)
    session = cookie_of(node.login())
    node.clock.advance(29_999)
    assert node.call("GET", "/console/api/topics", with_cookie(session)).status == 200
    node.clock.advance(1)
    assert node.call("GET", "/console/api/topics", with_cookie(session)).status == 401
    assert node.call("GET", "/console", with_cookie(session)).headers["Location"] == "/console/login"


def test_logout_ends_the_session_on_the_node():
    node = Node()
    session = cookie_of(node.login())
    answered = node.call("POST", "/console/logout", with_cookie(session))
    assert answered.status == 303 and answered.headers["Location"] == "/console/login"
    assert "Max-Age=0" in answered.headers["Set-Cookie"]
    assert node.call("GET", "/console/api/topics", with_cookie(session)).status == 401


def test_the_pages_api_calls_are_made_with_the_nodes_token():
    node = Node()
    session = cookie_of(node.login())
    listed = node.call("GET", "/console/api/listDeadMsg?topic=t&limit=5", with_cookie(session))
    assert orjson.loads(listed.body)["path"] == "/camellia/delayQueue/listDeadMsg"
    (seen,) = node.api_seen
    assert seen.query == b"topic=t&limit=5" and seen.headers == {"authorization": f"Bearer {TOKEN}"}
    headers = {**with_cookie(session), **FORM}
    assert node.call("POST", "/console/api/getMsg", headers, b"topic=t&msgId=m").status == 403  # no header
    found = node.call("POST", "/console/api/getMsg", {**headers, "x-hourglass-console": "1"}, b"topic=t&msgId=m")
    assert found.status == 200 and node.api_seen[-1].body == b"topic=t&msgId=m"
    assert node.api_seen[-1].path == "/camellia/delayQueue/getMsg" and "cookie" not in node.api_seen[-1].headers
    assert node.call("GET", "/console/api/listDeadMsg?topic=t").status == 401  # no session, no call


def test_a_login_body_is_bounded():
    node = Node()
    assert node.call("POST", "/console/login", FORM, b"token=" + b"&" * 20_000).status == 413
    assert node.call("POST", "/console/login", FORM, b"token=%ff").status == 401  # not UTF-8: not the token


def test_an_open_node_needs_no_login():
    node = Node(token=None)
    assert node.call("GET", "/console").status == 200
    assert node.call("GET", "/console/login").headers["Location"] == "/console"
    assert node.call("POST", "/console/login", FORM, b"token=anything").headers["Location"] == "/console"
    node.call("GET", "/console/api/listDeadMsg?topic=t")
    assert "authorization" not in node.api_seen[-1].headers


def test_the_pages_job_calls_are_made_with_the_nodes_token():
    """redriveMsgs and cancelJob are POSTs (the console's header needed),
    getJob a GET; each reaches the API call of its name with the node's token."""
    node = Node()
    for method, name in (("POST", "redriveMsgs"), ("GET", "getJob"), ("POST", "cancelJob")):
        node.table.add(method, f"/camellia/delayQueue/{name}", node.api, where=HERE)
    session = cookie_of(node.login())
    headers = {**with_cookie(session), **FORM}
    assert node.call("POST", "/console/api/redriveMsgs", headers, b"topic=t&tag=a").status == 403  # no header
    assert node.call("POST", "/console/api/redriveMsgs", {**FORM, "x-hourglass-console": "1"},
                     b"topic=t").status == 401  # no session
    assert node.api_seen == []
    headers["x-hourglass-console"] = "1"
    for method, target, body in (("POST", "/console/api/redriveMsgs", b"topic=t&tag=a&rate=5"),
                                 ("GET", "/console/api/getJob", b""),
                                 ("POST", "/console/api/cancelJob", b"jobId=j1")):
        answered = node.call(method, target, headers, body)
        assert answered.status == 200, (target, answered.body)
        seen = node.api_seen[-1]
        assert seen.path == "/camellia/delayQueue/" + target.rpartition("/")[2] and seen.body == body
        assert seen.headers["authorization"] == f"Bearer {TOKEN}" and "cookie" not in seen.headers
    assert len(node.api_seen) == 3
