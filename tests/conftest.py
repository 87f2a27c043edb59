"""Fixtures shared by every suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from redis_server import redis_server


def pytest_configure(config: pytest.Config) -> None:
    """`bash .ci/run` says which build a run must test (HOURGLASS_TESTS_BUILD:
    `compiled` or `sources`); a run that would test the other one stops at
    once, rather than passing on the wrong build."""
    wanted = os.environ.get("HOURGLASS_TESTS_BUILD", "")
    if not wanted:
        return
    from broker.build_info import describe

    build = describe()
    compiled = "(mypyc: " in build
    if wanted not in ("compiled", "sources") or compiled != (wanted == "compiled"):
        pytest.exit(f"HOURGLASS_TESTS_BUILD={wanted}, but this run imports {build}", returncode=4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test the compiled build cannot run (marker `sources`) says why: its
    reason is the only record of why `bash .ci/run` runs it on the sources."""
    for item in items:
        mark = item.get_closest_marker("sources")
        if mark is not None and not (mark.args and isinstance(mark.args[0], str) and mark.args[0].strip()):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.sources needs its reason, a sentence")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which hourglass the suites test: the sources (pure Python) or an
    installed wheel with mypyc-compiled modules (`bash .ci/run` runs them
    both ways), and the file one compiled module came from."""
    import storage.placement
    from broker.build_info import describe

    return [f"{describe()}; storage.placement: {storage.placement.__file__}"]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real redis-server for the session (each test flushes it)."""
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def own_redis_url(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A redis-server of the test's own, stopped after it: for a test whose
    Redis no other test's node may write to (one that checks what changed)."""
    with redis_server(tmp_path) as port:
        yield f"redis://127.0.0.1:{port}/0"
