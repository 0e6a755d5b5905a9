"""The local device queue: the jobs of one FTORCH_HOME take turns on this machine's device, first come,
first served, instead of sharing it (two trainers on one GPU, or on the same CPU cores, both crawl or
run out of memory).

A supervisor holds an exclusive `flock` on `$FTORCH_HOME/device.lock` for as long as it runs its job;
the kernel drops it when the process ends, however it ends, so a crashed supervisor never blocks the
queue. Waiting supervisors leave a ticket in `$FTORCH_HOME/queue/` (named by when they queued, holding
their pid and its start time); the oldest ticket whose process is alive goes next, stale ones are
removed. While it waits, the job is PENDING with a reason that names the job holding the device.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import procs

LOCK = "device.lock"
QUEUE = "queue"


class DeviceQueue:
    def __init__(self, home: Path, job_id: str) -> None:
        self.home = home
        self.job_id = job_id
        self._fd: int | None = None
        self._ticket: Path | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> str | None:
        """The job id that holds the device now (as it wrote it), None when free or unknown."""
        try:
            text = (self.home / LOCK).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return text or None

    def wait(self, stop: Callable[[], bool], on_wait: Callable[[str], None], poll_s: float = 0.2) -> bool:
        """Block until this job holds the device (True) or `stop()` says to give up (False). `on_wait`
        is called once, with the reason, when the job has to wait."""
        self._enqueue()
        told = False
        try:
            while not stop():
                if self._first_in_line() and self._try_lock():
                    return True
                if not told:
                    holder = self.holder()
                    ahead = f"{holder} is using it" if holder and holder != self.job_id else "jobs ahead"
                    on_wait(f"queued for this machine's device ({ahead})")
                    told = True
                time.sleep(poll_s)
            return False
        finally:
            self._dequeue()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    # ---- the ticket line ---------------------------------------------------------------------------
    def _enqueue(self) -> None:
        folder = self.home / QUEUE
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        me = os.getpid()
        self._ticket = folder / f"{time.time_ns():020d}-{self.job_id}"
        self._ticket.write_text(f"{me} {procs.start_time(me)}\n", encoding="utf-8")

    def _dequeue(self) -> None:
        if self._ticket is not None:
            self._ticket.unlink(missing_ok=True)
            self._ticket = None

    def _first_in_line(self) -> bool:
        """This job's ticket is the oldest live one (stale tickets, whose process is gone, are removed)."""
        for ticket in sorted((self.home / QUEUE).iterdir()):
            if ticket == self._ticket:
                return True
            if _ticket_alive(ticket):
                return False
            ticket.unlink(missing_ok=True)
        return False

    def _try_lock(self) -> bool:
        fd = os.open(self.home / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.job_id}\n".encode(), 0)
        self._fd = fd
        return True


def _ticket_alive(ticket: Path) -> bool:
    try:
        pid_text, started_text = ticket.read_text(encoding="utf-8").split()
        started = None if started_text == "None" else float(started_text)
        return procs.alive(int(pid_text), started)
    except (OSError, ValueError):
        return False
