"""What the CLI's job commands do: launch, status, logs, cancel, resume. No torch, no sky here."""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import SpecError, UserError
from orchestrator.registry import RESUMABLE, TERMINAL, Job, Registry

if TYPE_CHECKING:
    from trainer.config import JobSpec
    from trainer.store import RunStore

# `status` must not load pydantic, yaml or fsspec: the job-file and store modules are imported where used


#: fsspec filesystems that do not outlive the process that wrote them: never a run store
NON_DURABLE_SCHEMES = ("memory",)


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
    from orchestrator.spec import load_job
    from trainer.store import RunStore, StoreError, join_uri, preflight

    spec = load_job(job_file, overrides)
    check_data(spec)
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
    task = None
    if dry_run and spec.resources.backend == "skypilot":
        from orchestrator.backends import skypilot

        return {**summary, "dry_run": True, **skypilot.dry_run(spec, job_id, run_uri)}
    if dry_run:
        return {**summary, "dry_run": True, "spec": spec.model_dump(mode="json")}
    scheme = spec.checkpoint.uri.split("://", 1)[0] if "://" in spec.checkpoint.uri else "file"
    if scheme in NON_DURABLE_SCHEMES:
        raise UserError(
            f"checkpoint.uri: {scheme}:// lives in one process's memory and is gone when it ends; "
            "give a local folder, s3://, gs:// or another shared store"
        )
    try:  # preflight: write, read back and delete a probe, so a wrong store fails now, in one line
        preflight(run_uri, spec.checkpoint.storage_options)
    except StoreError as exc:
        raise UserError(f"checkpoint.uri: the run store is not writable: {exc}") from None
    if spec.resources.backend == "skypilot":  # plan, render, preflight (clouds, secrets)
        from orchestrator.backends import skypilot

        task = skypilot.prepare(spec, job_id, run_uri)
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
    _start(registry, job, task)
    return summary


def check_data(spec: JobSpec) -> None:
    """The data file, checked at launch as the trainer will read it (encoding, JSON, the format's keys).

    A local file must pass; a remote one is checked when it can be read now (when it cannot, the
    trainer reports it, with the same `file:line` messages)."""
    from trainer.data_check import DataError, read_jsonl

    path = spec.data.path
    remote = "://" in path and not path.startswith("file://")
    options = dict(spec.checkpoint.storage_options)
    if remote and path.startswith(("s3://", "s3a://")):  # answer in seconds when the store is unreachable
        config = {"connect_timeout": 3, "read_timeout": 10, "retries": {"max_attempts": 2}}
        options["config_kwargs"] = {**config, **options.get("config_kwargs", {})}
    try:
        rows = read_jsonl(path, options, fmt=spec.data.format)
    except DataError as exc:
        raise SpecError("data.path", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - unreadable now: the trainer reads (and reports) it
        if not remote:
            raise SpecError("data.path", f"cannot read {path}: {exc.__class__.__name__}: {exc}") from None
        return
    if spec.data.eval_examples >= len(rows):
        raise SpecError(
            "data.eval_examples",
            f"{spec.data.eval_examples} leaves no training examples ({path} has {len(rows)})",
        )


def _start(registry: Registry, job: Job, task: dict[str, Any] | None = None) -> None:
    if job.backend == "local":
        from orchestrator.backends.local import start_supervisor, wait_for_previous_trainer

        wait_for_previous_trainer(registry, job)
        start_supervisor(registry, job)
    elif job.backend == "skypilot":
        from orchestrator.backends import skypilot

        skypilot.start(registry, job, task)
    else:  # pragma: no cover - refused at validation
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
    if job.state not in TERMINAL and job.backend == "skypilot":
        from orchestrator.backends import skypilot

        return skypilot.reconcile(registry, job)
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
    from trainer.store import RunStore

    options = job.spec.get("checkpoint", {}).get("storage_options") or {}
    return RunStore(job.run_uri, options, retry_seconds=5)


def job_summary(registry: Registry, job: Job, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """One job's status row (see `orchestrator.overview.summarize`)."""
    from orchestrator import overview

    if progress is None:
        progress = overview.read_progress(job.run_uri, job.spec.get("checkpoint", {}).get("storage_options"))
    return overview.with_backend_fields(
        registry, job, overview.summarize(job, registry.attempts(job.job_id), progress, time.time())
    )


def status_all() -> list[dict[str, Any]]:
    from orchestrator import overview

    return overview.status_all()


def status_one(job_ref: str) -> dict[str, Any]:
    from orchestrator import overview

    return overview.status_one(job_ref)


def lost_time_per_preemption(timeline: list[dict[str, Any]]) -> list[float]:
    from orchestrator import overview

    return overview.lost_time_per_preemption(timeline)


def log_paths(registry: Registry, job: Job) -> list[Path]:
    folder = registry.job_dir(job.job_id) / "logs"
    return sorted(folder.glob("attempt-*.log"))


def print_logs(job_ref: str, follow: bool = False) -> None:
    registry = Registry()
    job = get_job(job_ref, registry)
    if job.backend == "skypilot":
        from orchestrator.backends import skypilot

        skypilot.print_logs(job, follow)
        return
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
    if job.backend == "skypilot":
        from orchestrator.backends import skypilot

        return skypilot.cancel(registry, job)
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
    from orchestrator.spec import apply_overrides, validate_job

    data = apply_overrides(dict(job.spec), overrides)
    spec = validate_job(data)
    from orchestrator import procs

    # one resume wins; until its supervisor runs, this process stands in for it (so no one judges the
    # job's supervisor gone and resumes it a second time)
    found = registry.claim(
        job.job_id,
        RESUMABLE,
        "PENDING",
        "resuming from the newest checkpoint",
        os.getpid(),
        procs.start_time(os.getpid()),
    )
    if found is not None:
        raise UserError(f"JOB: {job.job_id} is {found}: another `ftorch resume` got there first")
    store = _store(job)
    resolved = _resolved_spec_for_resume(job, store)
    resolved["job"] = spec.model_dump(mode="json")
    store.write_spec(resolved)
    registry.update(
        job.job_id,
        spec_json=_json(spec.model_dump(mode="json")),
        cancel_requested=0,
        hourly_usd=spec.local.hourly_usd,
    )
    registry.event(job.job_id, "resume", " ".join(overrides) or None)
    _start(registry, registry.get(job.job_id))
    return f"{job.job_id} resumed from its newest checkpoint"


def _resolved_spec_for_resume(job: Job, store: RunStore) -> dict[str, Any]:
    """The run store's spec.json; rebuilt from the registry (one warning line) if it is unreadable."""
    resolved = store.read_json_or_none("spec.json")
    if isinstance(resolved, dict) and resolved.get("run_id") == job.job_id and resolved.get("output_uri"):
        return resolved
    sys.stderr.write(f"warning: {job.run_uri}/spec.json is unreadable or not this job's; rebuilt it\n")
    return {"job": job.spec, "run_id": job.job_id, "output_uri": job.output_uri, "created_at": job.created_at}


def _json(payload: Any) -> str:
    import json

    return json.dumps(payload)


__all__ = ["SpecError", "UserError", "launch", "status_all", "status_one", "print_logs", "cancel", "resume"]
