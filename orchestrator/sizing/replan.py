"""The re-plan after "does not fit": a job whose smallest layout ran out of memory (trainer/train_step/oom.py,
spec.json `does_not_fit`) is planned again with what it measured, so the GPU it ran on, and every GPU
with no more memory than that one, is refused with the measured peak as the reason.

Torch-free and backend-free: `Unfit` is what the planner takes (`make_plan(unfit=...)`); the SkyPilot
backend decides when to use it (orchestrator/backends/skypilot_replan.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from trainer.memory.facts import GIB
from trainer.train_step.oom import ADAPTATIONS_KEY, DOES_NOT_FIT_KEY

#: spec.json's list of past re-plans: the `does_not_fit` entry that caused each, with `from` and `to`
REPLANS_KEY = "replans"


@dataclass(frozen=True)
class Unfit:
    """What a run that did not fit measured, and on which GPU."""

    peak_gib: float | None  # per GPU (None: no GPU peak was measured)
    step: int | None
    accelerator: str | None  # the offer table's name of the GPU it ran on
    gpu_memory_gib: float | None  # that GPU's memory (the catalog's figure, else torch's total)

    def with_catalog(self, offers: Iterable[Any]) -> Unfit:
        """The GPU's memory as the catalog states it (torch reports a little less than the label)."""
        if not self.accelerator:
            return self
        sizes = [o.gpu_memory_gib for o in offers if o.accelerator.lower() == self.accelerator.lower()]
        return replace(self, gpu_memory_gib=max(sizes)) if sizes else self

    def refuses(self, offer: Any) -> str | None:
        """Why `offer` is refused (its GPU is the one that ran out of memory, or has no more memory)."""
        same = bool(self.accelerator) and offer.accelerator.lower() == str(self.accelerator).lower()
        smaller = self.gpu_memory_gib is not None and offer.gpu_memory_gib <= self.gpu_memory_gib + 1e-6
        if not (same or smaller):
            return None
        peak = f"{self.peak_gib:.1f} GiB" if self.peak_gib is not None else "out of memory"
        on = f" on {self.accelerator}" if self.accelerator else ""
        size = f" ({self.gpu_memory_gib:g} GiB)" if self.gpu_memory_gib is not None else ""
        return f"memory: measured {peak} by this job at step {self.step}{on}{size}; needs more GPU memory"


def unfit_of(resolved: Any, accelerator: str | None) -> Unfit | None:
    """The job's `does_not_fit` record as an Unfit (None when the job did not end so)."""
    entry = resolved.get(DOES_NOT_FIT_KEY) if isinstance(resolved, dict) else None
    if not isinstance(entry, dict):
        return None
    peak, total = entry.get("peak_allocated_bytes"), entry.get("gpu_total_bytes")
    return Unfit(
        peak_gib=peak / GIB if peak else None,
        step=entry.get("step"),
        accelerator=accelerator,
        gpu_memory_gib=total / GIB if total else None,
    )


def record_replan(resolved: dict[str, Any], old: str, new: str, line: str) -> dict[str, Any]:
    """spec.json after a re-plan: `does_not_fit` moves to `replans` (with from, to and the line), so
    status no longer says the job needs one. The out-of-memory adaptations made on the old GPU move with
    it: the larger GPU starts again from the job's own layout (trainer/train_step/oom.py adapts again if it must),
    not from the smallest one, which would waste it."""
    entry = dict(resolved.pop(DOES_NOT_FIT_KEY, None) or {})
    entry["adaptations"] = resolved.pop(ADAPTATIONS_KEY, None) or []
    resolved.setdefault(REPLANS_KEY, []).append({**entry, "from_offer": old, "to_offer": new, "line": line})
    return resolved


def replanned_lines(resolved: Any) -> list[str]:
    """The status lines of past re-plans, oldest first."""
    entries = resolved.get(REPLANS_KEY) if isinstance(resolved, dict) else None
    return [str(e["line"]) for e in entries or [] if isinstance(e, dict) and e.get("line")]


def local_refusal(job_id: str, resolved: Any) -> str | None:
    """Why `ftorch resume` refuses a local job that did not fit (its hardware cannot change), or None."""
    unfit = unfit_of(resolved, None)
    if unfit is None:
        return None
    peak = f"measured peak {unfit.peak_gib:.1f} GiB per GPU" if unfit.peak_gib else "out of memory"
    return (
        f"JOB: {job_id} does not fit this machine's GPUs even with the smallest layout ({peak} at step "
        f"{unfit.step}); the local backend cannot move it to a larger GPU: run it with "
        "resources.backend: skypilot or on a machine with more GPU memory"
    )
