"""`broker.client` against a real `hourglass serve` on 127.0.0.1, plus small
in-process aiohttp stubs for what a standalone node never does on its own:
answer 503, redirect like a follower, lose an answer after applying it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json

import aiohttp
import pytest
from aiohttp import web
from serving import Server, free_port

from broker.client import Consumer, DelayMsg, DelayQueueClient, DelayQueueError, NewMsg
from storage.entry import Status
from storage.errors import ConfigError

pytestmark = pytest.mark.slow

BOUND_S = 60  # no test body runs longer than this


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, BOUND_S))


@pytest.fixture
def server(tmp_path):
    server = Server.start(tmp_path / "data")
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def stub(handler):
    """An aiohttp app on a free loopback port answering every path with `handler`."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def wire_msg(topic: str, msg_id: str) -> dict:
    return {"topic": topic, "msgId": msg_id, "msg": "m", "produceTime": 1, "triggerTime": 1, "expireTime": 2,
            "maxRetry": 3, "retry": 0, "status": 2}


# ------------------------------------------------------------------- values

def test_delay_msg_from_json_with_and_without_the_extensions():
    camellia = wire_msg("t", "a")
    assert DelayMsg.from_json(camellia) == DelayMsg("t", "a", "m", 1, 1, 2, 3, 0, Status.READY, 0, "")
    ours = DelayMsg.from_json({**camellia, "priority": 5, "tag": "vip", "extra": "ignored",
                               "deliveryId": "0190a2b3c4d5e6f7"})
    assert (ours.priority, ours.tag, ours.status, ours.delivery_id) == (5, "vip", Status.READY, "0190a2b3c4d5e6f7")
    assert DelayMsg.from_json(camellia).delivery_id is None


def test_client_refuses_nonsense_settings_and_has_a_repr():
    with pytest.raises(ValueError, match="retries"):
        DelayQueueClient("http://x", retries=-1)
    client = DelayQueueClient("http://h:1/", retries=2)
    assert repr(client) == "DelayQueueClient('http://h:1', timeout_s=10.0, retries=2)"


# ------------------------------------------------------------ against serve

def test_send_get_pull_ack_round_trip(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            sent = await client.send("orders", "pay?", msg_id="o-1", max_retry=2, priority=3, tag="eu")
            assert (sent.topic, sent.msg_id, sent.msg, sent.max_retry, sent.retry) == ("orders", "o-1", "pay?", 2, 0)
            assert (sent.priority, sent.tag) == (3, "eu")
            assert sent.trigger_time >= sent.produce_time
            got = await client.get("orders", "o-1")
            assert got == dataclasses.replace(sent, status=got.status)  # waiting, or ready by now
            again = await client.send("orders", "changed", msg_id="o-1")  # same id: the stored message
            assert again.msg == "pay?"

            pulled = await client.long_poll("orders", timeout_ms=5_000, batch=10)
            assert [(m.msg_id, m.status, m.retry) for m in pulled] == [("o-1", Status.CONSUMING, 1)]
            await client.ack("orders", "o-1")
            assert (await client.get("orders", "o-1")).status == Status.ACKED
            assert await client.pull("orders", batch=10) == []
    run(body())


def test_send_without_id_gets_one_and_pull_filters_by_tag(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            a = await client.send("t", "a", tag="x")
            b = await client.send("t", "b", tag="y")
            assert a.msg_id != b.msg_id and len(a.msg_id) == 32
            assert [m.msg_id for m in await client.pull("t", batch=10, tags=["y"])] == [b.msg_id]
    run(body())


def test_send_batch_answers_in_order_and_repeats_idempotently(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            items = [NewMsg("first", msg_id="b-1"), {"msg": "second", "delay_ms": 0, "priority": 1}]
            sent = await client.send_batch("batch", items)
            assert [m.msg for m in sent] == ["first", "second"]
            assert sent[0].msg_id == "b-1" and sent[1].msg_id and sent[1].priority == 1
            [again] = await client.send_batch("batch", [NewMsg("changed", msg_id="b-1")])
            assert (again.msg, again.produce_time) == ("first", sent[0].produce_time)  # stored once
            pulled = await client.pull("batch", batch=10)
            assert sorted(m.msg_id for m in pulled) == sorted(m.msg_id for m in sent)
    run(body())


def test_nack_brings_the_message_back_with_retry_plus_one(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            await client.send("t", "x", msg_id="n-1")
            [first] = await client.pull("t")
            await client.nack("t", "n-1")
            [second] = await client.long_poll("t", timeout_ms=5_000)
            assert (first.msg_id, first.retry) == ("n-1", 1)  # retry counts deliveries
            assert (second.msg_id, second.retry) == ("n-1", 2)
    run(body())


def test_delete_and_release(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            await client.send("t", "x", msg_id="kept")
            await client.send("t", "y", msg_id="gone")
            await client.delete("t", "kept")
            assert (await client.get("t", "kept")).status == Status.DELETED
            await client.delete("t", "gone", release=True)
            assert await client.get("t", "gone") is None
            assert await client.pull("t", batch=10) == []
    run(body())


def test_unknowns_are_none_and_the_inspection_calls_answer(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            assert await client.get("nothing", "nope") is None
            assert (await client.topic_info("nothing"))["waitingQueueSize"] == 0  # camellia: zeros
            await client.send("known", "x", delay_ms=60_000)
            info = await client.topic_info("known")
            assert info["topic"] == "known"
            assert any(i["topic"] == "known" for i in await client.topic_info_list())
            assert isinstance(await client.monitor_data(), dict)
            assert (await client.health())["status"] == "ok"
    run(body())


def test_bad_input_raises_at_once_naming_the_parameter(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            with pytest.raises(DelayQueueError) as caught:
                await client.send("t", "")
            assert (caught.value.code, caught.value.endpoint) == (400, "sendMsg")
            assert "msg" in caught.value.msg
    run(body())


def test_long_poll_outlasts_the_per_call_timeout(server):
    async def body():
        async with DelayQueueClient(server.base, timeout_s=0.5, retries=0) as client:
            assert await client.long_poll("empty", timeout_ms=1_500) == []
    run(body())


# ------------------------------------------------------------------ consumer

def test_consumer_acks_what_succeeds_and_nacks_what_raises(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            await client.send_batch("jobs", [{"msg": "fine", "msg_id": "ok"}, {"msg": "boom", "msg_id": "bad"}])
            seen = []
            done = asyncio.Event()

            async def handler(msg: DelayMsg) -> None:
                seen.append((msg.msg_id, msg.retry))
                if msg.msg_id == "bad" and msg.retry == 1:
                    raise RuntimeError("first try fails")
                if len(seen) == 3:
                    done.set()

            consumer = Consumer(client, "jobs", handler, concurrency=2, long_poll_ms=500)
            task = asyncio.create_task(consumer.run())
            await done.wait()
            consumer.stop()
            await task
            assert sorted(seen) == [("bad", 1), ("bad", 2), ("ok", 1)]  # retry counts deliveries
            assert (consumer.acked, consumer.nacked) == (2, 1)
            bad = await client.get("jobs", "bad")
            assert (bad.status, bad.retry) == (Status.ACKED, 2)
            assert repr(consumer) == "Consumer(topic='jobs', in_flight=0/2, acked=2, nacked=1, stopping)"
    run(body())


def test_consumer_holds_no_more_than_its_slots_and_stops_gracefully(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            sent = await client.send_batch("jobs", [{"msg": str(i)} for i in range(10)])
            in_flight = peak = 0
            full, release = asyncio.Event(), asyncio.Event()

            async def handler(msg: DelayMsg) -> None:
                nonlocal in_flight, peak
                in_flight += 1
                peak = max(peak, in_flight)
                if in_flight == 3:
                    full.set()
                await release.wait()
                in_flight -= 1

            consumer = Consumer(client, "jobs", handler, concurrency=3, batch=10, long_poll_ms=500)
            task = asyncio.create_task(consumer.run())
            await full.wait()
            statuses = [(await client.get("jobs", m.msg_id)).status for m in sent]
            assert statuses.count(Status.CONSUMING) == 3 and statuses.count(Status.READY) == 7

            consumer.stop()
            await asyncio.sleep(0.2)
            assert not task.done()  # the three handlers still run
            release.set()
            await task
            assert (peak, consumer.acked) == (3, 3)
            statuses = [(await client.get("jobs", m.msg_id)).status for m in sent]
            assert statuses.count(Status.ACKED) == 3 and statuses.count(Status.READY) == 7
    run(body())


def test_consumer_extends_a_message_as_long_as_its_handler_runs(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            await client.send("jobs", "long work", msg_id="long")
            states = []
            done = asyncio.Event()

            async def handler(msg: DelayMsg) -> None:
                assert msg.delivery_id
                for _ in range(5):  # 2.5 s of work against a 0.9 s ack timeout
                    await asyncio.sleep(0.5)
                    held = await client.get("jobs", "long")
                    states.append((held.status, held.retry))
                done.set()

            consumer = Consumer(client, "jobs", handler, concurrency=1, ack_timeout_ms=900, long_poll_ms=300)
            task = asyncio.create_task(consumer.run())
            await done.wait()
            consumer.stop()
            await task
            assert states == [(Status.CONSUMING, 1)] * 5  # never delivered again meanwhile
            assert consumer.extended >= 5 and (consumer.acked, consumer.lost) == (1, 0)
            acked = await client.get("jobs", "long")
            assert (acked.status, acked.retry) == (Status.ACKED, 1)
    run(body())


def test_consumer_that_lost_its_lease_neither_acks_nor_nacks(tmp_path):
    server = Server.start(tmp_path / "data", "--max-lease-ms", "1500")
    try:
        async def body():
            async with DelayQueueClient(server.base) as client:
                await client.send("jobs", "long work", msg_id="long")
                seen = []
                done = asyncio.Event()

                async def handler(msg: DelayMsg) -> None:
                    seen.append(msg.retry)
                    if msg.retry == 1:  # outlives the lease's 1.5 s: an extension is refused
                        await asyncio.sleep(2.5)
                        raise RuntimeError("would nack, but the lease is lost")
                    done.set()

                consumer = Consumer(client, "jobs", handler, concurrency=2, ack_timeout_ms=900, long_poll_ms=300)
                task = asyncio.create_task(consumer.run())
                await done.wait()
                consumer.stop()
                await task
                assert seen == [1, 2] and consumer.lost == 1
                assert (consumer.acked, consumer.nacked) == (1, 0)  # the second delivery's ack only
                acked = await client.get("jobs", "long")
                assert (acked.status, acked.retry) == (Status.ACKED, 2)
        run(body())
    finally:
        server.stop()


def test_consumer_stops_while_idle_in_a_long_poll(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            consumer = Consumer(client, "quiet", lambda msg: asyncio.sleep(0), long_poll_ms=30_000)
            task = asyncio.create_task(consumer.run())
            await asyncio.sleep(0.3)
            consumer.stop()
            await asyncio.wait_for(task, 5)  # well before the poll's 30 s
    run(body())


# ------------------------------------------------------------------- retries

def test_send_survives_a_restart_and_is_stored_once(tmp_path):
    port = free_port()
    first = Server.start(tmp_path / "data", port=port)

    async def body():
        async with DelayQueueClient(first.base, retries=40, max_backoff_s=0.5) as client:
            await client.send("t", "before", msg_id="a")
            first.kill()
            sending = asyncio.create_task(client.send("t", "during"))
            await asyncio.sleep(0.5)  # the send meets a dead port
            assert not sending.done()
            second = await asyncio.to_thread(Server.start, tmp_path / "data", port=port)
            try:
                sent = await sending
                pulled = await client.pull("t", batch=10)
                assert sorted(m.msg_id for m in pulled) == sorted(["a", sent.msg_id])
            finally:
                await asyncio.to_thread(second.stop)
    try:
        run(body())
    finally:
        first.kill()


def test_a_send_whose_answer_was_lost_is_retried_and_stored_once(server):
    forwarded = []

    async def lose_first_answer(request: web.Request) -> web.StreamResponse:
        async with (aiohttp.ClientSession() as session,
                    session.post(server.base + request.path, data=await request.read(),
                                 headers={"Content-Type": request.headers["Content-Type"]}) as answer):
            status, text = answer.status, await answer.text()
        forwarded.append(status)
        if len(forwarded) == 1:
            request.transport.close()  # applied by the server, but the client never hears it
        return web.Response(status=status, text=text, content_type="application/json")

    async def body():
        async with stub(lose_first_answer) as proxy, DelayQueueClient(proxy, backoff_s=0.01) as client:
            sent = await client.send("t", "once")
            assert forwarded == [200, 200]
            async with DelayQueueClient(server.base) as direct:
                assert [m.msg_id for m in await direct.pull("t", batch=10)] == [sent.msg_id]
    run(body())


def test_a_send_held_up_in_the_network_past_its_ack_is_not_stored_again(server):
    """The first attempt of a send is held (a partitioned link), the client
    times out and retries; the retry is stored, pulled and acked; then the
    held attempt reaches the node. It must answer the acked message, not
    store it again (camellia's rule for an ended id): a fault drill saw
    such late attempts deliver messages after their ack."""
    async def body():
        release = asyncio.Event()
        held: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        attempts = []

        async def hold_first(request: web.Request) -> web.StreamResponse:
            if request.method == "GET":  # the client's read of the shard map, before its first send
                async with aiohttp.ClientSession() as session, session.get(server.base + request.path_qs) as answer:
                    return web.Response(status=answer.status, text=await answer.text(), content_type="application/json")
            attempts.append(request.path)
            data = await request.read()
            first = len(attempts) == 1
            if first:
                await release.wait()
            async with (aiohttp.ClientSession() as session,
                        session.post(server.base + request.path, data=data,
                                     headers={"Content-Type": request.headers["Content-Type"]}) as answer):
                status, text = answer.status, await answer.text()
            if first:
                held.set_result(json.loads(text))
            return web.Response(status=status, text=text, content_type="application/json")

        async with stub(hold_first) as proxy, DelayQueueClient(proxy, timeout_s=0.5, backoff_s=0.01) as client, \
                DelayQueueClient(server.base) as direct:
            for send in (lambda: client.send("t", "once", msg_id="a1"),
                         lambda: client.send_batch("t", [NewMsg("once", "b1")])):
                attempts.clear()
                release.clear()
                held = asyncio.get_running_loop().create_future()
                await send()  # the first attempt timed out: this is the retry's answer
                [pulled] = await direct.pull("t", batch=10)
                await direct.ack("t", pulled.msg_id)
                release.set()
                answer = await asyncio.wait_for(held, 10)
                stored = answer.get("delayMsg") or answer["delayMsgList"][0]
                assert stored["status"] == Status.ACKED
                assert await direct.pull("t", batch=10) == []
                assert (await direct.get("t", pulled.msg_id)).status is Status.ACKED
    run(body())


def test_503_is_retried_with_the_same_id_and_other_errors_are_not():
    ids = []

    async def flaky(request: web.Request) -> web.Response:
        form = await request.post()
        ids.append(form["msgId"])
        if form["topic"] == "bad":
            return web.json_response({"code": 400, "msg": "msg: is required"}, status=400)
        if len(ids) < 3 or form["topic"] == "down":
            return web.json_response({"code": 503, "msg": "no leader", "leader": None}, status=503)
        return web.json_response({"code": 200, "msg": "success", "delayMsg": wire_msg("t", form["msgId"])})

    async def body():
        async with stub(flaky) as base, DelayQueueClient(base, retries=3, backoff_s=0.01) as client:
            sent = await client.send("t", "x")
            assert ids == [sent.msg_id] * 3

            ids.clear()
            with pytest.raises(DelayQueueError) as caught:
                await client.send("bad", "x")
            assert (caught.value.code, len(ids)) == (400, 1)

            ids.clear()
            with pytest.raises(DelayQueueError) as caught:
                await client.send("down", "x")
            assert caught.value.code == 503 and caught.value.answer["leader"] is None
            assert len(ids) == 4  # retries=3
    run(body())


def test_a_pull_is_repeated_only_when_the_node_surely_did_not_apply_it():
    """broker.retry: a 503 (refused: nothing applied) is retried for any
    call, after the pause its Retry-After asks; a 504 (a proxy lost the
    node, perhaps after it applied the call) only for an idempotent one."""
    calls: list[tuple[str, str]] = []

    async def flaky(request: web.Request) -> web.Response:
        form = await request.post()
        endpoint, topic = request.path.rsplit("/", 1)[-1], str(form["topic"])
        calls.append((endpoint, topic))
        if calls.count((endpoint, topic)) == 1:
            if topic == "refused":
                return web.json_response({"code": 503, "msg": "no leader"}, status=503, headers={"Retry-After": "1"})
            return web.json_response({"code": 504, "msg": "gateway timeout"}, status=504)
        if endpoint == "getMsg":
            return web.json_response({"code": 200, "msg": "success", "delayMsg": wire_msg(topic, "m")})
        return web.json_response({"code": 200, "msg": "success", "delayMsgList": []})

    async def body():
        async with stub(flaky) as base, DelayQueueClient(base, retries=3, backoff_s=0.01) as client:
            started = asyncio.get_running_loop().time()
            assert await client.pull("refused") == []
            assert asyncio.get_running_loop().time() - started >= 0.9  # Retry-After: 1 (less the clock's grain)
            with pytest.raises(DelayQueueError) as caught:
                await client.pull("lost")
            assert caught.value.code == 504
            assert (await client.get("lost", "m")).msg_id == "m"
        assert calls == [("pullMsg", "refused")] * 2 + [("pullMsg", "lost")] + [("getMsg", "lost")] * 2
    run(body())


def test_a_redirect_is_followed_with_method_body_and_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o600)  # readable by others: refused (--allow-readable-token)
    leader = Server.start(tmp_path / "data", "--auth-token-file", str(token_file))
    redirects = []

    async def follower(request: web.Request) -> web.Response:
        redirects.append(request.headers.get("Authorization"))
        raise web.HTTPTemporaryRedirect(leader.base + request.path_qs)

    async def body():
        async with stub(follower) as base, DelayQueueClient(base, token="s3cret-token-0123456789") as client:
            sent = await client.send("t", "via a follower", msg_id="r-1")
            assert sent.msg == "via a follower"
            assert (await client.topic_info("t"))["topic"] == "t"  # a GET with a query
            assert redirects == ["Bearer s3cret-token-0123456789"] * 3  # getShardMap (before the send), send, GET
        async with DelayQueueClient(leader.base, token="wrong", retries=0) as client:
            with pytest.raises(DelayQueueError) as caught:
                await client.get("t", "r-1")
            assert caught.value.code == 401
    try:
        run(body())
    finally:
        leader.stop()


def test_a_non_json_answer_is_an_error_naming_the_status():
    async def proxy_page(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    async def body():
        async with stub(proxy_page) as base, DelayQueueClient(base) as client:
            with pytest.raises(DelayQueueError) as caught:
                await client.get("t", "x")
            assert caught.value.code == 502 and "bad gateway" in caught.value.msg
    run(body())


def test_a_caller_session_is_used_and_left_open():
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"code": 200, "msg": "success", "status": "ok"})

    async def body():
        async with stub(ok) as base, aiohttp.ClientSession() as session:
            async with DelayQueueClient(base, session=session) as client:
                assert (await client.health())["status"] == "ok"
            assert not session.closed
    run(body())



def test_bulk_calls_list_pages_count_delete_and_reschedule(server):
    async def body():
        async with DelayQueueClient(server.base) as client:
            for i in range(5):
                await client.send("bulk", f"m{i}", msg_id=f"b{i}", tag="x" if i < 3 else "y", delay_ms=60_000 + i)
            pages = [[m.msg_id for m in page] async for page in client.list_msgs("bulk", tag="x", limit=2)]
            assert pages == [["b0", "b1"], ["b2"]]
            assert await client.count_msgs("bulk", msg_id_prefix="b", statuses=[1]) == 5
            assert await client.reschedule_msgs("bulk", tag="y", shift_ms=1000) == (2, False)
            assert (await client.get("bulk", "b4")).trigger_time == (await client.get("bulk", "b4")).produce_time \
                + 61_004
            assert await client.delete_msgs("bulk", tag="x", limit=2) == (2, True)
            assert await client.delete_msgs("bulk", all=True) == (3, False)
            assert await client.count_msgs("bulk") == 0
            with pytest.raises(DelayQueueError) as refused:
                await client.delete_msgs("bulk")
            assert refused.value.code == 400 and "all" in str(refused.value)
            with pytest.raises(ConfigError):
                await client.count_msgs("bulk", colour="red")
    run(body())


def test_subscribe_get_subscription_unsubscribe(tmp_path):
    """The push calls, against a node with --push-allow and an in-process subscriber."""
    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1")
    got: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.read())
        return web.Response(text="ok")

    async def body():
        async with stub(hook) as url, DelayQueueClient(server.base) as client:
            data = await client.subscribe("pushed", url + "/hook", secret="k", concurrency=2)
            assert data["signed"] is True and data["concurrency"] == 2 and "secret" not in data
            sent = await client.send("pushed", "hi")
            for _ in range(500):
                if got:
                    break
                await asyncio.sleep(0.01)
            assert sent.msg_id.encode() in got[0]
            assert (await client.get_subscription("pushed"))["url"] == url + "/hook"
            assert await client.unsubscribe("pushed") is True
            assert await client.unsubscribe("pushed") is False
            assert await client.get_subscription("pushed") is None
    try:
        run(body())
    finally:
        server.stop()


def test_schedule_calls_put_get_list_pause_resume_delete(server):
    """The recurring schedules' calls: a run pulled carries its schedule and
    nominal time; versions compare and set; pages; unknowns are None."""
    async def body():
        async with DelayQueueClient(server.base) as client:
            put = await client.put_schedule("sched", "every", "tick", every_ms=1000, tag="hb", version=0)
            assert put["version"] == 1 and put["everyMillis"] == 1000 and len(put["nextFireTimes"]) == 5
            first = put["nextFireTimes"][0]
            with pytest.raises(DelayQueueError) as refused:
                await client.put_schedule("sched", "every", "tick", every_ms=1000, version=0)  # exists
            assert refused.value.code == 409
            with pytest.raises(DelayQueueError) as refused:
                await client.put_schedule("sched", "bad", "x", cron="61 * * * *")
            assert refused.value.code == 400 and "cron" in str(refused.value)
            await client.put_schedule("sched", "nightly", "n", cron="0 2 * * *", time_zone="Europe/London",
                                      misfire="skip")
            await client.put_schedule("sched", "weekly", "w", cron="0 9 * * MON", limit=3)
            runs: list[DelayMsg] = []
            for _ in range(100):
                runs += await client.pull("sched", batch=10)
                if runs:
                    break
                await asyncio.sleep(0.05)
            assert runs[0].schedule_id == "every" and runs[0].scheduled_time == first
            assert runs[0].msg_id == f"every@{first}" and runs[0].tag == "hb"
            await client.ack("sched", runs[0].msg_id)
            got = await client.get_schedule("sched", "every", next=2)
            assert got is not None and len(got["nextFireTimes"]) == 2
            assert got["lastRuns"][0]["scheduledTime"] == first
            pages = [[s["scheduleId"] for s in page] async for page in client.list_schedules("sched", limit=2)]
            assert pages == [["every", "nightly"], ["weekly"]]
            paused = await client.pause_schedule("sched", "nightly")
            assert paused is not None and paused["paused"] is True and paused["nextFireTimes"] == []
            resumed = await client.resume_schedule("sched", "nightly")
            assert resumed is not None and resumed["paused"] is False and resumed["version"] == 3
            assert await client.delete_schedule("sched", "every") is True
            assert await client.delete_schedule("sched", "every") is False
            assert await client.get_schedule("sched", "every") is None
            assert await client.pause_schedule("sched", "every") is None
            assert await client.resume_schedule("sched", "every") is None
            plain = await client.send("sched", "not a run", delay_ms=60_000)
            assert plain.schedule_id is None and plain.scheduled_time is None
    run(body())
