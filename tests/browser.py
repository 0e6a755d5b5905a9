"""A page opened in real headless Chromium through the DevTools protocol: its console errors, uncaught
exceptions, every request it makes, and what a script evaluated in it returns.

`chromium()` is the browser's path, or None when it is not installed (scripts/test.sh installs Debian's
`chromium` when it is missing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-extensions",
    "--remote-debugging-port=0",
]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageRun:
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    value: Any = None


def open_page(path: Path, script: str, timeout: float = 60.0) -> PageRun:
    """Load `path` in headless Chromium, wait for its load event, evaluate `script` (an expression whose
    value comes back as JSON) and return it with the console errors and requests seen."""
    from websockets.sync.client import connect

    exe = chromium()
    assert exe is not None
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its renderer and helper processes with it: all ended below
        )
        try:
            port = _devtools_port(proc, timeout)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                page = next(t for t in json.load(answer) if t["type"] == "page")
            with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout) as ws:
                return _drive(ws, path, script, timeout)
        finally:
            _end_group(proc)  # before the profile folder goes: a helper still writing there fails its removal


def _end_group(proc: subprocess.Popen[str]) -> None:
    """Chromium and every process it started (its session): SIGTERM, then SIGKILL to what is left."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(proc.pid, 0)  # any process of the group left?
                except ProcessLookupError:
                    return
            time.sleep(0.05)
    proc.wait()


def _devtools_port(proc: subprocess.Popen[str], timeout: float) -> int:
    deadline = time.time() + timeout
    assert proc.stderr is not None
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"chromium exited with {proc.returncode} before DevTools listened")
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            return int(found.group(1))
    raise AssertionError("chromium's DevTools did not start")


def _drive(ws: Any, path: Path, script: str, timeout: float) -> PageRun:
    run = PageRun()
    ids = iter(range(1, 10_000))
    results: dict[int, Any] = {}
    loaded = False

    def send(method: str, **params: Any) -> int:
        n = next(ids)
        ws.send(json.dumps({"id": n, "method": method, "params": params}))
        return n

    def pump(until: Any) -> None:
        nonlocal loaded
        deadline = time.time() + timeout
        while not until():
            if time.time() > deadline:
                raise AssertionError("the page did not answer in time")
            message = json.loads(ws.recv(timeout=timeout))
            method, params = message.get("method"), message.get("params") or {}
            if "id" in message:
                results[message["id"]] = message
            elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "assert",
                "warning",
            ):
                run.errors.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                said = (details.get("exception") or {}).get("description") or details.get("text")
                run.errors.append(f"exception: {said}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                run.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Network.requestWillBeSent":
                run.requests.append(params["request"]["url"])
            elif method == "Page.loadEventFired":
                loaded = True

    for method in ("Page.enable", "Runtime.enable", "Log.enable", "Network.enable"):
        n = send(method)
        pump(lambda n=n: n in results)
    send("Page.navigate", url=path.resolve().as_uri())
    pump(lambda: loaded)
    time.sleep(0.3)  # late console messages
    n = send("Runtime.evaluate", expression=script, returnByValue=True)
    pump(lambda: n in results)
    answer = results[n]["result"]
    if "exceptionDetails" in answer:
        raise AssertionError(f"the probe script failed: {answer['exceptionDetails']}")
    run.value = answer["result"].get("value")
    return run
