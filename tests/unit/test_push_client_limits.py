"""broker.push.client's bounds on a subscriber's answer (PushLimits), each
against a raw subscriber on loopback misbehaving as a test scripts it: an
endless header line, too many headers, a head or a body that trickles past
its deadline, bytes sent on an idle kept-alive connection, an idle
connection kept too long; and the descriptors the connections hold
(PushDescriptors): a subscription's share, a POST that waits for one
rather than opening more, and another subscription's idle connection
closed to make room."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from broker.http.descriptors import DescriptorBudget
from broker.push.client import PostFailed, PushClient, PushDescriptors
from broker.push.rules import PushAllow, PushLimits

LOCAL = PushAllow.parse(["127.0.0.1"])
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


class Subscriber:
    """A loopback server running `handler` on each connection; counts
    connections, bytes it sent, and whether the client closed on it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.sent = 0
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client.set()
        finally:
            writer.close()

    async def write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.sent += len(data)

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())  # type: ignore[arg-type]


async def endless(sub: Subscriber, writer: asyncio.StreamWriter, start: bytes) -> None:
    """`start`, then a header line that never ends, until the client closes."""
    await sub.write(writer, start)
    while True:
        await sub.write(writer, b"a" * 65536)


def test_an_endless_header_line_fails_the_post_at_max_head_bytes_without_gathering_it():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await endless(sub, writer, b"HTTP/1.1 200 OK\r\nX-Endless: ")

    async def test() -> None:
        port = await sub.start()
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, PushLimits(max_head_bytes=4096))
        with pytest.raises(PostFailed) as failed:
            await client.post(b"x", [])
        assert failed.value.reason == "head too large"
        await asyncio.wait_for(sub.closed_by_client.wait(), 5)
        assert sub.sent < 16 * 1024 * 1024  # closed as soon as the head passed 4 KiB, not at the 60 s timeout
        await client.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)


def test_more_header_lines_than_max_headers_fail_the_post():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await sub.write(writer, b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 20 + b"Content-Length: 0\r\n\r\n")
        await reader.read()

    async def test() -> None:
        port = await sub.start()
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 5, 1000, PushLimits(max_headers=10))
        with pytest.raises(PostFailed) as failed:
            await client.post(b"x", [])
        assert failed.value.reason == "too many headers"
        many = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 5, 1000, PushLimits(max_headers=21))
        assert (await many.post(b"x", []))[0] == 200  # 20 and Content-Length: within 21
        await client.close()
        await many.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)


@pytest.mark.parametrize(("start", "reason"), [
    (b"HTTP/1.1 200 OK\r\nX-Slow: ", "head timeout"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", "body timeout"),
])
def test_an_answer_that_trickles_fails_at_its_deadline_within_timeout_millis(start, reason):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await sub.write(writer, start)
        while True:  # a byte every 50 ms: never idle, never done
            await asyncio.sleep(0.05)
            await sub.write(writer, b"a")

    async def test() -> None:
        port = await sub.start()
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 100_000,
                            PushLimits(head_timeout_ms=300, body_timeout_ms=300))
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PostFailed) as failed:
            await client.post(b"x", [])
        assert failed.value.reason == reason
        assert loop.time() - started < 30  # (its deadline, not the 60 s of timeoutMillis)
        await client.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)


def test_bytes_on_an_idle_kept_connection_close_it_and_the_next_post_opens_another():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await sub.write(writer, OK)
        if sub.connections == 1:  # then an answer to no request, a header line that never ends
            await endless(sub, writer, b"HTTP/1.1 200 OK\r\nX-Endless: ")
        await read_request(reader)
        await sub.write(writer, OK)
        await reader.read()

    async def test() -> None:
        port = await sub.start()
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000)
        assert (await client.post(b"1", []))[0] == 200
        await asyncio.wait_for(sub.closed_by_client.wait(), 5)
        assert sub.sent < 16 * 1024 * 1024
        assert client._idle == [] and client._open == set() and client.held == 0
        assert (await client.post(b"2", []))[0] == 200
        assert sub.connections == 2
        await client.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)


def test_an_idle_kept_connection_is_closed_after_idle_timeout():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await sub.write(writer, OK)
        if not await reader.read(1):
            sub.closed_by_client.set()

    async def test() -> None:
        port = await sub.start()
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, PushLimits(idle_timeout_ms=200))
        assert (await client.post(b"1", []))[0] == 200
        assert len(client._idle) == 1
        await asyncio.wait_for(sub.closed_by_client.wait(), 5)
        await asyncio.sleep(0.05)
        assert client._idle == [] and client.held == 0
        await client.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)


def test_a_subscription_holds_at_most_its_share_of_descriptors_and_posts_wait_for_one():
    release = asyncio.Event

    async def test() -> None:
        answer = release()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await read_request(reader)
                await answer.wait()
                await sub.write(writer, OK)

        nonlocal sub
        sub = Subscriber(handler)
        port = await sub.start()
        budget = DescriptorBudget(0, limit=10_000)
        shared = PushDescriptors(budget, max_fds=8)
        tarpit = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, descriptors=shared)
        other = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, descriptors=shared)
        assert shared.share() == 4 and budget.push_pool() == 8
        posts = [asyncio.create_task(tarpit.post(b"x", [])) for _ in range(10)]
        await asyncio.sleep(0.3)
        assert sub.connections == 4 and tarpit.held == 4 and budget.push_open == 4  # six wait, unanswered
        assert all(not p.done() for p in posts)
        answer.set()
        assert [status for status, _ in await asyncio.gather(*posts)] == [200] * 10
        assert sub.connections == 4  # the waiting ones went over the connections that came back
        assert (await other.post(b"y", []))[0] == 200 and other.held == 1
        await tarpit.close()
        await other.close()
        await asyncio.sleep(0.05)
        assert budget.push_open == 0 and budget.push_max == 0  # no client: nothing set aside
        sub.close()
    sub: Subscriber | None = None
    run(test)


def test_a_full_pool_closes_another_subscriptions_idle_connection_for_a_new_one():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await sub.write(writer, OK)

    async def test() -> None:
        port = await sub.start()
        budget = DescriptorBudget(0, limit=10_000)
        shared = PushDescriptors(budget, max_fds=2)
        first = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, descriptors=shared)
        assert [s for s, _ in await asyncio.gather(first.post(b"1", []), first.post(b"2", []))] == [200, 200]
        assert first.held == 2 and len(first._idle) == 2  # the whole pool, idle: it was alone
        second = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, descriptors=shared)
        assert shared.share() == 1
        assert (await asyncio.wait_for(second.post(b"3", []), 5))[0] == 200
        assert second.held == 1 and first.held == 1 and budget.push_open == 2
        await first.close()
        await second.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)


def test_a_post_that_gets_no_connection_within_its_timeout_fails_as_no_connection():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(3600)  # a tarpit: never answers

    async def test() -> None:
        port = await sub.start()
        shared = PushDescriptors(DescriptorBudget(0, limit=10_000), max_fds=1)
        # the pool's one descriptor is held by a POST whose own timeout is far off, so the
        # other's 0.5 s run out while it waits (two equal timeouts would race each other)
        holder = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 60, 1000, descriptors=shared)
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 0.5, 1000, descriptors=shared)
        held = asyncio.create_task(holder.post(b"1", []))
        for _ in range(500):
            if sub.connections:
                break
            await asyncio.sleep(0.01)
        assert sub.connections == 1  # the holder's, within 5 s
        with pytest.raises(PostFailed) as failed:
            await client.post(b"2", [])
        assert failed.value.reason == "no connection"
        assert sub.connections == 1 and not held.done()  # the second never opened one of its own
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
        await holder.close()
        await client.close()
        sub.close()
    sub = Subscriber(handler)
    run(test)
