"""Published peak-memory measurements vs ftorch's analytic estimate vs a trace of ftorch's own step.

Reads ../shared/data/vram/calibration.csv (ms-swift's A100-80GB benchmark), and for every row it can
model prints the measured peak, the analytic estimate (orchestrator/sizing/memory.py) and, with --trace, one
step of ftorch's trainer traced on fake tensors (trainer/memtrace/steptrace.py, classic allocator: the measured
stack predates expandable segments), and the median absolute error of each. Nothing is fitted here: the
estimator's constants come from traces (bench/derive_memory_constants.py), never from this file.

Rows left out, and why: multi-GPU rows (device_map layer splitting, not FSDP: ftorch does not plan it),
GPTQ int4/int8 bases (ftorch's QLoRA is bitsandbytes NF4), and the GaLore row (not a method of ftorch).
The sources measured torch's reserved memory (ms-swift's 'memory' log), so reserved is compared.

Usage: python bench/calibrate_memory.py [CSV] [--trace [--every N] [--models a,b]] [--jobs 2]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.sizing.memory import Constants, Settings, estimate  # noqa: E402
from orchestrator.sizing.shapes import ModelShape, shape_from_config  # noqa: E402

DEFAULT_CSV = REPO.parent / "shared" / "data" / "vram" / "calibration.csv"


def _llama(
    h: int, layers: int, heads: int, inter: int, vocab: int, kv: int | None = None, bias: bool = False
):
    return {
        "model_type": "llama",
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv or heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "attention_bias": bias,
        "tie_word_embeddings": False,
    }


#: the measured models, from their public config.json files, expressed as llama-like layouts
#: (Qwen v1's fused c_attn = q,k,v with bias and its w1/w2 = gate/up of intermediate_size/2; ChatGLM3's
#: multi-query attention = 2 KV heads; Baichuan2's W_pack = q,k,v)
MODELS: dict[str, tuple[dict, str]] = {
    "qwen-1_8b-chat": (_llama(2048, 24, 16, 5504, 151936, bias=True), "sdpa"),
    "qwen-7b-chat": (_llama(4096, 32, 32, 11008, 151936, bias=True), "sdpa"),
    "qwen-14b-chat": (_llama(5120, 40, 40, 13696, 152064, bias=True), "sdpa"),
    "qwen-72b-chat": (_llama(8192, 80, 64, 24576, 152064, bias=True), "sdpa"),
    # ChatGLM3's own attention passes a mask to SDPA (math kernel, s^2 memory); Baichuan2-13B uses
    # ALiBi without flash attention: both are modelled as eager attention
    "chatglm3-6b": (_llama(4096, 28, 32, 13696, 65024, kv=2, bias=True), "eager"),
    "yi-6b-chat": (_llama(4096, 32, 32, 11008, 64000, kv=4), "sdpa"),
    "yi-34b-chat": (_llama(7168, 60, 56, 20480, 64000, kv=8), "sdpa"),
    "openbuddy-zephyr-7b-chat": (_llama(4096, 32, 32, 14336, 32000, kv=8), "sdpa"),
    "baichuan2-7b-chat": (_llama(4096, 32, 32, 11008, 125696), "sdpa"),
    "baichuan2-13b-chat": (_llama(5120, 40, 40, 13696, 125696), "eager"),
}


def _int(text: str) -> int:
    return int(re.match(r"\s*(\d+)", text).group(1))  # "1 (default, unverified)" -> 1


def load_rows(path: Path) -> tuple[list[tuple[ModelShape, Settings, float, str]], list[str]]:
    rows, skipped = [], []
    for i, r in enumerate(csv.DictReader(path.open(encoding="utf-8"))):
        label = f"row {i + 2} {r['model']} {r['method']} s={r['seq_len']}"
        if r["model"] not in MODELS:
            skipped.append(f"{label}: model not described")
            continue
        if r["method"] not in ("lora", "qlora", "full"):
            skipped.append(f"{label}: method {r['method']} (not ftorch's)")
            continue
        if int(r["n_gpus"]) != 1:
            skipped.append(f"{label}: {r['n_gpus']} GPUs with device_map layer splitting")
            continue
        if r["method"] == "qlora" and "bnb" not in r["precision"]:
            skipped.append(f"{label}: {r['precision']} base (ftorch's QLoRA is bitsandbytes NF4)")
            continue
        cfg, attn = MODELS[r["model"]]
        shape = shape_from_config(cfg, r["model"], "calibration")
        all_linear = "ALL" in r["notes"].split("; ")[-1] or "ALL linear" in r["notes"]
        settings = Settings(
            method=r["method"],
            precision="bf16" if r["method"] == "full" else "bf16-mixed",
            optimizer="adamw",
            micro_batch=_int(r["micro_batch"]),
            seq_len=_int(r["seq_len"]),
            grad_ckpt=r["grad_checkpointing"].strip() == "yes",
            attn="eager" if "FA OFF" in r["notes"] else attn,
            lora_r=int(r["lora_rank"] or 8),
            lora_targets="all-linear" if all_linear else ("q_proj", "k_proj", "v_proj"),
            lora_dropout=0.05,
            n_gpus=1,
            grad_accum=16,
        )
        rows.append((shape, settings, float(r["measured_peak_gb_per_gpu"]), label))
    return rows, skipped


def predict(rows, constants: Constants | None = None) -> list[float]:
    """Estimated torch-reserved GiB (the CUDA context is not in what the sources measured)."""
    return [estimate(shape, s, constants).peak_reserved_gib for shape, s, _, _ in rows]


def _trace_row(args: tuple) -> float | None:
    import torch

    from trainer.config import JobSpec
    from trainer.memtrace.steptrace import TraceUnsupported, trace

    torch.set_num_threads(1)
    config, s = args
    job = {
        "name": "published",
        "model": "calibration",
        "method": s.method,
        "lora": {
            "r": s.lora_r,
            "alpha": 32,
            "dropout": s.lora_dropout,
            "target_modules": s.lora_targets if isinstance(s.lora_targets, str) else list(s.lora_targets),
        },
        "data": {"path": "unused.jsonl", "max_seq_len": s.seq_len},
        "train": {
            "micro_batch_size": s.micro_batch,
            "grad_accum": s.grad_accum,
            "precision": s.precision,
            "attn_implementation": s.attn,
            "gradient_checkpointing": s.grad_ckpt,
        },
        "checkpoint": {"uri": "/tmp/unused"},
    }
    try:
        spec = JobSpec.model_validate(job)
        return trace(spec, config, [1], expandable_segments=False, hf_loss=True)[0].peak_reserved_gib
    except TraceUnsupported:
        return None


def trace_rows(rows, jobs: int) -> list[float | None]:
    from concurrent.futures import ProcessPoolExecutor

    work = [(MODELS[shape.name][0], s) for shape, s, _, _ in rows]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_trace_row, work))


def _err(pred: float | None, measured: float) -> float | None:
    return None if pred is None else pred / measured - 1


def main() -> None:
    parser = argparse.ArgumentParser(description="published measurements vs estimate vs trace")
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--trace", action="store_true", help="also trace every row (minutes)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--every", type=int, default=1, help="trace every N-th row only (speed)")
    parser.add_argument("--models", help="trace only these models (comma-separated; speed)")
    args = parser.parse_args()
    rows, skipped = load_rows(args.csv)
    print(f"{len(rows)} rows used, {len(skipped)} left out ({args.csv})")
    analytic = predict(rows)
    traced: list[float | None] = [None] * len(rows)
    if args.trace:
        wanted = set(args.models.split(",")) if args.models else None
        picked = [i for i in range(0, len(rows), args.every) if wanted is None or rows[i][0].name in wanted]
        for i, value in zip(picked, trace_rows([rows[i] for i in picked], args.jobs), strict=True):
            traced[i] = value
    print("| row | measured GiB | analytic | error | traced | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for (_shape, _s, measured, label), a, t in zip(rows, analytic, traced, strict=True):
        ea, et = _err(a, measured), _err(t, measured)
        tr = "-" if t is None else f"{t:.2f}"
        print(
            f"| {label} | {measured:.2f} | {a:.2f} | {ea:+.0%} | {tr} | "
            + ("-" if et is None else f"{et:+.0%}")
            + " |"
        )
    errs_a = [abs(a / m - 1) for a, (_, _, m, _) in zip(analytic, rows, strict=True)]
    print(f"analytic: median absolute error {statistics.median(errs_a):.1%}, p90 {p90(errs_a):.1%}")
    errs_t = [abs(t / m - 1) for t, (_, _, m, _) in zip(traced, rows, strict=True) if t is not None]
    if errs_t:
        print(f"traced:   median absolute error {statistics.median(errs_t):.1%}, p90 {p90(errs_t):.1%}")
    for line in skipped:
        print(f"left out: {line}")


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


if __name__ == "__main__":
    main()
