"""Push delivery's rules, pure: what a subscription is, which addresses
--push-allow lets the node connect to, how a delivery is signed, and how
long a failed one waits before the next (docs/api.md, "Push delivery").

    parse_subscribe(params, allow)  -> Subscription   (subscribe's parameters)
    PushAllow.parse(entries)        the --push-allow list
    PushAllow.allows(host, port)    a URL's host (name or address) and port
    PushLimits                      what a subscriber's answers may cost (--push-* flags)
    signature(secret, ts_ms, body)  "sha256=<hex HMAC-SHA256 of '<ts>.<body>'>"
    backoff_ms(retry, after_ms, r)  the wait before delivery number retry+1
    LogGate(every_ms)               one log line a minute about a failing subscription

No I/O and no clock: the pusher (broker.push.pusher) does the requests.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import urllib.parse
from dataclasses import dataclass, field

from storage.errors import ConfigError, Forbidden, InvalidRequest

from ..core.params import Params, _int, _name, _text

# A subscription's bounds and defaults (subscribe's parameters).
DEFAULT_CONCURRENCY = 8
MAX_CONCURRENCY = 256
DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 5 * 60 * 1000
DEFAULT_MAX_BODY_BYTES = 64 * 1024
MAX_MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_RATE_LIMIT = 1_000_000
MAX_URL_BYTES = 2048
# --max-subscriptions' default: push subscriptions a node keeps (each has
# its own delivery loop, HTTP client and connections); one more is code 429.
DEFAULT_MAX_SUBSCRIPTIONS = 100
MAX_SECRET_BYTES = 1024
# Backoff after a failed delivery: base * 2^(failures-1), jittered down to
# half, never above the cap; a subscriber's Retry-After is taken within
# [that backoff's floor (half of it), the cap]: it lengthens a wait, never
# shortens it below what the backoff would have allowed.
BACKOFF_BASE_MS = 1000
BACKOFF_CAP_MS = 5 * 60 * 1000
# Log lines about one failing subscription: at most one in this long, with
# a count of the failures not logged since the last one.
FAILURE_LOG_EVERY_MS = 60_000

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Subscription:
    """A topic's one push subscription. `secret` is the HMAC key: never in
    a repr, an answer, a log line or a metric (`public()` leaves it out)."""

    topic: str
    url: str
    secret: str | None = field(default=None, repr=False)
    concurrency: int = DEFAULT_CONCURRENCY
    rate_limit: int = 0  # deliveries per second; 0: none
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def public(self) -> dict[str, object]:
        """getSubscription's answer: everything but the secret, and whether there is one."""
        return {"topic": self.topic, "url": self.url, "signed": self.secret is not None,
                "concurrency": self.concurrency, "rateLimit": self.rate_limit,
                "timeoutMillis": self.timeout_ms, "maxBodyBytes": self.max_body_bytes}

    def stored(self) -> dict[str, object]:
        """What the subscriptions file keeps of it (the secret too: the file is the node's alone)."""
        return {**self.public(), "secret": self.secret}

    @classmethod
    def from_stored(cls, row: dict[str, object]) -> Subscription:
        secret = row.get("secret")
        return cls(str(row["topic"]), str(row["url"]), secret if isinstance(secret, str) else None,
                   _stored_int(row, "concurrency"), _stored_int(row, "rateLimit"),
                   _stored_int(row, "timeoutMillis"), _stored_int(row, "maxBodyBytes"))


def _stored_int(row: dict[str, object], key: str) -> int:
    value = row[key]
    if not isinstance(value, int):
        raise ConfigError(f"the subscriptions file's {key} is not a whole number: {value!r}")
    return value


@dataclass(frozen=True)
class PushLimits:
    """What a subscriber's answers may cost the node, whatever the
    subscription asks (flags of `hourglass serve`, docs/security.md): a
    limit hit is a failed delivery, its reason in /metrics, and the
    connection closed."""

    # An answer's status line and headers, in bytes (--push-max-head-bytes).
    max_head_bytes: int = 16 * 1024
    # Header lines in one answer head (--push-max-headers).
    max_headers: int = 100
    # From an answer's first byte until its head is complete (--push-head-timeout-ms).
    head_timeout_ms: int = 10_000
    # From an answer's head until its body is complete (--push-body-timeout-ms).
    body_timeout_ms: int = 30_000
    # A kept-alive push connection with no POST on it is closed after this
    # long (--push-idle-timeout-ms); a byte the subscriber sends on it
    # meanwhile closes it at once.
    idle_timeout_ms: int = 30_000
    # Descriptors all push connections hold at once (--push-max-fds), at
    # most half of what RLIMIT_NOFILE leaves after --reserved-fds and the
    # descriptors storage holds; each subscription gets an equal share
    # (broker.http.descriptors).
    max_fds: int = 256

    def __post_init__(self) -> None:
        for name in ("max_head_bytes", "max_headers", "head_timeout_ms", "body_timeout_ms", "idle_timeout_ms",
                     "max_fds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--push-{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")


@dataclass(frozen=True)
class PushAllow:
    """--push-allow: host names (any port, or name:port), addresses and CIDRs
    (any port, or addr:port, [v6]:port). A URL whose host is a name is let
    through when the name is listed, or else when every address it resolves
    to at connect time is (broker.push.pusher checks it then: no DNS rebinding
    around it). Empty: nothing is allowed."""

    names: frozenset[tuple[str, int | None]] = frozenset()
    networks: tuple[tuple[Network, int | None], ...] = ()

    @classmethod
    def parse(cls, entries: list[str] | tuple[str, ...]) -> PushAllow:
        names: set[tuple[str, int | None]] = set()
        networks: list[tuple[Network, int | None]] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            host, port = _split_port(entry)
            try:
                networks.append((ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                if "/" in host or not host.replace("-", "").replace(".", "").replace("_", "").isalnum():
                    raise ConfigError(f"--push-allow: {raw!r} is not a host, host:port or CIDR") from None
                names.add((host.lower().rstrip("."), port))
        return cls(frozenset(names), tuple(networks))

    def __bool__(self) -> bool:
        return bool(self.names or self.networks)

    def allows_name(self, name: str, port: int) -> bool:
        name = name.lower().rstrip(".")
        return (name, None) in self.names or (name, port) in self.names

    def allows_address(self, address: str, port: int) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network and (allowed is None or allowed == port) for network, allowed in self.networks)


def _split_port(entry: str) -> tuple[str, int | None]:
    """"host:port", "[v6]:port", "v6", "cidr" -> (host, port or None)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, _port(entry, rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise ConfigError(f"--push-allow: {entry!r} has a bad port")
    return int(text)


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def url_target(url: str) -> tuple[str, int]:
    """The host and port a push URL connects to; InvalidRequest("url") if it is not http(s)://host..."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https"):
        raise InvalidRequest("url", "must be an http:// or https:// URL")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        raise InvalidRequest("url", "has a bad port") from None
    if not host:
        raise InvalidRequest("url", "has no host")
    if parsed.username is not None or parsed.password is not None:
        raise InvalidRequest("url", "must not hold credentials (sign with `secret` instead)")
    return host, port or (443 if parsed.scheme == "https" else 80)


def parse_subscribe(params: Params, allow: PushAllow) -> Subscription:
    """subscribe's parameters, validated; Forbidden (403) when --push-allow
    is empty, or the URL's host is an address it does not allow (a name is
    checked at connect time, against the addresses it resolves to)."""
    topic = _name("topic", params.get("topic"), no_nul=True)
    if topic is None:
        raise InvalidRequest("topic", "is required")
    url = _text("url", params.get("url"))
    if url is None:
        raise InvalidRequest("url", "is required")
    if len(url.encode("utf-8", "replace")) > MAX_URL_BYTES:
        raise InvalidRequest("url", f"must be at most {MAX_URL_BYTES} bytes")
    host, port = url_target(url)
    secret = _text("secret", params.get("secret"))
    if secret is not None and len(secret.encode("utf-8", "replace")) > MAX_SECRET_BYTES:
        raise InvalidRequest("secret", f"must be at most {MAX_SECRET_BYTES} bytes")
    subscription = Subscription(
        topic, url, secret,
        concurrency=_bounded(params, "concurrency", DEFAULT_CONCURRENCY, 1, MAX_CONCURRENCY),
        rate_limit=_bounded(params, "rateLimit", 0, 0, MAX_RATE_LIMIT),
        timeout_ms=_bounded(params, "timeoutMillis", DEFAULT_TIMEOUT_MS, 1, MAX_TIMEOUT_MS),
        max_body_bytes=_bounded(params, "maxBodyBytes", DEFAULT_MAX_BODY_BYTES, 0, MAX_MAX_BODY_BYTES))
    if not allow:
        raise Forbidden("push delivery is off: no host is allowed until the node is started with --push-allow "
                        "(hosts, host:port or CIDRs the node may POST to)")
    if is_address(host) and not allow.allows_address(host, port):
        raise Forbidden(f"url: {host} port {port} is not in --push-allow")
    return subscription


def _bounded(params: Params, parameter: str, default: int, low: int, high: int) -> int:
    value = _int(parameter, params.get(parameter))
    if value is None:
        return default
    if not low <= value <= high:
        raise InvalidRequest(parameter, f"must be in {low}..{high}, got {value}")
    return value


def signature(secret: str, timestamp_ms: int, body: bytes) -> str:
    """Hourglass-Signature: "sha256=" and the hex HMAC-SHA256, keyed by the
    secret, of the timestamp, a dot and the body, as a receiver recomputes it."""
    mac = hmac.new(secret.encode(), f"{timestamp_ms}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def backoff_ms(failures: int, retry_after_ms: int | None, jitter: float) -> int:
    """How long the `failures`-th failed delivery in a row waits before the
    next: BACKOFF_BASE_MS * 2^(failures-1) capped, scaled by `jitter` in
    [0.5, 1]; or the subscriber's Retry-After if it gave one, taken within
    [half that backoff (its floor), the cap] -- a `Retry-After: 0` cannot
    turn the backoff off."""
    exponent = min(max(failures, 1) - 1, 30)
    full = min(BACKOFF_BASE_MS * (1 << exponent), BACKOFF_CAP_MS)
    if retry_after_ms is not None:
        return max(full // 2, min(retry_after_ms, BACKOFF_CAP_MS))
    return int(full * min(max(jitter, 0.5), 1.0))


def retry_after_ms(header: str | None) -> int | None:
    """Retry-After in whole seconds (an HTTP date is not taken: None)."""
    if header is None or not (header.strip().isascii() and header.strip().isdigit()):
        return None
    return min(int(header.strip()), BACKOFF_CAP_MS // 1000 + 1) * 1000


class LogGate:
    """Rate-limits the log lines about one failing subscription: `admit(now_ms)`
    is None while a line was written less than `every_ms` ago (the line is
    counted as suppressed), else the number suppressed since that line (the
    caller writes one, saying so)."""

    def __init__(self, every_ms: int = FAILURE_LOG_EVERY_MS) -> None:
        self.every_ms = every_ms
        self.suppressed = 0
        self._last_ms: int | None = None

    def __repr__(self) -> str:
        return f"LogGate(every_ms={self.every_ms}, suppressed={self.suppressed})"

    def admit(self, now_ms: int) -> int | None:
        if self._last_ms is not None and now_ms - self._last_ms < self.every_ms:
            self.suppressed += 1
            return None
        self._last_ms = now_ms
        suppressed, self.suppressed = self.suppressed, 0
        return suppressed
