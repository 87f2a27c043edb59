"""The console on a real `hourglass serve` with a token, in a real headless
Chromium (Debian's `chromium`): the page shows the node's topics and a
non-empty forecast chart (a screenshot is saved in the test's tmp dir);
without the token the page and its data are refused, a cookie given by
`/console?token=` opens the console's paths only, never the API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request

import pytest
from serving import Server, request

pytestmark = pytest.mark.slow

TOKEN = "console-test-token"
TOPICS = ("orders", "reminders", "payments")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")


@pytest.fixture
def node(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    server = Server.start(tmp_path / "data", "--auth-token-file", str(token_file), token=TOKEN)
    now = int(time.time() * 1000)
    for n, topic in enumerate(TOPICS):
        msgs = [{"msgId": f"{topic}{i}", "msg": "x", "triggerTime": now + 5_000 + (i * 7_919 + n) % 3_000_000}
                for i in range(200)]
        code, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert code == 200, body
    yield server
    server.stop()


def test_the_console_shows_topics_and_the_forecast(node, tmp_path):
    browser = chromium()
    url = f"{node.base}/console?token={TOKEN}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000",
             "--virtual-time-budget=8000"]
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    for topic in TOPICS:
        assert f'data-topic="{topic}"' in dom, dom[:2000]
    per_second = dom[dom.index('id="perSecond"'):]
    per_second = per_second[:per_second.index("</svg>")]
    assert per_second.count('<rect class="bar') >= 10  # 600 messages over the next 50 min: many seconds
    assert 'data-loaded="1"' in dom
    shot = tmp_path / "console.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_the_console_needs_the_token(node):
    for path in ("/console", "/console/api/topics", "/console/api/forecast", "/console/api/node"):
        status, _ = request(node.base + path)
        assert status == 401, path
    status, _ = request(node.base + "/console?token=wrong")
    assert status == 401
    opened = urllib.request.urlopen(f"{node.base}/console?token={TOKEN}")
    cookie = opened.headers["Set-Cookie"].split(";")[0]
    assert "HttpOnly" in opened.headers["Set-Cookie"] and "SameSite=Strict" in opened.headers["Set-Cookie"]
    status, body = request(node.base + "/console/api/topics", headers={"Cookie": cookie})
    assert status == 200 and [t["topic"] for t in json.loads(body)["topics"]] == sorted(TOPICS)
    status, _ = request(node.base + "/camellia/delayQueue/getTopicInfoList", headers={"Cookie": cookie})
    assert status == 401  # the cookie opens the console, not the API
    status, body = request(node.base + "/console/api/topics?limit=2&offset=1",
                           headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body)["total"] == 3 and len(json.loads(body)["topics"]) == 2
