"""broker.health: camellia's online/offline switch, on a fake monotonic clock."""

import asyncio

import orjson

from broker.health import ServingStatus
from broker.httpd import Request, Response


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

    async def handler(request):
        assert s.in_flight == (1 if request.method == "POST" and request.path.startswith("/api/") else 0)
        clock.s += 3
        return Response(200)
    tracked = s.track(handler)
    call(tracked, "GET", "/api/getMonitorData")
    call(tracked, "POST", "/metrics")
    assert s.is_idle()
    call(tracked, "POST", "/api/sendMsg")
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
