"""A data directory is its owner's alone (docs/security.md): real
`hourglass serve` processes started under umask 022 make every file and
directory private (a cluster node's Raft journal too); a node refuses a
directory group or others may reach, in one line naming the command that
closes it, unless --allow-shared-data-dir; a read-only or unopenable
directory is one line and exit 1, never a traceback."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import pytest
from cluster import NODE_IDS, Cluster
from modes import everything_under, open_to_others, read_only_tmpfs
from serving import ROOT, Server, free_port

pytestmark = pytest.mark.slow

FAR_MS = 3 * 24 * 3600 * 1000  # a far hour's files, besides the near ones
SPAN_MS = 60 * 24 * 3600 * 1000  # a span's


def umask_022() -> None:
    """Run in the child before it starts: the umask most users have."""
    os.umask(0o022)


def serve_once(data_dir, *flags: str) -> subprocess.CompletedProcess:
    """`hourglass serve` on `data_dir` under umask 022, expected to refuse
    to start: its exit code and what it printed."""
    return subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--port", str(free_port()),
                           "--data-dir", str(data_dir), *flags],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          preexec_fn=umask_022)  # preexec_fn: os.umask takes no lock


def one_line(done: subprocess.CompletedProcess) -> str:
    """The one line a refused start printed (on stderr, nothing on stdout)."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


def send_near_far_and_span(server: Server, topic: str) -> None:
    for n, delay_ms in enumerate((1000, FAR_MS, SPAN_MS)):
        status, body = server.post("sendMsg", topic=topic, msg=f"body {n}", msgId=f"m{n}", delayMillis=delay_ms)
        assert status == 200, body


def wait_checkpointed(server: Server) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, text = server.get("/metrics")
        if b"\nhourglass_checkpoints_total 0" not in text:
            return
        time.sleep(0.1)
    raise AssertionError("no checkpoint within 30 s")


def test_a_node_started_under_umask_022_makes_every_file_and_directory_private(tmp_path):
    data = tmp_path / "data"
    server = Server.start(data, log_path=tmp_path / "serve.log", preexec_fn=umask_022)
    try:
        send_near_far_and_span(server, "t")
        wait_checkpointed(server)
    finally:
        assert server.stop() == 0  # and a last checkpoint
    made = everything_under(data)
    assert {"checkpoint", "tick", "ids/secret", "commitlog", "delay"} <= made, made
    assert len([p for p in made if p.startswith("delay/")]) >= 9  # near, far and span hours
    assert open_to_others(data) == []


def test_a_cluster_node_started_under_umask_022_keeps_its_raft_journal_private(tmp_path):
    before = os.umask(0o022)  # the nodes inherit it
    try:
        cluster = Cluster.start(tmp_path / "cluster")
    finally:
        os.umask(before)
    try:
        leader = cluster.wait_leader()
        send_near_far_and_span(cluster.nodes[leader], "t")
        for n in NODE_IDS:
            wait_checkpointed(cluster.nodes[n])
    finally:
        cluster.stop()
    for n in NODE_IDS:
        node = tmp_path / "cluster" / n
        made = everything_under(node)
        assert {"checkpoint", "tick", "epochs", "ids/secret", "raft/journal"} <= made, (n, made)
        assert open_to_others(node) == [], n
    assert any((tmp_path / "cluster" / n / "leadership.log").exists() for n in NODE_IDS)


def test_a_data_dir_open_to_others_is_refused_in_one_line_naming_the_command(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    line = one_line(serve_once(data))
    command = f"chmod -R go-rwx {data}"
    assert f"the data directory {data} is open to group or others ({data} has mode 0755)" in line
    assert f"run `{command}`, or pass --allow-shared-data-dir" in line
    assert os.listdir(data) == []  # refused before anything was made in it

    server = Server.start(data, "--allow-shared-data-dir", log_path=tmp_path / "allowed.log", preexec_fn=umask_022)
    try:
        send_near_far_and_span(server, "t")
    finally:
        assert server.stop() == 0
    with open(tmp_path / "allowed.log") as f:
        warnings = [line for line in f if " WARNING " in line and "--allow-shared-data-dir" in line]
    assert len(warnings) == 1 and f"{data} has mode 0755" in warnings[0]
    assert open_to_others(data) == ["0755 ."]  # what the node made in it is private all the same

    subprocess.run(command, shell=True, check=True)
    server = Server.start(data, log_path=tmp_path / "private.log")
    try:
        status, body = server.post("getMsg", topic="t", msgId="m1")
        assert status == 200 and body["delayMsg"]["msg"] == "body 1"
    finally:
        assert server.stop() == 0


def test_a_data_dir_an_older_release_made_under_umask_022_is_refused_until_the_chmod(tmp_path):
    """An older release made its directories 0755 and files 0644; the
    directory itself may have been closed since: its entries are looked
    at too. After the command named, it serves what it held."""
    data = tmp_path / "data"
    server = Server.start(data, log_path=tmp_path / "first.log")
    try:
        send_near_far_and_span(server, "t")
    finally:
        assert server.stop() == 0
    for directory, dirs, names in os.walk(data):  # as umask 022 made them
        for name in dirs:
            os.chmod(os.path.join(directory, name), 0o755)
        for name in names:
            os.chmod(os.path.join(directory, name), 0o644)
    line = one_line(serve_once(data))
    others = len(os.listdir(data)) - 1  # every entry of the directory is open now, the checkpoint named
    assert f"({data / 'checkpoint'} has mode 0644, and {others} more in it)" in line, line
    assert f"run `chmod -R go-rwx {data}`" in line

    subprocess.run(f"chmod -R go-rwx {shlex.quote(str(data))}", shell=True, check=True)
    server = Server.start(data, log_path=tmp_path / "after.log")
    try:
        for n in range(3):
            status, body = server.post("getMsg", topic="t", msgId=f"m{n}")
            assert status == 200 and body["delayMsg"]["msg"] == f"body {n}", body
    finally:
        assert server.stop() == 0


def test_a_read_only_data_dir_is_one_line_and_exit_1(tmp_path):
    def a_stopped_node(root: str) -> None:
        server = Server.start(os.path.join(root, "data"), log_path=tmp_path / "before.log")
        send_near_far_and_span(server, "t")
        assert server.stop() == 0

    with read_only_tmpfs(tmp_path / "ro", a_stopped_node) as root:
        line = one_line(serve_once(os.path.join(root, "data")))
        assert f"the data directory {root}/data is on a read-only file system" in line, line
        line = one_line(serve_once(os.path.join(root, "missing")))
        assert f"cannot create the data directory {root}/missing: Read-only file system" in line, line


def test_a_data_dir_this_user_may_not_write_is_one_line_and_exit_1(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root may write any directory: the read-only file system is root's case")
    data = tmp_path / "data"
    data.mkdir(0o500)
    try:
        assert "is not readable and writable by this user" in one_line(serve_once(data))
    finally:
        data.chmod(0o700)


def test_a_store_that_does_not_open_is_one_line_and_exit_1(tmp_path):
    """What the start-up checks cannot foresee (here a directory where the
    checkpoint file belongs; as another user, a file root left behind)."""
    data = tmp_path / "data"
    (data / "checkpoint").mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    line = one_line(serve_once(data))
    assert f"cannot open the data directory {data}: " in line and "Is a directory" in line, line
