"""What the CLI's job commands do: launch, logs, cancel, resume. Backend-neutral: each backend's part
goes through `orchestrator.backends.base.Backend`; status is `orchestrator.views.status`. No torch, no sky."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import backend_for, get_job, reconcile
from orchestrator.errors import SpecError, UserError
from orchestrator.registry import RESUMABLE, Job, JobState, Registry
from trainer.checkpoints.fingerprint import ALLOWED_KEY, DamagedRecord, describe_allowance

if TYPE_CHECKING:
    from trainer.checkpoints.fingerprint import Change
    from trainer.config import JobSpec
    from trainer.runstore.store import RunStore

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


def launch(
    job_file: str,
    overrides: list[str],
    dry_run: bool = False,
    before_start: Callable[[Registry, Job], None] | None = None,
) -> dict[str, Any]:
    """Validate, record and start a job. Nothing is recorded or started when the input is wrong.
    `before_start` runs once the job is recorded, before its backend starts it (a sweep joins its group)."""
    from orchestrator.jobfile.data_check import check_data
    from orchestrator.jobfile.spec import load_job
    from trainer.runstore.storage import StoreError, join_uri, preflight
    from trainer.runstore.store import RunStore

    spec = load_job(job_file, overrides)
    check_data(spec)  # the rows stay in this process for the planner's token count
    backend = backend_for(spec.resources.backend)
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
        return {**summary, "dry_run": True, **backend.dry_run(spec, job_id, run_uri)}
    scheme = spec.checkpoint.uri.split("://", 1)[0] if "://" in spec.checkpoint.uri else "file"
    if scheme in NON_DURABLE_SCHEMES:
        raise UserError(
            f"checkpoint.uri: {scheme}:// lives in one process's memory and is gone when it ends; "
            "give a local folder, s3://, gs:// or another shared store"
        )
    if spec.output.uri:  # probed like the run store: not found after the last step
        try:
            preflight(spec.output.uri, spec.checkpoint.storage_options)
        except StoreError as exc:
            raise UserError(f"output.uri: the output folder is not writable: {exc}") from None
    try:  # preflight: write, read back and delete a probe, so a wrong store fails now, in one line
        preflight(run_uri, spec.checkpoint.storage_options)
    except StoreError as exc:
        raise UserError(f"checkpoint.uri: the run store is not writable: {exc}") from None
    from orchestrator.jobfile import envlock as runenv

    lock, lock_info = runenv.lock_for_launch(spec, backend.remote)  # the run's environment (env/lock.txt)
    prepared = backend.prepare(spec, job_id, run_uri)  # e.g. plan, render, clouds, secrets
    store = RunStore(run_uri, spec.checkpoint.storage_options, retry_seconds=20)
    try:
        runenv.write_lock(store, lock, lock_info)
        store.write_spec(_resolved_spec(spec, job_id, output_uri))
    except (OSError, StoreError) as exc:
        raise UserError(
            f"checkpoint.uri: cannot write to {run_uri}: {exc.__class__.__name__}: {exc}"
        ) from None
    plan = backend.plan_record(prepared)
    if plan is not None:  # the chosen plan, for `ftorch report` (orchestrator/views/report.py)
        store.write_json("plan.json", plan)
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
    if before_start is not None:
        before_start(registry, job)
    backend.start(registry, job, prepared)
    return summary


def print_logs(job_ref: str, follow: bool = False) -> None:
    registry = Registry()
    job = get_job(job_ref, registry)
    backend_for(job.backend).print_logs(registry, job, follow)


def cancel(job_ref: str, wait_s: float = 90.0) -> str:
    registry = Registry()
    job = get_job(job_ref, registry)
    if job.state.terminal:
        return f"{job.job_id} is already {job.state}; nothing to cancel"
    done = backend_for(job.backend).cancel(registry, job)
    if done is not None:
        return done
    deadline = time.time() + wait_s
    while time.time() < deadline:
        job = reconcile(registry, registry.get(job.job_id))
        if job.state.terminal:
            break
        time.sleep(0.2)
    return f"{job.job_id} {job.state} (checkpoints kept in {job.run_uri})"


def cancel_many(job_refs: list[str], everything: bool = False, wait_s: float = 90.0) -> list[str]:
    """Cancel several jobs (or, `everything`, every job that has not ended): every id is found before any
    job is touched; all are asked to stop at once, then awaited together. One line per job."""
    registry = Registry()
    if everything:
        targets = [reconcile(registry, j) for j in registry.jobs() if not j.state.terminal]
        targets = [j for j in targets if not j.state.terminal]
        if not targets:
            return ["no job to cancel: every job has ended"]
    else:
        targets = [get_job(ref, registry) for ref in dict.fromkeys(job_refs)]
    said: dict[str, str] = {}
    for job in targets:
        if job.state.terminal:
            said[job.job_id] = f"{job.job_id} is already {job.state}; nothing to cancel"
            continue
        done = backend_for(job.backend).cancel(registry, job)
        if done is not None:
            said[job.job_id] = done
    deadline = time.time() + wait_s
    waiting = [j.job_id for j in targets if j.job_id not in said]
    while waiting and time.time() < deadline:
        waiting = [j for j in waiting if not reconcile(registry, registry.get(j)).state.terminal]
        if waiting:
            time.sleep(0.2)
    for job in targets:
        if job.job_id not in said:
            job = registry.get(job.job_id)
            said[job.job_id] = f"{job.job_id} {job.state} (checkpoints kept in {job.run_uri})"
    return [said[j.job_id] for j in targets]


def resume(job_ref: str, overrides: list[str], allow_change: bool = False, relock: bool = False) -> str:
    """Continue a job from its newest checkpoint. A --set that changes the math of a job with checkpoints
    (trainer/checkpoints/fingerprint.py), or other library versions (orchestrator/jobfile/envlock.py), is refused,
    nothing written, unless `allow_change`: then it is recorded in spec.json (the trainer accepts it), in the
    job's events, and shown by `ftorch status`. `relock`: the run's lock is replaced by the one a launch
    would write now (a cloud run moves to the versions this ftorch ships)."""
    registry = Registry()
    job = get_job(job_ref, registry)
    if job.state not in RESUMABLE:
        restarted = backend_for(job.backend).resume_running(registry, job)
        if restarted:
            return restarted
        raise UserError(f"JOB: {job.job_id} is {job.state}; only {', '.join(RESUMABLE)} jobs can be resumed")
    _refuse_unfit_local(job)
    from orchestrator.jobfile.spec import apply_overrides, validate_job

    had_output = (job.spec.get("output") or {}).get("uri")  # before the overrides (they edit in place)
    data = apply_overrides(dict(job.spec), overrides)
    spec = validate_job(data)
    store = job.run_store()
    try:
        step, changes = changes_since_checkpoint(job, store, spec.model_dump(mode="json"))
    except DamagedRecord as exc:  # a fingerprint that is no record: refused unless taken as it is
        if not allow_change:
            raise UserError(str(exc)) from None
        step, changes = exc.step, []
    new_lock = None
    if relock:
        from orchestrator.jobfile import envlock as runenv

        new_lock = runenv.lock_for_launch(spec, backend_for(job.backend).remote)
    step, env_changes = _version_changes(job, store, step, new_lock[0] if new_lock else None)
    changes = [*changes, *env_changes]
    if changes and not allow_change:
        raise UserError(changes[0].line())
    output_uri = _output_for_resume(job, spec, had_output)
    from orchestrator import procs

    # one resume wins; until its supervisor runs, this process stands in for it (so no one judges the
    # job's supervisor gone and resumes it a second time)
    found = registry.claim(
        job.job_id,
        RESUMABLE,
        JobState.PENDING,
        "resuming from the newest checkpoint",
        os.getpid(),
        procs.start_time(os.getpid()),
    )
    if found is not None:
        raise UserError(f"JOB: {job.job_id} is {found}: another `ftorch resume` got there first")
    resolved = _resolved_spec_for_resume(job, store)
    resolved["job"] = spec.model_dump(mode="json")
    resolved["output_uri"] = output_uri  # the registry's (an adopted run's own store), or --set output.uri
    allowance = None
    if allow_change and step is not None:
        allowance = _allowance(step, changes, overrides)
        resolved.setdefault(ALLOWED_KEY, []).append(allowance)
    if new_lock is not None:
        from orchestrator.jobfile import envlock as runenv

        runenv.write_lock(store, *new_lock)
    store.write_spec(resolved)
    registry.update(
        job.job_id,
        spec_json=json.dumps(spec.model_dump(mode="json")),
        cancel_requested=0,
        hourly_usd=spec.local.hourly_usd,
        output_uri=output_uri,
    )
    registry.event(job.job_id, "resume", " ".join(overrides) or None)
    if allowance is not None:
        registry.event(job.job_id, "change", describe_allowance(allowance))
    job = registry.get(job.job_id)
    backend_for(job.backend).start(registry, job)
    said = f" ({describe_allowance(allowance)})" if allowance is not None else ""
    if step is None and not _has_checkpoint(store):
        return f"{job.job_id} restarted: no checkpoint was saved, so it starts from step 0"
    return f"{job.job_id} resumed from its newest checkpoint{said}"


def _output_for_resume(job: Job, spec: JobSpec, had_output: str | None) -> str:
    """Where the resumed run's output goes: `output.uri` when this resume's spec sets one (a --set, probed
    like at launch), else the registry's output_uri (never spec.json's: a moved or copied store names
    its original's output there)."""
    from trainer.runstore.storage import StoreError, preflight

    wanted = spec.output.uri
    if not wanted or (wanted == had_output and job.output_uri):
        return job.output_uri
    try:
        preflight(wanted, spec.checkpoint.storage_options)
    except StoreError as exc:
        raise UserError(f"output.uri: the output folder is not writable: {exc}") from None
    return wanted


def _refuse_unfit_local(job: Job) -> None:
    """A job that does not fit its machine's GPUs is resumed only where a re-plan can move it (a cloud
    backend, orchestrator/backends/skypilot_replan.py): local hardware cannot change."""
    if backend_for(job.backend).remote:
        return
    from orchestrator.sizing.replan import local_refusal

    try:
        resolved = job.run_store().read_json_or_none("spec.json")
    except Exception:  # noqa: BLE001 - unreadable now: the resume below reports it
        return
    refusal = local_refusal(job.job_id, resolved)
    if refusal:
        raise UserError(refusal)


def _has_checkpoint(store: RunStore) -> bool:
    """A complete checkpoint is in the store (True when it cannot be read now: the trainer will see)."""
    try:
        return bool(store.complete_checkpoints())
    except Exception:  # noqa: BLE001
        return True


def changes_since_checkpoint(
    job: Job, store: RunStore, new: dict[str, Any]
) -> tuple[int | None, list[Change]]:
    """(newest checkpoint step or None, the fingerprinted settings `new` changes against it). A
    checkpoint written before fingerprints were recorded is compared with the job's last spec. The data's
    identity is checked by the trainer (only it reads the data)."""
    from trainer.checkpoints import fingerprint

    try:
        newest = fingerprint.newest_record(store)
    except fingerprint.DamagedRecord:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable now: the trainer checks at start
        sys.stderr.write(
            f"warning: cannot read the checkpoints in {job.run_uri} ({exc.__class__.__name__})\n"
        )
        return None, []
    if newest is None:
        return None, []
    step, recorded = newest
    if not recorded:
        recorded = fingerprint.record(job.spec, None)
    return step, fingerprint.changes(recorded, new, step)


def _version_changes(
    job: Job, store: RunStore, step: int | None, lock: str | None = None
) -> tuple[int | None, list[Change]]:
    """The library versions that differ between the newest checkpoint and the next attempt (the run's
    lock for a cloud run, this machine's for a local one; orchestrator/jobfile/envlock.py)."""
    from orchestrator.jobfile import envlock as runenv
    from trainer.checkpoints.versions import newest_versions

    try:
        newest = newest_versions(store)
        found = runenv.version_changes(store, backend_for(job.backend).remote, newest, lock)
    except Exception as exc:  # noqa: BLE001 - unreadable now: the trainer checks at start
        sys.stderr.write(
            f"warning: cannot compare library versions in {job.run_uri} ({exc.__class__.__name__})\n"
        )
        return step, []
    return (newest[0] if newest and step is None else step), found


def _allowance(step: int, changes: list[Change], overrides: list[str]) -> dict[str, Any]:
    """spec.json's record of a change `--allow-change` allowed (trainer/checkpoints/fingerprint.py reads it)."""
    return {
        "at": time.time(),
        "checkpoint_step": step,
        "changes": [c.to_json() for c in changes],
        "overrides": list(overrides),
    }


def _resolved_spec_for_resume(job: Job, store: RunStore) -> dict[str, Any]:
    """The run store's spec.json; rebuilt from the registry (one warning line) if it is unreadable."""
    resolved = store.read_json_or_none("spec.json")
    if isinstance(resolved, dict) and resolved.get("run_id") == job.job_id and resolved.get("output_uri"):
        return resolved
    sys.stderr.write(f"warning: {job.run_uri}/spec.json is unreadable or not this job's; rebuilt it\n")
    return {"job": job.spec, "run_id": job.job_id, "output_uri": job.output_uri, "created_at": job.created_at}


__all__ = [
    "SpecError", "UserError", "launch", "get_job", "reconcile", "print_logs", "cancel", "resume",
]  # fmt: skip
