"""camellia-delay-queue's own Java SDK against a real `hourglass serve`, on
both backends: tests/java/SdkDriver.java calls every SDK method and runs
its long-polling listener; each answer must be what camellia's server
would make the SDK return (SPEC 2-3).

Needs a JDK (javac) and Debian's libokhttp-java, libokio-java and
libslf4j-java (`.ci/run` installs them); the SDK and fastjson jars are in
tests/java/lib. Without them the test is skipped, saying what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JAVA_DIR = os.path.join(os.path.dirname(HERE), "java")
SYSTEM_JARS = ["/usr/share/java/okhttp.jar", "/usr/share/java/okio.jar", "/usr/share/java/slf4j-api.jar",
               "/usr/share/java/slf4j-simple.jar"]
SDK_JARS = [os.path.join(JAVA_DIR, "lib", name) for name in ("camellia-delay-queue-sdk.jar", "fastjson-1.2.83.jar")]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver_classes(tmp_path_factory) -> str:
    """SdkDriver compiled against the SDK: the classpath to run it with."""
    missing = [tool for tool in ("javac", "java") if shutil.which(tool) is None]
    missing += [jar for jar in SYSTEM_JARS + SDK_JARS if not os.path.exists(jar)]
    if missing:
        pytest.skip(f"camellia's SDK needs {', '.join(missing)} "
                    "(apt-get install default-jdk-headless libokhttp-java libokio-java libslf4j-java)")
    out = tmp_path_factory.mktemp("sdk-driver")
    classpath = os.pathsep.join(SYSTEM_JARS + SDK_JARS)
    subprocess.run(["javac", "-d", str(out), "-cp", classpath, os.path.join(JAVA_DIR, "SdkDriver.java")],
                   check=True, capture_output=True, timeout=120)
    return os.pathsep.join([classpath, str(out)])


def test_camellias_sdk_gets_camellias_answers(api, driver_classes, tmp_path):
    prefix = "sdk-" + uuid.uuid4().hex[:8]
    run = subprocess.run(["java", "-cp", driver_classes, "SdkDriver", api.server.base, prefix],
                         capture_output=True, text=True, timeout=120)
    (tmp_path / "sdk.err").write_text(run.stderr)
    got = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert got.get("done") == "true", f"the driver stopped early ({run.returncode}): {run.stdout}\n{run.stderr[-3000:]}"
    # msgId:msg:status:retry
    assert got["send"] == "a1:hello:1:0"
    assert got["send_duplicate"] == "a1:hello:1:0"  # a live id: the stored message, unchanged
    assert got["get"] == "a1:hello:1:0"
    assert got["get_missing"] == "null"  # code 404 in an HTTP 200: the SDK's null, no exception
    assert (got["delete"], got["delete_again"], got["delete_missing"]) == ("true", "false", "false")
    assert got["get_deleted"] == "a1:hello:7:0"
    # The SDK's deleteMsg(topic, msgId, release) does not send `release` (camellia 6b57ff3d):
    # an ended message, so false, and nothing forgotten.
    assert (got["delete_release"], got["get_released"]) == ("false", "a1:hello:7:0")
    assert got["send_past_trigger"] == "past:due:2:0"  # a negative delay: due now, answered ready
    assert got["send_zero_delay"] == "zero:now:2:0"
    assert got["send_empty_msg_error"] == "PARAM_WRONG"  # code 400: the SDK's PARAM_WRONG
    assert got["pull_code"] == "200"
    assert sorted(filter(None, got["pull"].split(","))) == ["past:due:3:1", "zero:now:3:1"]  # retry counts pulls
    assert (got["ack_code"], got["get_acked"]) == ("200", "past:due:4:1")
    assert (got["nack_code"], got["get_nacked"]) == ("200", "zero:now:2:1")
    assert got["ack_unknown_code"] == "200"
    assert got["long_poll_empty"] == "200:0" and got["long_poll_waited_ms_at_least_900"] == "true"
    assert got["long_poll_woken"] == "soon:x:3:1"
    assert got["listener_ok"] == "ok:fine:4:1"
    assert got["listener_boom"] == "boom:fails once:4:2"  # an exception in the listener: delivered again
    assert got["listener_never"] == "never:always nacked:6:2"  # maxRetry 1: two deliveries, then ended
    assert got["listener_deliveries"] == "ok=1,boom=2,never=2"
    assert got["listener_removed"] == "true"
