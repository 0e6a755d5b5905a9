"""The one interface every backend implements, and the registry that finds a backend by its name.

A backend is what runs a job's attempts somewhere (this machine, a cloud through SkyPilot). The
backend-neutral code (`orchestrator.jobs.lifecycle`, `orchestrator.views.status`) validates, records and reports; it
never asks which backend a job uses, it calls `backend_for(job.backend)`. To add a backend: subclass
`Backend`, implement its methods, and add `name: "module:Class"` to `BACKENDS` (and the name to
`resources.backend` in `trainer/config.py`). Backends are imported on first use, so `ftorch status`
does not load SkyPilot (or pydantic) for local jobs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.registry import Job, Registry
    from trainer.config import JobSpec

#: backend name (resources.backend) -> "module:Class"
BACKENDS = {
    "local": "orchestrator.backends.local:LocalBackend",
    "skypilot": "orchestrator.backends.skypilot:SkyPilotBackend",
}
_loaded: dict[str, Backend] = {}


class Backend:
    """Runs jobs somewhere. Methods take the registry and the job's row; none of them branches on
    another backend. `prepare` and `dry_run` run before anything is recorded; the others after."""

    name: str = ""
    #: runs away from this machine: data, model and run store must be reachable from there (URLs)
    remote: bool = False
    #: a job of this backend can have its spot controller run in the foreground (`ftorch controller`)
    has_controller: bool = False
    #: the job delivers its own webhook events from where it runs (the launcher sends only its own)
    job_sends_events: bool = False
    #: jobs wait their turn for this machine's one device (PENDING) instead of sharing it
    jobs_take_turns: bool = False

    def dry_run(self, spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
        """What `launch --dry-run` adds to the summary. Nothing is written or launched."""
        return {"spec": spec.model_dump(mode="json")}

    def format_dry_run(self, result: dict[str, Any]) -> str:
        """`launch --dry-run` for people."""
        import json

        return json.dumps(result, indent=2, default=str) + "\n"

    def check(self, spec: JobSpec, job_id: str, run_uri: str) -> dict[str, Any]:
        """What `ftorch validate` adds: the launch checks that need no store probe and launch nothing
        (SpecError/UserError on a problem), and what they found."""
        return {}

    def prepare(self, spec: JobSpec, job_id: str, run_uri: str) -> Any:
        """Checks (and planning) before a launch is recorded; what `start` needs from them, or None.
        Raises SpecError/UserError: nothing is recorded then."""
        return None

    def plan_record(self, prepared: Any) -> dict[str, Any] | None:
        """The plan `prepare` chose, as the run store keeps it (plan.json, shown by `ftorch report`);
        None for a backend that does not compare offers."""
        return None

    def start(self, registry: Registry, job: Job, prepared: Any = None) -> None:
        """Start (or, after `resume`, restart) the job's attempts. `prepared` is `prepare`'s result at
        launch and None on resume."""
        raise NotImplementedError

    def reconcile(self, registry: Registry, job: Job) -> Job:
        """Bring the registry up to date with what the backend knows (a lost supervisor, a cloud job's
        state) and return the job as it is now. Called for jobs that have not ended."""
        return job

    def status_fields(self, registry: Registry, job: Job) -> dict[str, Any]:
        """Fields this backend knows better than the registry (where, preemptions, its own cost)."""
        return {}

    def ondemand_hourly_usd(self, registry: Registry, job: Job) -> float | None:
        """The on-demand price of the offer the job ran on, for its cost ledger (trainer/recording/ledger.py);
        None when there is none (the ledger then says n/a)."""
        return None

    def attempt_times(self, registry: Registry, job: Job) -> dict[int, dict[str, float]]:
        """The backend's own timestamps of each attempt (by number) for the cost ledger's restart phases
        (`detected_at`: when it saw the attempt end; `placed_at`: its new machine up, before setup);
        {} when it keeps none (the ledger then uses the registry's attempt times)."""
        return {}

    def log_paths(self, registry: Registry, job: Job) -> list[Path]:
        """Attempt logs kept on this machine, oldest first ([] when the backend keeps them elsewhere)."""
        return []

    def print_logs(self, registry: Registry, job: Job, follow: bool) -> None:
        """Write the job's logs to stdout; with `follow`, until the job ends."""
        raise NotImplementedError

    def resume_running(self, registry: Registry, job: Job) -> str | None:
        """`ftorch resume` on a job that has not ended: restart what watches it if that died (a cloud
        job's controller). A message when something was restarted, else None (resume refuses)."""
        return None

    def adopt(self, registry: Registry, job: Job) -> str | None:
        """`ftorch attach`: the job was just registered from its run store (state, attempts derived from
        it, orchestrator/jobs/adopt.py). Learn what this backend knows about it; a line for the user, or None."""
        return None

    def cancel(self, registry: Registry, job: Job) -> str | None:
        """Ask the job to stop (checkpoints kept). A message when it is done, or None when the caller
        should wait for the job to reach an end state."""
        raise NotImplementedError


def backend_for(name: str) -> Backend:
    """The backend registered as `name`; a one-line UserError for an unknown name."""
    if name not in _loaded:
        target = BACKENDS.get(name)
        if target is None:
            raise UserError(f"resources.backend: {name!r} is not available; one of {', '.join(BACKENDS)}")
        module, cls = target.split(":")
        _loaded[name] = getattr(importlib.import_module(module), cls)()
    return _loaded[name]


def ledger_facts(registry: Registry, job: Job) -> dict[str, Any]:
    """What the cost ledger needs from the job's backend, as `job_ledger` keywords: its on-demand price
    and its attempts' times (a backend that cannot say: n/a, and the registry's times)."""
    backend = backend_for(job.backend)
    try:
        ondemand = backend.ondemand_hourly_usd(registry, job)
    except Exception:  # noqa: BLE001 - a backend that cannot say: n/a
        ondemand = None
    try:
        times = backend.attempt_times(registry, job)
    except Exception:  # noqa: BLE001 - a backend that cannot say: the registry's times
        times = {}
    return {"ondemand_hourly_usd": ondemand, "attempt_times": times}


def reconcile(registry: Registry, job: Job) -> Job:
    """The job as it is now: unended jobs are refreshed by their backend."""
    if job.state.terminal:
        return job
    return backend_for(job.backend).reconcile(registry, job)


def get_job(job_ref: str, registry: Registry | None = None) -> Job:
    """The job an id (or a unique prefix) names, reconciled; a one-line UserError if there is none."""
    from orchestrator.registry import Registry

    registry = registry or Registry()
    return reconcile(registry, registry.lookup(job_ref))
