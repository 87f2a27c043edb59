"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis_server import redis_server


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real redis-server for the session (each test flushes it)."""
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"
