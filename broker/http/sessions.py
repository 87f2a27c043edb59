"""The console's sessions: what its cookie `hg_console` holds instead of
the API token.

An operator gives the token once (the login form, broker/console/login.py,
or `GET /console?token=`, console_auth and console_entry in broker/http/api.py, and broker/http/gate.py); the node answers
with a new random session id in the cookie, and checks that id against
this table on every console request. The token itself never reaches the
browser's storage, a session dies on its own after `ttl_s`, and logging
out ends it here, on the node, not only in the browser.

    sessions = ConsoleSessions(ConsoleConfig(session_ttl_s=60, max_sessions=2), clock)
    a = sessions.create()        # 43 URL-safe characters: 256 random bits
    sessions.valid(a)            # True until 60 s of monotonic time have passed
    b = sessions.create()
    c = sessions.create()        # at the cap the oldest session goes:
    sessions.valid(a)            # False
    sessions.end(b)              # logout: b is refused from now on

Lifetimes run on the clock's monotonic time (a wall clock stepping back
extends nothing) and count from the login, whatever the session did since:
an open page logs in again after `session_ttl_s`. The table is in memory
only, so a restart ends every session. It keys each session by the
SHA-256 digest of its id, not the id: a lookup's timing says nothing of a
live id, and the node's memory holds no cookie a browser could present.
Cost: one digest and one dict lookup a console request; at most
`max_sessions` entries of about 150 bytes.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

from storage.errors import ConfigError
from wheel.clock import Clock

COOKIE = "hg_console"
# The console's paths: the cookie is sent to these only, never to the API's.
CONSOLE = "/console"
# The login form (GET) and its POST, and logout: open to a browser without
# a session, they check for themselves (broker.console.login).
LOGIN_PATH = CONSOLE + "/login"
LOGOUT_PATH = CONSOLE + "/logout"
LOGIN_PATHS = frozenset((LOGIN_PATH, LOGOUT_PATH))
# secrets.token_urlsafe(32): 256 bits, 43 characters a cookie takes unquoted.
SESSION_ID_BYTES = 32


@dataclass(frozen=True)
class ConsoleConfig:
    # Seconds a console session lasts from its login (--console-session-ttl-s);
    # then the browser is sent to the login form again.
    session_ttl_s: float = 12 * 3600
    # Sessions alive at once (--max-console-sessions): a login at the cap
    # ends the oldest one.
    max_sessions: int = 64
    # Mark the cookie Secure (--console-cookie-secure): browsers then send it
    # over HTTPS only. For a console behind a TLS-terminating proxy.
    cookie_secure: bool = False

    def __post_init__(self) -> None:
        if not (self.session_ttl_s > 0 and math.isfinite(self.session_ttl_s)):
            raise ConfigError(f"--console-session-ttl-s must be a number of seconds above 0, got {self.session_ttl_s}")
        if self.max_sessions < 1:
            raise ConfigError(f"--max-console-sessions must be at least 1, got {self.max_sessions}")


class ConsoleSessions:
    """The live console sessions of one node: digest of the id -> the
    monotonic second it expires, oldest first (a dict keeps insertion
    order, and every session lives equally long, so the first entry is
    both the oldest and the next to expire). Called on the event loop only."""

    def __init__(self, config: ConsoleConfig, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._expires_s: dict[bytes, float] = {}

    def create(self) -> str:
        """A new session's id (for the cookie); ends the oldest at the cap."""
        now_s = self._clock.monotonic_s()
        self._drop_expired(now_s)
        while len(self._expires_s) >= self.config.max_sessions:
            del self._expires_s[next(iter(self._expires_s))]
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        self._expires_s[_digest(session_id)] = now_s + self.config.session_ttl_s
        return session_id

    def valid(self, session_id: str | None) -> bool:
        """Whether `session_id` (a cookie's value, None if none) is a live
        session of this node."""
        if not session_id:
            return False
        key = _digest(session_id)
        expires_s = self._expires_s.get(key)
        if expires_s is None:
            return False
        if self._clock.monotonic_s() >= expires_s:
            del self._expires_s[key]
            return False
        return True

    def end(self, session_id: str | None) -> None:
        """Logout: the session is refused from now on (unknown: nothing)."""
        if session_id:
            self._expires_s.pop(_digest(session_id), None)

    def set_cookie(self, session_id: str) -> str:
        """The Set-Cookie value that gives a browser `session_id`: HttpOnly
        (no script reads it), SameSite=Strict (no other site's page sends
        it), the console's paths only, dropped by the browser too once the
        session has expired."""
        return self._cookie(session_id, math.ceil(self.config.session_ttl_s))

    def clear_cookie(self) -> str:
        """The Set-Cookie value that makes a browser drop the cookie."""
        return self._cookie("", 0)

    def _cookie(self, value: str, max_age_s: int) -> str:
        secure = "; Secure" if self.config.cookie_secure else ""
        return f"{COOKIE}={value}; Path={CONSOLE}; Max-Age={max_age_s}; HttpOnly; SameSite=Strict{secure}"

    def _drop_expired(self, now_s: float) -> None:
        while self._expires_s:
            oldest = next(iter(self._expires_s))
            if self._expires_s[oldest] > now_s:
                return
            del self._expires_s[oldest]

    def __len__(self) -> int:
        """Sessions not yet expired."""
        now_s = self._clock.monotonic_s()
        return sum(1 for expires_s in self._expires_s.values() if expires_s > now_s)

    def __repr__(self) -> str:
        return (f"ConsoleSessions(live={len(self)}, max_sessions={self.config.max_sessions}, "
                f"session_ttl_s={self.config.session_ttl_s:g}, cookie_secure={self.config.cookie_secure})")


def session_cookie(cookie_header: str) -> str | None:
    """The console cookie's value in a Cookie header (None: not there)."""
    for part in cookie_header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name == COOKIE:
            return value
    return None


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).digest()
