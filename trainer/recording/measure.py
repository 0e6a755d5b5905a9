"""What an attempt measured: peak memory, throughput, checkpoint costs and the restart phases.

Recorded in the attempt's epoch record in the run store under `measured` (rank 0; the other ranks' store
has no epoch and writes nothing), at every checkpoint and at the end of the attempt, so a killed attempt
keeps what it measured up to its last checkpoint. The schema (read by `ftorch status` and the history):

    {"device": "cuda"|"cpu", "gpu_name": str|None, "world_size": int, "micro_batch_size": int,
     "grad_accum": int, "gradient_checkpointing": bool, "peak_allocated_bytes": int|None,
     "peak_reserved_bytes": int|None, "peak_rss_bytes": int|None, "steps": int, "tokens": int,
     "tokens_per_s": float|None, "step_s": float|None, "checkpoint_blocking_s": float|None,
     "checkpoint_upload_s": float|None,
     "phases": {"process_start_s": float, "model_load_s": float, "checkpoint_read_s": float,
                "first_step_s": float}}

- peaks are rank 0's GPU (`torch.cuda.max_memory_allocated/reserved`; FSDP ranks hold equal shards); on
  a CPU they are None and `peak_rss_bytes` is the process's peak resident set (getrusage), which is no
  GPU figure: the label `device: cpu` says so.
- `micro_batch_size` / `grad_accum` are what one rank ran (the layout, after any out-of-memory adaptation).
- `steps`, `tokens`: this attempt's own; `step_s` and `tokens_per_s` leave out the first step (warm-up)
  when there are more.
- phases are durations in seconds, the first counted from the process's start (the OS's clock,
  trainer/stops/interruptions.py `process_started_at`): `process_start_s` = process start to the
  trainer's setup (interpreter, imports), `model_load_s` = loading (and wrapping) the model,
  `checkpoint_read_s` = reading the newest checkpoint (0 on a fresh start), `first_step_s` = from the end
  of setup to the end of the first step (0 until it is taken).
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

from trainer.memory.facts import GIB
from trainer.runstore.store import MEASURED
from trainer.stops.interruptions import process_started_at

KEY = MEASURED  # the epoch record key (trainer/runstore/store.py)


def peak_rss_bytes() -> int:
    """The process's peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


class Measurer:
    """Collects one attempt's measurements; `record(store)` writes them to the epoch record."""

    def __init__(self) -> None:
        self.started_at = process_started_at()
        self.setup_at = time.time()
        self.phases = {
            "process_start_s": round(max(0.0, self.setup_at - self.started_at), 3),
            "model_load_s": 0.0,
            "checkpoint_read_s": 0.0,
            "first_step_s": 0.0,
        }
        self.layout: dict[str, Any] = {}
        self.device = "cpu"
        self.gpu_name: str | None = None
        self.ready_at: float | None = None
        self.first_step_end: float | None = None
        self.last_step_end: float | None = None
        self.steps = 0
        self.tokens = 0
        self.tokens_after_first = 0
        self.checkpoint_blocking_s = 0.0
        self.checkpoint_upload_s = 0.0
        self.saves = 0
        self.uploads = 0
        self._seen_upload: Any = None

    # ---- setup ---------------------------------------------------------------------------------
    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = round(seconds, 3)

    def ready(self, device: Any, world: int, micro_batch: int, accum: int, checkpointing: bool) -> None:
        """Setup is done: what this attempt runs (device, ranks, per-rank layout)."""
        self.device = getattr(device, "type", str(device))
        if self.device == "cuda":
            import torch

            self.gpu_name = torch.cuda.get_device_name(device)
            torch.cuda.reset_peak_memory_stats(device)  # the training peak, not the load's
        self.layout = {
            "world_size": int(world),
            "micro_batch_size": int(micro_batch),
            "grad_accum": int(accum),
            "gradient_checkpointing": bool(checkpointing),
        }
        self.ready_at = time.time()

    # ---- training ------------------------------------------------------------------------------
    def step(self, tokens: int) -> None:
        now = time.time()
        self.steps += 1
        self.tokens += int(tokens)
        if self.first_step_end is None:
            self.first_step_end = now
            self.phases["first_step_s"] = round(now - (self.ready_at or now), 3)
        else:
            self.tokens_after_first += int(tokens)
        self.last_step_end = now

    def checkpoint(self, blocking_s: float, writer: Any = None) -> None:
        """A save blocked training `blocking_s`; the writer's newest finished upload is counted once."""
        self.saves += 1
        self.checkpoint_blocking_s += blocking_s
        self.observe_upload(writer)

    def observe_upload(self, writer: Any) -> None:
        done = getattr(writer, "last", None)
        if done is not None and done is not self._seen_upload:
            self._seen_upload = done
            self.uploads += 1
            self.checkpoint_upload_s += float(getattr(done, "upload_s", 0.0) or 0.0)

    # ---- the record ----------------------------------------------------------------------------
    def peaks(self) -> dict[str, int | None]:
        if self.device == "cuda":
            import torch

            return {
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
                "peak_rss_bytes": peak_rss_bytes(),
            }
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None, "peak_rss_bytes": peak_rss_bytes()}

    def rates(self) -> tuple[float | None, float | None]:
        """(tokens/s, s/step) over the attempt, the first step left out when there are more."""
        if not self.steps or self.first_step_end is None or self.last_step_end is None:
            return None, None
        if self.steps > 1 and self.last_step_end > self.first_step_end:
            span = self.last_step_end - self.first_step_end
            return round(self.tokens_after_first / span, 3), round(span / (self.steps - 1), 6)
        span = self.phases["first_step_s"]
        if span <= 0:
            return None, None
        return round(self.tokens / span, 3), round(span, 6)

    def to_json(self) -> dict[str, Any]:
        tokens_per_s, step_s = self.rates()
        layout = self.layout or {
            "world_size": 1, "micro_batch_size": 0, "grad_accum": 0, "gradient_checkpointing": False,
        }  # fmt: skip
        return {
            "device": self.device,
            "gpu_name": self.gpu_name,
            **layout,
            **self.peaks(),
            "steps": self.steps,
            "tokens": self.tokens,
            "tokens_per_s": tokens_per_s,
            "step_s": step_s,
            "checkpoint_blocking_s": round(self.checkpoint_blocking_s, 3) if self.saves else None,
            "checkpoint_upload_s": round(self.checkpoint_upload_s, 3) if self.uploads else None,
            "checkpoint_uploads": self.uploads,  # saves that reached the run store (the ledger's transfer)
            "phases": dict(self.phases),
        }

    def record(self, store: Any, writer: Any = None) -> dict[str, Any]:
        """Into this attempt's epoch record (best effort, rank 0 only: the others hold no epoch)."""
        if writer is not None:
            self.observe_upload(writer)
        measured = self.to_json()
        store.update_epoch_record(**{KEY: measured})
        return measured


def describe(measured: dict[str, Any]) -> str:
    """One short line for `ftorch status`: 'cuda H100: peak 31.2 GiB alloc / 33.0 reserved, 4/GPU x4,
    1,234 tok/s, 0.52 s/step, load 12 s, first step 3 s'."""
    gib = GIB
    if measured.get("device") == "cuda":
        alloc, reserved = measured.get("peak_allocated_bytes"), measured.get("peak_reserved_bytes")
        where = f"cuda {measured.get('gpu_name') or ''}".rstrip()
        peak = (
            f"peak {alloc / gib:.1f} GiB alloc / {reserved / gib:.1f} reserved per GPU"
            if alloc is not None and reserved is not None
            else "peak ?"
        )
    else:
        rss = measured.get("peak_rss_bytes")
        where = "cpu"
        peak = f"peak RSS {rss / gib:.2f} GiB (process, not a GPU)" if rss else "peak ?"
    layout = f"{measured.get('micro_batch_size')}/rank x{measured.get('grad_accum')}"
    if measured.get("gradient_checkpointing"):
        layout += " ckpt"
    parts = [f"{where}: {peak}", layout]
    if measured.get("tokens_per_s") is not None:
        parts.append(f"{measured['tokens_per_s']:,.0f} tok/s")
    if measured.get("step_s") is not None:
        parts.append(f"{measured['step_s']:.2f} s/step")
    phases = measured.get("phases") or {}
    parts.append(
        f"start {phases.get('process_start_s', 0):.0f} s, load {phases.get('model_load_s', 0):.0f} s, "
        f"ckpt read {phases.get('checkpoint_read_s', 0):.1f} s, first step {phases.get('first_step_s', 0):.1f} s"
    )
    if measured.get("checkpoint_blocking_s") is not None:
        parts.append(f"ckpt blocked {measured['checkpoint_blocking_s']:.1f} s")
    return ", ".join(parts)
