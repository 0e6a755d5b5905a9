"""What the CLI's job commands do: launch, status, logs, cancel, resume. No torch, no sky here."""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError, UserError
from orchestrator.registry import RESUMABLE, TERMINAL, Job, Registry
from orchestrator.spec import apply_overrides, load_job, validate_job
from trainer.config import JobSpec
from trainer.store import RunStore, StoreError, join_uri


def new_job_id(name: str) -> str:
    return f"{name[:40].lower()}-{secrets.token_hex(3)}"


def _resolved_spec(spec: JobSpec, run_id: str, output_uri: str) -> dict[str, Any]:
    return {
        "job": spec.model_dump(mode="json"),
        "run_id": run_id,
        "output_uri": output_uri,
        "created_at": time.time(),
    }


def launch(job_file: str, overrides: list[str], dry_run: bool = False) -> dict[str, Any]:
    """Validate, record and start a job. Nothing is recorded or started when the input is wrong."""
    spec = load_job(job_file, overrides)
    job_id = new_job_id(spec.name)
    run_uri = join_uri(spec.checkpoint.uri, job_id)
    output_uri = spec.output.uri or join_uri(run_uri, "output")
    summary = {
        "job_id": job_id,
        "name": spec.name,
        "backend": spec.resources.backend,
        "run_uri": run_uri,
        "output_uri": output_uri,
        "method": spec.method,
        "model": spec.model,
    }
    if dry_run:
        return {**summary, "dry_run": True, "spec": spec.model_dump(mode="json")}
    store = RunStore(run_uri, spec.checkpoint.storage_options, retry_seconds=20)
    try:
        store.write_spec(_resolved_spec(spec, job_id, output_uri))
    except (OSError, StoreError) as exc:
        raise UserError(
            f"checkpoint.uri: cannot write to {run_uri}: {exc.__class__.__name__}: {exc}"
        ) from None
    registry = Registry()
    job = registry.create_job(
        job_id,
        spec.name,
        spec.resources.backend,
        run_uri,
        output_uri,
        spec.model_dump(mode="json"),
        hourly_usd=spec.local.hourly_usd,
    )
    _start(registry, job)
    return summary


def _start(registry: Registry, job: Job) -> None:
    if job.backend == "local":
        from orchestrator.backends.local import start_supervisor, wait_for_previous_trainer

        wait_for_previous_trainer(registry, job)
        start_supervisor(registry, job)
    else:  # pragma: no cover - refused at validation until the SkyPilot backend lands
        raise UserError(f"resources.backend: {job.backend} is not available")


def get_job(job_ref: str, registry: Registry | None = None) -> Job:
    registry = registry or Registry()
    matches = registry.find(job_ref)
    if not matches:
        raise UserError(f"JOB: no job {job_ref!r}; `ftorch status` lists the jobs")
    if len(matches) > 1:
        raise UserError(
            f"JOB: {job_ref!r} matches {len(matches)} jobs ({', '.join(j.job_id for j in matches[:4])});"
            " give more of the id"
        )
    return reconcile(registry, matches[0])


def reconcile(registry: Registry, job: Job) -> Job:
    """A job whose supervisor died is not left RUNNING: it becomes FAILED, resumable."""
    if job.state in TERMINAL or job.backend != "local":
        return job
    from orchestrator.backends.local import supervisor_alive

    if supervisor_alive(job):
        return job
    time.sleep(0.2)  # the supervisor may have just finished: read again before judging
    job = registry.get(job.job_id)
    if job.state in TERMINAL or supervisor_alive(job):
        return job
    registry.set_state(
        job.job_id,
        "FAILED",
        f"supervisor (pid {job.supervisor_pid}) is gone; `ftorch resume {job.job_id}` continues",
    )
    for attempt in registry.attempts(job.job_id):
        if attempt.ended_at is None:
            registry.update_attempt(job.job_id, attempt.n, ended_at=time.time(), end_reason="supervisor lost")
    return registry.get(job.job_id)


def _cost(registry: Registry, job: Job) -> float:
    total = 0.0
    now = time.time()
    for attempt in registry.attempts(job.job_id):
        end = attempt.ended_at or (now if job.state not in TERMINAL else attempt.started_at)
        total += max(0.0, end - attempt.started_at) / 3600.0 * attempt.hourly_usd
    return total


def _store(job: Job) -> RunStore:
    options = job.spec.get("checkpoint", {}).get("storage_options") or {}
    return RunStore(job.run_uri, options, retry_seconds=5)


def job_summary(registry: Registry, job: Job, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    if progress is None:
        try:
            progress = _store(job).read_progress() or {}
        except Exception:  # a dead store must not break status
            progress = {}
    attempts = registry.attempts(job.job_id)
    preemptions = sum(1 for a in attempts if (a.end_reason or "").startswith("preempted"))
    running = job.state in ("RUNNING", "RECOVERING", "PREEMPTED", "PROVISIONING")
    total = progress.get("total_steps")
    return {
        "job_id": job.job_id,
        "name": job.name,
        "backend": job.backend,
        "state": job.state,
        "reason": job.reason,
        "step": progress.get("step", 0),
        "total_steps": total,
        "loss": progress.get("loss"),
        "attempts": len(attempts),
        "preemptions": preemptions,
        "cost_usd": round(_cost(registry, job), 6),
        "eta_s": progress.get("eta_s") if running else (0.0 if job.state == "SUCCEEDED" else None),
        "run_uri": job.run_uri,
        "output_uri": job.output_uri,
        "last_checkpoint_step": progress.get("last_checkpoint_step"),
        "last_checkpoint_at": progress.get("last_checkpoint_at"),
        "tokens_per_s": progress.get("tokens_per_s"),
        "where": attempts[-1].instance if attempts else None,
        "created_at": job.created_at,
        "updated_at": max(job.updated_at, progress.get("updated_at") or 0.0),
        "ended_at": job.ended_at,
    }


def status_all() -> list[dict[str, Any]]:
    registry = Registry()
    return [job_summary(registry, reconcile(registry, job)) for job in registry.jobs()]


def status_one(job_ref: str) -> dict[str, Any]:
    registry = Registry()
    job = get_job(job_ref, registry)
    store = _store(job)
    try:
        progress = store.read_progress() or {}
        checkpoints = [
            {"step": c.step, "created_at": c.created_at, "size_bytes": c.size_bytes, "uri": store.uri(c.path)}
            for c in store.complete_checkpoints()
        ]
        metrics = store.read_metrics()
    except Exception as exc:
        progress, checkpoints, metrics = {}, [], []
        sys.stderr.write(f"warning: cannot read the run store {job.run_uri}: {exc.__class__.__name__}\n")
    detail = job_summary(registry, job, progress)
    detail["attempt_timeline"] = [
        {
            "n": a.n,
            "instance": a.instance,
            "spot": a.spot,
            "hourly_usd": a.hourly_usd,
            "started_at": a.started_at,
            "first_step_at": a.first_step_at,
            "ended_at": a.ended_at,
            "exit_code": a.exit_code,
            "end_reason": a.end_reason,
            "start_step": a.start_step,
            "end_step": a.end_step,
        }
        for a in registry.attempts(job.job_id)
    ]
    detail["events"] = registry.events(job.job_id)
    detail["checkpoints"] = checkpoints
    detail["loss_curve"] = [[m["step"], m["loss"]] for m in metrics if m.get("loss") is not None]
    detail["eval_before"] = progress.get("eval_before")
    detail["eval_after"] = progress.get("eval_after")
    detail["lost_time_s"] = lost_time_per_preemption(detail["attempt_timeline"])
    return detail


def lost_time_per_preemption(timeline: list[dict[str, Any]]) -> list[float]:
    """For each preemption: seconds from the end of the attempt to the next attempt's first step."""
    lost = []
    for previous, following in zip(timeline, timeline[1:], strict=False):
        if (previous.get("end_reason") or "").startswith("preempted") and following.get("first_step_at"):
            lost.append(round(following["first_step_at"] - previous["ended_at"], 2))
    return lost


def log_paths(registry: Registry, job: Job) -> list[Path]:
    folder = registry.job_dir(job.job_id) / "logs"
    return sorted(folder.glob("attempt-*.log"))


def print_logs(job_ref: str, follow: bool = False) -> None:
    registry = Registry()
    job = get_job(job_ref, registry)
    offsets: dict[Path, int] = {}
    while True:
        attempts = {a.n: a for a in registry.attempts(job.job_id)}
        for path in log_paths(registry, job):
            if path not in offsets:
                n = int(path.stem.split("-")[1])
                a = attempts.get(n)
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.started_at)) if a else "?"
                sys.stdout.write(f"===== attempt {n} (started {when}) =====\n")
                offsets[path] = 0
            with open(path, encoding="utf-8", errors="replace") as handle:
                handle.seek(offsets[path])
                sys.stdout.write(handle.read())
                offsets[path] = handle.tell()
        sys.stdout.flush()
        job = reconcile(registry, registry.get(job.job_id))
        if not follow or job.state in TERMINAL:
            if follow:
                sys.stdout.write(f"===== job {job.state} =====\n")
            return
        time.sleep(0.5)


def cancel(job_ref: str, wait_s: float = 90.0) -> str:
    registry = Registry()
    job = get_job(job_ref, registry)
    if job.state in TERMINAL:
        return f"{job.job_id} is already {job.state}; nothing to cancel"
    if job.backend == "local":
        from orchestrator.backends.local import request_cancel

        if not request_cancel(registry, job):
            registry.set_state(job.job_id, "CANCELLED", "cancelled by the user; checkpoints kept")
            return f"{job.job_id} CANCELLED (checkpoints kept in {job.run_uri})"
    deadline = time.time() + wait_s
    while time.time() < deadline:
        job = reconcile(registry, registry.get(job.job_id))
        if job.state in TERMINAL:
            break
        time.sleep(0.2)
    return f"{job.job_id} {job.state} (checkpoints kept in {job.run_uri})"


def resume(job_ref: str, overrides: list[str]) -> str:
    registry = Registry()
    job = get_job(job_ref, registry)
    if job.state not in RESUMABLE:
        raise UserError(f"JOB: {job.job_id} is {job.state}; only {', '.join(RESUMABLE)} jobs can be resumed")
    data = apply_overrides(dict(job.spec), overrides)
    spec = validate_job(data)
    store = _store(job)
    resolved = store.read_spec()
    resolved["job"] = spec.model_dump(mode="json")
    store.write_spec(resolved)
    registry.update(
        job.job_id,
        spec_json=_json(spec.model_dump(mode="json")),
        cancel_requested=0,
        hourly_usd=spec.local.hourly_usd,
    )
    registry.event(job.job_id, "resume", " ".join(overrides) or None)
    registry.set_state(job.job_id, "PENDING", "resuming from the newest checkpoint")
    _start(registry, registry.get(job.job_id))
    return f"{job.job_id} resumed from its newest checkpoint"


def _json(payload: Any) -> str:
    import json

    return json.dumps(payload)


__all__ = ["SpecError", "UserError", "launch", "status_all", "status_one", "print_logs", "cancel", "resume"]
