"""A SkyPilot job as the registry sees it: SkyPilot's managed-job record -> ftorch state, attempts (one
per recovery) and the cost data kept in the job's folder (`skypilot.json`: launches, offers, segments)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from orchestrator.backends import skypilot_cost as cost
from orchestrator.backends.skypilot_sdk import QUEUE_FIELDS
from orchestrator.registry import Job, JobState, Outcome, Registry
from trainer.recording.ledger import number

#: SkyPilot ManagedJobStatus -> ftorch state
STATES = {
    "PENDING": JobState.PENDING,
    "STARTING": JobState.PROVISIONING,
    "RUNNING": JobState.RUNNING,
    "RECOVERING": JobState.RECOVERING,
    "CANCELLING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "FAILED_SETUP": JobState.FAILED,
    "FAILED_PRECHECKS": JobState.FAILED,
    "FAILED_NO_RESOURCE": JobState.FAILED,
    "FAILED_CONTROLLER": JobState.FAILED,
}
#: how an attempt ended when SkyPilot's job ended in this state
OUTCOMES = {
    JobState.SUCCEEDED: Outcome.SUCCEEDED,
    JobState.CANCELLED: Outcome.CANCELLED,
    JobState.FAILED: Outcome.FAILED,
}
RECOVERED = "preempted (SkyPilot recovered)"
STATE_FILE = "skypilot.json"


def read_state(registry: Registry, job: Job) -> dict[str, Any]:
    path = registry.job_dir(job.job_id) / STATE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_state(registry: Registry, job: Job, state: dict[str, Any]) -> None:
    path = registry.job_dir(job.job_id) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def record_launch(
    registry: Registry, job: Job, sky_job_id: int, note: str, offers: list[dict[str, Any]] | None = None
) -> None:
    """A new managed job for the run (launch, resume, or a controller's switch): the cost of the
    launches before it is kept, and attempts are counted from here."""
    registry.update(job.job_id, backend_job_id=str(sky_job_id))
    state = read_state(registry, job)
    state["past_cost_usd"] = (cost.cost_usd(state) or 0.0) if state.get("sky_job_id") is not None else 0.0
    state["attempt_base"] = len(registry.attempts(job.job_id))
    state.setdefault("launches", []).append({"sky_job_id": sky_job_id, "at": time.time()})
    state.update(sky_job_id=sky_job_id, segments=[], record=None, times={})
    if offers is not None:
        state["offers"] = offers
    write_state(registry, job, state)
    registry.set_state(job.job_id, JobState.PENDING, note)


def apply_record(registry: Registry, job: Job, record: Mapping[str, Any] | None) -> Job:
    """Move the registry to what SkyPilot reports: state, attempts (one per recovery), cost data."""
    state = read_state(registry, job)
    now = time.time()
    if record is None:
        if _progress(job).get("state") == "finished":
            registry.set_state(job.job_id, JobState.SUCCEEDED, "finished (SkyPilot no longer lists the job)")
        elif job.reason is None or "no longer lists" not in job.reason:
            registry.update(
                job.job_id,
                reason="SkyPilot no longer lists the job as in progress; `sky jobs queue --refresh` "
                "shows how it ended",
            )
        return registry.get(job.job_id)
    state["record"] = {k: record.get(k) for k in QUEUE_FIELDS}
    cost.update_segments(state, record, now)
    note_times(state, record, now)
    write_state(registry, job, state)
    _sync_attempts(registry, job, record, state)
    sky_status = str(record.get("status") or "")
    new_state = STATES.get(sky_status, job.state)
    reason = None
    if new_state is JobState.SUCCEEDED and job.state is not JobState.STOPPED:
        stopped = budget_stop(job)  # exit 0 is the trainer's budget stop too: the run store says which
        if stopped is not None:
            new_state, reason = JobState.STOPPED, stopped
    if STATES.get(sky_status) is JobState.FAILED or sky_status == "CANCELLING":
        reason = f"SkyPilot {sky_status}" + (
            f": {record['failure_reason']}" if record.get("failure_reason") else ""
        )
    ended = STATES.get(sky_status)
    sick = unhealthy_stop(job) if ended in (JobState.FAILED, JobState.SUCCEEDED) else None
    if sick is not None:  # the health checks ended it: the run script exits 0 (never relaunched), an older
        # one 86; the run store says which
        new_state, reason = JobState.UNHEALTHY, sick
    refused = env_refusal(job) if ended in (JobState.FAILED, JobState.SUCCEEDED) else None
    if refused is not None:  # the setup refused the environment: it exits 0 too, never relaunched
        new_state, reason = JobState.FAILED, refused
    if new_state != job.state or (reason and reason != job.reason):
        registry.set_state(job.job_id, new_state, reason)
    return registry.get(job.job_id)


# ---- SkyPilot's own timestamps of each attempt (the cost ledger's restart phases) ------------------
#: SkyPilot 0.14.1 (sky/jobs/state.py, controller.py, recovery_strategy.py, utils.py):
#: - `submitted_at`: set_starting_async, when the jobs controller starts launching the first cluster;
#: - `start_at` and `last_recovered_at`: the job's submission time on the cluster that
#:   `_wait_until_job_starts_on_cluster` reads back once the cluster is up, i.e. after provisioning and
#:   before the task's setup commands (managed jobs run setup detached, inside the job; job_lib's
#:   get_job_submitted_or_ended_timestamp: "the managed job duration need[s] to include both setup and
#:   running time"); `last_recovered_at` is that time for the newest (re)launch;
#: - no column holds when RECOVERING began, but set_recovering_async adds the span just run to the DB's
#:   `job_duration` (now - last_recovered_at), so attempt k ended at running_at[k] + done[k+1] - done[k],
#:   `done[k]` being the DB's job_duration after k recoveries. The queue reports that DB value exactly in a
#:   RECOVERING record and reports end_at - last_recovered_at + it in a terminal one (utils.py
#:   get_managed_job_queue); a RUNNING record adds now - last_recovered_at at the server's clock, so a
#:   value read from one is close, not exact, and exact readings replace it.
def note_times(state: dict[str, Any], record: Mapping[str, Any], now: float) -> None:
    """Keep this launch's SkyPilot timestamps (`times`) and each registry attempt's (`attempt_times`:
    submitted_at, placed_at, detected_at), which survive later launches of the run."""
    times = state.setdefault("times", {})
    running_at, done = times.setdefault("running_at", {}), times.setdefault("done_s", {"0": 0.0})
    status, k = str(record.get("status") or ""), int(record.get("recovery_count") or 0)
    duration, recovered = number(record.get("job_duration")), number(record.get("last_recovered_at"))
    end_at = number(record.get("end_at"))
    if number(record.get("submitted_at")) is not None:
        times["submitted_at"] = number(record.get("submitted_at"))
    if status == "RECOVERING" and duration is not None:
        done[str(k + 1)] = duration  # exact: the span just run is added, last_recovered_at unchanged
    elif status in ("RUNNING", "CANCELLING") and recovered is not None:
        running_at.setdefault(str(k), (number(record.get("start_at")) or recovered) if k == 0 else recovered)
        if duration is not None:
            done.setdefault(str(k), max(0.0, duration - max(0.0, now - recovered)))
    elif end_at is not None and recovered is not None and duration is not None:
        done[str(k)] = max(0.0, duration - max(0.0, end_at - recovered))  # exact, as RECOVERING
        times["end_at"] = end_at
    base = int(state.get("attempt_base") or 0)
    out = state.setdefault("attempt_times", {})
    for key, placed in running_at.items():
        if placed is None:
            continue
        i = int(key)
        entry = {"placed_at": placed}
        if i == 0 and times.get("submitted_at") is not None:
            entry["submitted_at"] = times["submitted_at"]
        if str(i + 1) in done and key in done:
            entry["detected_at"] = placed + done[str(i + 1)] - done[key]
        out[str(base + i + 1)] = entry


def attempt_times(state: Mapping[str, Any]) -> dict[int, dict[str, float]]:
    """SkyPilot's timestamps of each registry attempt (by its number), as `note_times` kept them."""
    found = state.get("attempt_times") or {}
    return {int(n): dict(v) for n, v in found.items() if str(n).isdigit() and isinstance(v, dict)}


def _sync_attempts(registry: Registry, job: Job, record: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Attempt n+1 runs after SkyPilot's n-th recovery; the one before it ends as preempted."""
    recoveries = int(record.get("recovery_count") or 0)
    seg = (state.get("segments") or [{}])[-1]
    base = int(state.get("attempt_base") or 0)  # attempts of earlier launches of this run
    attempts = registry.attempts(job.job_id)[base:]

    def end_open(outcome: Outcome, reason: str, at: float | None = None) -> None:
        if attempts and attempts[-1].ended_at is None:
            registry.update_attempt(
                job.job_id, attempts[-1].n, ended_at=at or time.time(), end_reason=reason, outcome=outcome
            )

    if len(attempts) <= recoveries:  # recovering, or already running again
        end_open(Outcome.PREEMPTED, RECOVERED)
    while cost.placed(record) and len(attempts) < recoveries + 1:
        end_open(Outcome.PREEMPTED, RECOVERED)
        registry.start_attempt(
            job.job_id,
            None,
            instance=seg.get("where") or "cloud",
            spot=cost.is_spot(record),
            hourly_usd=seg.get("hourly_usd") or 0.0,
        )
        attempts = registry.attempts(job.job_id)[base:]
    status = str(record.get("status"))
    ended = STATES.get(status)
    if ended is not None and ended.terminal:
        outcome = OUTCOMES[ended]
        if outcome is Outcome.SUCCEEDED and budget_stop(job) is not None:
            outcome = Outcome.BUDGET
        elif outcome in (Outcome.SUCCEEDED, Outcome.FAILED) and unhealthy_stop(job) is not None:
            outcome = Outcome.UNHEALTHY
        refused = env_refusal(job)
        if refused is not None:
            outcome, status = Outcome.FAILED, refused
        end_open(outcome, status, float(record.get("end_at") or time.time()))


def budget_stop(job: Job) -> str | None:
    """Why the trainer stopped itself at its budget, when the run's newest attempt did (its epoch record)."""
    try:
        records = job.run_store().epoch_records()
    except Exception:  # noqa: BLE001 - unreadable: SUCCEEDED stays what SkyPilot said
        return None
    newest = records[max(records)] if records else {}
    if newest.get("stop_reason") != "budget" or _progress(job).get("state") == "finished":
        return None
    return str(newest.get("stop_detail") or "budget: the trainer stopped at resources.budget_usd")


def unhealthy_stop(job: Job) -> str | None:
    """Why the health checks ended the run, when its newest attempt says so (trainer/health/rules.py)."""
    try:
        records = job.run_store().epoch_records()
    except Exception:  # noqa: BLE001 - unreadable: FAILED stays what SkyPilot said
        return None
    newest = records[max(records)] if records else {}
    if newest.get("ended") != "unhealthy":
        return None
    from trainer.health.rules import unhealthy_reason

    return unhealthy_reason(job.run_store(), newest.get("attempt"))


def env_refusal(job: Job) -> str | None:
    """The setup's one line when it refused this launch's environment (trainer/envlock.py REFUSED; the run
    store is data: only a printable string is shown, and at most 400 characters of it)."""
    from trainer.runstore.env_refusal import REFUSED

    try:
        record = job.run_store().read_json_or_none(REFUSED)
    except Exception:  # noqa: BLE001 - unreadable: the state stays what SkyPilot said
        return None
    line = record.get("line") if isinstance(record, dict) else None
    if not isinstance(line, str) or not line.strip():
        return None
    shown = "".join(c if c.isprintable() else " " for c in line).strip()[:400]
    return shown.removeprefix("ftorch: ")


def clear_refusal(job: Job) -> None:
    """A new launch starts without the last one's refusal (a fixed image or lock may pass now)."""
    from trainer.runstore.env_refusal import REFUSED

    try:
        job.run_store().remove_file(REFUSED)
    except Exception:  # noqa: BLE001 - best effort: a stale refusal shows only once SkyPilot ends the job
        pass


def _progress(job: Job) -> dict[str, Any]:
    try:
        return job.run_store().read_progress() or {}
    except Exception:
        return {}


def status_fields(registry: Registry, job: Job) -> dict[str, Any]:
    """What status shows for a cloud job beyond the local fields: preemptions, cost, where it runs."""
    state = read_state(registry, job)
    record = state.get("record") or {}
    fields: dict[str, Any] = {"sky_job_id": state.get("sky_job_id")}
    if record:
        fields["preemptions"] = int(record.get("recovery_count") or 0)
        fields["where"] = cost.where(record) or fields.get("where")
        fields["sky_status"] = record.get("status")
    usd = cost.cost_usd(state)
    if usd is not None:
        fields["cost_usd"] = usd
    from orchestrator.spot.controller import status_fields as controller_fields

    fields.update(controller_fields(registry.job_dir(job.job_id)))
    return {k: v for k, v in fields.items() if v is not None}
