"""What a run store says about its attempts, read by the orchestrator without the trainer: one entry per
attempt from the trainer's epoch records, and the lines `ftorch logs` shows for a job adopted from its
store (whose trainer logs stayed on the machine that ran it). Ground floor: the backends and `attach` use it.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.records import Job
from orchestrator.states import Outcome

#: epoch record `ended` (and `stop_reason`) -> the attempt's outcome
_ENDED = {"finished": Outcome.SUCCEEDED, "notice": Outcome.PREEMPTED, "unhealthy": Outcome.UNHEALTHY}
_STOPPED = {"cancel": Outcome.CANCELLED, "budget": Outcome.BUDGET, "policy switch": Outcome.SWITCH,
            "supervisor lost": Outcome.LOST, "out of memory": Outcome.ADAPTED,
            "does not fit": Outcome.FAILED}  # fmt: skip


def attempts_from_store(store: Any) -> list[dict[str, Any]]:
    """One entry per attempt from the trainer's epoch records, oldest first: n, started_at, ended_at,
    end_step, end_reason, outcome (an attempt with no record of how it ended was killed or crashed)."""
    try:
        records = store.epoch_records()
    except Exception:  # noqa: BLE001
        return []
    by_attempt: dict[int, dict[str, Any]] = {}
    for epoch in sorted(records):
        record = records[epoch]
        n = record.get("attempt") if isinstance(record.get("attempt"), int) else epoch
        entry = by_attempt.setdefault(n, {"n": n, "started_at": float(record.get("claimed_at") or 0.0)})
        if isinstance(record.get("step"), int):
            entry["end_step"] = record["step"]
        if isinstance(record.get("measured"), dict):  # trainer/recording/measure.py
            entry["measured"] = record["measured"]
        ended = record.get("ended")
        if ended == "stopped":
            entry["outcome"] = _STOPPED.get(str(record.get("stop_reason")), Outcome.CANCELLED)
            entry["end_reason"] = f"stopped ({record.get('stop_reason')})"
        elif ended in _ENDED:
            entry["outcome"] = _ENDED[ended]
            entry["end_reason"] = {"finished": "succeeded", "notice": "preempted (with notice)"}.get(
                ended, str(record.get("stop_detail") or ended)
            )
    ordered = [by_attempt[n] for n in sorted(by_attempt)]
    for entry, following in zip(ordered, [*ordered[1:], None], strict=False):  # [] for a run never started
        entry["ended_at"] = following["started_at"] if following else None
        if "end_reason" not in entry and following is not None:
            entry["end_reason"] = "ended without a record (killed, crashed or preempted without notice)"
    return ordered


def store_log_lines(job: Job) -> list[str]:
    """What the run store has in place of trainer logs (a job adopted from its store): each attempt's
    record and the metric rows."""
    try:
        store = job.run_store()
        attempts = attempts_from_store(store)
        rows = store.read_metrics()
    except Exception as exc:  # noqa: BLE001
        return [
            f"(no trainer logs on this machine, and the run store cannot be read: {exc.__class__.__name__})"
        ]
    lines = ["(no trainer logs on this machine: the job was adopted from its run store; what the store has:)"]
    for a in attempts:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["started_at"]))
        lines.append(f"===== attempt {a['n']} (started {when}) =====")
        for r in rows:
            if r.get("attempt") == a["n"]:
                loss = r.get("loss")
                lines.append(
                    f"step {r.get('step')} loss {loss:.4f}"
                    if isinstance(loss, float)
                    else f"step {r.get('step')}"
                )
        lines.append(f"ended at step {a.get('end_step', '?')}: {a.get('end_reason') or 'running or unknown'}")
    return lines
