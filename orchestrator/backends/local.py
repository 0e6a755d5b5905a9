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
    old = os.umask(0o077)
    try:
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    finally:
        os.umask(old)
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
