"""What runs measured, kept in the registry under $FTORCH_HOME (table `measurements`, owner-only like the
registry), and read by the next plan.

Each attempt's epoch record in the run store carries `measured` (peak memory, tokens/s, step time, the
layout that ran). A row is keyed by what decides those figures: the model, method, precision, sequence
length, micro-batch per GPU, gradient checkpointing, ranks and the GPU type (the catalog's name for the
CUDA device's name). It is kept when a job ends (the local supervisor) or `ftorch status` reconciles it,
and from bench/gpu_check.py (`record_gpu_check`).

How the planner uses it (docs/planner.md, "What runs measured"):
- memory: a plausible row with the same key (same GPU first, else any GPU: tensor bytes do not depend on
  the GPU type) replaces the estimate or the trace (fit `measured`, with the job it came from): its peak
  reserved bytes plus the CUDA context;
- time: the median measured/predicted tokens/s of the plausible rows on that GPU (same method first)
  scales the time model for that GPU (orchestrator/sizing/throughput.py `scaled`).
A row is implausible, kept but never used, when it did not run on CUDA (a CPU run's peak is the process's
RSS), its GPU is unknown to the catalog, or it has no GPU peak.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.home import ftorch_home
from orchestrator.registry import Registry
from orchestrator.sizing.throughput import ACCELERATORS
from trainer.memory.facts import CUDA_CONTEXT_BYTES, GIB

KEY = ("model", "method", "precision", "seq_len", "micro_batch", "grad_ckpt", "ranks", "gpu")
_VENDOR = ("nvidia ", "tesla ", "geforce ", "quadro ")


def catalog_gpu(name: str | None) -> str | None:
    """The catalog's accelerator name for a CUDA device name ('NVIDIA A100-SXM4-80GB' -> 'A100-80GB');
    None when the catalog does not know it."""
    if not name:
        return None
    s = name.lower().strip()
    for prefix in _VENDOR:
        s = s.removeprefix(prefix)
    words = s.replace("-", " ").split()
    if not words:
        return None
    key = words[0]
    if key == "rtx" and len(words) > 1:
        rest = "".join(words[1:3])
        key = f"rtx{words[1]}-ada" if "ada" in words else f"rtx{rest.removesuffix('ada')}"
        key = key if key in ACCELERATORS else f"rtx{words[1]}"
    elif key == "a100" and "80gb" in words:
        key = "a100-80gb"
    elif key == "h100" and "pcie" in words:
        key = "h100-pcie"
    elif key == "v100" and "32gb" in words:
        key = "v100-32gb"
    found = ACCELERATORS.get(key)
    return found.name if found else None


def judge(measured: dict[str, Any], gpu: str | None) -> str | None:
    """Why a measurement must not decide a GPU plan, or None when it may."""
    if measured.get("device") != "cuda":
        return f"device {measured.get('device')!r}, not cuda: a CPU run's peak is the process's RSS"
    if gpu is None:
        return f"GPU {measured.get('gpu_name')!r} is unknown to the catalog"
    if not (measured.get("peak_reserved_bytes") or measured.get("peak_allocated_bytes")):
        return "no GPU memory peak recorded"
    return None


def key_of(
    spec: dict[str, Any], micro_batch: int, grad_ckpt: bool, ranks: int, gpu: str | None
) -> dict[str, Any]:
    train, data = spec.get("train") or {}, spec.get("data") or {}
    return {
        "model": spec.get("model"),
        "method": spec.get("method"),
        "precision": train.get("precision"),
        "seq_len": data.get("max_seq_len"),
        "micro_batch": int(micro_batch),
        "grad_ckpt": bool(grad_ckpt),
        "ranks": int(ranks),
        "gpu": gpu,
    }


def measurement_row(spec: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any] | None:
    """The history row for one attempt's `measured` (None when it lacks the layout that ran)."""
    try:
        mb, ranks = int(measured["micro_batch_size"]), int(measured["world_size"])
    except (KeyError, TypeError, ValueError):
        return None
    gpu = catalog_gpu(measured.get("gpu_name")) if measured.get("device") == "cuda" else None
    why = judge(measured, gpu)
    key = key_of(
        spec, mb, bool(measured.get("gradient_checkpointing")), ranks, gpu or str(measured.get("device"))
    )
    facts = {k: measured.get(k) for k in ("device", "gpu_name", "peak_allocated_bytes", "peak_reserved_bytes",
                                          "peak_rss_bytes", "tokens_per_s", "step_s", "steps", "tokens")}  # fmt: skip
    predicted = _predicted_tokens_per_s(spec, measured, gpu) if why is None else None
    return {**key, **facts, "predicted_tokens_per_s": predicted, "plausible": why is None, "why": why}


def _predicted_tokens_per_s(spec: dict[str, Any], measured: dict[str, Any], gpu: str | None) -> float | None:
    """What the time model predicts for this layout on this GPU (None when it cannot say offline)."""
    try:
        from orchestrator.sizing.memory import estimate, settings_from_spec
        from orchestrator.sizing.shapes import resolve_shape
        from orchestrator.sizing.throughput import Workload, accelerator, estimate_time
        from trainer.config import JobSpec

        job = JobSpec.model_validate(spec)
        acc = accelerator(gpu or "")
        ranks = int(measured["world_size"])
        shape = resolve_shape(job.model, online=False)
        settings = settings_from_spec(job, ranks)
        settings = type(settings)(
            **{**settings.__dict__, "micro_batch": int(measured["micro_batch_size"]),
               "grad_ckpt": bool(measured.get("gradient_checkpointing"))}
        )  # fmt: skip
        sequences = (
            (measured.get("steps") or 0) * settings.micro_batch * (measured.get("grad_accum") or 1) * ranks
        )
        per_seq = measured["tokens"] / sequences if sequences and measured.get("tokens") else settings.seq_len
        work = Workload(None, 1.0, 1, float(per_seq), 1, "measured")
        trainable = estimate(shape, settings).trainable_params
        link = "nvlink" if ranks > 1 else "none"
        return estimate_time(shape, settings, trainable, work, acc, ranks, link).tokens_per_s if acc else None
    except Exception:  # noqa: BLE001 - no prediction: the row is kept, not used for the time scale
        return None


def learn_from_job(registry: Registry, job: Any) -> int:
    """Keep what each attempt of `job` measured (its run store's epoch records); rows newly kept."""
    from trainer.recording.ledger import by_attempt

    try:
        records = job.run_store(retry_seconds=2.0).epoch_records()
    except Exception:  # noqa: BLE001 - an unreachable store: learn next time
        return 0
    kept = 0
    for n, record in by_attempt(records).items():
        measured = record.get("measured")
        row = measurement_row(job.spec, measured) if isinstance(measured, dict) else None
        if row is not None and registry.record_measurement(job.job_id, n, {**row, "source": "job"}):
            kept += 1
    return kept


def record_gpu_check(
    spec: dict[str, Any], measured: dict[str, Any], label: str, home: Path | None = None
) -> dict[str, Any] | None:
    """bench/gpu_check.py's measured facts for a job (`spec`: its job dict) into the history."""
    row = measurement_row(spec, measured)
    if row is not None:
        Registry(home).record_measurement(label, 0, {**row, "source": "gpu_check"})
    return row


@dataclass
class History:
    """The kept rows and the planner's questions about them."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def usable(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("plausible")]

    def peak_for(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The newest plausible row with this key (its GPU first, else any GPU), or None."""
        same = [r for r in self.usable() if all(r.get(k) == key[k] for k in KEY if k != "gpu")]
        on_gpu = [r for r in same if r.get("gpu") == key.get("gpu")]
        found = (on_gpu or same)[-1:]
        return found[0] if found else None

    def time_scale(self, gpu: str, method: str) -> tuple[float, list[dict[str, Any]]] | None:
        """(measured / predicted tokens/s, the rows it comes from) on `gpu`, same method first."""
        on_gpu = [r for r in self.usable() if r.get("gpu") == gpu and r.get("tokens_per_s")
                  and r.get("predicted_tokens_per_s")]  # fmt: skip
        rows = [r for r in on_gpu if r.get("method") == method] or on_gpu
        if not rows:
            return None
        return statistics.median(r["tokens_per_s"] / r["predicted_tokens_per_s"] for r in rows), rows


def peak_gib(row: dict[str, Any]) -> float:
    """What the device held: the peak reserved (else allocated) bytes plus the CUDA context, in GiB."""
    return (
        (row.get("peak_reserved_bytes") or row.get("peak_allocated_bytes") or 0) + CUDA_CONTEXT_BYTES
    ) / GIB


def load_history(home: Path | None = None) -> History:
    """The history under $FTORCH_HOME (empty, and nothing created, when there is no registry yet)."""
    home = home or ftorch_home()
    if not (home / "registry.db").exists():
        return History()
    return History(Registry(home).measurements())
