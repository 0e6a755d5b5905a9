"""The pieces the local supervisor (`local_supervisor.py`) is made of: simulated spot preemptions
(`Chaos`), the trainer's progress as it goes (`ProgressTail`), the trainer's command line, starting and
stopping it with its children (`start_trainer`, `stop_trainer`), the words for a run store failure, and a registry that waits out another process's lock (`PatientRegistry`)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.registry import Registry, is_busy
from trainer.config import ChaosSpec
from trainer.runstore.runfiles import checked_progress


@dataclass
class Chaos:
    """Simulated spot preemptions: at given steps (each fires once per run) or at a random rate."""

    spec: ChaosSpec | None
    fired: set[int] = field(default_factory=set)
    rng: random.Random = field(default_factory=random.Random)

    def due(self, step: int, dt: float) -> tuple[str, bool] | None:
        """(what, with_notice) when a preemption should happen now."""
        if self.spec is None:
            return None
        for index, at in enumerate(self.spec.preempt_at_steps):
            if at not in self.fired and step >= at:
                self.fired.add(at)
                return f"step {at}", self.spec.notice_for(index)
        if self.spec.rate_per_min > 0 and self.rng.random() < self.spec.rate_per_min * dt / 60.0:
            notice = self.spec.notice if isinstance(self.spec.notice, bool) else self.rng.random() < 0.5
            return "random", notice
        return None


class ProgressTail:
    """The trainer's progress for this attempt, from the local copy it rewrites every step
    (FTORCH_PROGRESS_MIRROR): the step it is on, and the step it resumed from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step: int | None = None
        #: the step the trainer resumed from (progress.json in the store can lag after a kill)
        self.resumed: int | None = None
        self.state: str | None = None
        #: the newest snapshot (its `updated_at` is the heartbeat, `stall_timeout_s` the trainer's timeout)
        self.progress: dict[str, Any] = {}

    def poll(self) -> int | None:
        """The newest step of this attempt, or None before its first step."""
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return self.step
        progress = checked_progress(data)
        if progress is None:
            return self.step
        self.state = progress.get("state")
        self.progress = progress
        if progress.get("start_step") is not None:
            self.resumed = progress["start_step"]
        if progress.get("first_step_at") is not None and progress.get("step") is not None:
            self.step = progress["step"]
        return self.step


class PatientRegistry:
    """The registry, for a supervisor: a write that finds the database locked past SQLite's busy timeout
    (another process holding a long transaction) waits and tries again instead of failing the job.
    The supervisor has nothing better to do than record what happened, so it waits as long as it takes."""

    def __init__(self, registry: Registry, log: Callable[[str], None]) -> None:
        self._registry = registry
        self._log = log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._registry, name)
        if not callable(attr):
            return attr

        def patient(*args: Any, **kwargs: Any) -> Any:
            waited = 0.0
            while True:
                try:
                    return attr(*args, **kwargs)
                except Exception as exc:
                    if not is_busy(exc):
                        raise
                    if waited == 0.0:
                        self._log(f"the registry is locked by another process ({name}); waiting for it")
                    pause = min(5.0, 0.2 + waited / 4)
                    time.sleep(pause)
                    waited += pause

        return patient


def times(n: int) -> str:
    """'once', '2 times'."""
    return "once" if n == 1 else f"{n} times"


def newest_checkpoint_step(store: Any) -> int:
    """The step of the newest complete checkpoint (where the next attempt resumes), 0 when none."""
    try:
        found = store.complete_checkpoints()
    except Exception:  # noqa: BLE001 - a record only: the trainer finds the checkpoint itself
        found = []
    return found[-1].step if found else 0


def own_step(progress: dict[str, Any], attempt: int, otherwise: int) -> int:
    """The run's step if the progress is this attempt's (not the previous attempt's, left over)."""
    step = progress.get("step")
    return step if progress.get("attempt") == attempt and isinstance(step, int) else otherwise


def store_failure_reason(last_line: str) -> str:
    """Why a trainer that exited STORE_UNAVAILABLE stopped, from its last log line."""
    if "ENOSPC" in last_line or "EDQUOT" in last_line or "disk is full" in last_line:
        return (
            "the run store's disk is full (ENOSPC); checkpoints up to the last good one are safe; free "
            f"space, then `ftorch resume` continues: {last_line}"
        )
    return (
        "the run store stayed unreachable; checkpoints up to the last good one are safe, resume when it "
        f"is back: {last_line}"
    )


def trainer_command(nproc: int, run_uri: str, attempt: int) -> list[str]:
    """`python -m trainer`, or torchrun with `nproc` ranks (FSDP; it forwards SIGTERM to every rank,
    and the ranks die with it on SIGKILL)."""
    args = ["-m", "trainer", run_uri, "--attempt", str(attempt)]
    if nproc <= 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def start_trainer(command: list[str], log_file: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The trainer in a process group of its own (its tokeniser workers, torchrun's ranks join it), so
    that stopping it stops them all; it dies with the supervisor."""
    from orchestrator import procs

    def child() -> None:
        os.setpgid(0, 0)
        procs.die_with_parent()

    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=child,
    )


def stop_trainer(
    proc: subprocess.Popen[bytes], notice: bool, grace: float, log: Callable[[str], None]
) -> None:
    """SIGTERM (a notice: the trainer checkpoints) and `grace` seconds to leave, else SIGKILL; either way
    whatever is left of its process group (e.g. a tokeniser worker) is killed after it."""
    if notice:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log(f"trainer still running {grace:.0f}s after the notice: killing it")
    kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the trainer's process group (its own: `start_trainer`), the trainer first; then reap it."""
    if proc.poll() is None:
        proc.kill()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left of the group
    proc.wait()


def policy_inputs(progress: dict[str, Any], step: int | None) -> tuple[int, int, int, float]:
    """(step, total steps, last checkpoint step, wall seconds per step) from the run's progress."""
    rate = progress.get("steps_per_s") or 0.0
    total = progress.get("total_steps") or max(step or 0, 1)
    return (
        step or progress.get("step") or 0,
        total,
        progress.get("last_checkpoint_step") or 0,
        1.0 / rate if rate > 0 else 0.05,
    )


def record_run_facts(registry: Registry, job_id: str, spent_usd: float) -> None:
    """Cost and preemptions into the output's model card and training_summary.json (the trainer
    wrote them without: only the supervisor knows)."""
    from orchestrator.records import preempted
    from trainer.outputs import model_card
    from trainer.runstore.store import output_store

    job = registry.get(job_id)
    preemptions = sum(1 for a in registry.attempts(job_id) if preempted(a))
    try:
        output = output_store(job.output_uri, job.run_uri, job.storage_options)  # never through a link
        ledger = _ledger(
            registry, job, spent_usd
        )  # the cost ledger (trainer/recording/ledger.py); feeds the history
        model_card.add_run_facts(output, cost_usd=round(spent_usd, 4), preemptions=preemptions, ledger=ledger)
    except Exception as exc:  # noqa: BLE001 - the card is a record; the job still succeeded
        registry.event(job_id, "card", f"model card not completed: {exc.__class__.__name__}: {exc}")


def _ledger(registry: Registry, job: Any, spent_usd: float) -> dict[str, Any] | None:
    """The job's cost ledger, after keeping what its attempts measured (orchestrator/sizing/history.py)."""
    from orchestrator.backends.base import ledger_facts
    from orchestrator.sizing.history import learn_from_job
    from orchestrator.spot.cost_ledger import job_ledger
    from orchestrator.spot.hazards import learn_from_job as learn_hazards

    learn_from_job(registry, job)
    learn_hazards(registry, job)  # the spot attempts' hours and ends (orchestrator/spot/hazards.py)
    facts = ledger_facts(registry, job)
    return job_ledger(registry, job, registry.attempts(job.job_id), round(spent_usd, 4), **facts)
