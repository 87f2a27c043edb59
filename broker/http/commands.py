"""The command table: every (method, path) a node serves, and what serving
it takes, looked up once per request, on its head.

As Redis's command table (a name -> its procedure, arity and flags), each
entry is a `Command`: its handler, the largest body it takes, who may call
it (`Auth`), whether it is an API call the health switch counts
(broker.http.health), the table that turns what it raises into answers, and
whether it may start in the connection's own frame. A request meets it
twice, and nothing else in between:

    head complete   broker.http.gate.Gate.admit: the browser checks, the command
                    looked up (404, or 405 naming the methods in Allow),
                    its auth rule applied (401, 403) -> the Command
                    broker.http.httpd: a body over `body_cap` is 413, unread
    body complete   broker.http.httpd.Connection._run, one frame: the tracking,
                    `await handler(request)`, the error table, the answer
                    written

Each command also declares where it runs on a node of many shards
(`Where`, docs/internals.md "Shards"): on the shard the request reached,
through the node's backend, on the shard that owns one of its parameters,
or on every shard with a named merge of the answers. A command cannot be
added without it; broker.shards.router serves each as it declares, and
nothing else decides it.

Who adds what (broker.node.base.NodeBase.app builds one table a node):
/health and /metrics the node itself, the health switch broker.http.health,
camellia's API broker.http.api, push delivery broker.push.api, the console
broker.console.api and broker.console.login, a cluster's peer calls
broker.cluster.peers.

Who may call a path is decided by the path alone (`auth_of`), the same
way for a path the table does not serve, so that an unknown path is
answered 401 or 403 before it is answered 404, as a known one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from storage.errors import InvariantError

from .http_types import BatchHandler, Handler, Request, Response, StreamResponse, plain_answer
from .paths import CLUSTER_PREFIX, HEALTH_PREFIX
from .sessions import CONSOLE


class Auth(enum.Enum):
    """Who may call a path (broker.http.gate applies it; docs/security.md)."""

    OPEN = "open"        # /health and /camellia/health/*: load balancers, no token
    PEER = "peer"        # /_cluster/*: the cluster secret's proof (an --insecure-cluster
                         # has no secret: the token, as TOKEN)
    TOKEN = "token"      # every other path: the bearer token, when one is configured
    CONSOLE = "console"  # /console and /console/*: the token, or a console session


def auth_of(path: str) -> Auth:
    """Who may call `path`, served or not."""
    if path == "/health" or path.startswith(HEALTH_PREFIX):
        return Auth.OPEN
    if path.startswith(CLUSTER_PREFIX):
        return Auth.PEER
    if path == CONSOLE or path.startswith(CONSOLE + "/"):
        return Auth.CONSOLE
    return Auth.TOKEN


class Runs(enum.Enum):
    """Where a command runs on a node of many shards (a node of one: there)."""

    HERE = "here"    # on the shard the request reached, alone: state of that process
                     # (its sessions, its health), or state every shard keeps alike
    NODE = "node"    # there, its handler reaching the node's messages through the
                     # node's backend (broker.shards.backend.ShardedBackend: each of
                     # its calls on the owner, or on all with a merge) or the
                     # node's calls (its jobs, its views)
    OWNER = "owner"  # forwarded whole to the shard that owns a parameter's value
                     # (broker.shards.placement.owner)
    EVERY = "every"  # forwarded whole to every shard, their answers made one by a merge


@dataclass(frozen=True, slots=True)
class Where:
    """Where a command runs: `runs`; OWNER: `param`, the parameter whose
    value places it; EVERY: `merge`, the name of how the shards' answers
    become one (broker.shards.answers.MERGES)."""

    runs: Runs
    param: str = ""
    merge: str = ""

    def __post_init__(self) -> None:
        if (self.runs is Runs.OWNER) != bool(self.param) or (self.runs is Runs.EVERY) != bool(self.merge):
            raise InvariantError(f"{self.runs.value} takes {'a param' if self.runs is Runs.OWNER else 'a merge'}"
                                 if self.runs in (Runs.OWNER, Runs.EVERY) else f"{self.runs.value} takes neither")

    def __str__(self) -> str:
        if self.runs is Runs.OWNER:
            return f"owner of {self.param}"
        if self.runs is Runs.EVERY:
            return f"every shard, {self.merge}"
        return str(self.runs.value)


HERE = Where(Runs.HERE)
NODE = Where(Runs.NODE)


def on_owner(param: str) -> Where:
    """On the shard that owns `param`'s value."""
    return Where(Runs.OWNER, param=param)


def on_every(merge: str) -> Where:
    """On every shard, the answers made one by the merge named `merge`."""
    return Where(Runs.EVERY, merge=merge)


# A change every shard carries out alike: its answer the first that failed, else the one of the shard reached.
EVERY_SHARD = on_every("all_ok")


class Tracker(Protocol):
    """What counts a node's API calls (broker.http.health.ServingStatus). The
    connection's frame (broker.http.httpd) adds one to `in_flight` while a
    tracked command runs, and sets `last_used_s` from `now_s()` when it
    ends; `tracks` says which commands are API calls."""

    in_flight: int
    last_used_s: float
    now_s: Callable[[], float]

    def tracks(self, method: str, path: str) -> bool: ...


# What a command's handler raises, and its answer: (exception class, code in
# the JSON body, HTTP status). The first row the error is an instance of
# answers it; an error no row names is a bug (HTTP 500, logged).
ErrorTable = tuple[tuple[type[Exception], int, int], ...]


@dataclass(frozen=True, slots=True)
class Command:
    """One (method, path) a node serves: what the gate and the connection
    need to know of it, made once when the table is built."""

    method: str
    path: str
    handler: Handler
    where: Where
    # The largest body, in bytes: a longer one is answered 413 on its head,
    # before a byte of it is read.
    body_cap: int
    auth: Auth
    # Counts it as an API call (broker.http.health's idleness); None: not one.
    tracker: Tracker | None = None
    errors: ErrorTable = ()
    # It may run in the connection's frame (broker.http.httpd), without a Task
    # of its own: resumed by the callbacks of the futures it awaits, it gets
    # a Task only once it yields bare (asyncio.sleep(0)). So it asks for
    # nothing that needs the current Task (asyncio.timeout, aiohttp's
    # client, redis-py) without such a yield first (broker.clock's wait_for
    # makes one). A handler that never waits (a pull on a standalone node,
    # /health) costs no Task at all, nor does a send that waits for its fsync.
    inline: bool = False
    # What runs a pipelined run of its requests as one batch (broker.http.httpd:
    # the requests of one connection parsed while one runs): each request's
    # answer, or what that request raised, in order -- each as it would have
    # had alone, one after the other. None: one at a time.
    batch: BatchHandler | None = None

    def error_answer(self, error: Exception) -> Response | None:
        """The answer its error table gives `error`; None: a bug."""
        for kind, code, status in self.errors:
            if isinstance(error, kind):
                return Response(status, orjson.dumps({"code": code, "msg": str(error)}))
        return None

    def __repr__(self) -> str:
        flags = [f"auth={self.auth.value}", f"body_cap={self.body_cap}", f"runs {self.where}"]
        if self.tracker is not None:
            flags.append("api call")
        if self.inline:
            flags.append("inline")
        if self.batch is not None:
            flags.append("batched")
        return f"Command({self.method} {self.path}, {', '.join(flags)})"


class CommandTable:
    """(method, path) -> Command. `body_cap` is the cap of a command that
    names none; `tracker` counts the API calls (None: nothing is counted).
    Built once at start-up; the gate holds `commands` and looks a request's
    command up there, once."""

    def __init__(self, body_cap: int, tracker: Tracker | None = None) -> None:
        self.body_cap = body_cap
        self.tracker = tracker
        self.commands: dict[tuple[str, str], Command] = {}
        self.methods: dict[str, list[str]] = {}  # path -> the methods it is served with

    def __repr__(self) -> str:
        return f"CommandTable({len(self.commands)} commands, {len(self.methods)} paths)"

    def add(self, method: str, path: str, handler: Handler, *, where: Where, body_cap: int | None = None,
            errors: ErrorTable = (), inline: bool = False, api_call: bool = False,
            batch: BatchHandler | None = None) -> None:
        """Serve `method path` with `handler`, run `where` it says on a node
        of many shards. `api_call`: counted as an API call though the
        tracker's rule would not (the console's API calls)."""
        if (method, path) in self.commands:
            raise InvariantError(f"{method} {path} is added to the command table twice")
        tracker = self.tracker
        tracked = tracker is not None and (api_call or tracker.tracks(method, path))
        self.commands[(method, path)] = Command(method, path, handler, where,
                                                self.body_cap if body_cap is None else body_cap, auth_of(path),
                                                tracker if tracked else None, errors, inline, batch)
        self.methods.setdefault(path, []).append(method)

    def alter(self, change: Callable[[Command], Command]) -> None:
        """Replace every command by what `change` makes of it (a cluster
        node's API calls forward to the leader: broker.node.base)."""
        for key, command in self.commands.items():
            self.commands[key] = change(command)

    def refusal(self, method: str, path: str) -> Response:
        """The answer to a request the table has no command for: 404, or
        405 naming the path's methods in Allow."""
        methods = self.methods.get(path)
        if methods is None:
            return plain_answer(404, "Not Found")
        return plain_answer(405, "Method Not Allowed", {"Allow": ", ".join(sorted(methods))})

    async def call(self, request: Request) -> Response | StreamResponse:
        """The handler of the command `request` names, awaited (the console
        makes its API calls so: broker.console.login). Its errors reach the
        caller, whose frame answers them."""
        command = self.commands.get((request.method, request.path))
        if command is None:
            return self.refusal(request.method, request.path)
        return await command.handler(request)
