"""The local backend: a detached supervisor process per job that runs the trainer on this machine.

The supervisor outlives the CLI that started it. It is what would be a spot VM's lifecycle on a cloud:
it starts attempts, injects the simulated preemptions the job file asks for (`local.chaos`), tells a
preemption from a crash, relaunches, and records everything in the registry.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orchestrator import procs
from orchestrator.registry import Job, Registry


def start_supervisor(registry: Registry, job: Job) -> int:
    """Start the job's supervisor, detached from the terminal; returns its pid."""
    log_path = registry.job_dir(job.job_id) / "supervisor.log"
    env = dict(os.environ)
    env["FTORCH_HOME"] = str(registry.home)
    log = procs.open_private(log_path)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.backends.local_supervisor", job.job_id],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
    started = None
    for _ in range(50):
        started = procs.start_time(proc.pid)
        if started is not None:
            break
        time.sleep(0.01)
    registry.update(job.job_id, supervisor_pid=proc.pid, supervisor_started=started)
    return proc.pid


def supervisor_alive(job: Job) -> bool:
    return procs.alive(job.supervisor_pid, job.supervisor_started)


def request_cancel(registry: Registry, job: Job) -> bool:
    """Ask the supervisor to stop the job gracefully. False if there is no live supervisor."""
    registry.update(job.job_id, cancel_requested=1)
    if supervisor_alive(job):
        try:
            os.kill(job.supervisor_pid or 0, signal.SIGTERM)
            return True
        except ProcessLookupError:
            return False
    return False


def wait_for_previous_trainer(registry: Registry, job: Job, timeout: float = 120.0) -> None:
    """Before a resume: the last attempt's trainer may still be saving after a notice. Let it finish."""
    attempts = registry.attempts(job.job_id)
    pid = attempts[-1].pid if attempts else None
    if not pid:
        return
    deadline = time.time() + timeout
    while time.time() < deadline and _is_trainer(pid):
        time.sleep(0.1)
    if _is_trainer(pid):
        os.kill(pid, signal.SIGKILL)


def _is_trainer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return procs.start_time(pid) is not None and b"trainer" in argv
