"""Drive the system's headless Chromium through the DevTools protocol over a pipe, for page tests.

`--remote-debugging-pipe` makes Chromium read protocol commands from its fd 3 and write replies to
its fd 4 (NUL-separated JSON): no port, no websocket, no Python package to install and no browser
download, which is why the tests use it instead of a browser-automation library.

Where Chromium is missing, `find_chromium` says so; the tests skip outside CI and fail in CI
(`VPRL_CI` or `CI` set), where the set-up must have installed it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
# Without the background-networking flags Chromium phones home at start, which floods a closed network.
FLAGS = (
    "--headless",
    "--no-sandbox",  # root in CI: Chromium refuses to start sandboxed as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    explicit = os.environ.get("VPRL_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def required_in_ci() -> bool:
    return bool(os.environ.get("VPRL_CI") or os.environ.get("CI"))


@contextlib.contextmanager
def browser_or_skip() -> Iterator[Browser]:
    """A Browser for a test; where Chromium is missing the test skips, or fails in CI."""
    import pytest

    executable = find_chromium()
    if executable is None:
        if required_in_ci():
            pytest.fail(
                "Chromium is not installed, and CI must have it: the set-up installs it (apt-get install chromium)"
            )
        pytest.skip("Chromium is not installed (apt-get install chromium); with VPRL_CI=1 this is a failure")
    with Browser(executable) as b:
        yield b


def _above_nine(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class ProtocolError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page; `call` sends a command to the page and waits for its reply."""

    def __init__(self, executable: str, width: int = 1400, height: int = 1000, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="vprl-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Above 9, so that putting them at 3 and 4 below never overwrites one with the other.
        to_child_r, from_child_w = (_above_nine(fd) for fd in (to_child_r, from_child_w))
        self.log = Path(self.profile) / "chromium.log"
        args = [
            executable,
            *FLAGS,
            f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        # bash (dash takes single-digit fds only) puts the pipe's ends at fds 3 and 4 of the browser, where the protocol wants them.
        shell = f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w} {to_child_r}<&- {from_child_w}>&-'
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", shell, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(to_child_r, from_child_w),
            )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # -- protocol ------------------------------------------------------------------------------------
    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ProtocolError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply from Chromium within {self.timeout_s} s")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                err = self.log.read_text(errors="replace")[-2000:] if self.log.is_file() else ""
                raise ProtocolError(f"Chromium closed the pipe (exit {self.proc.poll()}): {err}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._send(method, params, self.session)

    # -- what the tests use ----------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for event in self.events:
                if event["method"] == method:
                    return event
            self.events.append(self._read(deadline))

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise); page exceptions raise."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression[:80]!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads the page produced so far."""
        self.call("Runtime.evaluate", {"expression": "0"})  # flush pending events into `events`
        out = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails", {}).get("exception", {}).get("description")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                out.append(f"{entry.get('text')} {entry.get('url', '')}".strip())
        return out

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send("Browser.close")
        except (ProtocolError, TimeoutError, OSError):
            self.proc.kill()  # it would not close when asked: end it, the test is over either way
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._to_child, self._from_child):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
