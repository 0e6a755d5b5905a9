"""Processes the test session started and left running: found, stopped, and named.

Every process the session starts inherits the marker `FTORCH_TEST_SESSION=<token>` in its environment, so
the check finds them even when they detached themselves (a new session, reparented to init: the local
supervisor, the cloud controller, SkyPilot's API server), plus this process's own descendants.
"""

from __future__ import annotations

import os
import uuid

MARKER = "FTORCH_TEST_SESSION"
#: the session's own temporary folder (TMPDIR for every process it starts), removed at its end
SESSION_TMP_PREFIX = "ftorch-tests-"
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


def _own_resource_tracker() -> int | None:
    """The pid of this process's own multiprocessing resource tracker, if it started one (its first spawn:
    the sharded-load tests' torch.multiprocessing.spawn). No leak and not counted: it reads a pipe this
    process holds and ends when this process does. Not excused by its command line (as SELF_ENDING is):
    the tracker of another process ends by itself within settle's grace once that process is gone, and
    while that process lives both are leaks and both are named."""
    import sys

    tracker = getattr(sys.modules.get("multiprocessing.resource_tracker"), "_resource_tracker", None)
    pid = getattr(tracker, "_pid", None)
    return pid if isinstance(pid, int) else None


def survivors(token: str) -> list[object]:
    """The live processes (psutil.Process) that carry `token` or descend from this process, but for this
    process's own resource tracker."""
    import psutil

    me = os.getpid()
    own_tracker = _own_resource_tracker()
    found: dict[int, psutil.Process] = {}
    try:
        for child in psutil.Process(me).children(recursive=True):
            if child.pid != own_tracker:
                found[child.pid] = child
    except psutil.Error:
        pass
    needle = f"{MARKER}={token}".encode()
    for proc in psutil.process_iter():
        if proc.pid not in (me, own_tracker) and proc.pid not in found and _carries(proc.pid, needle):
            found[proc.pid] = proc
    for proc in list(found.values()):  # and what they started (SkyPilot's API server's executors keep no
        try:  # marker: their environment is not the server's), before killing a parent orphans them
            for child in proc.children(recursive=True):
                if child.pid not in (me, own_tracker):
                    found.setdefault(child.pid, child)
        except psutil.Error:
            continue
    alive = []
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def stop_resource_tracker() -> None:
    """This process's own multiprocessing resource tracker, started by its first spawn (the sharded-load
    tests' torch.multiprocessing.spawn): it reads a pipe this process holds open, so it would end only
    when this process exits, after the check. Stopped as multiprocessing stops it (the pipe closed, the
    tracker waited for); a tracker of any other process is still a leak."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        stop()


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
