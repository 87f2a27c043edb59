"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis_server import redis_server


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
