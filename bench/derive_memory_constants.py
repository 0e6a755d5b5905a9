"""Derive the analytic memory estimator's constants from traces of ftorch's own training step.

    PYTHONPATH=. python bench/derive_memory_constants.py [--jobs 2] [--quick]

Traces (trainer/memtrace/steptrace.py) one step for every configuration of a grid over architecture x method x
precision x attention x gradient checkpointing x sequence length x micro-batch, then fits the few
constants of orchestrator/sizing/memory.py (activation and logit factors per regime, autocast copies, optimizer
temporaries, allocator slack) by least squares on the traced peaks, and writes them with every traced row
to orchestrator/data/memory_constants.json. tests/orchestrator_tests/sizing/test_memory_trace.py holds the analytic estimate within
10% of these traces, and re-traces a sample to check the file is current. No published benchmark is used.

Architectures are the bundled configs with their real widths, vocabularies and module layouts, traced
with 2 decoder layers (the estimate is per layer, depth is a multiplier; tracing costs about a
millisecond of CPU per operation, so deep models would make the grid slow on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.sizing.memory import CONSTANTS_FILE, RAW, Constants, Settings, estimate  # noqa: E402
from orchestrator.sizing.shapes import bundled_configs, bundled_shape  # noqa: E402

#: real configs (widths, heads, vocabularies, module layouts), traced with LAYERS decoder layers
ARCHS = [
    "smollm2-135m",
    "qwen2.5-0.5b",
    "llama-3.2-1b",
    "stablelm-2-1.6b",
    "gemma-2b",
    "gemma-2-2b",
    "phi-2",
    "phi-3-mini",
    "llama-3.1-8b",
    "mistral-7b",
    "pythia-6.9b",
]
LAYERS = 2
#: (method, precision, attention, gradient checkpointing, sequence, micro-batch); architecture i gets
#: the rows i, i+1, i+2, i+3 (mod 8), so every row meets six architectures
GRID = [
    ("lora", "bf16-mixed", "sdpa", True, 4096, 2),
    ("lora", "bf16-mixed", "sdpa", False, 1024, 1),
    ("lora", "bf16-mixed", "eager", True, 1024, 2),
    ("qlora", "bf16-mixed", "sdpa", True, 2048, 4),
    ("full", "bf16-mixed", "sdpa", True, 2048, 2),
    ("full", "bf16-mixed", "sdpa", False, 512, 1),
    ("full", "bf16", "sdpa", True, 4096, 1),
    ("lora", "bf16", "eager", False, 512, 2),
]
QUICK = ["smollm2-135m", "pythia-6.9b"]


def work_items(archs: list[str]) -> list[tuple[str, int, tuple]]:
    return [
        (name, LAYERS, GRID[(i + j) % len(GRID)])
        for i, name in enumerate(ARCHS)
        if name in archs
        for j in range(4)
    ]


#: the constants fitted (the CUDA context, the workspace and the chunk size are not: they are stated)
FITTED = (
    "act_adapter_ckpt",
    "act_adapter",
    "act_full_ckpt",
    "act_full",
    "eager_factor",
    "logits_bytes",
    "cast_factor",
    "step_temp",
    "alloc_slack",
)


def settings_for(row: tuple) -> Settings:
    method, precision, attn, ckpt, seq, mb = row
    return Settings(
        method=method,
        precision=precision,
        attn=attn,
        grad_ckpt=ckpt,
        seq_len=seq,
        micro_batch=mb,
        lora_r=16,
        lora_targets="all-linear",
        lora_dropout=0.05,
    )


def job_for(name: str, s: Settings) -> dict:
    return {
        "name": "grid",
        "model": name,
        "method": s.method,
        "lora": {
            "r": s.lora_r,
            "alpha": 2 * s.lora_r,
            "dropout": s.lora_dropout,
            "target_modules": "all-linear",
        },
        "data": {"path": "unused.jsonl", "max_seq_len": s.seq_len},
        "train": {
            "micro_batch_size": s.micro_batch,
            "precision": s.precision,
            "attn_implementation": s.attn,
            "gradient_checkpointing": s.grad_ckpt,
            "optimizer": s.optimizer,
        },
        "checkpoint": {"uri": "/tmp/unused"},
    }


def trace_one(args: tuple[str, int | None, tuple]) -> dict:
    import torch

    from trainer.config import JobSpec
    from trainer.memtrace.steptrace import TraceUnsupported, trace

    torch.set_num_threads(1)
    name, layers, row = args
    if bundled_configs()[name]["model_type"] == "gemma2" and row[2] == "sdpa":
        row = (*row[:2], "eager", *row[3:])  # transformers runs Gemma 2 with eager attention only
    s = settings_for(row)
    config = {k: v for k, v in bundled_configs()[name].items() if k != "aliases"}
    if layers:
        config["num_hidden_layers"] = layers
    spec = JobSpec.model_validate(job_for(name, s))
    try:
        result = trace(spec, config, [1])[0].to_json()
    except TraceUnsupported as exc:
        return {"model": name, "layers": layers, "settings": list(row), "error": str(exc)}
    return {"model": name, "layers": layers, "settings": list(row), "trace": result}


def shape_of(record: dict):
    shape = bundled_shape(record["model"])
    return replace(shape, layers=record["layers"]) if record["layers"] else shape


def _loss(rows: list, k: Constants) -> float:
    total = 0.0
    for shape, s, t in rows:
        est = estimate(shape, s, k)
        total += math.log(est.peak_allocated_gib / t["peak_allocated_gib"]) ** 2
        total += math.log(est.peak_reserved_gib / t["peak_reserved_gib"]) ** 2
    return total


def fit_constants(rows: list, start: Constants) -> Constants:
    """Coordinate search on the squared log error of allocated and reserved peaks (a handful of constants,
    each moved by shrinking multiplicative steps while the error falls)."""
    best, err = start, _loss(rows, start)
    step = 0.5
    while step > 0.002:
        improved = False
        for name in FITTED:
            for mult in (1 + step, 1 / (1 + step)):
                value = getattr(best, name) * mult
                if name == "alloc_slack":
                    value = max(0.0, value) if getattr(best, name) else step / 10
                trial = replace(best, **{name: value})
                trial_err = _loss(rows, trial)
                if trial_err < err:
                    best, err, improved = trial, trial_err, True
        if not improved:
            step /= 2
    return best


def errors(records: list[dict], constants: Constants) -> list[tuple[float, float]]:
    out = []
    for rec in records:
        if "trace" not in rec:
            continue
        est = estimate(shape_of(rec), settings_for(tuple(rec["settings"])), constants)
        t = rec["trace"]
        out.append(
            (
                est.peak_allocated_gib / t["peak_allocated_gib"] - 1,
                est.peak_reserved_gib / t["peak_reserved_gib"] - 1,
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="three architectures (a smoke run)")
    parser.add_argument("--out", default=str(REPO / "orchestrator" / "data" / CONSTANTS_FILE))
    parser.add_argument("--refit", action="store_true", help="fit again on the rows already in --out")
    args = parser.parse_args()
    work = work_items(QUICK if args.quick else ARCHS)
    started = time.perf_counter()
    if args.refit:
        stored = json.loads(Path(args.out).read_text(encoding="utf-8"))["rows"]
        records = [r for r in stored if r["model"] in ARCHS]
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            records = list(pool.map(trace_one, work))
    failed = [r for r in records if "error" in r]
    for r in failed:
        print(f"not traced: {r['model']} {r['settings']}: {r['error']}")
    traced = [r for r in records if "trace" in r]
    try:
        from trainer.train_step.loss import CHUNK_ELEMENTS
    except ImportError:  # a trainer without chunked cross-entropy: one chunk is the whole micro-batch
        CHUNK_ELEMENTS = 1 << 62  # noqa: N806
    start = replace(RAW, chunk_elements=float(CHUNK_ELEMENTS))
    rows = [(shape_of(r), settings_for(tuple(r["settings"])), r["trace"]) for r in traced]
    constants = fit_constants(rows, start)
    errs = errors(traced, constants)
    alloc = [abs(a) for a, _ in errs]
    reserved = [abs(r) for _, r in errs]
    summary = {
        "configurations": len(traced),
        "median_abs_error_allocated": statistics.median(alloc),
        "max_abs_error_allocated": max(alloc),
        "median_abs_error_reserved": statistics.median(reserved),
        "max_abs_error_reserved": max(reserved),
        "within_10pct": sum(1 for a, r in zip(alloc, reserved, strict=True) if a <= 0.1 and r <= 0.1),
        "trace_seconds_total": sum(r["trace"]["seconds"] for r in traced),
        "wall_seconds": time.perf_counter() - started,
    }
    payload = {
        "_comment": "Generated by bench/derive_memory_constants.py from traces of ftorch's own training "
        "step (trainer/memtrace/steptrace.py); do not edit by hand.",
        "constants": asdict(constants),
        "summary": summary,
        "rows": traced,
    }
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))
    for rec, (a, r) in zip(traced, errs, strict=True):
        print(f"{rec['model']:<16} {str(rec['settings']):<48} alloc {a:+.1%} reserved {r:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
