"""GPU check: measured peak memory, tokens/s and MFU next to `ftorch estimate`'s prediction.

    python bench/gpu_check.py               # CUDA: LoRA + QLoRA on an 8B Llama shape at 2048 tokens,
                                            #       full fine-tuning of a 1B Llama shape (under 10 minutes)
    python bench/gpu_check.py --cpu-tiny    # the same code path on the CPU with a tiny shape (a smoke test)
    python bench/gpu_check.py --json out.json --cases lora-8b,full-1b --steps 5

Models are randomly initialised from the bundled shapes (no downloads). Every case builds the model the
trainer's way (bf16 weights for LoRA, NF4 + double quantization for QLoRA, fp32 master weights with bf16
autocast for full fine-tuning, gradient checkpointing on, AdamW), runs warm-up steps, then times `--steps`
optimizer steps. Peak memory is torch.cuda.max_memory_allocated / max_memory_reserved (the CPU mode
reports the process's peak RSS instead). MFU = model FLOPs per token x tokens/s / the GPU's dense bf16
peak, with model FLOPs = 6N (full) or 4N (adapters: no weight gradients for the frozen base) plus
12 * layers * hidden * seq for attention; recomputation is not counted. A second table puts the measured
tokens/s next to the time model's (orchestrator/throughput.py with its calibrated constants) for the GPU
found; two extra LoRA cases at 512 tokens (micro-batch 1 and 8) check its micro-batch dependence.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: dense bf16 peak FLOP/s by device name fragment (no sparsity)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12}
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
}


@dataclass
class Case:
    name: str
    shape: str  # a bundled shape name, or "tiny"
    method: str  # full | lora | qlora
    seq_len: int
    micro_batch: int = 1


@dataclass
class Result:
    case: str
    device: str
    params: int
    trainable: int
    seq_len: int
    steps: int
    step_s: float
    tokens_per_s: float
    mfu: float | None
    peak_allocated_gib: float | None
    peak_reserved_gib: float | None
    peak_rss_gib: float
    estimate_gib: float
    estimate_phase: str
    skipped: str | None = None
    #: orchestrator/throughput.py's tokens/s for this case on this GPU (None off CUDA / unknown GPU)
    predicted_tokens_per_s: float | None = None


GPU_CASES = [
    Case("lora-8b", "llama-3.1-8b", "lora", 2048),
    Case("qlora-8b", "llama-3.1-8b", "qlora", 2048),
    Case("full-1b", "llama-3.2-1b", "full", 2048),
    # the time model's micro-batch dependence: the same 8B LoRA at 512 tokens, micro-batch 1 and 8
    Case("lora-8b-512x1", "llama-3.1-8b", "lora", 512, micro_batch=1),
    Case("lora-8b-512x8", "llama-3.1-8b", "lora", 512, micro_batch=8),
]
CPU_CASES = [
    Case("lora-tiny", "tiny", "lora", 64),
    Case("qlora-tiny", "tiny", "qlora", 64),
    Case("full-tiny", "tiny", "full", 64),
]


def config_for(shape: str) -> dict[str, Any]:
    from orchestrator.shapes import bundled_configs

    cfg = dict(TINY) if shape == "tiny" else dict(bundled_configs()[shape])
    cfg.pop("aliases", None)
    return cfg


def spec_for(case: Case, model_ref: str) -> Any:
    """The job the trainer would run for this case (what `ftorch estimate` is asked about)."""
    from trainer.config import JobSpec

    return JobSpec.model_validate(
        {
            "model": model_ref,
            "method": case.method,
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
            "data": {"path": "unused.jsonl", "max_seq_len": case.seq_len},
            "train": {
                "micro_batch_size": case.micro_batch,
                "precision": "bf16-mixed" if case.method == "full" else "bf16",
                "gradient_checkpointing": True,
                "optimizer": "adamw",
            },
            "checkpoint": {"uri": "/tmp/unused"},
        }
    )


def quantize_linears(model: Any, device: Any) -> int:
    """Swap the decoder layers' nn.Linear for bitsandbytes NF4 (double quant, bf16 compute) in place."""
    import bitsandbytes as bnb
    import torch

    count = 0
    for layer in model.model.layers:
        for parent in list(layer.modules()):
            for child_name, child in list(parent.named_children()):
                if type(child) is not torch.nn.Linear:
                    continue
                q = bnb.nn.Linear4bit(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    compute_dtype=torch.bfloat16,
                    compress_statistics=True,
                    quant_type="nf4",
                    device="meta",
                )
                weight = child.weight.data.to("cpu" if device.type == "cpu" else device)
                q.weight = bnb.nn.Params4bit(
                    weight, requires_grad=False, quant_type="nf4", compress_statistics=True
                ).to(device)
                assert q.weight.dtype == torch.uint8, "the NF4 weight was not quantized"
                setattr(parent, child_name, q)
                del child, weight
                count += 1
    return count


def build(case: Case, device: Any) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**config_for(case.shape))
    cfg.use_cache = False
    torch.manual_seed(0)
    dtype = torch.float32 if case.method == "full" else torch.bfloat16
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype (an 8B model in fp32 first would be 32 GB)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    if case.method == "qlora":
        quantize_linears(model, device)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case.method != "full":
        model.enable_input_require_grads()
        lora = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        )
        model = get_peft_model(model, lora)
        for p in model.parameters():  # adapters in fp32 (the trainer's default for LoRA weights)
            if p.requires_grad:
                p.data = p.data.float()
    return model


def estimate_gib(case: Case) -> tuple[float, str]:
    from orchestrator.memory import estimate_memory

    if case.shape == "tiny":
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "config.json").write_text(json.dumps(config_for("tiny")))
            est = estimate_memory(spec_for(case, tmp))
    else:
        est = estimate_memory(spec_for(case, case.shape))
    return est.peak_gib_per_gpu, est.peak_phase


def model_flops_per_token(case: Case, params: int, cfg: dict[str, Any]) -> float:
    per_param = 6 if case.method == "full" else 4
    return per_param * params + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * case.seq_len


def peak_flops(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def run_case(case: Case, device: Any, steps: int, warmup: int) -> Result:
    import torch

    from trainer.quant import bitsandbytes_devices

    est, phase = estimate_gib(case)
    base = Result(case.name, str(device), 0, 0, case.seq_len, 0, 0.0, 0.0, None, None, None, 0.0, est, phase)
    if case.method == "qlora" and device.type not in bitsandbytes_devices():
        base.skipped = f"bitsandbytes does not support {device.type} here"
        return base
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = build(case, device)
    model.train()
    params = sum(p.numel() * (2 if p.dtype == torch.uint8 else 1) for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if device.type == "cuda":  # the peak of training, not of building (QLoRA quantizes a bf16 copy)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=device.type == "cuda"
    )
    cfg = config_for(case.shape)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (case.micro_batch, case.seq_len), generator=gen).to(device)
    autocast = case.method == "full"

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    step_s = (time.perf_counter() - started) / steps
    tokens_per_s = case.micro_batch * case.seq_len / step_s
    peak = peak_flops(device)
    mfu = model_flops_per_token(case, params, cfg) * tokens_per_s / peak if peak else None
    gib = 1024**3
    result = Result(
        case=case.name,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        params=params,
        trainable=trainable,
        seq_len=case.seq_len,
        steps=steps,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        peak_allocated_gib=torch.cuda.max_memory_allocated(device) / gib if device.type == "cuda" else None,
        peak_reserved_gib=torch.cuda.max_memory_reserved(device) / gib if device.type == "cuda" else None,
        peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / gib,
        estimate_gib=est,
        estimate_phase=phase,
    )
    result.predicted_tokens_per_s = predicted_tokens_per_s(case, result.device, trainable)
    return result


#: CUDA device-name fragments -> orchestrator.throughput.ACCELERATORS keys (most specific first)
DEVICE_KEYS = [
    ("GH200", "gh200"),
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100"),
    ("B200", "b200"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100 80GB", "a100-80gb"),
    ("A100", "a100"),
    ("L40S", "l40s"),
    ("L40", "l40"),
    ("L4", "l4"),
    ("A10G", "a10g"),
    ("A10", "a10"),
    ("V100", "v100"),
    ("T4", "t4"),
]


def predicted_tokens_per_s(case: Case, device_name: str, trainable: int) -> float | None:
    """The time model's tokens/s for this case on one GPU named `device_name` (None if not modelled)."""
    from orchestrator.memory import Settings
    from orchestrator.shapes import bundled_shape, shape_from_config
    from orchestrator.throughput import ACCELERATORS, Workload, estimate_time

    key = next((k for frag, k in DEVICE_KEYS if frag in device_name), None)
    if key is None:
        return None
    shape = (
        shape_from_config(config_for("tiny"), "tiny", "gpu_check")
        if case.shape == "tiny"
        else bundled_shape(case.shape)
    )
    assert shape is not None
    s = Settings(
        method=case.method, micro_batch=case.micro_batch, seq_len=case.seq_len, grad_ckpt=True, attn="sdpa"
    )
    work = Workload(None, 1.0, 1, float(case.seq_len), case.micro_batch, "gpu_check")
    return estimate_time(shape, s, trainable, work, ACCELERATORS[key], 1, "n/a").tokens_per_s


def throughput_table(results: list[Result]) -> str:
    """Measured tokens/s next to the time model's (orchestrator/throughput.py, calibrated constants)."""
    rows = [
        "| case | device | micro-batch x seq | measured tokens/s | time model tokens/s | model/measured |"
    ]
    rows.append("|---|---|---|---|---|---|")
    for r in results:
        if r.skipped:
            continue
        case = next(c for c in GPU_CASES + CPU_CASES if c.name == r.case)
        pred = r.predicted_tokens_per_s
        shown = ("n/a", "n/a") if pred is None else (f"{pred:,.0f}", f"{pred / r.tokens_per_s:.2f}")
        rows.append(
            f"| {r.case} | {r.device} | {case.micro_batch} x {r.seq_len} | {r.tokens_per_s:,.0f} | {shown[0]} | {shown[1]} |"
        )
    return "\n".join(rows)


def table(results: list[Result]) -> str:
    def gib(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    rows = [
        "| case | device | params | trainable | seq | peak allocated GiB | peak reserved GiB | peak RSS GiB | "
        "estimate GiB (phase) | tokens/s | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.skipped:
            rows.append(
                f"| {r.case} | {r.device} | | | {r.seq_len} | skipped: {r.skipped} | | | {r.estimate_gib:.2f} | | |"
            )
            continue
        mfu = "n/a" if r.mfu is None else f"{r.mfu:.1%}"
        rows.append(
            f"| {r.case} | {r.device} | {r.params / 1e6:,.3f}M | {r.trainable / 1e6:,.3f}M | {r.seq_len} | "
            f"{gib(r.peak_allocated_gib)} | {gib(r.peak_reserved_gib)} | {r.peak_rss_gib:.2f} | {r.estimate_gib:.2f} ({r.estimate_phase}) | "
            f"{r.tokens_per_s:,.0f} | {mfu} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-tiny", action="store_true", help="run a tiny shape on the CPU (smoke test)")
    parser.add_argument("--cases", help="comma-separated case names (default: all of the mode)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per case")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    if args.cpu_tiny:
        device, cases = torch.device("cpu"), CPU_CASES
        steps, warmup = args.steps or 2, args.warmup if args.warmup is not None else 1
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --cpu-tiny for the CPU smoke test", file=sys.stderr)
            return 2
        device, cases = torch.device("cuda", 0), GPU_CASES
        steps, warmup = args.steps or 5, args.warmup if args.warmup is not None else 2
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c.name in wanted]
    started = time.time()
    results = []
    for case in cases:
        t0 = time.time()
        results.append(run_case(case, device, steps, warmup))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{case.name}: done in {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    print(table(results))
    print()
    print(throughput_table(results))
    print(f"\ntotal {time.time() - started:.0f}s; torch {torch.__version__}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
