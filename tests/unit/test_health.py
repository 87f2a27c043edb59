"""broker.http.health: camellia's online/offline switch, on a fake monotonic
clock; its count of API calls kept by the frame that runs each request
(broker.http.httpd, a real HttpServer over loopback)."""

import asyncio

import orjson

from broker.http.commands import HERE, CommandTable
from broker.http.health import ServingStatus
from broker.http.http_types import Request, Response
from broker.http.httpd import HttpServer


class FakeClock:
    def __init__(self) -> None:
        self.s = 100.0

    def __call__(self) -> float:
        return self.s


def call(handler, method: str, path: str):
    return asyncio.run(handler(Request(method, path, b"", {}, b"", None)))


def answer(response: Response) -> tuple[int, int]:
    return response.status, orjson.loads(response.body)["code"]


def test_offline_answers_500_until_no_api_call_ran_for_idle_s():
    clock = FakeClock()
    woken = []
    s = ServingStatus(20, "/api/", on_offline=lambda: woken.append(1), now_s=clock)
    assert answer(call(s.status, "GET", "/x")) == (200, 200)
    assert answer(call(s.set_offline, "GET", "/x")) == (500, 500)  # just started: not idle yet
    assert woken == [1] and not s.online
    assert answer(call(s.status, "GET", "/x")) == (500, 500)
    assert answer(call(s.check, "GET", "/x")) == (200, 200)
    clock.s += 20
    assert answer(call(s.set_offline, "GET", "/x")) == (200, 200)
    assert woken == [1]  # going offline again wakes nothing
    assert answer(call(s.set_online, "POST", "/x")) == (200, 200) and s.online


def test_only_api_posts_keep_the_node_busy():
    clock = FakeClock()
    s = ServingStatus(5, "/api/", now_s=clock)
    clock.s += 5
    in_flight: list[int] = []  # what each handler saw

    async def handler(request):
        in_flight.append(s.in_flight)
        clock.s += 3
        await asyncio.sleep(0)  # (waits: the count holds across a Task's resumption)
        return Response(200)
    table = CommandTable(1024, s)
    for method, path in (("GET", "/api/getMonitorData"), ("POST", "/metrics"), ("POST", "/api/sendMsg")):
        table.add(method, path, handler, where=HERE, inline=True)

    async def serve(*requests: tuple[str, str]) -> None:
        server = HttpServer(lambda request: table.commands[(request.method, request.path)])
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for method, path in requests:
            writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
        writer.close()
        await writer.wait_closed()
        await server.close(1)
    asyncio.run(serve(("GET", "/api/getMonitorData"), ("POST", "/metrics")))
    assert in_flight == [0, 0] and s.is_idle()
    asyncio.run(serve(("POST", "/api/sendMsg")))
    assert in_flight == [0, 0, 1]
    assert s.in_flight == 0 and not s.is_idle()  # idle counts from the end of the last call
    clock.s += 5
    assert s.is_idle()


def test_a_long_poll_ends_only_when_the_node_goes_offline_after_it_started():
    s = ServingStatus(0, "/api/")
    before = s.ends_long_poll()
    assert not before()
    s.go_offline()
    after = s.ends_long_poll()
    assert before() and not after()
