"""The process of a node of many shards: it holds the port, starts the
shard processes, starts again one that dies, and stops them (docs/operations.md,
"Shards").

    exec     the node's process, having read its flags and checked its data
             directory (broker.node.server), becomes this module alone
             (`python -m broker.shards.supervisor`): it keeps no import of
             the engine it does not run, a few MB where the node's whole
             code would be some 30
    start    bind the public port with SO_REUSEPORT (not listening: it only
             keeps the port, a `--port 0` is chosen here), then start shard
             i of N as `hourglass serve <the same flags> --port P
             --shard-of i/N`; each listens on P itself (the kernel spreads
             connections over them) and says on a pipe when it serves
    a shard  that exits while the node runs is started again (after 0.5 s,
    dies     doubling up to 10 s while it keeps dying young); its messages
             answer 503 meanwhile, the others serve on. One that exits
             with an error before the node ever served stops the node
             (exit 1: a bad flag or data directory, which a restart would
             not mend)
    SIGTERM  each shard is sent SIGTERM and stops as a node does (requests
    SIGINT   in flight finished, a last checkpoint); one still running after
             STOP_GRACE_S is killed. Exit 0 if every shard exited 0
    killed   each shard dies with it (PR_SET_PDEATHSIG), as a node of one
             process dies whole: the next start recovers every shard
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from .connections import FILE_NAME as BOARD_FILE
from .layout import links_path

log = logging.getLogger("hourglass.shards")

STOP_GRACE_S = 30.0
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 10.0
# A shard that ran this long before dying is restarted after RESTART_FIRST_S again.
LIVED_S = 30.0
POLL_S = 0.05
READY_FD_ENV = "HOURGLASS_SHARD_READY_FD"
NODE_PID_ENV = "HOURGLASS_NODE_PID"
PR_SET_PDEATHSIG = 1


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """A socket bound to host:port with SO_REUSEPORT, not listening: the
    port is the node's while it runs, and the shards bind it too."""
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock, sock.getsockname()[1]


def die_with_node() -> None:
    """In a shard process: be killed when the node's process dies (on
    Linux); if it is gone already, exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the shard outlives a killed node until stopped by hand
        log.warning("cannot ask to die with the node's process on this system")
    expected = os.environ.get(NODE_PID_ENV)
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)


def tell_ready() -> None:
    """In a shard process: tell the node it serves."""
    fd = os.environ.get(READY_FD_ENV)
    if fd is not None:
        try:
            os.write(int(fd), b"1")
            os.close(int(fd))
        except OSError:
            pass


class Shard:
    """One shard process the node runs."""

    def __init__(self, index: int, command: list[str]) -> None:
        self.index = index
        self.command = command
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_fd = -1
        self.served = False
        self.started_at = 0.0
        self.restart_at: float | None = None
        self.delay_s = RESTART_FIRST_S
        self.exits = 0

    def start(self) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        env = {**os.environ, READY_FD_ENV: str(write), NODE_PID_ENV: str(os.getpid())}
        self.process = subprocess.Popen(self.command, env=env, pass_fds=(write,))
        os.close(write)
        self.ready_fd = read
        self.started_at = time.monotonic()
        self.restart_at = None
        log.info("shard %d started (pid %d)", self.index, self.process.pid)

    def check_ready(self) -> bool:
        if self.ready_fd < 0:
            return False
        try:
            got = os.read(self.ready_fd, 1)
        except BlockingIOError:
            return False
        os.close(self.ready_fd)
        self.ready_fd = -1
        if got:
            self.served = True
            return True
        return False

    def ended(self) -> int | None:
        """Its exit status if it ended (the process reaped), else None."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None and self.ready_fd >= 0:
            os.close(self.ready_fd)
            self.ready_fd = -1
        return code


def shard_command(argv: Sequence[str], port: int, index: int, count: int) -> list[str]:
    """The command line of shard `index`: this process's own, the port and the shard added."""
    flags = ["-P"] if sys.flags.safe_path else []
    return [sys.executable, *flags, "-m", "broker.cli", *argv, "--port", str(port), "--shard-of", f"{index}/{count}"]


def become(host: str, port: int, node_path: str, count: int, argv: Sequence[str]) -> NoReturn:
    """Replace this process (its pid kept) by the node's supervisor alone,
    which runs `count` shards of `argv` (this process's arguments) on host:port."""
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    flags = ["-P"] if sys.flags.safe_path else []
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *flags, "-m", __name__, str(level), host, str(port), node_path,
                              str(count), *argv])


def main(args: Sequence[str]) -> int:
    """`python -m broker.shards.supervisor LEVEL HOST PORT DATA COUNT ARGV...` (as `become` runs it)."""
    level, host, port, node_path, count, *argv = args
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(host, int(port), node_path, int(count), argv)


def run(host: str, port: int, node_path: str, count: int, argv: Sequence[str]) -> int:
    """Run the node's `count` shards until SIGTERM or SIGINT (module docstring)."""
    try:
        reserved, port = reserve_port(host, port)
    except OSError as e:
        log.critical("cannot listen on %s:%d: %s", host, port, e.strerror)
        return 1
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    with contextlib.suppress(FileNotFoundError):  # the node's connections start from none (broker.shards.connections)
        os.unlink(os.path.join(links_path(node_path), BOARD_FILE))
    shards = [Shard(i, shard_command(argv, port, i, count)) for i in range(count)]
    log.info("starting %d shards on http://%s:%d (%s)", count, host, port, node_path)
    for shard in shards:
        shard.start()
    node_served = False
    failed = False
    try:
        while not stop:
            now = time.monotonic()
            for shard in shards:
                if shard.check_ready() and not node_served and all(s.served for s in shards):
                    node_served = True
                    log.info("serving on http://%s:%d (%d shards)", host, port, count)
                if shard.restart_at is not None:
                    if now >= shard.restart_at:
                        shard.start()
                    continue
                code = shard.ended()
                if code is None:
                    continue
                shard.exits += 1
                if not node_served and code > 0:  # it failed starting (killed by a signal: started again)
                    log.critical("shard %d exited with %d before the node served: stopping", shard.index, code)
                    failed = True
                    stop.append(0)
                    break
                lived = now - shard.started_at
                shard.delay_s = RESTART_FIRST_S if lived >= LIVED_S else min(shard.delay_s * 2, RESTART_MAX_S)
                shard.restart_at = now + shard.delay_s
                log.error("shard %d exited with %d after %.1f s; starting it again in %.1f s", shard.index, code,
                          lived, shard.delay_s)
            time.sleep(POLL_S)
    finally:
        codes = stop_all(shards)
        reserved.close()
    if failed or any(code != 0 for code in codes):
        return 1
    log.info("stopped")
    return 0


def stop_all(shards: Sequence[Shard]) -> list[int]:
    """SIGTERM to every shard running; SIGKILL to any left after STOP_GRACE_S. Their exit statuses."""
    running = [s for s in shards if s.process is not None and s.process.poll() is None]
    for shard in running:
        assert shard.process is not None
        shard.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    codes = []
    for shard in shards:
        process = shard.process
        if process is None:
            continue
        try:
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
            # one stopped while it was starting (no handler of its own yet) served nothing: a clean stop
            codes.append(0 if code == -signal.SIGTERM and not (shard.served or shard.check_ready()) else code)
        except subprocess.TimeoutExpired:
            log.error("shard %d did not stop in %.0f s: killed", shard.index, STOP_GRACE_S)
            process.kill()
            codes.append(process.wait())
    return codes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
