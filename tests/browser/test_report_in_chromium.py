"""report.html in a real browser: headless Chromium (Debian's package) loads the page written by
`dike-slurm replay`, renders it to PNG, and reports every console error, uncaught exception,
failed load and request through the DevTools protocol (over --remote-debugging-pipe, standard
library only). The page must load cleanly and request nothing but itself: everything is inline.

`make test` installs chromium when it runs as root with apt-get (the Makefile's `chromium`
target); elsewhere this test skips and says why.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which(os.environ.get("DIKE_CHROMIUM", "chromium")) or shutil.which("chromium-browser")
PAGE_WIDTH = 1400  # the width the report is laid out for
TIMEOUT_S = 60.0

if CHROMIUM is None:
    pytest.skip(
        "BROWSER TEST SKIPPED: chromium not found. `make test` installs it as root (apt-get install chromium); "
        "install it, or set DIKE_CHROMIUM to its path",
        allow_module_level=True,
    )


class DevTools:
    """A headless Chromium driven through the DevTools protocol on file descriptors 3 and 4."""

    def __init__(self, profile: Path) -> None:
        to_browser_read, self._write = os.pipe()
        self._read, from_browser_write = os.pipe()

        def wire_pipes() -> None:  # the child reads commands on fd 3 and answers on fd 4
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self.process = subprocess.Popen(
            [
                CHROMIUM, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", f"--window-size={PAGE_WIDTH},1000", "about:blank",
            ],
            pass_fds=(3, 4), preexec_fn=wire_pipes, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, TimeoutError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        os.close(self._read)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the DevTools pipe (exit {self.process.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, **params: object) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        command: dict = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            command["sessionId"] = session
        os.write(self._write, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            message = self._message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = self._message(deadline)
            self.events.append(message)
            if message.get("method") == method:
                return message


def problems(events: list[dict], page_url: str) -> tuple[list[str], list[str]]:
    """(errors, requests to anything but the page itself or a data: URI) among the DevTools events."""
    errors, requests = [], []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            errors.append("exception: " + params["exceptionDetails"].get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append("log: " + params["entry"]["text"])
        elif method == "Network.loadingFailed":
            errors.append("failed load: " + params.get("errorText", ""))
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if url != page_url and not url.startswith("data:"):
                requests.append(url)
    return errors, requests


def load(page: Path, profile: Path, screenshot: Path) -> tuple[list[str], list[str], dict]:
    """Open the page, wait for its load event, save a full-page PNG; (errors, requests, page facts)."""
    browser = DevTools(profile)
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session)
        browser.send(  # the layout width itself (the window's would lose a scrollbar's width)
            "Emulation.setDeviceMetricsOverride", session, width=PAGE_WIDTH, height=1000, deviceScaleFactor=1, mobile=False
        )
        browser.send("Page.navigate", session, url=page.as_uri())
        browser.wait_for("Page.loadEventFired")
        facts = browser.send(
            "Runtime.evaluate", session, returnByValue=True,
            expression="""({
                images: Array.from(document.images).map(i => ({loaded: i.complete && i.naturalWidth > 0,
                                                               width: i.getBoundingClientRect().width})),
                scrollWidth: document.documentElement.scrollWidth,
                headline: document.getElementById('headline') !== null,
                externalLinks: Array.from(document.querySelectorAll('link[href], script[src], iframe')).length,
            })""",
        )["result"]["value"]
        shot = browser.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors, requests = problems(browser.events, page.as_uri())
        return errors, requests, facts
    finally:
        browser.close()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """report.html of fifo, tiresias and dike on a small generated trace (100 jobs on 4 nodes: the same
    page, its five plots and tables, as on more), as `dike-slurm replay` writes it."""
    folder = tmp_path_factory.mktemp("replay")

    def dike_slurm(*args: str) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "dike_slurm", *args], capture_output=True, text=True, cwd=REPO, timeout=600,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, result.stderr

    dike_slurm("trace", "generate", "--out", str(folder / "trace"), "--jobs", "100", "--nodes", "4", "--seed", "4")
    dike_slurm(
        "replay", str(folder / "trace" / "sacct.txt"), "--slurm-conf", str(folder / "trace" / "slurm.conf"),
        "--policy", "fifo", "--policy", "tiresias", "--policy", "dike", "--penalty-sweep", "0", "--out", str(folder / "out"),
    )
    return folder / "out" / "report.html"


def test_the_report_loads_without_errors_or_requests_and_renders_to_png(report, tmp_path):
    screenshot = tmp_path / "report.png"
    errors, requests, facts = load(report, tmp_path / "profile", screenshot)
    assert errors == []
    assert requests == []
    assert facts["externalLinks"] == 0 and facts["headline"]
    assert len(facts["images"]) == 5 and all(image["loaded"] for image in facts["images"])
    assert all(image["width"] >= PAGE_WIDTH - 100 for image in facts["images"])  # plots span the page
    assert facts["scrollWidth"] <= PAGE_WIDTH  # nothing wider than the window
    width, height = png_size(screenshot)
    assert width == PAGE_WIDTH and height > 4000  # the whole page, not just the first screen


def test_the_harness_sees_console_errors_and_requests(tmp_path):
    """The checks above would catch a page that logs an error or loads something from outside."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><body><script>console.error("broken")</script>'
        '<img src="http://127.0.0.1:9/font.woff"><p>x</p></body></html>',
        encoding="utf-8",
    )
    errors, requests, _ = load(page, tmp_path / "profile", tmp_path / "bad.png")
    assert "console: broken" in errors
    assert requests == ["http://127.0.0.1:9/font.woff"]
    assert png_size(tmp_path / "bad.png")[0] == PAGE_WIDTH
