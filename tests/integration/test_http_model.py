"""One real `hourglass serve` process, driven over HTTP by a hypothesis
state machine against an in-memory model of docs/api.md's Semantics.

The model of one topic is `{msgId: delayMsg}` (what getMsg must answer)
plus the ids that must answer 404. Every example gets a fresh topic on the
same server (starting a process costs most of a second); `restart` stops
it with SIGTERM and starts it again on the same data directory, after
which everything must read the same, statuses included.

Real time is kept out of the outcome:

- "now" messages (delayMillis=0), "past" ones (an absolute triggerTime a
  few seconds ago) and "old" ones (90 minutes ago, an earlier hour's
  files, ttlMillis=3 h) are due at once. The send rules wait until getMsg
  shows them released (the wheel releases within milliseconds) before the
  model calls them READY. "expired" ones (triggerTime two hours ago,
  ttlMillis=1000) end as 5 on release.
- "far" messages wait two hours: they stay WAITING throughout.
- Pulls ask ackTimeoutMillis=10 min and ttl is the default hour, so no
  timer fires during a run. (A restart gives CONSUMING messages the
  server's default 30 s ack timeout; an example lasts a few seconds.)

getTopicInfo first commits whatever is pending (Broker.topic_info), and
the wheel's WAITING -> READY is appended before getMsg can see it, so once
the settle step has seen a release the counts must include it: the
invariant compares them exactly, with no allowance for lag.
"""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from serving import Server

pytestmark = pytest.mark.slow

WAITING, READY, CONSUMING, ACKED, EXPIRED, ENDED, DELETED = range(1, 8)
ACK_TIMEOUT_MS = 10 * 60 * 1000
FAR_DELAY_MS = 2 * 60 * 60 * 1000
SETTLE_TIMEOUT_S = 10
EMPTY_LONG_POLL_MS = 100
# Restarts per example: a start costs most of a second.
MAX_RESTARTS = 1

KINDS = st.sampled_from(["now", "now", "past", "old", "far", "expired"])
PRIORITIES = st.sampled_from([-3, 0, 0, 7])
MAX_RETRIES = st.integers(0, 2)
TAGS = st.sampled_from(["", "a", "b"])
PULL_TAGS = st.sampled_from([(), (), (), ("a",), ("a", "b")])
# One bad item of a sendMsgBatch, each refused with 400 naming msgs[i].
BAD_ITEMS = st.sampled_from([
    {"delayMillis": "soon"},
    {"msg": None},
    {"msg": ""},
    {"priority": 2**15},
    {"maxRetry": "two"},
    {"topic": "some-other-topic"},
    {"tag": "a,b"},
])


class Running:
    """The one server of this module; `restart` replaces it."""

    def __init__(self, data_dir) -> None:
        self.data_dir = data_dir
        self.server = Server.start(data_dir)
        self.restarts = 0

    def restart(self) -> None:
        code = self.server.stop()
        assert code == 0, f"serve exited {code} on SIGTERM"
        self.server = Server.start(self.data_dir)
        self.restarts += 1


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    node = Running(tmp_path_factory.mktemp("http-model") / "data")
    yield node
    assert node.server.stop() == 0


def order_key(m: dict) -> tuple[int, int]:
    """docs/api.md, Pulling: higher priority first, then earlier triggerTime."""
    return (-m["priority"], m["triggerTime"])


class HttpModel(RuleBasedStateMachine):
    running: Running  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.topic = f"model-{uuid.uuid4().hex[:12]}"
        self.messages: dict[str, dict] = {}  # msgId -> what getMsg must answer
        self.handed: set[tuple[str, str]] = set()  # (msgId, deliveryId) of every hand-over (docs/api.md, "Leases")
        self.absent: set[str] = set()  # ids that must answer 404
        self.next_id = 0
        self.stored_any = False  # a send answered 200 (getTopicInfo is 200 from then on)
        self.restarts = 0

    def __repr__(self) -> str:
        counts = {s: sum(m["status"] == s for m in self.messages.values()) for s in range(1, 8)}
        return f"HttpModel(topic={self.topic!r}, counts={counts}, absent={len(self.absent)})"

    # -- helpers ---------------------------------------------------------------------

    @property
    def server(self) -> Server:
        return self.running.server

    def fresh_id(self) -> str:
        self.next_id += 1
        return f"m{self.next_id}"

    def item(self, msg_id: str, kind: str, priority: int, max_retry: int, tag: str) -> dict:
        """sendMsg parameters of one new message of `kind`."""
        params = {"msgId": msg_id, "msg": f"body of {msg_id} ({kind}) é", "priority": priority,
                  "maxRetry": max_retry}
        if tag:
            params["tag"] = tag
        now_ms = int(time.time() * 1000)
        if kind == "now":
            params["delayMillis"] = 0
        elif kind == "past":
            params["triggerTime"] = now_ms - 5_000 - self.next_id
        elif kind == "old":
            params["triggerTime"] = now_ms - 90 * 60 * 1000 - self.next_id
            params["ttlMillis"] = 3 * 60 * 60 * 1000
        elif kind == "far":
            params["delayMillis"] = FAR_DELAY_MS
        elif kind == "expired":
            params["triggerTime"] = now_ms - 2 * 60 * 60 * 1000
            params["ttlMillis"] = 1000
        return params

    def check_new(self, params: dict, answered: dict) -> None:
        """The answer to sending a new message, as docs/api.md describes it."""
        assert answered["topic"] == self.topic and answered["msgId"] == params["msgId"]
        assert answered["msg"] == params["msg"]
        due = answered["triggerTime"] <= answered["produceTime"]
        expired = answered["expireTime"] <= answered["produceTime"]
        # due already: ready (or expired) in the answer itself, as camellia's
        assert answered["status"] == ((EXPIRED if expired else READY) if due else WAITING), answered
        assert answered["retry"] == 0
        assert answered["priority"] == params["priority"] and answered["maxRetry"] == params["maxRetry"]
        assert answered["tag"] == params.get("tag", "")
        if "triggerTime" in params:
            assert answered["triggerTime"] == params["triggerTime"]
        else:
            assert answered["triggerTime"] == answered["produceTime"] + params["delayMillis"]
        assert answered["expireTime"] == answered["triggerTime"] + params.get("ttlMillis", 3_600_000)

    def store_new(self, params: dict, answered: dict) -> None:
        self.check_new(params, answered)
        self.messages[params["msgId"]] = dict(answered)
        self.absent.discard(params["msgId"])
        self.stored_any = True

    def settle(self) -> None:
        """Wait until the wheel has released every due WAITING message
        (getMsg shows it READY, or EXPIRED past its ttl)."""
        due = [i for i, m in self.messages.items() if m["status"] == WAITING and m["triggerTime"] <= m["produceTime"]]
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while due:
            still = []
            for msg_id in due:
                status, body = self.server.post("getMsg", topic=self.topic, msgId=msg_id)
                assert status == 200, body
                got = body["delayMsg"]
                if got["status"] == WAITING:
                    still.append(msg_id)
                    continue
                m = self.messages[msg_id]
                expect = EXPIRED if m["expireTime"] <= m["produceTime"] else READY  # the "expired" kind
                assert got["status"] == expect, f"{msg_id} released as {got['status']}, expected {expect}: {got}"
                m["status"] = expect
            due = still
            assert time.monotonic() < deadline, f"due messages not released within {SETTLE_TIMEOUT_S} s: {due}"
            if due:
                time.sleep(0.005)

    def topic_info(self) -> dict | None:
        status, body = self.server.get("getTopicInfo", topic=self.topic)
        if status == 404:
            return None
        assert status == 200, body
        return body["data"]

    def counts(self) -> tuple[int, int, int]:
        statuses = [m["status"] for m in self.messages.values()]
        return statuses.count(WAITING), statuses.count(READY), statuses.count(CONSUMING)

    def ready(self, tags: tuple[str, ...] = ()) -> list[dict]:
        return sorted((m for m in self.messages.values()
                       if m["status"] == READY and (not tags or m["tag"] in tags)), key=order_key)

    def pick(self, data, among) -> str:
        return data.draw(st.sampled_from(sorted(among)), label="msgId")

    def target(self, data, preferred: int | None = None) -> str | None:
        """A msgId to act on: mostly a known one (with status `preferred`
        when there is one), sometimes a released or never-stored one; None
        when there is nothing to choose from."""
        choices = ["known", "known", "absent"] + (["preferred", "preferred"] if preferred is not None else [])
        choice = data.draw(st.sampled_from(choices), label="target")
        preferred_ids = [i for i, m in self.messages.items() if m["status"] == preferred]
        if choice == "preferred" and preferred_ids:
            return self.pick(data, preferred_ids)
        if choice != "absent" and self.messages:
            return self.pick(data, self.messages)
        return self.pick(data, self.absent | {"never-sent"})

    # -- sending ---------------------------------------------------------------------

    @rule(data=st.data(), kind=KINDS, priority=PRIORITIES, max_retry=MAX_RETRIES, tag=TAGS,
          id_choice=st.sampled_from(["fresh", "fresh", "existing", "absent"]))
    def send(self, data, kind, priority, max_retry, tag, id_choice):
        """A fresh id, or one released by deleteMsg (or refused in a bad
        batch): a new message. An existing id: 200 with the stored message,
        unchanged (whatever else the request says)."""
        if id_choice == "existing" and self.messages:
            msg_id = self.pick(data, self.messages)
        elif id_choice == "absent" and self.absent:
            msg_id = self.pick(data, self.absent)
        else:
            msg_id = self.fresh_id()
        params = self.item(msg_id, kind, priority, max_retry, tag)
        status, body = self.server.post("sendMsg", topic=self.topic, **params)
        assert status == 200, body
        if msg_id in self.messages and self.messages[msg_id]["status"] in (WAITING, READY, CONSUMING):
            assert body["delayMsg"] == self.messages[msg_id], "a duplicate send changed the stored message"
            return
        self.store_new(params, body["delayMsg"])
        self.settle()

    @rule(data=st.data(), kinds=st.lists(st.tuples(KINDS, PRIORITIES, MAX_RETRIES, TAGS), min_size=1, max_size=5),
          bad=st.none() | BAD_ITEMS)
    def send_batch(self, data, kinds, bad):
        """sendMsgBatch, answered in order; an item may repeat an id (earlier
        in the batch, or already stored). With one bad item: 400 naming its
        index, and nothing of the batch stored."""
        items = []
        for kind, priority, max_retry, tag in kinds:
            earlier = set(self.messages) | {i["msgId"] for i in items}
            repeat = bool(earlier) and data.draw(st.booleans(), label="repeat an id")
            msg_id = self.pick(data, earlier) if repeat else self.fresh_id()
            items.append(self.item(msg_id, kind, priority, max_retry, tag))
        if bad is not None:
            index = data.draw(st.integers(0, len(items)), label="bad index")
            bad_item = {**self.item(self.fresh_id(), "now", 0, 0, ""), **bad}
            items.insert(index, {k: v for k, v in bad_item.items() if v is not None})
        status, body = self.server.post_json("sendMsgBatch", {"topic": self.topic, "msgs": items})
        if bad is not None:
            assert status == 400 and body["code"] == 400, body
            assert f"msgs[{index}]" in body["msg"], body
            self.absent |= {i["msgId"] for i in items if i["msgId"] not in self.messages}
            return
        assert status == 200, body
        answered = body["delayMsgList"]
        assert len(answered) == len(items)
        stored_here: set[str] = set()
        for params, got in zip(items, answered):
            known = self.messages.get(params["msgId"])
            if known is not None and (params["msgId"] in stored_here or known["status"] in (WAITING, READY, CONSUMING)):
                assert got == known, "a repeated id in a batch changed or re-stored"
            else:  # new, or an ended one's id: stored anew (camellia)
                self.store_new(params, got)
                stored_here.add(params["msgId"])
        self.settle()

    # -- consuming ---------------------------------------------------------------------

    def take(self, path: str, batch: int, tags: tuple[str, ...], **extra) -> None:
        params = {"topic": self.topic, "batch": batch, "ackTimeoutMillis": ACK_TIMEOUT_MS, **extra}
        if tags:
            params["tags"] = ",".join(tags)
        ready = self.ready(tags)
        status, body = self.server.post(path, **params)
        assert status == 200, body
        got = body["delayMsgList"]
        assert len(got) == min(batch, len(ready)), f"{path} gave {got}; ready: {ready}"
        keys = [order_key(m) for m in got]
        assert keys == sorted(keys), f"not in priority order: {got}"
        # The first len(got) in (priority, triggerTime) order; ties may go either way.
        taken = {m["msgId"] for m in got}
        left = [m for m in ready if m["msgId"] not in taken]
        if got and left:
            assert max(keys) <= order_key(left[0]), f"{path} gave {got} before {left[0]}"
        for m in got:
            model = self.messages[m["msgId"]]
            assert model["status"] == READY
            model["status"] = CONSUMING
            model["retry"] += 1  # retry counts deliveries (camellia)
            handed = (m["msgId"], m.pop("deliveryId"))  # a hand-over's, not the message's: getMsg has none
            assert len(handed[1]) == 16 and handed not in self.handed  # new at each hand-over
            self.handed.add(handed)
            assert m == model

    @precondition(lambda self: self.messages)
    @rule(batch=st.integers(1, 4), tags=PULL_TAGS)
    def pull(self, batch, tags):
        self.take("pullMsg", batch, tags)

    @precondition(lambda self: self.messages)
    @rule(batch=st.integers(1, 4), tags=PULL_TAGS)
    def long_poll(self, batch, tags):
        """Answers at once when a message is ready, else [] after the timeout."""
        self.take("longPollingMsg", batch, tags, longPollingTimeoutMillis=EMPTY_LONG_POLL_MS)

    @precondition(lambda self: self.messages)
    @rule(data=st.data())
    def ack(self, data):
        """camellia's rules: an ack of a waiting, ready or consuming message
        acks it; of anything else (unknown, ended) changes nothing, no error."""
        msg_id = self.target(data, preferred=CONSUMING)
        status, body = self.server.post("ackMsg", topic=self.topic, msgId=msg_id)
        assert status == 200 and body["code"] == 200, body
        model = self.messages.get(msg_id)
        if model is not None and model["status"] in (WAITING, READY, CONSUMING):
            model["status"] = ACKED

    @precondition(lambda self: self.messages)
    @rule(data=st.data())
    def nack(self, data):
        """A consuming message is ready again, or ends after its last
        delivery (retry counts them: maxRetry + 1 at most); anything else
        changes nothing, no error."""
        msg_id = self.target(data, preferred=CONSUMING)
        status, body = self.server.post("ackMsg", topic=self.topic, msgId=msg_id, ack="false")
        assert status == 200 and body["code"] == 200, body
        model = self.messages.get(msg_id)
        if model is None or model["status"] != CONSUMING:
            return
        model["status"] = ENDED if model["retry"] > model["maxRetry"] else READY

    # -- deleting ------------------------------------------------------------------------

    @precondition(lambda self: self.messages)
    @rule(data=st.data(), release=st.booleans())
    def delete(self, data, release):
        """WAITING, READY, CONSUMING -> 7 (code 200); an ended or unknown
        message answers 404 and is left as it is; release=true forgets the
        id either way (getMsg 404, the id may be sent again)."""
        msg_id = self.target(data)
        status, body = self.server.post("deleteMsg", topic=self.topic, msgId=msg_id, release=str(release).lower())
        model = self.messages.get(msg_id)
        live = model is not None and model["status"] in (WAITING, READY, CONSUMING)
        assert status == (200 if live else 404) and body["code"] == status, body
        if model is None:
            return
        if release:
            del self.messages[msg_id]
            self.absent.add(msg_id)
        elif live:
            model["status"] = DELETED

    # -- restarting and checking ---------------------------------------------------------

    @precondition(lambda self: self.restarts < MAX_RESTARTS)
    @rule()
    def restart(self):
        """SIGTERM, exit 0, start again on the same directory."""
        self.running.restart()
        self.restarts += 1

    @invariant()
    def server_agrees(self):
        for msg_id, model in self.messages.items():
            status, body = self.server.post("getMsg", topic=self.topic, msgId=msg_id)
            assert status == 200, f"getMsg {msg_id}: {status} {body}"
            assert body["delayMsg"] == model, f"getMsg {msg_id}"
        for msg_id in self.absent:
            status, body = self.server.post("getMsg", topic=self.topic, msgId=msg_id)
            assert status == 404 and body["code"] == 404, f"getMsg {msg_id} should be absent: {body}"
        info = self.topic_info()
        assert info is not None, "getTopicInfo answered 404 (camellia: 200 with zeros for an unknown topic)"
        got = (info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"])
        assert got == self.counts(), f"topic info {info}, model (waiting, ready, consuming) {self.counts()}"
        # Far messages (two hours away) all sit in camellia's 1h..6h bucket.
        buckets = info["waitingQueueInfo"]
        assert buckets["sizeOf1hourTo6hour"] == sum(buckets.values()) == info["waitingQueueSize"], info


def test_http_api_agrees_with_the_model(running):
    HttpModel.running = running
    run_state_machine_as_test(HttpModel, settings=settings(
        max_examples=15, stateful_step_count=25, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
