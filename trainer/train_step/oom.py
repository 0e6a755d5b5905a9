"""Out of memory is not the end of a run: a step that runs out of GPU memory shrinks the micro-batch.

When a step raises `torch.cuda.OutOfMemoryError` on any rank, every rank agrees (`par.any`, as for a
notice), and rank 0 records the next smaller layout in spec.json's `adaptations` list: the examples per
rank halved and the accumulation doubled (trainer/layout.py `halved`: the effective batch, the data
position's unit and each step's examples are unchanged, so nothing in the fingerprint moves and the data
position needs no conversion), down to 1 per rank, then gradient checkpointing on. The attempt then exits
with `exitcodes.OOM_ADAPT`, and its launcher starts the next attempt from the newest checkpoint without
counting a crash (the local supervisor; on SkyPilot the task's run script loops on that code).

Why exit and relaunch rather than re-enter setup in the same process: an out-of-memory error leaves the
caching allocator fragmented, autograd graphs and FSDP's gathered parameters half-released, and NCCL
collectives possibly mid-flight; only a fresh process frees all of it for sure. It is also the path every
resume already takes (and its tests), at the price of one model load.

When the smallest layout still does not fit, the trainer records the measured peak in spec.json
`does_not_fit` and exits `exitcodes.DOES_NOT_FIT`, which no launcher retries: the job needs a re-plan
(`ftorch status` says so, with the peak).

spec.json keeps what finally ran: the newest adaptation's `to` (and `job.train.gradient_checkpointing`
once it was turned on). No torch at module level: the orchestrator reads these records.
"""

from __future__ import annotations

import time
from typing import Any

from trainer.layout import Layout, halved
from trainer.layout import check as check_layout
from trainer.memory.facts import GIB

ADAPTATIONS_KEY = "adaptations"
DOES_NOT_FIT_KEY = "does_not_fit"
#: the epoch record's stop_reason of an attempt that ran out of memory (then adapted, or does not fit)
STOP_REASON = "out of memory"
DOES_NOT_FIT_REASON = "does not fit"


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


def adaptations(resolved: Any) -> list[dict[str, Any]]:
    """spec.json's adaptations, oldest first."""
    entries = resolved.get(ADAPTATIONS_KEY) if isinstance(resolved, dict) else None
    return [e for e in entries or [] if isinstance(e, dict)]


def current(resolved: Any) -> dict[str, Any] | None:
    """What the newest adaptation runs (`micro_batch_per_rank`, `grad_accum_per_rank`,
    `gradient_checkpointing`), or None."""
    entries = adaptations(resolved)
    return entries[-1].get("to") if entries else None


def layout_for_attempt(
    spec: Any, resolved: dict[str, Any], world: int, local_world: int | None
) -> tuple[Any, Layout]:
    """The spec and layout this attempt runs: the job's, capped by the newest adaptation."""
    now = current(resolved)
    if not now:
        return spec, check_layout(spec, world, local_world)
    layout = check_layout(spec, world, local_world, int(now.get("micro_batch_per_rank") or 0) or None)
    if now.get("gradient_checkpointing") and not spec.train.gradient_checkpointing:
        spec = spec.model_copy(
            update={"train": spec.train.model_copy(update={"gradient_checkpointing": True})}
        )
    return spec, layout


def _describe(layout: dict[str, Any]) -> str:
    ckpt = ", gradient checkpointing" if layout.get("gradient_checkpointing") else ""
    return f"{layout['micro_batch_per_rank']}/rank x{layout['grad_accum_per_rank']}{ckpt}"


def _layout_dict(layout: Layout, checkpointing: bool) -> dict[str, Any]:
    return {
        "micro_batch_per_rank": layout.micro_batch,
        "grad_accum_per_rank": layout.accum,
        "gradient_checkpointing": bool(checkpointing),
    }


def next_layout(layout: Layout, checkpointing: bool) -> dict[str, Any] | None:
    """The next smaller way to run the same step: half the micro-batch, then gradient checkpointing."""
    smaller = halved(layout)
    if smaller is not None:
        return _layout_dict(smaller, checkpointing)
    if not checkpointing:
        return _layout_dict(layout, True)
    return None


def describe(entry: dict[str, Any]) -> str:
    """One line: 'attempt 1, step 3: out of memory at 16/rank x1 -> 8/rank x2 (same effective batch 16)'."""
    return (
        f"attempt {entry.get('attempt')}, step {entry.get('step')}: out of memory at "
        f"{_describe(entry['from'])} -> {_describe(entry['to'])} (same effective batch "
        f"{entry.get('effective_batch')})"
    )


def _peaks() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None, "gpu_total_bytes": None}
    return {
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "gpu_total_bytes": int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory),
    }


def on_oom(a: Any, error: BaseException | None, log: Any) -> int:
    """Every rank, after they agreed a step ran out of memory: record the next layout (rank 0) and
    return the exit code (OOM_ADAPT, or DOES_NOT_FIT when nothing smaller is left)."""
    from trainer import exitcodes

    checkpointing = bool(a.spec.train.gradient_checkpointing)
    before = _layout_dict(a.layout, checkpointing)
    step = a.state.step + 1  # the step that ran out of memory
    resume_from = a.checkpoints.durable_step or 0
    after = next_layout(a.layout, checkpointing)
    peaks = _peaks()
    entry: dict[str, Any] = {
        "at": time.time(),
        "attempt": a.number,
        "step": step,
        "resume_step": resume_from,
        "effective_batch": a.layout.effective_batch,
        "world_size": a.layout.ranks,
        "from": before,
        "to": after,
        "error": str(error).splitlines()[0][:200] if error is not None else "out of memory on another rank",
        **peaks,
    }
    if a.par.is_main:
        reason = STOP_REASON if after is not None else DOES_NOT_FIT_REASON
        a.store.update_epoch_record(ended="stopped", stop_reason=reason, step=a.state.step)
        resolved = a.store.read_spec()
        if after is None:
            resolved[DOES_NOT_FIT_KEY] = entry
        else:
            resolved.setdefault(ADAPTATIONS_KEY, []).append(entry)
            if after["gradient_checkpointing"] and isinstance(resolved.get("job"), dict):
                resolved["job"].setdefault("train", {})["gradient_checkpointing"] = True
        a.store.write_spec(resolved)
    a.par.barrier()  # spec.json is written before any rank leaves (the launcher reads it on exit)
    if after is None:
        peak = peaks.get("peak_allocated_bytes")
        measured = f"measured peak {peak / GIB:.1f} GiB per GPU" if peak else "no GPU peak measured"
        log(
            f"out of memory at step {step} even with {_describe(before)} (the smallest layout): does not "
            f"fit on this GPU ({measured}); exiting with code {exitcodes.DOES_NOT_FIT} (re-plan)"
        )
        return exitcodes.DOES_NOT_FIT
    log(
        f"out of memory at step {step} with {_describe(before)}: restarting from checkpoint step "
        f"{resume_from} with {_describe(after)} (same effective batch {a.layout.effective_batch}); "
        f"exiting with code {exitcodes.OOM_ADAPT}"
    )
    return exitcodes.OOM_ADAPT


def replan_line(resolved: Any) -> str | None:
    """'re-plan: out of memory with 1/rank x16, gradient checkpointing (measured peak 78.1 GiB of
    79.6 GiB per GPU); a GPU with more memory is needed', or None."""
    entry = resolved.get(DOES_NOT_FIT_KEY) if isinstance(resolved, dict) else None
    if not isinstance(entry, dict):
        return None
    peak, total = entry.get("peak_allocated_bytes"), entry.get("gpu_total_bytes")
    measured = "no GPU peak measured"
    if peak:
        measured = f"measured peak {peak / GIB:.1f} GiB" + (f" of {total / GIB:.1f} GiB" if total else "")
        measured += " per GPU"
    return (
        f"re-plan: out of memory at step {entry.get('step')} with {_describe(entry['from'])} ({measured}); "
        "the job needs a GPU with more memory"
    )
