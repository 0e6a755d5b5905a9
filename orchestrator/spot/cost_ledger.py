"""A job's cost ledger as the orchestrator sees it (`ftorch status JOB`, its JSON `ledger`, the model card):
trainer/recording/ledger.py's function over the run store's epoch records, with what only the orchestrator knows:
the attempts' start and end times and kept steps (registry), each trainer's last logged step (metrics),
the cost so far, and the on-demand price of the offer the job ran on (its backend: SkyPilot keeps the
launch's offers in skypilot.json; a local job has none, so its savings are n/a).
"""

from __future__ import annotations

from typing import Any

from orchestrator.records import Attempt, Job, preempted
from orchestrator.registry import Registry
from trainer.recording.ledger import compute_ledger


def attempt_dicts(
    attempts: list[Attempt], backend_times: dict[int, dict[str, float]] | None = None
) -> list[dict[str, Any]]:
    """The ledger's attempts: the registry's, with the backend's own timestamps where it keeps them
    (SkyPilot: detected_at, placed_at, submitted_at; orchestrator/backends/skypilot_state.py)."""
    times = backend_times or {}
    return [
        {
            **times.get(a.n, {}),
            "n": a.n,
            "started_at": a.started_at,
            "ended_at": a.ended_at,
            "start_step": a.start_step,
            "end_step": a.end_step,
            "preempted": preempted(a),
            "hourly_usd": a.hourly_usd,
        }
        for a in attempts
    ]


def last_step_times(metrics: list[dict[str, Any]]) -> dict[int, float]:
    """Each attempt's last logged step time (metrics rows carry the attempt and the time)."""
    out: dict[int, float] = {}
    for row in metrics:
        n, at = row.get("attempt"), row.get("time")
        if isinstance(n, int) and isinstance(at, int | float):
            out[n] = max(out.get(n, 0.0), float(at))
    return out


def job_ledger(
    registry: Registry,
    job: Job,
    attempts: list[Attempt],
    spent_usd: float | None,
    records: dict[int, dict[str, Any]] | None = None,
    metrics: list[dict[str, Any]] | None = None,
    tokens: int | None = None,
    *,
    ondemand_hourly_usd: float | None = None,
    attempt_times: dict[int, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The job's ledger; `records` and `metrics` are read from the run store when not given. The
    backend's facts come from the caller (`backends.base.ledger_facts`): the on-demand price the
    savings are measured against, and each attempt's times where the backend knows them better than the
    registry (None: n/a, the registry's times)."""
    if records is None or metrics is None:
        try:
            store = job.run_store(retry_seconds=2.0)
            records = store.epoch_records() if records is None else records
            metrics = store.read_metrics() if metrics is None else metrics
        except Exception:  # noqa: BLE001 - an unreachable store: the ledger from the registry alone
            records, metrics = records or {}, metrics or []
    hourly = attempts[-1].hourly_usd if attempts else job.hourly_usd
    ledger = compute_ledger(
        records,
        spent_usd=spent_usd,
        hourly_usd=hourly,
        ondemand_hourly_usd=ondemand_hourly_usd,
        attempts=attempt_dicts(attempts, attempt_times or {}),
        tokens=tokens,
        last_step_at=last_step_times(metrics),
    )
    moved = _data_movement(job, records) if records else None  # the jobs table passes none: no store read
    if moved is not None:
        ledger["data_movement"] = moved
    return ledger


def _data_movement(job: Job, records: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """What the attempts paid to move checkpoints (orchestrator/spot/egress.py), when the run store's
    region is known (checkpoint.region or the bucket's answer); None when it is not or the store cannot
    be read."""
    from orchestrator.spot.egress import attempt_movement, store_of
    from trainer.config import JobSpec
    from trainer.runstore.attempts import ATTEMPTS

    uri = str(((job.spec or {}).get("checkpoint") or {}).get("uri") or "")
    if "://" not in uri or uri.startswith("file://"):
        return None  # a local store: nothing crosses a cloud (and no spec validation per job)
    try:
        store = store_of(JobSpec.model_validate(job.spec))  # checkpoint.region, else the bucket's (cached)
        if not store.known or store.on_disk:
            return None
        run = job.run_store(retry_seconds=2.0)
        newest = run.complete_checkpoints()
        size = newest[-1].size_bytes if newest else 0
        attempts = {int(n.removesuffix(".json")): run.read_json_or_none(f"{ATTEMPTS}/{n}") or {}
                    for n in run.listdir(ATTEMPTS) if n.removesuffix(".json").isdigit()}  # fmt: skip
    except Exception:  # noqa: BLE001 - an unreadable store or spec: no data movement line
        return None
    return attempt_movement(store, attempts, records, float(size))
