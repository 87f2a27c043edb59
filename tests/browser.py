"""A real headless Chromium (Debian's `chromium`) driven over the DevTools
protocol (CDP) on a websocket, for tests that look at what a browser
keeps: its cookies, localStorage, the requests a page makes.

    async with Browser.start(tmp_path) as browser:
        page = await browser.new_page()
        await page.navigate(url)
        await page.wait_for("document.body.dataset.loaded === '1'")
        cookies = await browser.cookies()
        stored = await page.evaluate("JSON.stringify(localStorage)")

The browser runs with its own profile directory under the test's tmp dir
and no background traffic (no sync, updates or component downloads), and
is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import time
from typing import Any

import aiohttp
import pytest

QUIET_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
               "--hide-scrollbars", "--window-size=1400,1000")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")


class CdpError(AssertionError):
    """Chromium answered a DevTools call with an error."""


class _Connection:
    """One websocket to the browser: calls matched to answers by id, events
    kept in order of arrival (with the session that sent them)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            future = self.waiting.pop(data.get("id"), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def call(self, method: str, session: str | None = None, **params: object) -> dict[str, Any]:
        call_id = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = future
        message: dict[str, object] = {"id": call_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_str(json.dumps(message))
        answer = await asyncio.wait_for(future, 60)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result


class Page:
    """One tab, attached in flat mode (its calls carry its session id)."""

    def __init__(self, connection: _Connection, session: str) -> None:
        self._connection = connection
        self.session = session

    async def call(self, method: str, **params: object) -> dict[str, Any]:
        return await self._connection.call(method, self.session, **params)

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if a promise)."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, condition: str, wait_s: float = 60) -> None:
        """Until the JavaScript `condition` is true in the page (a page
        being replaced by a navigation counts as not yet)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                if await self.evaluate(f"!!({condition})"):
                    return
            except CdpError:
                pass  # the context went away mid-navigation
            await asyncio.sleep(0.05)
        raise AssertionError(f"{condition!r} did not become true; the page is {await self.evaluate('location.href')}")

    def requests(self) -> list[dict[str, Any]]:
        """Every request this page sent since Network.enable, as Chromium's
        requestWillBeSent reported it ({"url", "method", "headers", ...})."""
        return [e["params"]["request"] for e in self._connection.events
                if e.get("sessionId") == self.session and e["method"] == "Network.requestWillBeSent"]


class Browser:
    def __init__(self, proc: subprocess.Popen[bytes], profile: str) -> None:
        self.proc = proc
        self.profile = profile
        self._http: aiohttp.ClientSession | None = None
        self._connection: _Connection | None = None

    @classmethod
    def start(cls, tmp_path: str | os.PathLike[str]) -> Browser:
        profile = os.path.join(str(tmp_path), "chromium-profile")
        os.makedirs(profile, exist_ok=True)
        proc = subprocess.Popen([chromium(), *QUIET_FLAGS, "--remote-debugging-port=0",
                                 f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return cls(proc, profile)

    async def __aenter__(self) -> Browser:
        # Chromium writes its port and the browser target's path here once it listens
        deadline = time.monotonic() + 60
        while not (found := self._devtools_port()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError("chromium did not open its DevTools port")
            await asyncio.sleep(0.05)
        port, path = found
        self._http = aiohttp.ClientSession()
        ws = await self._http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        self._connection = _Connection(ws)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._connection is not None:
            await self._connection.ws.close()
            self._connection.reader.cancel()
        if self._http is not None:
            await self._http.close()
        self.close()

    def _devtools_port(self) -> list[str] | None:
        """[port, browser target path] once Chromium has written both."""
        try:
            with open(os.path.join(self.profile, "DevToolsActivePort")) as f:
                lines = f.read().split()
        except FileNotFoundError:
            return None
        return lines if len(lines) == 2 else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    async def new_page(self) -> Page:
        """A new tab with its Page, Runtime and Network events on."""
        assert self._connection is not None
        target = await self._connection.call("Target.createTarget", url="about:blank")
        attached = await self._connection.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        page = Page(self._connection, attached["sessionId"])
        for domain in ("Page", "Runtime", "Network"):
            await page.call(f"{domain}.enable")
        return page

    async def cookies(self) -> list[dict[str, Any]]:
        """Every cookie the browser holds ({"name", "value", "path",
        "httpOnly", "secure", "sameSite", "expires", ...})."""
        assert self._connection is not None
        cookies: list[dict[str, Any]] = (await self._connection.call("Storage.getCookies"))["cookies"]
        return cookies
