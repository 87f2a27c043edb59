"""What the HTTP front decides on a request's head (docs/security.md).

`Gate.admit` runs when a request's head is complete, before `100
Continue`, before any body budget is reserved and before a byte of its
body is read (broker.http.httpd): it answers a refusal, or the request's
command (broker.http.commands: its handler, body cap and auth rule), looked up
once, here. In order:

    check                      refused with   applies
    Host name                  403            no token configured: loopback names,
                                              the --host served and --allowed-hosts
                                              only (DNS rebinding)
    Origin / Sec-Fetch-Site    403            no token configured, state-changing
                                              methods: cross-site or same-site
                                              requests (CSRF from a web page)
    peer proof                 403            Auth.PEER (/_cluster/*) of a cluster
                                              with a secret
    token                      401            a token configured: every path but
                                              Auth.OPEN's (/health, /camellia/health/*);
                                              Auth.CONSOLE's also take a console session
    route, method              404, 405       (405 names the methods in Allow)
    body cap                   413 (httpd)    the command's cap

With a token configured an API client is checked by its token only, as
before: a browser cannot send the bearer header cross-site, and the
console's cookie is SameSite=Strict.
"""

from __future__ import annotations

import hmac
import ipaddress
import urllib.parse
from collections.abc import Callable, Iterable

from .commands import Auth, Command, CommandTable, auth_of
from .http_types import Request, Response, plain_answer

# Methods that change nothing: the browser checks do not stop them (a page
# can send them cross-site, but cannot read the answer without CORS, which
# this server never grants).
SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
# Host headers whose verdict is remembered (cleared when full).
HOST_CACHE_ENTRIES = 256


def host_name(host: str) -> str:
    """The name in a Host header or an authority, without its port; IPv6
    literals without brackets; lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Gate:
    """A node's decisions on request heads. `table` is what is served;
    `token` the clients' bearer token (None: open, and the browser checks
    apply); `served_host` the --host listened on and `allowed_hosts` the
    --allowed-hosts; `is_peer(request)` the cluster secret's proof for
    Auth.PEER's paths (None: a standalone node, or an --insecure-cluster
    whose /_cluster/* is the API's, behind the token);
    `console_auth(request)` whether a console request carries a valid
    console session (broker.console.api)."""

    def __init__(self, table: CommandTable, token: str | None, served_host: str = "127.0.0.1",
                 allowed_hosts: Iterable[str] = (), is_peer: Callable[[Request], bool] | None = None,
                 console_auth: Callable[[Request], bool] | None = None) -> None:
        self.table = table
        self.commands = table.commands
        self.token = None if token is None else token.encode()
        self.is_peer = is_peer
        self.console_auth = console_auth
        names = {host_name(h) for h in allowed_hosts}
        served = host_name(served_host)
        if served not in ("", "0.0.0.0", "::"):
            names.add(served)
        self.hosts = frozenset(names)
        self._host_ok: dict[str, bool] = {}  # Host header -> served; a few entries in practice

    def __repr__(self) -> str:
        return (f"Gate({self.table!r}, token={'set' if self.token else 'none'}, hosts={sorted(self.hosts)}, "
                f"peers={'secret' if self.is_peer else 'none'})")

    def admit(self, request: Request) -> Response | Command:
        method, path = request.method, request.path
        command = self.commands.get((method, path))
        if self.token is None:
            headers = request.headers
            # a known served Host's GET, or its POST with neither Sec-Fetch-Site nor Origin, needs no more
            if not (self._host_ok.get(headers.get("host", ""), False)
                    and (method in SAFE_METHODS or ("sec-fetch-site" not in headers and "origin" not in headers))):
                refusal = self._browser_refusal(request)
                if refusal is not None:
                    return refusal
        auth = auth_of(path) if command is None else command.auth
        if auth is Auth.PEER and self.is_peer is not None:
            if not self.is_peer(request):
                return plain_answer(403, "cluster calls need the cluster secret")
        elif self.token is not None and auth is not Auth.OPEN and not self._authorized(request, auth):
            return plain_answer(401, "missing or wrong bearer token")
        return self.table.refusal(method, path) if command is None else command

    def _browser_refusal(self, request: Request) -> Response | None:
        """Without a token a browser is the threat: a page the operator
        opens may post to the node (CSRF) or, through DNS rebinding, read
        it under a name of its own."""
        headers = request.headers
        host = headers.get("host")
        if host is not None:
            ok = self._host_ok.get(host)
            if ok is None:
                name = host_name(host)
                ok = is_loopback(name) or name in self.hosts
                if len(self._host_ok) >= HOST_CACHE_ENTRIES:  # a stranger's made-up names: bounded
                    self._host_ok.clear()
                self._host_ok[host] = ok
            if not ok:
                return plain_answer(403, "this Host is not served without a token (--allowed-hosts)")
        if request.method in SAFE_METHODS:
            return None
        site = headers.get("sec-fetch-site")
        if site is not None and site.strip().lower() not in ("same-origin", "none"):
            return plain_answer(403, "cross-site requests may not change state")
        origin = headers.get("origin")
        if origin is not None:
            parts = urllib.parse.urlsplit(origin.strip())
            if origin.strip() == "null" or host is None or parts.netloc.lower() != host.strip().lower():
                return plain_answer(403, "cross-origin requests may not change state")
        return None

    def _authorized(self, request: Request, auth: Auth) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.matches(given):
            return True
        if auth is Auth.CONSOLE and self.console_auth is not None:
            return self.console_auth(request)
        return False

    def matches(self, given: str) -> bool:
        """The token, compared in constant time as the bytes sent (httpd
        decodes header bytes as latin-1: encoding back gives them)."""
        expected = self.token
        return expected is not None and hmac.compare_digest(given.strip().encode("latin-1", "replace"), expected)

