"""Calibrate the memory estimator on published peak-memory measurements.

Reads ../shared/data/vram/calibration.csv (ms-swift's A100-80GB benchmark), estimates every row it can
model, prints the median and 90th-percentile absolute relative error with the textbook constants
(orchestrator.memory.RAW) and after fitting the constants by coordinate descent, and with --write stores
the fitted constants in orchestrator/data/memory_calibration.json (which the estimator loads).

Rows left out, and why: multi-GPU rows (device_map layer splitting, not FSDP: ftorch does not plan it),
GPTQ int4/int8 bases (ftorch's QLoRA is bitsandbytes NF4), and the GaLore row (not a method of ftorch).
The sources measured torch's reserved memory, which does not include the CUDA context, so the context is
subtracted from each estimate before comparing.

Usage: python bench/calibrate_memory.py [CSV] [--write] [--verbose]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.memory import RAW, Constants, Settings, estimate  # noqa: E402
from orchestrator.shapes import ModelShape, shape_from_config  # noqa: E402

DEFAULT_CSV = REPO.parent / "shared" / "data" / "vram" / "calibration.csv"
OUT = REPO / "orchestrator" / "data" / "memory_calibration.json"


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


def predict(rows, constants: Constants) -> list[float]:
    """Estimated torch-reserved GiB (the CUDA context is not in what the sources measured)."""
    return [
        estimate(shape, s, constants).peak_gib_per_gpu - constants.cuda_context_gib for shape, s, _, _ in rows
    ]


def errors(rows, constants: Constants) -> list[float]:
    return [abs(p - m) / m for p, (_, _, m, _) in zip(predict(rows, constants), rows, strict=True)]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def score(rows, constants: Constants) -> float:
    errs = errors(rows, constants)
    return statistics.median(errs) + p90(errs)


GRID = {
    "fixed_overhead_gib": [x * 0.25 for x in range(0, 17)],
    "alloc_slack": [x * 0.025 for x in range(0, 13)],
    "act_factor": [0.5 + x * 0.25 for x in range(0, 23)],
    "logits_bytes": [4.0 + x for x in range(0, 21)],
}
STARTS = [(a, lb) for a in (0.75, 1.0, 2.0, 4.0) for lb in (4.0, 10.0, 18.0)]


def descend(rows, start: Constants, sweeps: int = 4) -> tuple[Constants, float]:
    """Coordinate descent over bounded grids (physically plausible ranges only)."""
    best, best_score = start, score(rows, start)
    for _ in range(sweeps):
        improved = False
        for name, grid in GRID.items():
            for value in grid:
                trial = replace(best, **{name: value})
                s = score(rows, trial)
                if s < best_score - 1e-9:
                    best, best_score, improved = trial, s, True
        if not improved:
            break
    return best, best_score


def fit(rows) -> Constants:
    """The best of several descents (activation factor and logit bytes trade off against each other)."""
    results = [descend(rows, replace(RAW, act_factor=a, logits_bytes=lb)) for a, lb in STARTS]
    return min(results, key=lambda r: r[1])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description="calibrate the memory estimator")
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--write", action="store_true", help=f"store the fitted constants in {OUT}")
    parser.add_argument("--verbose", action="store_true", help="print every row")
    args = parser.parse_args()
    rows, skipped = load_rows(args.csv)
    print(f"{len(rows)} rows used, {len(skipped)} left out ({args.csv})")
    before = errors(rows, RAW)
    fitted = fit(rows)
    after = errors(rows, fitted)
    if args.verbose:
        for (_shape, _s, measured, label), raw_p, fit_p in zip(
            rows, predict(rows, RAW), predict(rows, fitted), strict=True
        ):
            print(f"  {label:45s} measured {measured:6.2f}  raw {raw_p:6.2f}  calibrated {fit_p:6.2f} GiB")
        for line in skipped:
            print(f"  left out: {line}")
    print(
        f"before calibration (RAW constants): median {statistics.median(before):.1%}, p90 {p90(before):.1%}"
    )
    print(f"after calibration:                  median {statistics.median(after):.1%}, p90 {p90(after):.1%}")
    print(
        "constants: "
        + ", ".join(
            f"{k} {getattr(RAW, k):g} -> {getattr(fitted, k):g}"
            for k in asdict(RAW)
            if getattr(RAW, k) != getattr(fitted, k)
        )
    )
    if args.write:
        payload = {
            "source": "bench/calibrate_memory.py on ../shared/data/vram/calibration.csv",
            "rows_used": len(rows),
            "error_before": {"median": round(statistics.median(before), 4), "p90": round(p90(before), 4)},
            "error_after": {"median": round(statistics.median(after), 4), "p90": round(p90(after), 4)},
            "constants": asdict(fitted),
        }
        OUT.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
