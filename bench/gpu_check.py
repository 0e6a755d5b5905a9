"""GPU check: ftorch's trainer's measured peak memory, tokens/s and MFU next to the trace and the estimate.

    python bench/gpu_check.py               # CUDA: LoRA + QLoRA on an 8B Llama shape at 2048 tokens,
                                            #       full fine-tuning of a 1B Llama shape (under 10 minutes)
    python bench/gpu_check.py --cpu-tiny    # the same code path on the CPU with a tiny shape (a smoke test)
    python bench/gpu_check.py --json out.json --cases lora-8b,full-1b --steps 5

Models are randomly initialised from the bundled shapes (no downloads), in `trainer.model.base_dtype`,
and go through the trainer's own code: `trainer.model.prepare_model` (gradient checkpointing, LoRA),
`trainer.loop.make_optimizer`, and the trainer's step (`trainer.step`: accumulate + update, or the
model's loss where that module is absent); QLoRA's decoder projections are bitsandbytes NF4 with double
quantization. It runs warm-up steps, then times `--steps` optimizer steps. Peak memory is
torch.cuda.max_memory_allocated / max_memory_reserved (the CPU mode reports the process's peak RSS
instead), printed next to the trace of the same job (trainer/memory/memtrace.py, on fake tensors) and the
analytic estimate (orchestrator/sizing/memory.py), allocated and reserved each. MFU = model FLOPs per token x tokens/s / the GPU's dense bf16
peak, with model FLOPs = 6N (full) or 4N (adapters: no weight gradients for the frozen base) plus
12 * layers * hidden * seq for attention; recomputation is not counted. A second table puts the measured
tokens/s next to the time model's (orchestrator/sizing/throughput.py with its calibrated constants) for the GPU
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
    #: orchestrator/sizing/throughput.py's tokens/s for this case on this GPU (None off CUDA / unknown GPU)
    predicted_tokens_per_s: float | None = None
    estimate_allocated_gib: float | None = None
    estimate_reserved_gib: float | None = None
    trace_allocated_gib: float | None = None
    trace_reserved_gib: float | None = None


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
    from orchestrator.sizing.shapes import bundled_configs

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
                "precision": "bf16-mixed",
                "gradient_checkpointing": True,
                "optimizer": "adamw",
                "max_grad_norm": 1.0,
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
    """The base from its config (random weights) in the trainer's dtype, then the trainer's own preparation."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.model import base_dtype, prepare_model

    spec = spec_for(case, "unused")
    cfg = config_for(case.shape)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if case.method == "qlora" else base_dtype(spec)
    with torch.device(device):  # built in the target dtype (an 8B model in fp32 first would be 32 GB)
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation="sdpa")
    if case.method == "qlora":
        quantize_linears(model, device)
        for param in model.parameters():  # the 4-bit base is frozen (trainer/quant.py)
            param.requires_grad_(False)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return prepare_model(model, spec, device)


def step_fn(case: Case, model: Any, optimizer: Any, ids: Any, device: Any) -> Any:
    """One optimizer step through the trainer's step functions (trainer/step.py when present)."""
    import torch

    from trainer.data.dataset import Example

    spec = spec_for(case, "unused")
    try:
        from trainer.step import accumulate, update
    except ImportError:
        accumulate = None
    examples = [Example(input_ids=row, labels=row) for row in ids.tolist()]

    def step() -> None:
        if accumulate is not None:
            accumulate(model, [examples], spec=spec, device=device, pad_id=0)
            update(model, optimizer, spec.train.max_grad_norm)
        else:
            from trainer.model import autocast_dtype

            amp = autocast_dtype(spec)
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def traced_gib(case: Case) -> tuple[float | None, float | None]:
    """The same job traced on fake tensors (on the CPU): peak allocated and reserved."""
    from trainer.memory.memtrace import TraceUnsupported, trace

    try:
        result = trace(spec_for(case, "unused"), config_for(case.shape), [1])[0]
    except TraceUnsupported:
        return None, None
    return result.peak_allocated_gib, result.peak_reserved_gib


def estimate_for(case: Case) -> Any:
    from orchestrator.sizing.memory import estimate_memory

    if case.shape == "tiny":
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "config.json").write_text(json.dumps(config_for("tiny")))
            return estimate_memory(spec_for(case, tmp))
    return estimate_memory(spec_for(case, case.shape))


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

    est = estimate_for(case)
    base = Result(
        case.name, str(device), 0, 0, case.seq_len, 0, 0.0, 0.0, None, None, None, 0.0,
        est.peak_gib_per_gpu, est.peak_phase,
        estimate_allocated_gib=est.peak_allocated_gib, estimate_reserved_gib=est.peak_reserved_gib,
    )  # fmt: skip
    base.trace_allocated_gib, base.trace_reserved_gib = traced_gib(case)
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
    from trainer.loop import make_optimizer

    optimizer = make_optimizer(spec_for(case, "unused"), model)
    cfg = config_for(case.shape)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (case.micro_batch, case.seq_len), generator=gen).to(device)
    step = step_fn(case, model, optimizer, ids, device)

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
        estimate_gib=est.peak_gib_per_gpu,
        estimate_phase=est.peak_phase,
        estimate_allocated_gib=base.estimate_allocated_gib,
        estimate_reserved_gib=base.estimate_reserved_gib,
        trace_allocated_gib=base.trace_allocated_gib,
        trace_reserved_gib=base.trace_reserved_gib,
    )
    result.predicted_tokens_per_s = predicted_tokens_per_s(case, result.device, trainable)
    return result


#: CUDA device-name fragments -> orchestrator.sizing.throughput.ACCELERATORS keys (most specific first)
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
    from orchestrator.sizing.memory import Settings
    from orchestrator.sizing.shapes import bundled_shape, shape_from_config
    from orchestrator.sizing.throughput import ACCELERATORS, Workload, estimate_time

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
    """Measured tokens/s next to the time model's (orchestrator/sizing/throughput.py, calibrated constants)."""
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
        "| case | device | params | trainable | seq | allocated GiB: measured / traced / estimated | "
        "reserved GiB: measured / traced / estimated | peak RSS GiB | estimate + context GiB (phase) | "
        "tokens/s | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        allocated = (
            f"{gib(r.peak_allocated_gib)} / {gib(r.trace_allocated_gib)} / {gib(r.estimate_allocated_gib)}"
        )
        reserved = (
            f"{gib(r.peak_reserved_gib)} / {gib(r.trace_reserved_gib)} / {gib(r.estimate_reserved_gib)}"
        )
        if r.skipped:
            rows.append(
                f"| {r.case} | {r.device} | | | {r.seq_len} | skipped: {r.skipped}; {allocated} | {reserved} "
                f"| | {r.estimate_gib:.2f} | | |"
            )
            continue
        mfu = "n/a" if r.mfu is None else f"{r.mfu:.1%}"
        rows.append(
            f"| {r.case} | {r.device} | {r.params / 1e6:,.3f}M | {r.trainable / 1e6:,.3f}M | {r.seq_len} | "
            f"{allocated} | {reserved} | {r.peak_rss_gib:.2f} | {r.estimate_gib:.2f} ({r.estimate_phase}) | "
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
