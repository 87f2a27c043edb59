"""The shards' local sockets trust only this user's processes
(broker.shards.link): a connection from another user's process is
dropped before any call of it is served, a dial that reaches a socket
another user listens on is refused before any call goes out, and the
`links/` directory is made private at every start, whatever mode it had.
The other user is a real process of uid 65534 (forked, then setuid)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
import time

import msgpack
import pytest
from serving import Server

from broker.shards import link
from storage.errors import Unavailable

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="making a process of another uid needs root")

NOBODY = 65534


def _as_nobody(work, report_fd: int) -> int:
    """Fork a child that runs `work()` as uid NOBODY and writes what it
    returns (an int) to `report_fd`; the child's pid."""
    pid = os.fork()
    if pid == 0:  # the child: socket calls only, then out
        code = 0
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(report_fd, b"%d\n" % work())
        except BaseException as e:
            os.write(2, repr(e).encode())
            code = 99
        os._exit(code)
    return pid


def _shared_dir() -> str:
    """A directory another user may make sockets in and reach (a lax
    `links/`, as a restore or a hand-made one may leave it)."""
    path = tempfile.mkdtemp(prefix="hg-links-")
    os.chmod(path, 0o777)
    return path


def _read_report(fd: int, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        assert time.monotonic() < deadline, "the other user's process did not report"
        try:
            data += os.read(fd, 64)
        except BlockingIOError:
            time.sleep(0.02)
    return int(data)


def test_a_connection_from_another_users_process_is_dropped_unserved():
    directory = _shared_dir()
    path = os.path.join(directory, "0.sock")
    served: list[str] = []

    async def serve(op, args, connection):
        served.append(op)
        return "served"

    def connect_and_call() -> int:  # as nobody: a call frame, then what comes back before the link closes it
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(path)
            got = b""
            try:
                s.sendall(msgpack.packb([link.CALL, 1, "hello", [5]]))
                while chunk := s.recv(4096):
                    got += chunk
            except (BrokenPipeError, ConnectionResetError):  # dropped: aborted by the link (before or after the call)
                pass
            return len(got)

    async def body() -> int:
        server = await link.listen(path, serve, lambda connection: None)
        os.chmod(path, 0o777)
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        pid = _as_nobody(connect_and_call, write_fd)
        os.close(write_fd)
        try:
            deadline = time.monotonic() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG: it does not wait)
                if done:
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert os.waitstatus_to_exitcode(status) == 0
            return _read_report(read_fd)
        finally:
            os.close(read_fd)
            server.close()

    answered = asyncio.run(body())
    assert served == [] and answered == 0


def test_a_dial_that_reaches_another_users_socket_is_refused_before_any_call():
    directory = _shared_dir()
    path = os.path.join(directory, "1.sock")
    ready_r, ready_w = os.pipe()
    report_r, report_w = os.pipe()

    def listen_and_count() -> int:  # as nobody: what a dialler sends before it hangs up
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(path)
            s.listen(1)
            os.write(ready_w, b"1")
            s.settimeout(20)
            connection, _ = s.accept()
            with connection:
                connection.settimeout(2)
                got = b""
                try:
                    while chunk := connection.recv(4096):
                        got += chunk
                except TimeoutError:
                    pass
                return len(got)

    pid = _as_nobody(listen_and_count, report_w)
    os.close(report_w)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"

    async def dial() -> None:
        peer = link.Peer(1, path, lambda op, args: None, lambda index: None)
        try:
            await peer.call("hello", [0])
        finally:
            peer.close()

    with pytest.raises(Unavailable, match="another user"):
        asyncio.run(dial())
    os.set_blocking(report_r, False)
    sent = _read_report(report_r)
    os.waitpid(pid, 0)
    assert sent == 0  # not one frame reached the other user's process


def test_links_is_made_private_at_every_start(tmp_path):
    """A node started on a data directory open to others (refused unless
    --allow-shared-data-dir) still keeps its links its user's alone."""
    data = tmp_path / "data"
    server = Server.start(data, "--shards", "2")
    assert server.stop() == 0
    links = data / "links"
    os.chmod(links, 0o777)
    server = Server.start(data, "--shards", "2", "--allow-shared-data-dir")
    try:
        assert stat.S_IMODE(os.stat(links).st_mode) == 0o700
        assert server.post("sendMsg", topic="t", msgId="m1", msg="x")[1]["code"] == 200
        assert server.post("sendMsg", topic="t", msgId="m2", msg="x")[1]["code"] == 200
    finally:
        assert server.stop() == 0
