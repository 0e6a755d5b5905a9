"""Calibrate the time model (orchestrator/sizing/throughput.py) on published fine-tuning throughputs.

Reads ../shared/data/throughput/published_fms_acceleration.csv (fms-acceleration's reference runs: plain
HF Trainer, A100-SXM 80GB, flash attention 2, gradient checkpointing, 4096-token packed sequences,
micro-batch 4 on 1 GPU and 2 per GPU on 2 GPUs with FSDP), predicts every row with the uncalibrated
constants (orchestrator.sizing.throughput.RAW) and with constants fitted on a TRAINING subset, and prints the
ratio predicted/measured on every row and the median / worst ratio on the HELD-OUT subset side by side.

Split: the CSV has one source and one GPU type, so whole *models* are held out: the fit sees only
Mistral-7B (full, LoRA, QLoRA on 1 and 2 GPUs, 6 rows); Mixtral-8x7B (MoE) and Llama-2-70B (4 rows) are
never seen by the fit. The bundled table says what the data cannot: other GPUs, other stacks.

Fitted (coordinate descent on the mean squared log ratio): the large-batch MFU of full fine-tuning and of
adapters (LoRA and QLoRA share it: QLoRA's extra cost is the dequantization), the factor on QLoRA's ideal
dequantization traffic, and the per-GPU efficiency of 2-GPU FSDP runs. Fixed by physics, not fitted: the
16-bit weight read per pass (2 bytes/param at HBM bandwidth: the micro-batch dependence; the data has
micro-batch 2 only together with 2 GPUs, so the two effects cannot be told apart here) and gradient
checkpointing's extra forward (every row checkpoints).

Usage: python bench/calibrate_throughput.py [CSV] [--write]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.sizing.memory import Settings  # noqa: E402
from orchestrator.sizing.shapes import bundled_shape  # noqa: E402
from orchestrator.sizing.throughput import RAW, TimeConstants, Workload, accelerator, estimate_time  # noqa: E402

DEFAULT_CSV = REPO.parent / "shared" / "data" / "throughput" / "published_fms_acceleration.csv"
OUT = REPO / "orchestrator" / "data" / "throughput_calibration.json"
MODELS = {
    "Mistral-7B-v0.1": "mistral-7b",
    "Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "Llama-2-70b-hf": "llama-2-70b",
}
GPUS = {"A100-SXM 80GB": "A100-80GB"}
TRAIN_MODELS = {"Mistral-7B-v0.1"}
#: the fitted constants and their search bounds
FITTED = {
    "mfu_full": (0.1, 0.9),
    "mfu_lora": (0.1, 0.9),
    "dequant_factor": (0.5, 20.0),
    "multi_gpu_efficiency": (0.5, 1.0),
}
#: fixed by physics: one read of the 16-bit weights per pass
WEIGHT_READ_BYTES = 2.0


@dataclass(frozen=True)
class Row:
    model: str
    method: str
    n_gpus: int
    micro_batch: int
    seq_len: int
    measured: float  # tokens/s, all GPUs
    interconnect: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.method} {self.n_gpus}x mb{self.micro_batch}"


def load(path: Path) -> list[Row]:
    rows = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            rows.append(
                Row(
                    model=r["model_published"],
                    method=r["method"],
                    n_gpus=int(r["gpu_count"]),
                    micro_batch=int(r["micro_batch_per_gpu"]),
                    seq_len=int(r["seq_len"]),
                    measured=float(r["measured_tokens_per_s_total"]),
                    interconnect="nvlink" if r["interconnect"].lower().startswith("nvlink") else "pcie",
                )
            )
            assert r["gpu"] in GPUS and r["grad_ckpt"] == "True", r
    return rows


def predict(row: Row, c: TimeConstants, gpu: str = "A100-80GB") -> float:
    """tokens/s (all GPUs) the time model predicts for a published row."""
    shape = bundled_shape(MODELS[row.model])
    assert shape is not None
    s = Settings(
        method=row.method,
        precision="bf16",
        micro_batch=row.micro_batch,
        seq_len=row.seq_len,
        grad_ckpt=True,
        attn="flash_attention_2",
        loss="plain",  # the published stacks' loss: the head once, no recomputation
        lora_r=16,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
        n_gpus=row.n_gpus,
    )
    trainable = shape.params if row.method == "full" else shape.lora_params(16, list(s.lora_targets))
    work = Workload(None, 1.0, 1, float(row.seq_len), row.micro_batch, "published")
    acc = accelerator(gpu)
    assert acc is not None
    return estimate_time(shape, s, trainable, work, acc, row.n_gpus, row.interconnect, c).tokens_per_s


def loss(rows: list[Row], c: TimeConstants) -> float:
    return statistics.fmean(math.log(predict(r, c) / r.measured) ** 2 for r in rows)


def tie(c: TimeConstants) -> TimeConstants:
    return replace(c, mfu_qlora=c.mfu_lora)


def fit(rows: list[Row]) -> TimeConstants:
    """Coordinate descent with a golden-section search per constant, in log space, within FITTED."""
    c = tie(replace(RAW, weight_read_bytes=WEIGHT_READ_BYTES))
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(8):
        for name, (lo, hi) in FITTED.items():
            a, b = math.log(lo), math.log(hi)

            def f(x: float, name: str = name, c: TimeConstants = c) -> float:
                return loss(rows, tie(replace(c, **{name: math.exp(x)})))

            for _ in range(40):
                x1, x2 = b - golden * (b - a), a + golden * (b - a)
                if f(x1) < f(x2):
                    b = x2
                else:
                    a = x1
            c = tie(replace(c, **{name: math.exp((a + b) / 2)}))
    return c


def summary(rows: list[Row], c: TimeConstants) -> dict[str, float]:
    ratios = [predict(r, c) / r.measured for r in rows]
    worst = max(ratios, key=lambda x: abs(math.log(x)))
    return {"median_ratio": statistics.median(ratios), "worst_ratio": worst}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", default=str(DEFAULT_CSV))
    parser.add_argument("--write", action="store_true", help=f"store the fitted constants in {OUT.name}")
    args = parser.parse_args(argv)
    rows = load(Path(args.csv))
    train = [r for r in rows if r.model in TRAIN_MODELS]
    held = [r for r in rows if r.model not in TRAIN_MODELS]
    fitted = fit(train)
    print("| row | split | measured tok/s | old model | ratio | calibrated | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        old, new = predict(r, RAW), predict(r, fitted)
        split = "train" if r in train else "held out"
        print(
            f"| {r.label} | {split} | {r.measured:,.0f} | {old:,.0f} | {old / r.measured:.2f} | "
            f"{new:,.0f} | {new / r.measured:.2f} |"
        )
    results = {
        "train": {"old": summary(train, RAW), "calibrated": summary(train, fitted)},
        "held_out": {"old": summary(held, RAW), "calibrated": summary(held, fitted)},
    }
    print("\n| subset | rows | old median | old worst | calibrated median | calibrated worst |")
    print("|---|---|---|---|---|---|")
    for name, subset in (("train (Mistral-7B)", train), ("held out (Mixtral-8x7B, Llama-2-70B)", held)):
        key = "train" if subset is train else "held_out"
        o, n = results[key]["old"], results[key]["calibrated"]
        print(
            f"| {name} | {len(subset)} | {o['median_ratio']:.2f} | {o['worst_ratio']:.2f} | "
            f"{n['median_ratio']:.2f} | {n['worst_ratio']:.2f} |"
        )
    constants = {k: round(v, 4) for k, v in asdict(fitted).items()}
    print("\nconstants:", json.dumps(constants))
    if args.write:
        doc = {
            "source": "bench/calibrate_throughput.py on ../shared/data/throughput/published_fms_acceleration.csv",
            "train_models": sorted(TRAIN_MODELS),
            "held_out_models": sorted({r.model for r in held}),
            "gpu": "A100-SXM 80GB only (other GPUs: peak and HBM from datasheets, reach assumed)",
            "ratios_predicted_over_measured": {
                k: {m: {s: round(x, 3) for s, x in v.items()} for m, v in d.items()}
                for k, d in results.items()
            },
            "constants": constants,
        }
        OUT.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
