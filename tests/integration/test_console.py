"""The console on a real `hourglass serve` with a token, in a real headless
Chromium (Debian's `chromium`, driven over the DevTools protocol by
tests/browser.py): the page shows the node's topics and a non-empty
forecast chart (a screenshot is saved in the test's tmp dir); the token is
given once, to the login form or as `/console?token=`, and traded for a
session: the browser's cookie is a random session id, never the token,
its storage holds nothing, the page's own calls carry no token; a session
ends at its lifetime, at logout and at the cap of sessions; the cookie is
Secure when asked; it opens the console's paths only, never the API. On a
cluster, a follower's console calls the API through the leader. Re-drive
by filter starts a redriveMsgs job that the jobs list follows to done and
cancels while it runs; a bad parameter is shown and makes no job."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import time
import urllib.parse

import pytest
from browser import Browser, chromium
from cluster import Cluster
from serving import Server, request

pytestmark = pytest.mark.slow

TOKEN = "console-test-token"
TOPICS = ("orders", "reminders", "payments")
COOKIE = "hg_console"


def token_file(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return str(path)


def start(tmp_path, *flags: str) -> Server:
    server = Server.start(tmp_path / "data", "--auth-token-file", token_file(tmp_path), *flags, token=TOKEN)
    now = int(time.time() * 1000)
    for n, topic in enumerate(TOPICS):
        msgs = [{"msgId": f"{topic}{i}", "msg": "x", "triggerTime": now + 5_000 + (i * 7_919 + n) % 3_000_000}
                for i in range(200)]
        code, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert code == 200, body
    return server


@pytest.fixture
def node(tmp_path):
    server = start(tmp_path)
    yield server
    server.stop()


def call(base: str, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request, redirects not followed."""
    url = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def login(base: str, token: str = TOKEN) -> tuple[int, dict[str, str]]:
    status, headers, _ = call(base, "POST", "/console/login", urllib.parse.urlencode({"token": token}).encode(),
                              {"Content-Type": "application/x-www-form-urlencoded"})
    return status, headers


def session_of(headers: dict[str, str]) -> str:
    name, _, value = headers["Set-Cookie"].split(";")[0].partition("=")
    assert name == COOKIE
    return value


def console_status(base: str, session: str, path: str = "/console/api/topics") -> int:
    return call(base, "GET", path, headers={"Cookie": f"{COOKIE}={session}"})[0]


async def log_in_with_the_form(browser: Browser, base: str):
    page = await browser.new_page()
    await page.navigate(base + "/console")
    await page.wait_for("location.pathname === '/console/login' && document.querySelector('input[name=token]')")
    await page.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(TOKEN)};"
                        f"document.forms[0].submit()")
    await page.wait_for("location.pathname === '/console' && document.body.dataset.loaded === '1'")
    return page


def the_cookie(cookies: list[dict]) -> dict:
    (cookie,) = [c for c in cookies if c["name"] == COOKIE]
    return cookie


def test_the_console_shows_topics_and_the_forecast(node, tmp_path):
    browser = chromium()
    url = f"{node.base}/console?token={TOKEN}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000",
             "--virtual-time-budget=8000", f"--user-data-dir={tmp_path / 'profile'}"]
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


def test_the_token_in_the_address_becomes_a_session_and_leaves_no_trace(node, tmp_path):
    """`/console?token=` once: the browser ends up at /console without the
    token in its address, holding a session cookie that is not the token,
    nothing in localStorage or sessionStorage, and the page's requests carry
    no Authorization header."""
    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await browser.new_page()
            await page.navigate(f"{node.base}/console?token={TOKEN}")
            await page.wait_for("document.body && document.body.dataset.loaded === '1'")
            assert await page.evaluate("location.href") == node.base + "/console"
            assert await page.evaluate("document.querySelectorAll('tr[data-topic]').length") == len(TOPICS)
            cookie = the_cookie(await browser.cookies())
            assert TOKEN not in cookie["value"] and len(cookie["value"]) >= 22  # >= 128 random bits
            assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == (
                True, "Strict", "/console", False)
            assert await page.evaluate("JSON.stringify(localStorage)") == "{}"
            assert await page.evaluate("JSON.stringify(sessionStorage)") == "{}"
            assert COOKIE not in await page.evaluate("document.cookie")  # HttpOnly: no script reads it
            sent = [r for r in page.requests() if "/console/api/" in r["url"]]
            assert sent and not [r for r in sent if "authorization" in {k.lower() for k in r["headers"]}]
            return cookie["value"]
    session = asyncio.run(run())
    assert console_status(node.base, session) == 200
    # the session opens the console, not the API
    status, _ = request(node.base + "/camellia/delayQueue/getTopicInfoList", headers={"Cookie": f"{COOKIE}={session}"})
    assert status == 401


def test_the_login_form_opens_the_console_and_logout_ends_the_session(node, tmp_path):
    """The form posts the token once; the page loads its data, looks up a
    message and lists dead letters through the console's paths on the
    cookie alone; logging out ends the session on the node."""
    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await log_in_with_the_form(browser, node.base)
            cookie = the_cookie(await browser.cookies())
            assert TOKEN not in cookie["value"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert await page.evaluate("JSON.stringify(localStorage) + JSON.stringify(sessionStorage)") == "{}{}"
            assert await page.evaluate("document.querySelectorAll('tr[data-topic]').length") == len(TOPICS)
            await page.evaluate("document.querySelector('tr[data-topic=orders]').click()")  # its dead letters
            await page.wait_for("document.getElementById('deadTopic').textContent === '(orders)'")
            await page.evaluate("document.getElementById('lkTopic').value = 'orders';"
                                "document.getElementById('lkId').value = 'orders7';"
                                "document.getElementById('lookup').click()")
            await page.wait_for("document.getElementById('lkOut').textContent.includes('\"msgId\": \"orders7\"')")
            sent = [r for r in page.requests() if "/console/" in r["url"]]
            assert not [r for r in sent if "authorization" in {k.lower() for k in r["headers"]}]
            assert console_status(node.base, cookie["value"]) == 200
            await page.evaluate("document.getElementById('logout').click()")
            await page.wait_for("location.pathname === '/console/login'")
            assert not [c for c in await browser.cookies() if c["name"] == COOKIE]
            return cookie["value"]
    session = asyncio.run(run())
    assert console_status(node.base, session) == 401  # ended on the node, not only in the browser


def test_a_session_past_its_lifetime_is_refused(tmp_path):
    server = start(tmp_path, "--console-session-ttl-s", "4")
    try:
        async def run():
            async with Browser.start(tmp_path) as browser:
                page = await browser.new_page()
                await page.navigate(server.base + "/console/login")
                await page.wait_for("document.querySelector('input[name=token]')")
                await page.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(TOKEN)};"
                                    f"document.forms[0].submit()")
                await page.wait_for("location.pathname === '/console'")
                session = the_cookie(await browser.cookies())["value"]
                assert console_status(server.base, session) == 200
                # the page's next poll after 4 s is refused, and sends the browser to the form
                await page.wait_for("location.pathname === '/console/login'")
                return session
        # The browser drops the cookie 4 s after it got it (Max-Age), so the
        # session, made before, is 4 s old by now on the node too.
        session = asyncio.run(run())
        assert console_status(server.base, session) == 401
        status, headers, _ = call(server.base, "GET", "/console", headers={"Cookie": f"{COOKIE}={session}"})
        assert (status, headers["Location"]) == (303, "/console/login")
    finally:
        server.stop()


def test_the_cookie_is_secure_with_the_flag(tmp_path):
    server = start(tmp_path, "--console-cookie-secure")
    try:
        async def run():
            async with Browser.start(tmp_path) as browser:
                await log_in_with_the_form(browser, server.base)  # 127.0.0.1 counts as a secure origin
                cookie = the_cookie(await browser.cookies())
                assert cookie["secure"] and cookie["httpOnly"] and TOKEN not in cookie["value"]
        asyncio.run(run())
        status, headers = login(server.base)
        assert status == 303 and "; Secure" in headers["Set-Cookie"]
    finally:
        server.stop()


def test_the_console_needs_the_token(node):
    for path in ("/console/api/topics", "/console/api/forecast", "/console/api/node", "/console/api/listDeadMsg"):
        status, _ = request(node.base + path)
        assert status == 401, path
    status, headers, _ = call(node.base, "GET", "/console")
    assert (status, headers["Location"]) == (303, "/console/login")  # a browser is sent to the form
    assert call(node.base, "GET", "/console?token=wrong")[0] == 401
    status, headers = login(node.base, "wrong")
    assert status == 401 and "Set-Cookie" not in headers
    assert console_status(node.base, TOKEN) == 401  # the token is no session
    status, headers, _ = call(node.base, "GET", f"/console?token={TOKEN}")
    assert (status, headers["Location"]) == (303, "/console")  # the token dropped from the address
    set_cookie = headers["Set-Cookie"]
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age=43200"):
        assert attribute in set_cookie.split("; "), set_cookie
    assert "Secure" not in set_cookie and TOKEN not in set_cookie
    session = session_of(headers)
    status, _, body = call(node.base, "GET", "/console/api/topics", headers={"Cookie": f"{COOKIE}={session}"})
    assert status == 200 and [t["topic"] for t in json.loads(body)["topics"]] == sorted(TOPICS)
    status, _ = request(node.base + "/camellia/delayQueue/getTopicInfoList", headers={"Cookie": f"{COOKIE}={session}"})
    assert status == 401  # the cookie opens the console, not the API
    status, body = request(node.base + "/console/api/topics?limit=2&offset=1",
                           headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body)["total"] == 3 and len(json.loads(body)["topics"]) == 2


def test_a_console_post_needs_the_console_header(node):
    """A page of another origin on the same host (SameSite does not tell
    ports apart) could post a form with the cookie; it cannot add a header."""
    _, headers = login(node.base)
    cookie = {"Cookie": f"{COOKIE}={session_of(headers)}", "Content-Type": "application/x-www-form-urlencoded"}
    form = urllib.parse.urlencode({"topic": "orders", "msgId": "orders3"}).encode()
    status, _, body = call(node.base, "POST", "/console/api/getMsg", form, cookie)
    assert status == 403, body
    status, _, body = call(node.base, "POST", "/console/api/getMsg", form, {**cookie, "X-Hourglass-Console": "1"})
    assert status == 200 and json.loads(body)["delayMsg"]["msgId"] == "orders3"


def test_a_login_at_the_cap_ends_the_oldest_session(tmp_path):
    server = start(tmp_path, "--max-console-sessions", "2")
    try:
        sessions = [session_of(login(server.base)[1]) for _ in range(3)]
        assert len(set(sessions)) == 3
        assert [console_status(server.base, s) for s in sessions] == [401, 200, 200]
    finally:
        server.stop()


def test_a_follower_console_logs_in_and_calls_the_api_through_the_leader(tmp_path):
    cluster = Cluster.start(tmp_path / "cluster", "--auth-token-file", token_file(tmp_path))
    try:
        leader = cluster.wait_leader()
        cluster.wait_known(leader)
        cluster.nodes[leader].token = TOKEN
        assert cluster.nodes[leader].post("sendMsg", topic="t", msg="x", msgId="m1", delayMillis=600_000)[0] == 200
        follower = next(n for n in cluster.nodes if n != leader)
        base = cluster.url(follower)
        status, headers = login(base)
        assert status == 303
        session = session_of(headers)
        status, _, body = call(base, "GET", "/console/api/node", headers={"Cookie": f"{COOKIE}={session}"})
        assert status == 200 and json.loads(body)["node"] == follower
        form = urllib.parse.urlencode({"topic": "t", "msgId": "m1"}).encode()
        status, answer, body = call(base, "POST", "/console/api/getMsg", form, {
            "Cookie": f"{COOKIE}={session}", "X-Hourglass-Console": "1",
            "Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200 and json.loads(body)["delayMsg"]["msgId"] == "m1", body
        assert answer["X-Hourglass-Leader"] == leader  # forwarded with the node's token
        assert console_status(cluster.url(leader), session) == 401  # a session is one node's
    finally:
        cluster.stop()


def test_the_search_counts_and_lists_matches_and_cancels_them_once_confirmed(node, tmp_path):
    """A search by tag shows the count and a page; bulk cancel asks first
    (declined: nothing changes), and once confirmed deletes every match."""
    for i in range(3):
        status, body = node.post("sendMsg", topic="bulkui", msg="m", msgId=f"b{i}", tag="gone", delayMillis=60_000)
        assert status == 200, body
    status, body = node.post("sendMsg", topic="bulkui", msg="m", msgId="keep", tag="kept", delayMillis=60_000)
    assert status == 200, body

    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await log_in_with_the_form(browser, node.base)
            await page.wait_for("document.querySelector('tr[data-topic=bulkui]') !== null")
            await page.evaluate("document.querySelector('tr[data-topic=bulkui]').click()")
            await page.evaluate("document.getElementById('srTag').value = 'gone';"
                                "document.getElementById('search').click()")
            await page.wait_for("document.getElementById('srCount').textContent === '3 match'")
            assert await page.evaluate("document.querySelectorAll('#srTable tbody tr').length") == 3
            await page.evaluate("window.confirm = () => false; document.getElementById('bulkCancel').click()")
            await asyncio.sleep(0.3)
            assert node.get("listMsg", topic="bulkui", tag="gone", countOnly="true")[1]["count"] == 3
            await page.evaluate("window.confirm = () => true; document.getElementById('bulkCancel').click()")
            await page.wait_for("document.getElementById('srDone').textContent === 'cancelled: 3'")
            await page.wait_for("document.getElementById('srCount').textContent === '0 match'")
    asyncio.run(run())
    assert node.post("getMsg", topic="bulkui", msgId="b0")[1]["delayMsg"]["status"] == 7
    assert node.post("getMsg", topic="bulkui", msgId="keep")[1]["delayMsg"]["status"] == 1


def test_the_console_lists_schedules_and_folds_their_runs_into_the_forecast(node, tmp_path):
    """Recurring schedules: listed (next fires, last outcome, lateness,
    paused) in the page a real browser renders, and the runs after each one's
    pending run counted in the forecast (the pending run is a message)."""
    for sid, params in (("minutely", {"everyMillis": 60_000}), ("nightly", {"cron": "30 2 * * *"}),
                        ("held", {"everyMillis": 1000})):
        status, body = node.post("putSchedule", topic="cron", scheduleId=sid, msg="x", **params)
        assert status == 200 and body["code"] == 200, body
    assert node.post("pauseSchedule", topic="cron", scheduleId="held")[1]["code"] == 200
    _, headers = login(node.base)
    session = session_of(headers)
    _, _, raw = call(node.base, "GET", "/console/api/forecast", headers={"Cookie": f"{COOKIE}={session}"})
    forecast = json.loads(raw)
    # every minute for 24 h after the pending run, and the nightly's run after its pending one (if within 24 h)
    assert forecast["scheduleRuns"] in (1439, 1440) and forecast["scheduleRunsCut"] is False
    assert sum(forecast["perMinute"]) >= 1438 + 500  # the runs, and most of the topics' 600 messages
    _, _, raw = call(node.base, "GET", "/console/api/schedules?topic=cron", headers={"Cookie": f"{COOKIE}={session}"})
    listed = json.loads(raw)
    assert listed["total"] == 3 and [s["scheduleId"] for s in listed["schedules"]] == ["held", "minutely", "nightly"]
    assert listed["schedules"][0]["paused"] is True and len(listed["schedules"][1]["nextFireTimes"]) == 3
    browser = chromium()
    url = f"{node.base}/console?token={TOKEN}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000", "--virtual-time-budget=8000",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    for sid in ("minutely", "nightly", "held"):
        assert f'data-schedule="{sid}"' in dom, dom[:2000]
    assert "runs of recurring schedules not made yet: 14" in dom


def make_dead(node: Server, topic: str, tags: dict[str, int]) -> None:
    """Dead letters (status 5: each already past its ttl), `count` of each tag."""
    past = int(time.time() * 1000) - 3_600_000
    msgs = [{"msgId": f"{tag}{i}", "msg": "x", "tag": tag, "triggerTime": past, "ttlMillis": 600_000}
            for tag, count in tags.items() for i in range(count)]
    status, body = node.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
    assert status == 200, body
    status, body = node.get("listDeadMsg", topic=topic, limit=1000)
    assert status == 200 and len(body["delayMsgList"]) == len(msgs), body


async def open_topic(browser: Browser, base: str, topic: str):
    page = await log_in_with_the_form(browser, base)
    await page.wait_for(f"document.querySelector('tr[data-topic={topic}]') !== null")
    await page.evaluate(f"document.querySelector('tr[data-topic={topic}]').click()")
    await page.wait_for(f"document.getElementById('deadTopic').textContent === '({topic})'")
    return page


def job_rows(page_rows: list[list[str]]) -> list[dict[str, str]]:
    heads = ["jobId", "topic", "filter", "due", "rate", "state", "matched", "redriven", "skipped"]
    return [dict(zip(heads, row)) for row in page_rows]


JOB_CELLS = ("[...document.querySelectorAll('#jobs tbody tr')]"
             ".map(tr => [...tr.cells].map(td => td.textContent))")


def test_redrive_by_filter_runs_a_job_the_jobs_list_follows(node, tmp_path):
    """The form re-drives one tag's dead letters as a redriveMsgs job: the
    page shows its jobId, the jobs list follows it to done with the right
    counts (its filter shown as text, never as markup), and the dead
    letters' list then holds the other tag's only."""
    tag = '<i id="injected">a</i>'
    make_dead(node, "deadui", {tag: 3, "b": 2})

    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await open_topic(browser, node.base, "deadui")
            await page.wait_for("document.querySelectorAll('#dead tbody tr').length === 5")
            await page.evaluate("window.confirm = () => false;"
                                f"document.getElementById('rdTag').value = {json.dumps(tag)};"
                                "document.getElementById('redriveFilter').click()")
            await asyncio.sleep(0.3)
            assert node.get("getJob")[1]["jobs"] == []  # declined: no job
            await page.evaluate("window.confirm = () => true; document.getElementById('redriveFilter').click()")
            await page.wait_for("document.getElementById('rdDone').textContent.startsWith('job ')")
            job_id = (await page.evaluate("document.getElementById('rdDone').textContent")).split()[1]
            await page.wait_for("[...document.querySelectorAll('#jobs tbody tr')].some(tr => "
                                "tr.dataset.state === 'done')")
            (row,) = job_rows(await page.evaluate(JOB_CELLS))
            assert (row["jobId"], row["topic"], row["state"]) == (job_id, "deadui", "done"), row
            assert (row["matched"], row["redriven"], row["skipped"]) == ("3", "3", "0"), row
            assert tag in row["filter"] and await page.evaluate("document.getElementById('injected')") is None
            # the dead list is read again once the job is done: only the other tag's are left
            await page.wait_for("document.querySelectorAll('#dead tbody tr').length === 2")
            shown = await page.evaluate("[...document.querySelectorAll('#dead tbody tr')]"
                                        ".map(tr => tr.cells[0].textContent).sort()")
            assert shown == ["b0", "b1"]
            assert await page.evaluate("document.querySelectorAll('#jobs button[data-cancel-job]').length") == 0
            return job_id
    job_id = asyncio.run(run())
    job = node.get("getJob", jobId=job_id)[1]["job"]
    assert (job["state"], job["redriven"], job["filter"]["tag"]) == ("done", 3, tag)
    assert node.post("getMsg", topic="deadui", msgId=f"{tag}0")[1]["delayMsg"]["status"] == 2
    assert node.post("getMsg", topic="deadui", msgId="b0")[1]["delayMsg"]["status"] == 5


def test_a_running_job_is_cancelled_from_the_jobs_list(node, tmp_path):
    """A job paced at 1 message a second over 60 dead letters runs for a
    minute: the list shows it running with a cancel button, the button
    cancels it, and the list stops there with what it re-drove."""
    make_dead(node, "slowui", {"s": 60})

    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await open_topic(browser, node.base, "slowui")
            await page.evaluate("window.confirm = () => true; document.getElementById('rdRate').value = '1';"
                                "document.getElementById('redriveFilter').click()")
            await page.wait_for("document.querySelector('#jobs tr[data-state=running] button[data-cancel-job]')")
            await page.evaluate("document.querySelector('#jobs button[data-cancel-job]').click()")
            await page.wait_for("document.querySelector('#jobs tr[data-state=cancelled]') !== null")
            (row,) = job_rows(await page.evaluate(JOB_CELLS))
            assert row["rate"] == "1" and int(row["redriven"]) < 60, row
            return row
    row = asyncio.run(run())
    job = node.get("getJob", jobId=row["jobId"])[1]["job"]
    assert job["state"] == "cancelled" and job["redriven"] == int(row["redriven"]), job
    assert node.get("listMsg", topic="slowui", status="5", countOnly="true")[1]["count"] == 60 - job["redriven"]


def test_a_bad_redrive_parameter_is_shown_and_makes_no_job(node, tmp_path):
    make_dead(node, "badui", {"t": 2})

    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await open_topic(browser, node.base, "badui")
            await page.evaluate("window.confirm = () => true;"
                                "document.getElementById('rdFrom').value = '2030-01-02T00:00';"
                                "document.getElementById('rdTo').value = '2030-01-01T00:00';"
                                "document.getElementById('redriveFilter').click()")
            await page.wait_for("document.getElementById('rdDone').textContent.startsWith('endedFrom: ')")
            assert "must be before endedTo" in await page.evaluate("document.getElementById('rdDone').textContent")
            assert await page.evaluate("document.querySelectorAll('#jobs tbody tr').length") == 0
    asyncio.run(run())
    assert node.get("getJob")[1]["jobs"] == []
    assert node.get("listMsg", topic="badui", status="5", countOnly="true")[1]["count"] == 2


def test_the_job_calls_need_a_session_and_the_console_header(node):
    form = urllib.parse.urlencode({"topic": "orders"}).encode()
    posting = {"Content-Type": "application/x-www-form-urlencoded", "X-Hourglass-Console": "1"}
    for method, name in (("POST", "redriveMsgs"), ("GET", "getJob"), ("POST", "cancelJob")):
        status, _, body = call(node.base, method, "/console/api/" + name, form if method == "POST" else None, posting)
        assert status == 401, (name, body)
    session = {"Cookie": f"{COOKIE}={session_of(login(node.base)[1])}"}
    status, _, body = call(node.base, "POST", "/console/api/redriveMsgs", form,
                           {**session, "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403, body  # a session without the console's header: another origin's form
    assert node.get("getJob")[1]["jobs"] == []
    status, _, body = call(node.base, "POST", "/console/api/redriveMsgs", form, {**session, **posting})
    assert status == 200 and json.loads(body)["code"] == 200, body
    job_id = json.loads(body)["jobId"]
    status, _, body = call(node.base, "GET", "/console/api/getJob", headers=session)
    assert status == 200 and [j["jobId"] for j in json.loads(body)["jobs"]] == [job_id], body
    cancel = urllib.parse.urlencode({"jobId": job_id}).encode()
    status, _, body = call(node.base, "POST", "/console/api/cancelJob", cancel, {**session, **posting})
    assert status == 200 and json.loads(body)["job"]["jobId"] == job_id, body


def test_a_paused_topic_shows_paused_with_its_held_backlog_and_what_a_resume_will_release(node, tmp_path):
    """The topics' table marks a paused topic, its held backlog (ready) and
    the age of its oldest due message; selected, the pause says what a
    resume will release (shift: those that fell due while paused are
    moved); resume and pause from the page, each once confirmed."""
    now = int(time.time() * 1000)
    before = [{"msgId": f"b{i}", "msg": "x", "triggerTime": now - 3_000 - i} for i in range(4)]
    assert node.post_json("sendMsgBatch", {"topic": "held", "msgs": before})[0] == 200
    status, body = node.post("pauseTopic", topic="held", onResume="shift")
    assert status == 200 and body["data"]["paused"] is True, body
    paused_by_ms = int(time.time() * 1000)  # (the pause's time is at or before it)
    assert node.post("pauseTopic", topic="orders", key="k1")[0] == 200  # a paused key, not the topic
    during = [{"msgId": f"d{i}", "msg": "x", "triggerTime": int(time.time() * 1000) + 200} for i in range(2)]
    assert node.post_json("sendMsgBatch", {"topic": "held", "msgs": during})[0] == 200
    deadline = time.monotonic() + 10
    while node.get("getTopicInfo", topic="held")[1]["data"]["dueUndelivered"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    cell = "document.querySelector('tr[data-topic=held]').cells[{}].textContent"

    async def run():
        async with Browser.start(tmp_path) as browser:
            page = await log_in_with_the_form(browser, node.base)
            await page.wait_for("document.querySelector('tr[data-topic=held]') !== null")
            assert await page.evaluate(cell.format(5)) == "⏸ paused"
            assert await page.evaluate(cell.format(2)) == "6"  # held: due, not handed out
            assert (await page.evaluate(cell.format(6))).endswith(" s")  # the oldest fell due seconds ago
            assert await page.evaluate("document.querySelector('tr[data-topic=orders]').cells[5].textContent") == "⏸ 1 key"
            assert await page.evaluate("document.querySelector('tr[data-topic=reminders]').cells[5].textContent") == ""
            await page.evaluate("document.querySelector('tr[data-topic=held]').click()")
            await page.wait_for("document.getElementById('flowInfo').textContent.includes('moves the 2 that fell due')")
            info = await page.evaluate("document.getElementById('flowInfo').textContent")
            assert "paused since" in info and "(on resume: shift)" in info and "Held: 6 due" in info, info
            await page.evaluate("window.confirm = () => false; document.getElementById('resume').click()")
            await asyncio.sleep(0.3)
            assert node.get("getTopicConfig", topic="held")[1]["data"]["paused"] is True  # declined: still paused
            resumed_from_ms = int(time.time() * 1000)  # (the resume's time is at or after it)
            await page.evaluate("window.confirm = () => true; document.getElementById('resume').click()")
            await page.wait_for("document.getElementById('flowInfo').textContent === 'not paused'")
            await page.wait_for(f"{cell.format(5)} === ''")
            pulled = node.post("pullMsg", topic="held", batch=10)[1]["delayMsgList"]
            assert {"b0", "b1", "b2", "b3"} <= {m["msgId"] for m in pulled}  # due before the pause: at once
            for d in during:  # the 2 were moved by the pause's length (due again some 200 ms after the resume)
                moved = node.post("getMsg", topic="held", msgId=d["msgId"])[1]["delayMsg"]["triggerTime"]
                assert moved >= d["triggerTime"] + (resumed_from_ms - paused_by_ms), (moved, d)
            await page.evaluate("document.getElementById('flowOnResume').value = 'hold';"
                                "window.confirm = () => true; document.getElementById('pause').click()")
            await page.wait_for("document.getElementById('flowInfo').textContent.includes('(on resume: hold)')")
            await page.wait_for(f"{cell.format(5)} === '⏸ paused'")
    asyncio.run(run())
    config = node.get("getTopicConfig", topic="held")[1]["data"]
    assert config["paused"] is True and config["pause"]["onResume"] == "hold"
