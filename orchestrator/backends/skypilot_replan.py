"""`ftorch resume` of a SkyPilot job that ended "does not fit" (trainer/train_step/oom.py): plan again with the
measured peak (orchestrator/sizing/replan.py refuses the GPU it ran on and every one with no more memory),
launch on the next adequate offer, and say so: a line in status (the job's reason and spec.json
`replans`), a `replanned` event and notification. Never silently on a dearer class."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from orchestrator.backends import skypilot_cost as cost
from orchestrator.backends import skypilot_state as sky_state
from orchestrator.registry import Job, Registry
from orchestrator.sizing.replan import Unfit, record_replan, unfit_of
from orchestrator.sizing.sky_names import ftorch_name

EVENT = "replanned"


@dataclass(frozen=True)
class Pending:
    """A re-plan to make: what the job measured and where it ran (as status says it), at what price."""

    unfit: Unfit
    old_offer: str
    old_hourly_usd: float | None


def pending(registry: Registry, job: Job) -> Pending | None:
    """The re-plan a resume of `job` needs, or None (it did not end "does not fit")."""
    try:
        resolved = job.run_store().read_json_or_none("spec.json")
    except Exception:  # noqa: BLE001 - unreadable now: resume as before (the trainer reads it)
        return None
    state = sky_state.read_state(registry, job)
    record = state.get("record") or {}
    gpus = list((record.get("accelerators") or {}).keys())
    unfit = unfit_of(resolved, ftorch_name(str(gpus[0])) if gpus else None)
    if unfit is None:
        return None
    priced = [s for s in state.get("segments") or [] if s.get("hourly_usd") is not None]
    old = (priced[-1].get("where") if priced else None) or cost.where(record) or (unfit.accelerator or "?")
    return Pending(unfit, str(old), float(priced[-1]["hourly_usd"]) if priced else None)


def describe_offer(chosen: Any) -> str:
    kind = "spot" if chosen.spot else "on-demand"
    return f"{chosen.cloud} {chosen.count}x {chosen.accelerator} {kind}"


def line(p: Pending, chosen: Any) -> str:
    """'re-planned: from gcp/us-central1 1x L4 spot to aws 1x A100 spot ($0.29 -> $1.10 per hour) after
    out of memory at step 12 (measured 20.1 GiB per GPU)'."""
    old_price = f"${p.old_hourly_usd:.2f}" if p.old_hourly_usd is not None else "$?"
    peak = f"measured {p.unfit.peak_gib:.1f} GiB per GPU" if p.unfit.peak_gib else "no GPU peak measured"
    return (
        f"re-planned: from {p.old_offer} to {describe_offer(chosen)} ({old_price} -> "
        f"${chosen.hourly_usd:.2f} per hour) after out of memory at step {p.unfit.step} ({peak})"
    )


def announce(registry: Registry, job: Job, p: Pending, plan: Any) -> str:
    """After the new launch is submitted: spec.json, the job's reason, an event and the notification."""
    said = line(p, plan.chosen)
    try:
        store = job.run_store()
        store.write_spec(record_replan(store.read_spec(), p.old_offer, describe_offer(plan.chosen), said))
    except Exception as exc:  # noqa: BLE001 - the registry still says it
        sys.stderr.write(f"warning: cannot record the re-plan in {job.run_uri}/spec.json: {exc}\n")
    registry.update(job.job_id, reason=said)
    registry.event(job.job_id, EVENT, said)
    sys.stderr.write(said + "\n")
    from orchestrator.backends.notify import notify_job

    notify_job(registry, job.job_id, EVENT, lambda text: sys.stderr.write(text + "\n"))
    return said
