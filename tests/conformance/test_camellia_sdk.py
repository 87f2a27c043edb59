"""camellia-delay-queue's own Java SDK against a real `hourglass serve`, on
both backends: tests/java/SdkDriver.java calls every SDK method and runs
the long-polling listener, printing what each returned; the assertions
are what camellia's server would make the SDK return (docs/api.md), except
where hourglass differs on purpose (never early: docs/api.md).

Needs `java`/`javac` (Java 17: default-jdk-headless) and OkHttp, okio and
slf4j from Debian (libokhttp-java, libokio-java, libslf4j-java, in
/usr/share/java); the SDK and fastjson jars are in tests/java/lib. Without
them the tests skip, saying which is missing (`bash .ci/run` installs
them). The driver is compiled once per session into a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

pytestmark = pytest.mark.slow

JAVA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "java")
SYSTEM_JARS = os.environ.get("HOURGLASS_JAVA_LIBS", "/usr/share/java")
# jar in SYSTEM_JARS -> the Debian package that has it
DEBIAN_JARS = {"okhttp.jar": "libokhttp-java", "okio.jar": "libokio-java", "slf4j-api.jar": "libslf4j-java",
               "slf4j-simple.jar": "libslf4j-java"}
SDK_JARS = ("camellia-delay-queue-sdk.jar", "fastjson-1.2.83.jar")
HOUR_MS = 3_600_000
MINUTE_MS = 60_000


@pytest.fixture(scope="session")
def driver_classpath(tmp_path_factory) -> str:
    """Compile SdkDriver.java; the classpath to run it with."""
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: apt-get install default-jdk-headless (bash .ci/run does)")
    jars = []
    for jar, package in DEBIAN_JARS.items():
        path = os.path.join(SYSTEM_JARS, jar)
        if not os.path.exists(path):
            pytest.skip(f"{path} not found: apt-get install {package} (bash .ci/run does)")
        jars.append(path)
    for jar in SDK_JARS:
        path = os.path.join(JAVA_DIR, "lib", jar)
        if not os.path.exists(path):
            pytest.skip(f"{path} not found (see tests/java/README.md)")
        jars.append(path)
    classes = tmp_path_factory.mktemp("sdk-driver")
    compiled = subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", str(classes), "-cp", os.pathsep.join(jars),
                               os.path.join(JAVA_DIR, "SdkDriver.java")], capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    return os.pathsep.join([*jars, str(classes)])


@pytest.fixture(scope="module")
def sdk(driver_classpath, backend_flags, shared_server) -> dict:
    """What every step of the driver returned ({"value": ...} or
    {"error": {"code", "message"}}), by step name; `stderr`: its log."""
    prefix = "sdk-" + uuid.uuid4().hex[:10]
    ran = subprocess.run(["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", driver_classpath,
                          "SdkDriver", shared_server.base, prefix], capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr[-4000:]
    steps = {}
    for line in ran.stdout.splitlines():
        step = json.loads(line)
        steps[step.pop("step")] = step
    steps["stderr"] = ran.stderr
    steps["prefix"] = prefix
    return steps


def value(sdk: dict, step: str):
    """The step's return value; an exception the SDK threw fails the test, naming it."""
    got = sdk[step]
    assert "error" not in got, f"{step}: the SDK threw {got['error']}"
    return got["value"]


def test_send_in_every_form(sdk):
    topic = sdk["prefix"] + "-send"
    m = value(sdk, "send")
    assert (m["topic"], m["msgId"], m["msg"], m["status"], m["retry"], m["maxRetry"]) == (topic, "m1", "hello", 1, 0, 3)
    assert m["triggerTime"] - m["produceTime"] == 10 * MINUTE_MS
    assert m["expireTime"] - m["triggerTime"] == 2 * MINUTE_MS
    assert value(sdk, "send_duplicate") == m  # a live id: the stored message, unchanged

    generated = value(sdk, "send_generated_id")
    assert generated["msgId"] and generated["msg"] == "gen"
    assert (generated["maxRetry"], generated["expireTime"] - generated["triggerTime"]) == (10, HOUR_MS)  # defaults
    units = value(sdk, "send_timeunit_id")
    assert (units["msgId"], units["maxRetry"]) == ("m2", 5)
    assert (units["triggerTime"] - units["produceTime"], units["expireTime"] - units["triggerTime"]) == (
        10 * MINUTE_MS, 2 * HOUR_MS)
    units = value(sdk, "send_timeunit")
    assert (units["maxRetry"], units["expireTime"] - units["triggerTime"]) == (0, 30 * MINUTE_MS)
    defaults = value(sdk, "send_defaults")
    assert (defaults["maxRetry"], defaults["expireTime"] - defaults["triggerTime"]) == (10, HOUR_MS)
    for step, msg_id in (("send_delay_unit", None), ("send_delay_unit_id", "m3")):
        m = value(sdk, step)
        assert m["triggerTime"] - m["produceTime"] == 5 * MINUTE_MS and m["status"] == 1
        assert msg_id is None or m["msgId"] == msg_id


def test_a_delay_of_zero_or_less_is_due_now(sdk):
    """camellia: delayMillis <= 0 (sendMsgByTriggerTime of a past time
    sends one) makes the trigger time now, the message ready (2), and its
    ttl runs from now."""
    for step in ("send_now", "send_negative", "send_by_trigger_past"):
        m = value(sdk, step)
        assert m["status"] == 2, (step, m)
        assert m["triggerTime"] == m["produceTime"], (step, m)
        assert m["expireTime"] - m["triggerTime"] == HOUR_MS, (step, m)
    future = value(sdk, "send_by_trigger_id")
    requested = value(sdk, "send_by_trigger_id_requested")
    assert future["msgId"] == "m6" and future["status"] == 1
    # the SDK sends triggerTime - its clock as a delay; the server adds its own clock back
    assert abs(future["triggerTime"] - requested) < 5_000


def test_an_empty_msg_is_param_wrong(sdk):
    assert sdk["send_empty_msg"]["error"]["code"] == "PARAM_WRONG"


def test_an_ended_id_takes_a_new_message(sdk):
    assert value(sdk, "resend_ended_first")["msg"] == "first"
    assert value(sdk, "resend_ended_delete") is True
    again = value(sdk, "resend_ended")
    assert (again["msg"], again["status"], again["retry"]) == ("second", 1, 0)


def test_get_and_delete(sdk):
    assert value(sdk, "get") == value(sdk, "send")
    assert value(sdk, "get_missing") is None  # camellia's 404: null, no exception
    assert value(sdk, "get_unknown_topic") is None
    assert value(sdk, "delete") is True
    deleted = value(sdk, "get_deleted")
    assert (deleted["msgId"], deleted["status"]) == ("m1", 7)
    assert value(sdk, "delete_again") is False  # ended: 404, the SDK's false
    assert value(sdk, "delete_missing") is False
    assert value(sdk, "delete_release") is True
    # the SDK never sends `release`: the deleted message stays readable
    assert value(sdk, "get_after_release")["status"] == 7


def test_pull_ack_and_nack(sdk):
    assert value(sdk, "pull_unknown_topic") == {"code": 200, "msg": "success", "delayMsgList": []}
    sent = value(sdk, "pull_send")
    pulled = value(sdk, "pull")
    assert pulled["code"] == 200
    assert [(m["msgId"], m["status"], m["retry"]) for m in pulled["delayMsgList"]] == [("p1", 3, 1)]  # retry from 1
    assert pulled["delayMsgList"][0]["triggerTime"] == sent["triggerTime"]
    assert value(sdk, "pull_empty")["delayMsgList"] == []
    for step in ("ack", "ack_again", "ack_unknown", "nack_unknown", "ack_waiting", "nack", "nack_ack"):
        assert value(sdk, step)["code"] == 200, step
    assert (value(sdk, "get_acked")["status"], value(sdk, "get_acked")["retry"]) == (4, 1)
    assert value(sdk, "get_ack_waiting")["status"] == 4  # a waiting message acked: never delivered
    assert [(m["msgId"], m["retry"]) for m in value(sdk, "nack_pull1")["delayMsgList"]] == [("p3", 1)]
    assert [(m["msgId"], m["status"], m["retry"]) for m in value(sdk, "nack_pull2")["delayMsgList"]] == [
        ("p3", 3, 2)]  # a nack makes it ready again at once, its next pull counts the next delivery
    assert (value(sdk, "get_nacked_then_acked")["status"], value(sdk, "get_nacked_then_acked")["retry"]) == (4, 2)


def test_long_poll(sdk):
    empty = value(sdk, "long_poll_empty")
    assert empty["response"] == {"code": 200, "msg": "success", "delayMsgList": []}
    assert empty["answeredAt"] - empty["startedAt"] >= 400  # held until its 500 ms timeout
    sent = value(sdk, "long_poll_send")
    assert sent["status"] == 1
    polled = value(sdk, "long_poll")
    assert [(m["msgId"], m["status"], m["retry"]) for m in polled["response"]["delayMsgList"]] == [("lp1", 3, 1)]
    assert polled["answeredAt"] >= sent["triggerTime"]  # never early (camellia: up to 100 ms early)
    assert value(sdk, "long_poll_ack")["code"] == 200


def test_the_long_polling_listener(sdk):
    for step in ("listen_send_ok", "listen_send_fail_once", "listen_send_throw_once", "listen_send_always_throw",
                 "listen_send_delayed", "listen_send_two_arg"):
        value(sdk, step)
    assert value(sdk, "add_listener") > 0 and value(sdk, "add_listener_two_arg") > 0
    final = value(sdk, "listener_final")
    assert {k: (m["status"], m["retry"]) for k, m in final.items()} == {
        "ok": (4, 1),             # returned true: acked
        "fail-once": (4, 2),      # returned false: the SDK nacked it, delivered again
        "throw-once": (4, 2),     # threw: the SDK nacks it, delivered again
        "always-throw": (6, 2),   # maxRetry=1: two deliveries, then ended
        "delayed": (4, 1),
        "two-arg": (4, 1),        # addMsgListener(topic, listener): the SDK config's listener settings
    }
    deliveries = value(sdk, "listener_deliveries")
    per_id: dict[str, list[int]] = {}
    for d in deliveries:
        per_id.setdefault(d["msgId"], []).append(d["retry"])
        assert d["status"] == 3
        assert d["at"] >= d["triggerTime"]  # never early
    assert per_id == {"ok": [1], "fail-once": [1, 2], "throw-once": [1, 2], "always-throw": [1, 2], "delayed": [1],
                      "two-arg": [1]}
    assert value(sdk, "remove_listener") is True and value(sdk, "remove_listener_two_arg") is True
    assert value(sdk, "remove_listener_again") is False
    # the 6-minute long poll is clamped by the server, not refused: the SDK never saw an error
    assert "longPollingMsg error" not in sdk["stderr"] and "ack error" not in sdk["stderr"], sdk["stderr"][-3000:]
    assert sdk["stderr"].count("listener failure (on purpose)") >= 3
