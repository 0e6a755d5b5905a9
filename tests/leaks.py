"""Processes the test session started and left running: found, stopped, and named.

Every process the session starts inherits the marker `FTORCH_TEST_SESSION=<token>` in its environment, so
the check finds them even when they detached themselves (a new session, reparented to init: the local
supervisor, the cloud controller, SkyPilot's API server), plus this process's own descendants.
"""

from __future__ import annotations

import os
import uuid

MARKER = "FTORCH_TEST_SESSION"
#: SkyPilot's own watchdog (sky/skylet/subprocess_daemon.py): detached by each SDK subprocess call, it waits
#: for that process, then 30 s, and exits by itself; stopped with the rest but not counted as a leak
SELF_ENDING = ("sky/skylet/subprocess_daemon.py",)


def mark_session() -> str:
    """Give this process (and so every child it starts from now on) a marker of its own."""
    token = uuid.uuid4().hex
    os.environ[MARKER] = token
    return token


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in handle.read().split(b"\0")
    except OSError:  # gone, or not ours
        return False


def survivors(token: str) -> list[object]:
    """The live processes (psutil.Process) that carry `token` or descend from this process."""
    import psutil

    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    try:
        for child in psutil.Process(me).children(recursive=True):
            found[child.pid] = child
    except psutil.Error:
        pass
    needle = f"{MARKER}={token}".encode()
    for proc in psutil.process_iter():
        if proc.pid != me and proc.pid not in found and _carries(proc.pid, needle):
            found[proc.pid] = proc
    alive = []
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def settle(token: str, grace: float = 10.0) -> list[object]:
    """The survivors once those ending by themselves have had `grace` seconds (a supervisor sending its
    last notification when the last test ended)."""
    import time

    deadline = time.time() + grace
    left = survivors(token)
    while left and time.time() < deadline and not all(self_ending(p) for p in left):
        time.sleep(0.2)
        left = survivors(token)
    return left


def self_ending(proc: object) -> bool:
    import psutil

    assert isinstance(proc, psutil.Process)
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return any(name in cmdline for name in SELF_ENDING)


def describe(proc: object) -> str:
    import psutil

    assert isinstance(proc, psutil.Process)
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}: (gone)"


def stop_all(procs: list[object], grace: float = 5.0) -> None:
    """SIGTERM each, then SIGKILL what is still there after `grace` seconds."""
    import psutil

    typed = [p for p in procs if isinstance(p, psutil.Process)]
    for proc in typed:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(typed, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
