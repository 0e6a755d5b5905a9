"""The local backend: a detached supervisor process per job that runs the trainer on this machine.

The supervisor outlives the CLI that started it. It is what would be a spot VM's lifecycle on a cloud:
it starts attempts, injects the simulated preemptions the job file asks for (`local.chaos`), tells a
preemption from a crash, relaunches, and records everything in the registry.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import procs
from orchestrator.backends.base import Backend
from orchestrator.logtail import LogTail
from orchestrator.registry import Job, JobState, Outcome, Registry

if TYPE_CHECKING:
    from trainer.config import JobSpec


def start_supervisor(registry: Registry, job: Job) -> int:
    """Start the job's supervisor, detached from the terminal; returns its pid."""
    proc = procs.spawn_detached(
        "orchestrator.backends.local_supervisor",
        job.job_id,
        registry.job_dir(job.job_id) / "supervisor.log",
        registry.home,
    )
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
        try:  # its process group (local_parts.start_trainer): its workers too
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _is_trainer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return procs.start_time(pid) is not None and b"trainer" in argv


def log_paths(registry: Registry, job: Job) -> list[Path]:
    """The trainer logs of the job's attempts, oldest first."""
    return sorted((registry.job_dir(job.job_id) / "logs").glob("attempt-*.log"))


class LocalBackend(Backend):
    """Jobs run by a detached supervisor process on this machine."""

    name = "local"
    jobs_take_turns = True  # orchestrator/backends/local_queue.py

    def check(self, spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
        from orchestrator.backends.local_preflight import preflight

        return preflight(spec)

    def prepare(self, spec: JobSpec, job_id: str, run_uri: str) -> Any:
        from orchestrator.backends.local_preflight import preflight

        preflight(spec)
        return None

    def start(self, registry: Registry, job: Job, prepared: object = None) -> None:
        wait_for_previous_trainer(registry, job)
        start_supervisor(registry, job)

    def reconcile(self, registry: Registry, job: Job) -> Job:
        """A job whose supervisor died is not left RUNNING: it becomes FAILED, resumable."""
        if supervisor_alive(job):
            return job
        time.sleep(0.2)  # the supervisor may have just finished: read again before judging
        job = registry.get(job.job_id)
        if job.state.terminal or supervisor_alive(job):
            return job
        registry.set_state(
            job.job_id,
            JobState.FAILED,
            f"supervisor (pid {job.supervisor_pid}) is gone; `ftorch resume {job.job_id}` continues",
        )
        for attempt in registry.attempts(job.job_id):
            if attempt.ended_at is None:
                registry.update_attempt(
                    job.job_id,
                    attempt.n,
                    ended_at=time.time(),
                    end_reason="supervisor lost",
                    outcome=Outcome.LOST,
                )
        return registry.get(job.job_id)

    def log_paths(self, registry: Registry, job: Job) -> list[Path]:
        return log_paths(registry, job)

    def print_logs(self, registry: Registry, job: Job, follow: bool) -> None:
        from orchestrator.backends.base import reconcile

        if not log_paths(registry, job) and any(e["kind"] == "adopted" for e in registry.events(job.job_id)):
            from orchestrator.run_records import store_log_lines

            sys.stdout.write("".join(line + "\n" for line in store_log_lines(job)))
            if job.state.terminal:
                return
        tails: dict[Path, LogTail] = {}
        while True:
            job = reconcile(registry, registry.get(job.job_id))
            ended = not follow or job.state.terminal  # read once more after the end: nothing is lost
            attempts = {a.n: a for a in registry.attempts(job.job_id)}
            paths = log_paths(registry, job)
            for path in paths:
                if path not in tails:
                    n = int(path.stem.split("-")[1])
                    a = attempts.get(n)
                    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.started_at)) if a else "?"
                    sys.stdout.write(f"===== attempt {n} (started {when}) =====\n")
                    tails[path] = LogTail(path)
                lines = tails[path].read_lines(final=ended or path != paths[-1])
                sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()
            if ended:
                if follow:
                    sys.stdout.write(f"===== job {job.state} =====\n")
                return
            time.sleep(0.5)

    def cancel(self, registry: Registry, job: Job) -> str | None:
        if not request_cancel(registry, job):
            registry.set_state(job.job_id, JobState.CANCELLED, "cancelled by the user; checkpoints kept")
            return f"{job.job_id} CANCELLED (checkpoints kept in {job.run_uri})"
        return None
