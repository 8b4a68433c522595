"""A real headless browser for tests and benchmarks: Debian's Chromium, driven through the
DevTools protocol over a websocket (``websocket-client``).

:func:`find_chromium` returns the browser, or None with the reason: a test or a benchmark never
installs it (``make browser`` does, and CI runs that target).
:class:`Browser` starts one isolated Chromium (its own profile folder, no network services);
:meth:`Browser.open` loads a page in a new tab and returns a :class:`Page` that records every
network request, console message and exception the page caused, and evaluates JavaScript in
it (what a person sees: ``innerText``, clicks, typing).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0")


def _which() -> str | None:
    return next((found for name in NAMES if (found := shutil.which(name))), None)


def find_chromium() -> tuple[str | None, str]:
    """(path, "") or (None, why not). Nothing here installs it: ``make browser`` (run by CI)
    installs Debian's ``chromium``."""
    found = _which()
    return found, "" if found else (
        "Chromium is not installed (`make browser` installs Debian's chromium package; CI "
        "runs it)")


class Page:
    """One tab: the events it caused, and JavaScript evaluated in it."""

    def __init__(self, browser: "Browser", session: str, target: str) -> None:
        self._browser = browser
        self.session = session
        self.target = target
        self.requests: list[str] = []
        """URLs of every request the page made (``Network.requestWillBeSent``)."""
        self.console: list[str] = []
        """Console and log messages at level warning or error, and uncaught exceptions."""

    def send(self, method: str, **params: Any) -> dict:
        return self._browser.send(method, params, session=self.session)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                          awaitPromise=True)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def on_event(self, message: dict) -> None:
        method, params = message["method"], message.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Log.entryAdded" and params["entry"]["level"] in ("warning", "error"):
            self.console.append(params["entry"]["text"])
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("warning", "error"):
            self.console.append(" ".join(str(a.get("value")) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            self.console.append(json.dumps(params["exceptionDetails"])[:500])

    def close(self) -> None:
        self._browser.send("Target.closeTarget", {"targetId": self.target})


class Browser:
    """A headless Chromium of its own (profile in a temporary folder), stopped by
    :meth:`close`."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        import websocket

        self.profile = tempfile.mkdtemp(prefix="rewrite-chromium-")
        self.timeout = timeout
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{executable} did not start (exit {self.process.poll()})")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self._socket = websocket.create_connection(f"ws://127.0.0.1:{port}{path}",
                                                   timeout=timeout, suppress_origin=True)
        self._ids = itertools.count(1)
        self._pages: dict[str, Page] = {}
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, *, session: str | None = None
             ) -> dict:
        """Send a command and wait for its reply; events meanwhile go to their pages."""
        message: dict[str, Any] = {"id": next(self._ids), "method": method,
                                   "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._socket.send(json.dumps(message))
        while True:
            reply = self._receive()
            if reply.get("id") == message["id"]:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _receive(self) -> dict:
        message = json.loads(self._socket.recv())
        if "method" in message:
            self.events.append(message)
            page = self._pages.get(message.get("sessionId", ""))
            if page is not None:
                page.on_event(message)
        return message

    def wait_for(self, page: Page, method: str, timeout: float | None = None) -> dict:
        """The next event ``method`` of ``page`` (raises after ``timeout`` seconds)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        start = len(self.events)
        while True:
            for event in self.events[start:]:
                if event["method"] == method and event.get("sessionId") == page.session:
                    return event
            start = len(self.events)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout or self.timeout}s")
            self._receive()

    def open(self, path: str | Path, *, width: int = 1300, height: int = 1000) -> Page:
        """Load ``path`` in a new tab and wait for its load event."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        page = self._pages[session] = Page(self, session, target)
        for domain in ("Network", "Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        start = len(self.events)
        page.send("Page.navigate", url=Path(path).resolve().as_uri())
        if not any(e["method"] == "Page.loadEventFired" and e.get("sessionId") == session
                   for e in self.events[start:]):
            self.wait_for(page, "Page.loadEventFired")
        return page

    def close(self) -> None:
        """Stop the browser this object started and remove its profile."""
        socket = getattr(self, "_socket", None)
        if socket is not None:
            try:
                socket.close()
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)
