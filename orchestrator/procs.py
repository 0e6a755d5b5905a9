"""Process identity on Linux: a pid plus its start time, so a recycled pid is not mistaken for ours."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # `ftorch status` imports this module for its pid checks: no subprocess, no ctypes
    import subprocess

PR_SET_PDEATHSIG = 1


def open_private(path: str | os.PathLike[str], mode: str = "ab") -> IO[bytes]:
    """Open a file that only the owner can read (logs may quote job details)."""
    old = os.umask(0o077)
    try:
        return open(path, mode)  # noqa: SIM115 - the caller hands it to a child process and closes it
    finally:
        os.umask(old)


def start_time(pid: int) -> float | None:
    """The process's start time in clock ticks since boot, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie is gone for our purposes
        return None
    return float(fields[19])


def alive(pid: int | None, started: float | None) -> bool:
    if not pid:
        return False
    now = start_time(pid)
    if now is None:
        return False
    return started is None or abs(now - started) < 0.5


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Run in a child before exec: the kernel sends `sig` to it when its parent dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def spawn_detached(module: str, arg: str, log_path: Path, home: Path) -> subprocess.Popen[bytes]:
    """Run `python -m module arg` detached from the terminal (its own session, no stdin), logging to an
    owner-only file, with FTORCH_HOME pinned: the local supervisor and the cloud controller start so."""
    import subprocess

    env = dict(os.environ)
    env["FTORCH_HOME"] = str(home)
    log = open_private(log_path)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", module, arg],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
