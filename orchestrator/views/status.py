"""What `ftorch status` knows about a job: its facts (orchestrator/views/job_facts.py: progress, cost so far
and projected, checkpoint age, ETA) with what its backend knows better (where, its own cost), every job's
row for the jobs table, and one job in detail (attempts, checkpoints, curves, events, the cost ledger).

It answers from the registry and the run stores without torch, sky, pydantic or fsspec on the common
path: a local run store is read with a plain file read, and a finished job's last progress is cached in
the registry (an event of kind `final_progress`), so listing 1,000 jobs reads no store at all.
"""

from __future__ import annotations

import json
import time
from typing import Any

from orchestrator.backends.base import backend_for, get_job, reconcile
from orchestrator.records import preempted
from orchestrator.registry import Attempt, Job, Registry
from orchestrator.views.job_facts import (
    PROGRESS_FILE,
    checked_or_warn,
    cost_curve,
    job_facts,
    lost_time_per_preemption,
    read_progress,
    summarize,
    timeline,
    with_fields,
    with_saved_checkpoint,
)

CACHE_KIND = "final_progress"


# ---- with the backend's fields ------------------------------------------------------------------
def with_backend_fields(registry: Registry, job: Job, row: dict[str, Any]) -> dict[str, Any]:
    """A backend may know more (recoveries, where, its own cost): merge it, keep the projection."""
    return with_fields(row, backend_for(job.backend).status_fields(registry, job))


def job_row(registry: Registry, job: Job, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """One job's status row, with its backend's fields."""
    return with_backend_fields(registry, job, job_facts(registry, job, progress))


# ---- bulk reading for the jobs table ------------------------------------------------------------
def _cached(
    details: dict[str, str], skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, dict[str, Any]]:
    from trainer.runstore.runfiles import checked_progress

    parsed: dict[str, dict[str, Any]] = {}
    for job_id, detail in details.items():
        if job_id in skip:
            continue
        try:
            entry = json.loads(detail)
        except (TypeError, json.JSONDecodeError):
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("checked") is True or checked_progress(entry.get("progress")) is not None:
            parsed[job_id] = entry  # an entry cached before progress files were checked may not be
    return parsed


def cache_final_progress(registry: Registry, job: Job, progress: dict[str, Any]) -> None:
    """Remember a finished job's last progress, valid while the job stays ended at `job.ended_at`."""
    if job.state.terminal and progress:
        # `checked`: read through read_progress, which drops a progress file that fails the check
        entry = {"ended_at": job.ended_at, "progress": progress, "checked": True}
        registry.event(job.job_id, CACHE_KIND, json.dumps(entry))


def _progress_for(registry: Registry, job: Job, cached: dict[str, Any] | None) -> dict[str, Any]:
    if job.state.terminal and cached and cached.get("ended_at") == job.ended_at:
        return cached.get("progress") or {}
    progress = read_progress(job)
    if job.state.terminal:
        progress = with_saved_checkpoint(job, progress)
        cache_final_progress(registry, job, progress)
    return progress


def status_all(
    registry: Registry | None = None, savings: bool = True, brief_hidden: bool = False
) -> list[dict[str, Any]]:
    """Every job's status row, oldest first. `savings`: the cost ledger's savings per job (the table
    shows them only from WIDEST columns; --json always has them). `brief_hidden`: the finished jobs the
    table collapses into one line (jobs_table.recent_finished) get only their id, state and end (the
    table counts them; with 1,000 jobs their rows were most of the work)."""
    registry = registry or Registry()
    jobs, attempts, details = registry.snapshot(CACHE_KIND)
    groups = registry.groups()
    brief = _collapsed(jobs, groups) if brief_hidden else set()
    cached = _cached(details, skip=brief)
    rows = []
    to_cache: dict[str, str] = {}  # ended jobs' savings, kept with their cached progress (one write)
    for job in jobs:
        if job.job_id in brief:
            rows.append({"job_id": job.job_id, "state": job.state, "ended_at": job.ended_at})
            continue
        job_attempts = attempts.get(job.job_id, [])
        if not job.state.terminal:
            job = reconcile(registry, job)
            if job.state.terminal:
                job_attempts = registry.attempts(job.job_id)
                learn(registry, job)  # it ended: what it measured feeds the next plan
        progress = _progress_for(registry, job, cached.get(job.job_id))
        row = with_backend_fields(registry, job, summarize(job, job_attempts, progress, time.time()))
        group = groups.get(job.job_id)
        if group:  # launched by `ftorch sweep`
            row.update(group=group["group_id"], point=group["point"], group_budget_usd=group["budget_usd"])
        if savings:
            row = _savings_of(job, job_attempts, row, progress, cached.get(job.job_id), to_cache, registry)
        rows.append(row)
    registry.add_events(CACHE_KIND, to_cache)
    return rows


def _collapsed(jobs: list[Any], groups: dict[str, Any]) -> set[str]:
    """The finished jobs of no sweep group that the jobs table collapses into its "older jobs" line."""
    from orchestrator.views.jobs_table import recent_finished

    ended = [(j.job_id, j.ended_at) for j in jobs if j.state.terminal and j.job_id not in groups]
    shown = set(recent_finished(ended, time.time()))
    return {job_id for job_id, _at in ended if job_id not in shown}


# ---- one job in detail --------------------------------------------------------------------------
def allowed_changes(resolved: Any) -> list[dict[str, Any]]:
    """The changes `ftorch resume --allow-change` allowed (spec.json, trainer/checkpoints/fingerprint.py), oldest first."""
    from trainer.checkpoints.fingerprint import ALLOWED_KEY

    entries = resolved.get(ALLOWED_KEY) if isinstance(resolved, dict) else None
    return [e for e in entries or [] if isinstance(e, dict)]


def _attach_changes(rows: list[dict[str, Any]], changes: list[dict[str, Any]]) -> None:
    """Each allowed change goes with the first attempt that started after the resume that allowed it."""
    for row in rows:
        row.setdefault("allowed_changes", [])
    for entry in changes:
        following = next((r for r in rows if r["started_at"] >= float(entry.get("at") or 0)), None)
        if following is not None:
            following["allowed_changes"].extend(entry.get("changes") or [])


def _attach_measured(
    rows: list[dict[str, Any]], store_attempts: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Each attempt's `measured` (trainer/recording/measure.py, from its epoch record) on its timeline row; the
    newest one's is returned."""
    by_n = {a["n"]: a.get("measured") for a in store_attempts}
    for row in rows:
        row["measured"] = by_n.get(row["n"])
    newest = [row["measured"] for row in rows if row.get("measured")]
    return newest[-1] if newest else None


def status_one(job_ref: str) -> dict[str, Any]:
    """One job in detail: the row, the attempt timeline, checkpoints, loss and cost curves, events."""
    import sys

    from orchestrator.run_records import attempts_from_store
    from orchestrator.sizing.replan import replanned_lines  # the detail's alone: the jobs list loads less
    from trainer.train_step import oom

    registry = Registry()
    job = get_job(job_ref, registry)
    attempts = registry.attempts(job.job_id)
    checkpoints: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    changes: list[dict[str, Any]] = []
    resolved: Any = None
    store_attempts: list[dict[str, Any]] = []
    try:
        store = job.run_store()
        progress = checked_or_warn(store.read_json_or_none(PROGRESS_FILE), store.uri(PROGRESS_FILE))
        checkpoints = [
            {"step": c.step, "created_at": c.created_at, "size_bytes": c.size_bytes, "uri": store.uri(c.path)}
            for c in store.complete_checkpoints()
        ]
        metrics = store.read_metrics()
        newest = (checkpoints[-1]["step"], checkpoints[-1]["created_at"]) if checkpoints else None
        progress = with_saved_checkpoint(job, progress, newest)
        resolved = store.read_json_or_none("spec.json")
        changes = allowed_changes(resolved)
        store_attempts = attempts_from_store(store)
    except Exception as exc:
        progress = {}
        sys.stderr.write(f"warning: cannot read the run store {job.run_uri}: {exc.__class__.__name__}\n")
    now = time.time()
    detail = with_backend_fields(registry, job, summarize(job, attempts, progress, now))
    detail["attempt_timeline"] = timeline(attempts, job.state, now, progress)
    detail["allowed_changes"] = changes
    _attach_changes(detail["attempt_timeline"], changes)
    detail["measured"] = _attach_measured(detail["attempt_timeline"], store_attempts)
    detail["adaptations"] = oom.adaptations(resolved)  # out-of-memory adaptations (trainer/train_step/oom.py)
    detail["replan"] = oom.replan_line(resolved)
    detail["replanned"] = replanned_lines(resolved)  # resumed on a larger GPU (orchestrator/sizing/replan.py)
    detail["events"] = [e for e in registry.events(job.job_id) if e["kind"] != CACHE_KIND]
    detail["checkpoints"] = checkpoints
    detail["loss_curve"] = [[m["step"], m["loss"]] for m in metrics if m.get("loss") is not None]
    detail["cost_curve"] = cost_curve(metrics, attempts, job.state)
    detail["preemption_steps"] = [a.end_step for a in attempts if preempted(a) and a.end_step is not None]
    detail["eval_before"] = progress.get("eval_before")
    detail["eval_after"] = progress.get("eval_after")
    detail["lost_time_s"] = lost_time_per_preemption(detail["attempt_timeline"])
    detail["ledger"] = ledger_for(registry, job, attempts, detail, metrics, progress)
    return detail


# ---- the cost ledger (trainer/recording/ledger.py) ----------------------------------------------------------
def ledger_for(
    registry: Registry,
    job: Job,
    attempts: list[Attempt],
    row: dict[str, Any],
    metrics: list[dict[str, Any]],
    progress: dict[str, Any],
) -> dict[str, Any]:
    """One job's cost ledger (`ledger` in `status JOB --json`); what it measured goes to the history."""
    from orchestrator.backends.base import ledger_facts
    from orchestrator.sizing.history import learn_from_job
    from orchestrator.spot.cost_ledger import job_ledger
    from orchestrator.spot.hazards import learn_from_job as learn_hazards

    if job.state.terminal:  # an ended job's measured facts feed the next plan (a running attempt's are
        learn_from_job(registry, job)  # partial, and the history keeps each attempt's first row)
        learn_hazards(registry, job)  # and its spot attempts' hours and ends (orchestrator/spot/hazards.py)
    tokens = progress.get("tokens_seen") if isinstance(progress.get("tokens_seen"), int) else None
    facts = ledger_facts(registry, job)
    return job_ledger(registry, job, attempts, row.get("cost_usd"), metrics=metrics, tokens=tokens, **facts)


def with_savings(
    registry: Registry, job: Job, attempts: list[Attempt], row: dict[str, Any]
) -> dict[str, Any]:
    """`savings_usd`/`savings_pct` for the jobs table: the ledger from the registry alone (no run store
    read: restart losses are not subtracted, `ftorch status JOB` has the full ledger)."""
    from orchestrator.backends.base import ledger_facts
    from orchestrator.spot.cost_ledger import job_ledger

    facts = ledger_facts(registry, job)
    ledger = job_ledger(registry, job, attempts, row.get("cost_usd"), records={}, metrics=[], **facts)
    row["savings_usd"], row["savings_pct"] = ledger["savings_usd"], ledger["savings_pct"]
    return row


def _savings_of(
    job: Job,
    attempts: list[Attempt],
    row: dict[str, Any],
    progress: dict[str, Any],
    cached: dict[str, Any] | None,
    to_cache: dict[str, str],
    registry: Registry,
) -> dict[str, Any]:
    """`with_savings`, kept with a finished job's cached progress (into `to_cache`): an ended job's ledger
    does not change (recomputed for every job, it was a third of `status --json` over 1,000 jobs)."""
    fresh = job.state.terminal and cached is not None and cached.get("ended_at") == job.ended_at
    kept = cached.get("savings") if fresh and cached is not None else None
    if isinstance(kept, list) and len(kept) == 2:
        row["savings_usd"], row["savings_pct"] = kept
        return row
    row = with_savings(registry, job, attempts, row)
    if job.state.terminal and progress:
        entry = {"ended_at": job.ended_at, "progress": progress, "checked": True}
        entry["savings"] = [row["savings_usd"], row["savings_pct"]]
        to_cache[job.job_id] = json.dumps(entry)
    return row


def learn(registry: Registry, job: Job) -> None:
    from orchestrator.sizing.history import learn_from_job
    from orchestrator.spot.hazards import learn_from_job as learn_hazards

    learn_from_job(registry, job)
    learn_hazards(registry, job)  # the spot attempts' hours and ends (orchestrator/spot/hazards.py)
