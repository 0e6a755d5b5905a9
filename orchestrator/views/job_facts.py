"""A job's facts from the registry and its run store, free of the backends: its progress, the numbers of
its status row (cost so far and projected, ETA, checkpoint age, why it stopped) and its attempt timeline.

Ground floor, so that the backends may read it: `ftorch status` adds the backend's fields to these rows
(orchestrator/views/status.py), and a backend's notification carries the same row
(orchestrator/backends/notify.py). No torch, sky, pydantic or fsspec on the common path: a local run
store is read with a plain file read.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from orchestrator.records import attempt_cost, cost_usd, preempted
from orchestrator.registry import ACTIVE, Attempt, Job, JobState, Outcome, Registry
from trainer.stops.watchdog import stale

PROGRESS_FILE = "progress.json"


# ---- reading progress ---------------------------------------------------------------------------
def _local_path(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def read_progress(job: Job) -> dict[str, Any]:
    """The job's progress.json, or {} when there is none, the store cannot be read, or the file does not
    check out (then one warning line on stderr names it)."""
    local = _local_path(job.run_uri)
    try:
        if local is not None:
            with open(os.path.join(local, PROGRESS_FILE), encoding="utf-8") as handle:
                data = json.load(handle)
        else:
            data = job.run_store().read_json_or_none(PROGRESS_FILE)
    except Exception:  # a missing, half-written or unreachable progress file must not break status
        return {}
    return checked_or_warn(data, f"{job.run_uri.rstrip('/')}/{PROGRESS_FILE}")


def checked_or_warn(data: Any, where: str) -> dict[str, Any]:
    """A progress snapshot that checks out, or {} after one warning line naming the file."""
    import sys

    from trainer.runstore.runfiles import progress_problem

    if data is None:
        return {}
    problem = progress_problem(data)
    if problem is None:
        return data
    sys.stderr.write(f"warning: {where} ignored: {problem}\n")
    return {}


def newest_checkpoint(job: Job) -> tuple[int, float] | None:
    """(step, saved at) of the newest complete checkpoint in the job's store; None when there is none or
    the store cannot be read now."""
    try:
        found = job.run_store(retry_seconds=2.0).complete_checkpoints()
    except Exception:  # an unreachable store must not break status
        return None
    return (found[-1].step, found[-1].created_at) if found else None


def with_saved_checkpoint(
    job: Job, progress: dict[str, Any], newest: tuple[int, float] | None | bool = True
) -> dict[str, Any]:
    """A job that stopped short of its end: its saved progress is at least the newest complete checkpoint
    in the store (progress.json is written every few seconds and can lag a checkpoint made durable just
    before a kill). `newest`: that checkpoint when the caller read it, True to read it here."""
    if job.state in ACTIVE or job.state is JobState.SUCCEEDED:
        return progress
    if newest is True:
        newest = newest_checkpoint(job)
    if not newest:
        return progress
    step, saved_at = newest
    out = dict(progress)
    if (out.get("last_checkpoint_step") or 0) < step:
        out.update(last_checkpoint_step=step, last_checkpoint_at=saved_at)
    if (out.get("step") or 0) < step:
        out["step"] = step
    return out


# ---- the numbers --------------------------------------------------------------------------------
def stop_reason(job: Job) -> str | None:
    """A short word for why a job stopped: budget, cancelled, failed, succeeded; None while active.
    STOPPED is the budget guard's stop (the only thing that stops a job short of its end)."""
    if not job.state.terminal:
        return None
    return "budget" if job.state is JobState.STOPPED else job.state.lower()


def summarize(job: Job, attempts: list[Attempt], progress: dict[str, Any], now: float) -> dict[str, Any]:
    """One job's status row (the `status --json` fields of DESIGN.md and more)."""
    state = job.state
    active = state in ACTIVE
    step = progress.get("step") or 0
    total = progress.get("total_steps")
    rate = progress.get("steps_per_s") or 0.0
    remaining_steps = max(0, total - step) if total else None
    if state is JobState.SUCCEEDED:
        remaining_s: float | None = 0.0
    elif active and progress.get("eta_s") is not None and state is JobState.RUNNING:
        remaining_s = float(progress["eta_s"])
    elif remaining_steps is not None and rate > 0:
        remaining_s = remaining_steps / rate
    else:
        remaining_s = None
    last = attempts[-1] if attempts else None
    hourly = last.hourly_usd if last is not None else job.hourly_usd
    cost = cost_usd(attempts, state, now)
    if state is JobState.SUCCEEDED:
        projected: float | None = cost
    elif remaining_s is not None:
        projected = cost + remaining_s / 3600.0 * hourly
    else:
        projected = None
    ckpt_at = progress.get("last_checkpoint_at")
    spot = last.spot if last is not None else None
    market = None if spot is None else ("spot" if spot else "on-demand")
    budget = (job.spec.get("resources") or {}).get("budget_usd")
    return {
        "job_id": job.job_id,
        "name": job.name,
        "backend": job.backend,
        "state": state,
        "reason": job.reason,
        "stop_reason": stop_reason(job),
        # the trainer's heartbeat (progress.json) is older than its stall timeout (trainer/stops/watchdog.py)
        "stalled_s": stale(progress, now, grace=False) if state is JobState.RUNNING else None,
        "step": step,
        "total_steps": total,
        "fraction_done": (step / total) if total else None,
        "loss": progress.get("loss"),
        "eval_loss": held_out_loss(progress),
        "attempts": len(attempts),
        "preemptions": sum(1 for a in attempts if preempted(a)),
        "cost_usd": round(cost, 6),
        "projected_cost_usd": None if projected is None else round(projected, 6),
        "budget_usd": budget,
        "hourly_usd": hourly,
        "eta_s": remaining_s if (active or state is JobState.SUCCEEDED) else None,
        "remaining_s": remaining_s,
        "run_uri": job.run_uri,
        "output_uri": job.output_uri,
        "last_checkpoint_step": progress.get("last_checkpoint_step"),
        "last_checkpoint_at": ckpt_at,
        "last_checkpoint_age_s": (now - ckpt_at) if ckpt_at else None,
        "tokens_per_s": progress.get("tokens_per_s"),
        "steps_per_s": rate or None,
        "where": last.instance if last is not None else None,
        "spot": spot,
        "market": market,
        "created_at": job.created_at,
        "updated_at": max(job.updated_at, progress.get("updated_at") or 0.0),
        "ended_at": job.ended_at,
    }


def held_out_loss(progress: dict[str, Any]) -> float | None:
    """The held-out loss after training, else the newest one measured during it (None without a held-out set)."""
    after = progress.get("eval_after")
    if isinstance(after, dict) and isinstance(after.get("loss"), (int, float)):
        return float(after["loss"])
    value = progress.get("eval_loss")
    return float(value) if isinstance(value, (int, float)) else None


def with_fields(row: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """`row` with what its backend knows better (`Backend.status_fields`: recoveries, where, its own cost);
    the projection keeps the cost still to come."""
    cost_before = row["cost_usd"]
    row.update(fields)
    if row["projected_cost_usd"] is not None and row["cost_usd"] != cost_before:
        row["projected_cost_usd"] = round(row["projected_cost_usd"] - cost_before + row["cost_usd"], 6)
    return row


def job_facts(registry: Registry, job: Job, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """One job's status row from the registry and its run store, without its backend's fields."""
    if progress is None:
        progress = with_saved_checkpoint(job, read_progress(job))
    return summarize(job, registry.attempts(job.job_id), progress, time.time())


# ---- the attempt timeline -----------------------------------------------------------------------
def _current_step(current: dict[str, Any] | int | None, attempt: Attempt) -> int | None:
    """The running attempt's step so far: progress that is this attempt's (a progress file still
    holding the previous attempt's step, while this one loads, is not)."""
    if not isinstance(current, dict):
        return current
    if current.get("attempt") is not None and current.get("attempt") != attempt.n:
        return None
    return current.get("step")


def _kept(attempts: list[Attempt], i: int) -> int | None:
    """The step attempt i's work survived to: where the next attempt that trained resumed from (its
    start is the trainer's own word; an attempt that never took a step may carry a stale start)."""
    following = attempts[i + 1 :]
    trained = next((f for f in following if f.first_step_at is not None and f.start_step is not None), None)
    if trained is not None:
        return trained.start_step
    if following and following[0].start_step is not None:
        return following[0].start_step
    return attempts[i].end_step


def timeline(
    attempts: list[Attempt], state: str, now: float, current: dict[str, Any] | int | None = None
) -> list[dict[str, Any]]:
    """Each attempt with what it gained (steps that survived) and what it lost (steps and seconds).

    A running attempt has no end step yet: its gain so far comes from `current` (the run's progress, or
    its step). An ended attempt that never took a step gained and lost nothing."""
    rows = []
    for i, a in enumerate(attempts):
        following = attempts[i + 1] if i + 1 < len(attempts) else None
        start = a.start_step or 0
        # an attempt that never took a step (it records its start step, and the first one when it comes)
        idle = a.ended_at is not None and a.first_step_at is None and a.start_step is not None
        idle = idle and following is not None
        kept = None if idle else _kept(attempts, i)
        if following is None and a.ended_at is None and a.end_step is None:
            kept = _current_step(current, a)
        if idle:
            steps_lost = 0
        else:
            steps_lost = (
                max(0, (a.end_step or 0) - kept) if kept is not None and a.end_step is not None else 0
            )
        time_lost = None
        if following is not None and a.ended_at and following.first_step_at:
            time_lost = following.first_step_at - a.ended_at
            if a.end_step and a.first_step_at and a.end_step > start:
                per_step = (a.ended_at - a.first_step_at) / max(1, a.end_step - start)
                time_lost += steps_lost * per_step
        gained = 0 if idle else (max(0, kept - start) if kept is not None else None)
        rows.append(
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
                "outcome": a.outcome,
                "start_step": a.start_step,
                "end_step": a.end_step,
                "steps_gained": gained,
                "steps_lost": steps_lost,
                "time_lost_s": None if time_lost is None else round(time_lost, 2),
                "cost_usd": round(attempt_cost(a, state, now), 6),
            }
        )
    return rows


def lost_time_per_preemption(timeline_rows: list[dict[str, Any]]) -> list[float]:
    """For each preemption: seconds from the end of the attempt to the next attempt's first step, plus
    the time its steps not kept took (the timeline's `time_lost_s`): a kill without notice before any
    checkpoint loses the whole attempt's steps, which the next attempt runs again."""
    lost = []
    for previous, following in zip(timeline_rows, timeline_rows[1:], strict=False):
        if previous.get("outcome") == Outcome.PREEMPTED and following.get("first_step_at"):
            gap = following["first_step_at"] - previous["ended_at"]
            lost.append(round(max(gap, previous.get("time_lost_s") or 0.0), 2))
    return lost


def cost_curve(metrics: list[dict[str, Any]], attempts: list[Attempt], state: JobState) -> list[list[float]]:
    """[step, cost so far] at each logged step: what the run had cost when it got there."""
    curve = []
    for row in metrics:
        at = row.get("time")
        if at is None:
            continue
        spent = sum(attempt_cost(a, state, at, until=at) for a in attempts if a.started_at < at)
        curve.append([row["step"], round(spent, 6)])
    return curve
