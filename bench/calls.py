"""Python-level calls a request makes in a running node: the real server
object (a standalone DiskNode, `hourglass serve`'s own parts) in this
process, the real wire bytes over one keep-alive loopback socket, one
request at a time. Prints ONE JSON object.

    .venv/bin/python bench/calls.py
    .venv/bin/python bench/calls.py --repeat 30 --batch 100

It imports hourglass as a user's script does: the installed build (the
compiled one the README's set-up makes; an editable install: the
sources), named in the JSON's "build". In the compiled build a call
between compiled functions is a C call, not counted: what is counted is
what still runs as Python (the modules left uncompiled, the standard
library, the loop's callbacks).

A profile hook (sys.setprofile) counts its `call` events -- every Python
function entered and every coroutine or generator resumed -- and its
`c_call` events, from the moment the request's bytes are handed over
until its answer's last byte is written (the loop's own scheduling in
between included). The syncer thread (its fsync) is
not counted: the hook is this thread's. Nor are the harness's own
frames: its transport's methods (`Wire`: uvloop's transport is C, so
each is counted as a `c_call`) and its own task resuming once the answer
is in (this file's coroutines and the runner's wrapper). Background work of the loop (the
wheel's ticks, timers) may fall inside a request's window; each figure is
therefore the least over --repeat requests, which is deterministic on any
machine: the path of a request does not change between repeats.

    send            sendMsg, a new id, 60 s ahead
    send_batch      sendMsgBatch of --batch new ids, 60 s ahead
    pull_ack        pullMsg of one ready message, then its ackMsg
    pull_ack_batch  pullMsg of --batch ready messages, then one ackMsg each
    pull_ack_many   pullMsg of --batch ready messages, then one ackMsg of
                    them all (msgIds)

With --paths it prints instead the path of a send (sendMsg), a pull
(pullMsg of one ready message) and an ack (ackMsg of it) through the
code: each call from a module of broker/ into another module of the
project, in order, as "file:function" (a coroutine resumed is not a new
entry; storage's, the wheel's and replication's calls among themselves
are left out: the path ends where it enters them); which broker modules
it enters before its first call into storage; and each module it enters
more than once. docs/internals.md ("Three requests, file by file") lists
the same; a compiled module is invisible to the hook, so --paths needs
the pure sources (PYTHONPATH=. from a checkout, or an editable install).

    PYTHONPATH=. .venv/bin/python bench/calls.py --paths
    PYTHONPATH=. .venv/bin/python bench/calls.py --paths --write-doc docs/internals.md   # the section anew
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import sys
import tempfile
import urllib.parse
from collections.abc import Callable
from types import FrameType
from typing import Any

from broker.build_info import describe
from broker.cli import build_parser, config_from_args
from broker.disk.group_commit import INLINE_SYNC_AFTER
from broker.http.httpd import Connection
from broker.http.paths import PREFIX
from broker.node.standalone import DiskNode

HOST = "127.0.0.1"


# The harness's own code: this file's, and the loop runner's wrapper
# that resumes the measuring task (uvloop.run's).
HARNESS_FILES = frozenset((os.path.abspath(__file__),))


def _harness(filename: str) -> bool:
    return os.path.abspath(filename) in HARNESS_FILES or filename.endswith(os.path.join("uvloop", "__init__.py"))


class Counter:
    """Counts profile events of this thread while `on`: the server's
    Python calls (`call`) and its C calls (`c_call`, the harness's
    transport methods among them)."""

    def __init__(self) -> None:
        self.calls = 0
        self.c_calls = 0
        self.harness: dict[object, bool] = {}  # code object -> the harness's own

    def hook(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            own = self.harness.get(code)
            if own is None:
                own = self.harness[code] = _harness(code.co_filename)
            if not own:
                self.calls += 1
            elif code.co_name in _TRANSPORT:
                self.c_calls += 1
        elif event == "c_call":
            self.c_calls += 1


PROJECT = ("broker/", "storage/", "wheel/", "replication/")
# the frames of the request itself: the front's reading and its frame
REQUEST_FRAMES = frozenset(("Connection.data_received", "Connection._step", "Connection._run"))


class PathRecorder:
    """Records, while hooked, each call from a module of broker/ into
    another module of the project made by the request (a frame under the
    connection's reading or its request frame), in order."""

    def __init__(self, root: str) -> None:
        self.root = root + os.sep
        self.entries: list[tuple[str, str]] = []  # (file, function) entered
        self.modules: dict[object, str | None] = {}  # code object -> its file in the project, or None
        self.seen: dict[int, FrameType] = {}  # the frames entered: a later `call` of one is a resumption
        # the collector's callbacks run under whatever frame allocated: not the request's path
        self.gc_callbacks = {getattr(getattr(c, "__func__", c), "__code__", None) for c in gc.callbacks}

    def module(self, frame: FrameType) -> str | None:
        code = frame.f_code
        known = self.modules.get(code, "")
        if known == "":
            name = code.co_filename
            rel = name[len(self.root):] if name.startswith(self.root) else ""
            known = self.modules[code] = rel if rel.startswith(PROJECT) else None
        return known

    def hook(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        if self.seen.get(id(frame)) is frame:
            return
        self.seen[id(frame)] = frame
        callee = self.module(frame)
        if callee is None or frame.f_code in self.gc_callbacks:
            return
        caller, up, requested = None, frame.f_back, frame.f_code.co_qualname in REQUEST_FRAMES
        while up is not None:
            if caller is None:
                caller = self.module(up)
            requested = requested or up.f_code.co_qualname in REQUEST_FRAMES
            up = up.f_back
        if requested and caller is not None and caller != callee and caller.startswith("broker/"):
            self.entries.append((callee, frame.f_code.co_qualname))

    def path(self) -> dict[str, Any]:
        entered: dict[str, int] = {}
        before_storage: list[str] = []
        for file, _ in self.entries:
            entered[file] = entered.get(file, 0) + 1
            if (not any(f.startswith("storage/") for f in entered) and file.startswith("broker/")
                    and file not in before_storage):
                before_storage.append(file)
        return {"entries": [f"{file}:{function}" for file, function in self.entries],
                "broker_modules_before_storage": before_storage,
                "entered_more_than_once": {f: n for f, n in entered.items() if n > 1}}


class Wire(asyncio.Transport):
    """The connection's transport: what the server writes is kept; a
    future is set once a whole answer (head and Content-Length body) is in."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.answered: asyncio.Future[bytes] | None = None
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data
        end = self.out.find(b"\r\n\r\n")
        if end < 0 or self.answered is None or self.answered.done():
            return
        length = 0
        for line in bytes(self.out[:end]).split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if len(self.out) >= end + 4 + length:
            body = bytes(self.out[end + 4:end + 4 + length])
            del self.out[:end + 4 + length]
            self.answered.set_result(body)

    def writelines(self, data: Any) -> None:
        for piece in data:
            self.write(piece)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


# Wire's methods: what uvloop's transport does in C.
_TRANSPORT = frozenset(name for name in vars(Wire) if not name.startswith("__"))


class Client:
    """One keep-alive connection of the real server, fed the request's bytes
    as the socket would deliver them (`data_received`)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.wire = Wire()
        connection.connection_made(self.wire)

    @staticmethod
    def form(path: str, **params: object) -> bytes:
        body = urllib.parse.urlencode({k: str(v) for k, v in params.items()}).encode()
        return (f"POST {PREFIX}{path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/x-www-form-urlencoded"
                f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    @staticmethod
    def json_body(path: str, obj: object) -> bytes:
        body = json.dumps(obj).encode()
        return (f"POST {PREFIX}{path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    async def call(self, raw: bytes, counter: Counter | PathRecorder | None = None) -> dict[str, Any]:
        answered = self.wire.answered = asyncio.get_running_loop().create_future()
        if counter is not None:
            sys.setprofile(counter.hook)
        try:  # from the loop, as a socket's bytes are: in no Task's step
            asyncio.get_running_loop().call_soon(self.connection.data_received, raw)
            body = await answered
        finally:
            if counter is not None:
                sys.setprofile(None)
        answer: dict[str, Any] = json.loads(body)
        if answer.get("code") != 200:
            raise RuntimeError(f"{raw[:60]!r}: {answer}")
        return answer


async def least(repeat: int, one: Callable[[Counter], Any]) -> dict[str, int]:
    best: tuple[int, int] | None = None
    for _ in range(repeat):
        counter = Counter()
        await one(counter)
        pair = (counter.calls, counter.c_calls)
        best = pair if best is None or pair < best else best
    assert best is not None
    return {"python_calls": best[0], "c_calls": best[1]}


def project_root() -> str:
    """The folder the imported broker package stands in."""
    import broker
    return os.path.dirname(os.path.dirname(os.path.abspath(broker.__file__)))


async def paths(client: Client, node: DiskNode) -> dict[str, Any]:
    """--paths: the path of a send, a pull and an ack (see the docstring)."""
    root = project_root()
    out: dict[str, Any] = {}
    send = PathRecorder(root)
    await client.call(Client.form("sendMsg", topic="r", msg="hello", msgId="p1", delayMillis=0), send)
    out["send"] = send.path()
    await node.broker.commits.flush()
    pull = PathRecorder(root)
    pulled = await client.call(Client.form("pullMsg", topic="r", batch=1, ackTimeoutMillis=30_000), pull)
    out["pull"] = pull.path()
    (m,) = pulled["delayMsgList"]
    ack = PathRecorder(root)
    await client.call(Client.form("ackMsg", topic="r", msgId=m["msgId"], ack="true"), ack)
    out["ack"] = ack.path()
    out["compiled"] = [name for name, module in sorted(sys.modules.items())
                       if name.startswith(("broker.", "storage.", "wheel."))
                       and not (getattr(module, "__file__", None) or ".py").endswith(".py")]
    return out


async def measure(repeat: int, batch: int, trace: bool = False) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="hourglass-calls-")
    args = build_parser().parse_args(["serve", "--data-dir", os.path.join(work, "data"), "--port", "0",
                                      "--fsync", "batch"])
    config = config_from_args(args)
    node = DiskNode(config)
    node.broker.start()
    server = await node.serve("calls")
    client = Client(Connection(server.shared))
    out: dict[str, Any] = {"repeat": repeat, "batch": batch}
    n = 0
    try:
        def next_id() -> str:
            nonlocal n
            n += 1
            return f"m{n}"

        # warm: more commit rounds than the group commit counts before it
        # fsyncs a small round on the loop (broker.disk.group_commit,
        # INLINE_SYNC_AFTER), so every round counted is one kind
        for _ in range(INLINE_SYNC_AFTER + 4):
            await client.call(Client.form("sendMsg", topic="t", msg="warm", msgId=next_id(), delayMillis=60_000))
        if trace:
            return await paths(client, node)

        async def send(counter: Counter) -> None:
            await client.call(Client.form("sendMsg", topic="t", msg="hello", msgId=next_id(), delayMillis=60_000),
                              counter)
        out["send"] = await least(repeat, send)

        async def send_batch(counter: Counter) -> None:
            msgs = [{"msgId": next_id(), "msg": "hello", "delayMillis": 60_000} for _ in range(batch)]
            await client.call(Client.json_body("sendMsgBatch", {"topic": "t", "msgs": msgs}), counter)
        out["send_batch"] = await least(repeat, send_batch)
        out["send_batch"]["python_calls_per_msg"] = round(out["send_batch"]["python_calls"] / batch, 1)

        async def ready(count: int) -> None:
            msgs = [{"msgId": next_id(), "msg": "hello", "delayMillis": 0} for _ in range(count)]
            await client.call(Client.json_body("sendMsgBatch", {"topic": "r", "msgs": msgs}))
            # their release's record (appended after the send's answer, made
            # durable soon) committed now: not counted in the requests measured
            await node.broker.commits.flush()

        async def pull_ack(counter: Counter) -> None:
            await ready(1)
            pulled = await client.call(Client.form("pullMsg", topic="r", batch=1, ackTimeoutMillis=30_000), counter)
            (m,) = pulled["delayMsgList"]
            await client.call(Client.form("ackMsg", topic="r", msgId=m["msgId"], ack="true"), counter)
        out["pull_ack"] = await least(repeat, pull_ack)

        async def pull_ack_batch(counter: Counter) -> None:
            await ready(batch)
            pulled = await client.call(Client.form("pullMsg", topic="r", batch=batch, ackTimeoutMillis=30_000),
                                       counter)
            assert len(pulled["delayMsgList"]) == batch, len(pulled["delayMsgList"])
            for m in pulled["delayMsgList"]:
                await client.call(Client.form("ackMsg", topic="r", msgId=m["msgId"], ack="true"), counter)
        out["pull_ack_batch"] = await least(max(3, repeat // 5), pull_ack_batch)
        out["pull_ack_batch"]["python_calls_per_msg"] = round(out["pull_ack_batch"]["python_calls"] / batch, 1)

        async def pull_ack_many(counter: Counter) -> None:
            await ready(batch)
            pulled = await client.call(Client.form("pullMsg", topic="r", batch=batch, ackTimeoutMillis=30_000),
                                       counter)
            assert len(pulled["delayMsgList"]) == batch, len(pulled["delayMsgList"])
            await client.call(Client.json_body("ackMsg", {"topic": "r", "ack": True,
                                                          "msgIds": [m["msgId"] for m in pulled["delayMsgList"]]}),
                              counter)
        out["pull_ack_many"] = await least(max(3, repeat // 5), pull_ack_many)
        out["pull_ack_many"]["python_calls_per_msg"] = round(out["pull_ack_many"]["python_calls"] / batch, 1)
    finally:
        client.connection.connection_lost(None)
        node.broker.begin_stop()
        await server.close(5)
        await node.broker.stop()
        node.store.close()
        shutil.rmtree(work, ignore_errors=True)
    return out


DOC_SECTION = "### Three requests, file by file\n"
DOC_TITLES = {"send": "A send (`sendMsg` of one message due now)",
              "pull": "A pull (`pullMsg` of one ready message, standalone)",
              "ack": "An ack (`ackMsg` of that message)"}
DOC_INTRO = """What a send, a pull and an ack call, in order: each call from a module of
`broker/` into another module of the project, as file → function, from
the front's reading of the request to its answer (calls inside one
module, and storage's, the wheel's and replication's among themselves,
left out: a path ends where it enters them). `bench/calls.py --paths`
prints them from a running node (the pure sources: a profile hook sees no
compiled call), `--write-doc docs/internals.md` writes this section anew,
and `tests/integration/test_paths_documented.py` checks that these lists
are what it prints.
"""


def write_doc(traced: dict[str, Any], path: str) -> None:
    """--write-doc: the section DOC_SECTION of `path` (a Markdown file) made
    from --paths' figures, in place (or put before its "## Shards")."""
    lines = [DOC_INTRO]
    for name, title in DOC_TITLES.items():
        lines.append(f"{title}:\n")
        lines += [f"{i}. `{entry.split(':', 1)[0]}` → `{entry.split(':', 1)[1]}`"
                  for i, entry in enumerate(traced[name]["entries"], 1)]
        twice = ", ".join(f"`{m}` ({n})" for m, n in traced[name]["entered_more_than_once"].items())
        lines += ["", f"Broker modules entered before its first call into storage: "
                      f"{len(traced[name]['broker_modules_before_storage'])}. Entered more than once: {twice}.\n"]
    body = "\n".join(lines)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if DOC_SECTION in text:
        start = text.index(DOC_SECTION) + len(DOC_SECTION)
        text = text[:start] + "\n" + body + text[text.index("\n#", start):]
    else:
        start = text.index("\n## Shards") + 1
        text = text[:start] + DOC_SECTION + "\n" + body + "\n" + text[start:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--paths", action="store_true",
                        help="the path of a send, a pull and an ack through the code (the pure sources)")
    parser.add_argument("--write-doc", metavar="MARKDOWN",
                        help="with --paths: write them as that file's section " + repr(DOC_SECTION.strip()))
    args = parser.parse_args()
    try:  # the loop `hourglass serve` runs on (broker.node.server)
        import uvloop
    except ImportError:
        result = asyncio.run(measure(args.repeat, args.batch, args.paths))
        result["loop"] = "asyncio"
    else:
        result = uvloop.run(measure(args.repeat, args.batch, args.paths))
        result["loop"] = "uvloop"
    result["build"] = describe()
    if args.write_doc:
        write_doc(result, args.write_doc)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
