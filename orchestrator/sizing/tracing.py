"""Running `trainer.memtrace.steptrace` (one training step on fake tensors) from the orchestrator, which never imports
torch: the trace runs in a subprocess of this Python, and its results are cached by what decides memory
(the job's model, method, precision, batch, sequence, optimizer, LoRA and quantization settings, the model
config, and the trainer's code), under `$FTORCH_HOME/traces/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.home import ftorch_home, private_dir, write_private
from orchestrator.sizing.shapes import ModelShape
from trainer.runstore import scratch

#: the trainer files whose code decides what a traced step (and a traced load) allocates, under trainer/
TRACED_CODE = (
    "memtrace/steptrace.py",
    "memtrace/live_bytes.py",
    "memtrace/loadtrace.py",
    "memtrace/cuda_allocator.py",
    "memory/facts.py",
    "memory/load_memory.py",
    "model/load.py",
    "model/quant.py",
    "model/sharded_load.py",
    "distributed.py",
    "optim/build.py",
    "optim/in_backward.py",
    "loop.py",
    "kernels.py",
    "train_step/loss.py",
    "train_step/step.py",
)
TRACE_TIMEOUT_S = 600.0


@dataclass
class Traced:
    """Per GPU count: the trace's JSON (trainer.memtrace.steptrace.TraceResult), or why there is none."""

    results: dict[int, dict[str, Any]]
    error: str | None = None
    cached: bool = False


def _memory_fields(spec: Any) -> dict[str, Any]:
    job = spec.model_dump(mode="json")
    return {
        "method": job["method"],
        "lora": job.get("lora"),
        "quantization": job.get("quantization"),
        "max_seq_len": job["data"]["max_seq_len"],
        "train": {
            k: job["train"].get(k)
            for k in (
                "micro_batch_size",
                "grad_accum",
                "precision",
                "optimizer",
                "gradient_checkpointing",
                "attn_implementation",
                "max_grad_norm",
                "offload",
                "optimizer_in_backward",
            )
        },
    }


def _code_digest() -> str:
    root = Path(__file__).resolve().parents[2] / "trainer"
    digest = hashlib.sha256()
    for name in TRACED_CODE:
        digest.update((root / name).read_bytes())  # a missing file is a stale list: fail loudly
    return digest.hexdigest()[:16]


def cache_key(spec: Any, shape: ModelShape, n_gpus: list[int], load: bool = False) -> str:
    payload = json.dumps(
        [_memory_fields(spec), shape.config, sorted(n_gpus), _code_digest()] + (["load"] if load else []),
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def trace_job(
    spec: Any,
    shape: ModelShape,
    n_gpus: list[int] | None = None,
    *,
    use_cache: bool = True,
    load: bool = False,
) -> Traced:
    """Trace `spec` on `shape` for each GPU count (FSDP when > 1); an error says why it fell back.
    `load` also traces QLoRA's loading (each result's `load`)."""
    gpus = sorted(set(n_gpus or [1]))
    if not shape.config:
        return Traced({}, "no config.json for this model")
    key = cache_key(spec, shape, gpus, load)
    cache = ftorch_home() / "traces" / f"{key}.json"
    if use_cache and cache.is_file():
        try:
            stored = json.loads(cache.read_text(encoding="utf-8"))
            return Traced({int(k): v for k, v in stored["results"].items()}, stored.get("error"), True)
        except (OSError, ValueError, KeyError):
            pass
    traced = _run(spec, shape, gpus, load)
    write_private(
        private_dir("traces") / cache.name,
        json.dumps(
            {"results": {str(k): v for k, v in traced.results.items()}, "error": traced.error}
        ).encode(),
    )
    return traced


def _run(spec: Any, shape: ModelShape, gpus: list[int], load: bool = False) -> Traced:
    with scratch.folder("ftorch-trace-") as tmp:
        spec_path, config_path = Path(tmp) / "spec.json", Path(tmp) / "config.json"
        spec_path.write_text(json.dumps(spec.model_dump(mode="json")), encoding="utf-8")
        config_path.write_text(json.dumps(shape.config), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-m", "trainer.memtrace.steptrace", str(spec_path), str(config_path)]
        cmd += ["--gpus", ",".join(map(str, gpus))] + (["--load"] if load else [])
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, timeout=TRACE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return Traced({}, f"the trace took over {TRACE_TIMEOUT_S:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Traced({}, f"the trace failed: {tail[:200]}")
    out = json.loads(lines[-1])
    if "error" in out:
        return Traced({}, out["error"])
    return Traced({int(r["n_gpus"]): r for r in out["results"]})


class TraceConfirmation:
    """The planner's check: fits within `margin` of an offer's usable memory are confirmed by one trace
    (all GPU counts that need it traced in one run, cached); any failure leaves the estimate in charge."""

    def __init__(
        self,
        spec: Any,
        shape: ModelShape,
        sizes: list[tuple[int, float]],
        memory_for: Any,
        headroom: float,
        margin: float,
    ) -> None:
        self.memory_for, self.headroom, self.margin = memory_for, headroom, margin
        self.spec = spec
        close = {ranks for ranks, gib in sizes if self._close(ranks, gib)}
        self.traced: dict[int, dict[str, Any]] = {}
        self.error: str | None = None
        self.asked = sorted(close)
        if close:
            result = trace_job(spec, shape, self.asked)
            self.traced, self.error = result.results, result.error

    def _close(self, ranks: int, gpu_memory_gib: float) -> bool:
        """A close fit set by the step (the trace measures the step; loading is only estimated)."""
        mem = self.memory_for(ranks)
        usable = gpu_memory_gib * (1 - self.headroom)
        return mem.peak_phase != "load" and abs(mem.peak_gib_per_gpu - usable) <= self.margin * usable

    def peak(self, ranks: int, gpu_memory_gib: float) -> tuple[float, str]:
        """The peak per GPU and how it was judged: the traced step, unless loading needs more."""
        mem = self.memory_for(ranks)
        traced = self.traced.get(ranks)
        if traced is not None and self._close(ranks, gpu_memory_gib):
            total = float(traced["total_gib"]) + self._packing_mask_gib(ranks)
            load = traced.get("load")  # traced loading, when it was asked for; else the estimate's
            load_gib = float(load["total_gib"]) if load else mem.load_gib_per_gpu
            if total >= load_gib:
                return total, "traced"
            return load_gib, "traced" if load else "estimated"
        return mem.peak_gib_per_gpu, "estimated"

    def _packing_mask_gib(self, ranks: int) -> float:
        """The trace runs unpacked micro-batches; packing's attention mask is added as the estimate has it."""
        if not getattr(self.spec.data, "packing", False):
            return 0.0
        from orchestrator.sizing.memory import settings_from_spec
        from trainer.data.packing import mask_bytes
        from trainer.memory.facts import GIB, compute_bytes

        s = settings_from_spec(self.spec, ranks)  # packing `auto` by the trainer's rule
        if not s.packing:
            return 0.0
        return mask_bytes(s.micro_batch, s.seq_len, s.attn, compute_bytes(s.precision)) / GIB

    def note(self) -> str:
        if not self.asked:
            return f"memory: no fit within {self.margin:.0%} of an offer's usable memory; all fits estimated"
        if self.error:
            return f"memory: not traced ({self.error}); all fits estimated"
        seconds = max(float(t.get("seconds", 0.0)) for t in self.traced.values())
        return (
            f"memory: close fits traced on {', '.join(map(str, self.asked))} GPU(s) "
            f"(one step on fake tensors, {seconds:.0f} s); the others estimated"
        )
