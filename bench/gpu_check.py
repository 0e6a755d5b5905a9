"""GPU check: ftorch's trainer's measured peak memory, tokens/s and MFU next to the trace and the estimate.

    python bench/gpu_check.py               # CUDA: LoRA + QLoRA on an 8B Llama shape at 2048 tokens,
                                            #       full fine-tuning of a 1B Llama shape (under 10 minutes)
    python bench/gpu_check.py --cpu-tiny    # the same code path on the CPU with a tiny shape (a smoke test)
    python bench/gpu_check.py --json out.json --cases lora-8b,full-1b --steps 5

Issue 32: on CUDA each case runs in its own process under a timeout (`--isolate`, the default there): a
crash is that case's row with its error; each row is appended to `--out` as the case ends, and the
whole run is held to `--budget-s`. The set-up the lent machine needs (the wheels it carries) is
bench/gpu_wheels.py's; the suite rehearses it on the CPU. The speed paths' cases (flash-attention,
the plain loss, Liger's fused cross-entropy, AdamW foreach vs fused) vary one path of lora-8b / full-1b.

Models are randomly initialised from the bundled shapes (no downloads), in `trainer.model.load.base_dtype`,
and go through the trainer's own code: `trainer.model.load.prepare_model` (gradient checkpointing, LoRA),
`trainer.loop.make_optimizer`, and the trainer's step (`trainer.train_step.step`: accumulate + update, or the
model's loss where that module is absent); QLoRA's decoder projections are bitsandbytes NF4 with double
quantization. It runs warm-up steps, then times `--steps` optimizer steps. Peak memory is
torch.cuda.max_memory_allocated / max_memory_reserved (the CPU mode reports the process's peak RSS
instead), printed next to the trace of the same job (trainer/memtrace/steptrace.py, on fake tensors) and the
analytic estimate (orchestrator/sizing/memory.py), allocated and reserved each. MFU = model FLOPs per token x tokens/s / the GPU's dense bf16
peak, with model FLOPs = 6N (full) or 4N (adapters: no weight gradients for the frozen base) plus
12 * layers * hidden * seq for attention; recomputation is not counted. A second table puts the measured
tokens/s next to the time model's (orchestrator/sizing/throughput.py with its calibrated constants) for the GPU
found; two extra LoRA cases at 512 tokens (micro-batch 1 and 8) check its micro-batch dependence.
Issue 20's cases: the step in backward, QLoRA loaded sharded on 2 ranks, and CPU offload
(`train.offload: params`, FSDP2's CPUOffloadPolicy) under torchrun, on 2 gloo ranks in the CPU mode (where
it moves nothing but the code path runs), with the estimate's host RAM next to the measured peak RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.tiny_model import tiny_llama  # noqa: E402

#: dense bf16 peak FLOP/s by device name fragment (no sparsity)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12}
#: the tests' tiny Llama shape (tests/support/tiny_model.py), with room for the CPU mode's sequences
TINY = tiny_llama(max_position_embeddings=256)


@dataclass
class Case:
    name: str
    shape: str  # a bundled shape name, or "tiny"
    method: str  # full | lora | qlora
    seq_len: int
    micro_batch: int = 1
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"
    in_backward: bool = False  # train.optimizer_in_backward (trainer/optim/in_backward.py)
    ranks: int = 1  # > 1: the sharded load and step under torchrun, one rank per GPU (sharded_case)
    #: train.offload: "params" runs FSDP2's CPUOffloadPolicy under torchrun (one rank: a world of one)
    offload: str = "none"
    # issue 32: the speed paths, one at a time against the case it varies
    attn: str = "sdpa"  # train.attn_implementation
    loss: str = "auto"  # train.loss
    kernels: tuple[str, ...] = ()  # train.kernels
    adamw: str | None = (
        None  # trainer.optim.build's implementation (None: the trainer's choice for the device)
    )
    #: in the default set (the rest run when named with --cases)
    default: bool = True
    #: also trace the job on fake tensors (a minute on the CPU for an 8B shape: the base cases only)
    trace: bool = True


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
    #: multi-rank cases: the largest per-rank peak of the sharded load, before the first step
    load_peak_allocated_gib: float | None = None
    #: the estimate's host RAM per machine (offloaded state, loading copy, processes): next to peak RSS
    estimate_host_gib: float | None = None
    #: multi-rank / offload cases: the FSDP2 offload policy the root module runs with, as FSDP reports it
    offload_policy: str | None = None
    #: the case's process failed (crashed, timed out): the tail of what it wrote; the row has no figures
    error: str | None = None
    #: issue 32: the paths this row ran (attention, loss path of train.loss, kernels, AdamW implementation)
    paths: str = ""


GPU_CASES = [
    Case("lora-8b", "llama-3.1-8b", "lora", 2048),
    # issue 32's paths, each against lora-8b or full-1b: flash-attention 2 (where installed), the loss in
    # one piece (3 GiB of logits) and Liger's fused linear cross-entropy (where carried), AdamW foreach
    Case("lora-8b-flash", "llama-3.1-8b", "lora", 2048, attn="flash_attention_2", trace=False),
    Case("lora-8b-plain-loss", "llama-3.1-8b", "lora", 2048, loss="plain", trace=False),
    Case("lora-8b-liger", "llama-3.1-8b", "lora", 2048, kernels=("liger_fused_ce",), trace=False),
    Case("qlora-8b", "llama-3.1-8b", "qlora", 2048),
    Case("full-1b", "llama-3.2-1b", "full", 2048),
    Case("full-1b-foreach", "llama-3.2-1b", "full", 2048, adamw="foreach", trace=False),
    # the time model's micro-batch dependence: the same 8B LoRA at 512 tokens, micro-batch 1 and 8
    Case("lora-8b-512x1", "llama-3.1-8b", "lora", 512, micro_batch=1, trace=False),
    Case("lora-8b-512x8", "llama-3.1-8b", "lora", 512, micro_batch=8, trace=False),
    # not in the default set (issue 32: minutes, no multi-GB host writes; name them with --cases):
    # issue 20: torchtune's published 8B full fine-tune (18.9 GiB on one RTX 4090), the step in backward
    Case(
        "full-8b-inbwd",
        "llama-3.1-8b",
        "full",
        2048,
        2,
        "paged_adamw_8bit",
        "bf16",
        in_backward=True,
        default=False,
    ),
    # issue 20: QLoRA loaded sharded (trainer/model/sharded_load.py) on 2 ranks; skipped with fewer GPUs
    Case("qlora-8b-2ranks", "llama-3.1-8b", "qlora", 2048, ranks=2, default=False),
    # issue 20: CPU offload (train.offload: params) on one GPU as an FSDP world of one: the GPU holds a
    # layer in flight and the activations, the shards, gradients and AdamW state live in pinned host RAM.
    # It saves the 8B model first (16 GB written to the host's disk)
    Case("qlora-8b-offload", "llama-3.1-8b", "qlora", 2048, offload="params", default=False),
]
CPU_CASES = [
    Case("lora-tiny", "tiny", "lora", 64),
    Case("qlora-tiny", "tiny", "qlora", 64),
    Case("full-tiny", "tiny", "full", 64),
    Case("full-tiny-inbwd", "tiny", "full", 64, 2, "paged_adamw_8bit", "bf16", in_backward=True),
    Case("qlora-tiny-2ranks", "tiny", "qlora", 64, ranks=2),
    # the offload code path on 2 gloo ranks (on a CPU it moves nothing, but CPUOffloadPolicy runs)
    Case("qlora-tiny-offload", "tiny", "qlora", 64, ranks=2, offload="params"),
    # issue 32's paths (named with --cases: the rehearsal runs them): Liger is a row saying why not here
    Case("lora-tiny-plain-loss", "tiny", "lora", 64, loss="plain", default=False),
    Case("full-tiny-foreach", "tiny", "full", 64, adamw="foreach", default=False),
    Case("lora-tiny-liger", "tiny", "lora", 64, kernels=("liger_fused_ce",), default=False),
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
                "precision": case.precision,
                "gradient_checkpointing": True,
                "optimizer": case.optimizer,
                "max_grad_norm": None if case.in_backward else 1.0,
                "optimizer_in_backward": case.in_backward,
                "offload": case.offload,
                "attn_implementation": case.attn,
                "loss": case.loss,
                "kernels": list(case.kernels),
            },
            "local": {"nproc": case.ranks},
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

    from trainer.model.load import base_dtype, prepare_model

    spec = spec_for(case, "unused")
    cfg = config_for(case.shape)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if case.method == "qlora" else base_dtype(spec)
    with torch.device(device):  # built in the target dtype (an 8B model in fp32 first would be 32 GB)
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation=case.attn)
    if case.method == "qlora":
        quantize_linears(model, device)
        for param in model.parameters():  # the 4-bit base is frozen (trainer/model/quant.py)
            param.requires_grad_(False)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return prepare_model(model, spec, device)


def step_fn(case: Case, model: Any, optimizer: Any, ids: Any, device: Any, world: int = 1) -> Any:
    """One optimizer step through the trainer's step functions (trainer/train_step/step.py when present)."""
    import torch

    from trainer.data.dataset import Example

    spec = spec_for(case, "unused")
    try:
        from trainer.train_step.step import accumulate, update
    except ImportError:
        accumulate = None
    examples = [Example(input_ids=row, labels=row) for row in ids.tolist()]

    def step() -> None:
        if accumulate is not None:
            accumulate(model, [examples], spec=spec, device=device, pad_id=0, world=world)
            update(model, optimizer, spec.train.max_grad_norm)
        else:
            from trainer.model.load import autocast_dtype

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
    from trainer.memtrace.steptrace import TraceUnsupported, trace

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
            return estimate_memory(spec_for(case, tmp), case.ranks)
    return estimate_memory(spec_for(case, case.shape), case.ranks)


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

    from trainer.model.quant import bitsandbytes_devices

    est = estimate_for(case)
    base = Result(
        case.name, str(device), 0, 0, case.seq_len, 0, 0.0, 0.0, None, None, None, 0.0,
        est.peak_gib_per_gpu, est.peak_phase,
        estimate_allocated_gib=est.peak_allocated_gib, estimate_reserved_gib=est.peak_reserved_gib,
        estimate_host_gib=est.host_gib,
    )  # fmt: skip
    if case.ranks > 1 or case.offload != "none":  # FSDP2 under torchrun (offload: a world of one)
        base.skipped = sharded_skip(case, device)
        if base.skipped:
            return base
        return sharded_case(case, device, steps, warmup, base)
    base.skipped = path_skip(case, device)
    if base.skipped:
        return base
    if case.trace:
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
    from trainer.optim.build import adamw, adamw_impl

    spec = spec_for(case, "unused")
    trained = [p for p in model.parameters() if p.requires_grad]
    if case.adamw and spec.train.optimizer == "adamw":
        optimizer = adamw(spec, trained, case.adamw)  # type: ignore[arg-type]
    else:
        optimizer = make_optimizer(spec, model)
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
    from trainer.kernels import loss_path

    adamw_used = (
        (case.adamw or adamw_impl(trained)) if spec.train.optimizer == "adamw" else spec.train.optimizer
    )
    loss_used = "+".join(case.kernels) or loss_path(
        case.loss, case.micro_batch * case.seq_len, cfg["vocab_size"]
    )
    result.paths = f"{case.attn}, loss {loss_used}, adamw {adamw_used}"
    return result


def path_skip(case: Case, device: Any) -> str | None:
    """Why a path this case asks for cannot run here (a package neither installed nor carried), or None."""
    import importlib.util

    if case.attn == "flash_attention_2":
        if device.type != "cuda":
            return "flash-attention runs on CUDA only"
        if importlib.util.find_spec("flash_attn") is None:
            return "flash-attn is not installed here (not on the image; too large to carry)"
    from trainer.kernels import kernel_problem

    for kernel in case.kernels:
        problem = kernel_problem(kernel, device.type)
        if problem:
            return problem
    needs_bnb = case.method == "qlora" or case.optimizer in ("adamw_8bit", "paged_adamw_8bit")
    if needs_bnb and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed here (not on the image; carry its wheel: bench/gpu_wheels.py)"
    return None


# ---- issue 20: the sharded QLoRA load on several ranks, and the measured facts for the planner -------
def sharded_skip(case: Case, device: Any) -> str | None:
    """Why this multi-rank case cannot run here (None: it can; the CPU runs it on gloo ranks)."""
    import torch

    found = torch.cuda.device_count() if device.type == "cuda" else case.ranks
    if found < case.ranks:
        return f"needs {case.ranks} GPUs, this machine has {found}"
    return None


def sharded_case(case: Case, device: Any, steps: int, warmup: int, base: Result) -> Result:
    """Save the case's model (random weights) to a folder, then load it sharded and step it on
    `case.ranks` processes under torchrun (`--rank-worker`); the peaks are the largest over the ranks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = config_for(case.shape)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).save_pretrained(tmp)
        cmd = [
            *python(), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={case.ranks}",
            __file__, "--rank-worker", case.name, "--model-dir", tmp, "--steps", str(steps),
            "--warmup", str(warmup), *(["--cpu-tiny"] if device.type == "cpu" else []),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = sorted(Path(tmp).glob("rank-*.json"))
        if done.returncode != 0 or len(ranks) != case.ranks:
            base.skipped = f"the {case.ranks}-rank run failed: {(done.stderr or done.stdout).strip()[-300:]}"
            return base
        rows = [json.loads(r.read_text()) for r in ranks]
    gib = 1024**3
    step_s = max(r["step_s"] for r in rows)

    def peak(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return max(values) / gib if values else None

    base.device, base.params, base.steps = rows[0]["device"], rows[0]["params"], steps
    base.trainable = rows[0]["trainable"]
    base.step_s, base.tokens_per_s = step_s, case.ranks * case.micro_batch * case.seq_len / step_s
    base.peak_allocated_gib, base.peak_reserved_gib = peak("peak_allocated"), peak("peak_reserved")
    base.load_peak_allocated_gib = peak("load_peak_allocated")
    base.offload_policy = rows[0]["offload_policy"]
    base.peak_rss_gib = max(r["rss"] for r in rows) / gib
    return base


def rank_worker(name: str, model_dir: str, steps: int, warmup: int, cpu: bool) -> int:
    """One rank of a multi-rank case (under torchrun): the trainer's sharded load, then timed steps."""
    import torch

    from trainer.distributed import Sharded
    from trainer.loop import make_optimizer

    case = next(c for c in GPU_CASES + CPU_CASES if c.name == name)
    device = torch.device("cpu") if cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    spec = spec_for(case, model_dir)
    par = Sharded(device, offload=case.offload == "params")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = par.load(spec, device)
    load_peak = torch.cuda.max_memory_allocated(device) if cuda else None
    model.train()
    optimizer = make_optimizer(spec, model)
    vocab = config_for(case.shape)["vocab_size"]
    gen = torch.Generator(device="cpu").manual_seed(par.rank)
    ids = torch.randint(0, vocab, (case.micro_batch, case.seq_len), generator=gen).to(device)
    step = step_fn(case, model, optimizer, ids, device, world=par.world)
    for _ in range(warmup):
        step()
    par.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    par.barrier()
    row = {
        "rank": par.rank,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "params": sum(p.numel() for p in model.parameters()),  # DTensors: the global sizes
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "step_s": (time.perf_counter() - started) / max(1, steps),
        "load_peak_allocated": load_peak,
        "peak_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
        "peak_reserved": torch.cuda.max_memory_reserved(device) if cuda else None,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "offload_policy": offload_policy_of(model),
    }
    Path(model_dir, f"rank-{par.rank}.json").write_text(json.dumps(row))
    par.dist.destroy_process_group()
    return 0


def offload_policy_of(model: Any) -> str | None:
    """The offload policy FSDP2 applies to the root module's parameters (its class name), so a run shows
    that CPUOffloadPolicy was really in effect; None where the private state is not found."""
    try:
        group = model._get_fsdp_state()._fsdp_param_group
    except AttributeError:
        return None
    return type(group.offload_policy).__name__ if group is not None else None


def measured_facts(results: list[Result]) -> list[dict[str, Any]]:
    """Each case that ran, as an attempt's `measured` record (the keys the planner's history reads), with
    the case's job settings beside it, so a lent GPU's run can feed the history."""
    facts = []
    for r in results:
        if r.skipped or r.error:
            continue
        case = next(c for c in GPU_CASES + CPU_CASES if c.name == r.case)
        cuda = r.device != "cpu"
        facts.append(
            {
                "case": case.name,
                "model": case.shape,
                "method": case.method,
                "seq_len": case.seq_len,
                "optimizer": case.optimizer,
                "optimizer_in_backward": case.in_backward,
                "offload": case.offload,
                "estimate_gib": r.estimate_gib,
                "measured": {
                    "device": "cuda" if cuda else "cpu",
                    "gpu_name": r.device if cuda else None,
                    "world_size": case.ranks,
                    "micro_batch_size": case.micro_batch,
                    "grad_accum": 1,
                    "gradient_checkpointing": True,
                    "peak_allocated_bytes": _bytes(r.peak_allocated_gib),
                    "peak_reserved_bytes": _bytes(r.peak_reserved_gib),
                    "tokens_per_s": r.tokens_per_s,
                    "step_s": r.step_s,
                },
            }
        )
    return facts


def learn(facts: list[dict[str, Any]]) -> int:
    """Each fact into the planner's history (orchestrator/sizing/history.py), keyed by the case's job: what a lent
    GPU measured corrects the next `ftorch plan` of the same shape, method and layout. CPU facts are kept
    but never override a GPU estimate (the history judges them implausible)."""
    from orchestrator.sizing.history import record_gpu_check

    cases = {c.name: c for c in GPU_CASES + CPU_CASES}
    kept = 0
    for fact in facts:
        spec = spec_for(cases[fact["case"]], fact["model"]).model_dump(mode="json")
        if record_gpu_check(spec, fact["measured"], f"gpu_check:{fact['case']}") is not None:
            kept += 1
    return kept


def _bytes(gib: float | None) -> int | None:
    return None if gib is None else round(gib * 1024**3)


# ---- end issue 20 ------------------------------------------------------------------------------------


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
        method=case.method, micro_batch=case.micro_batch, seq_len=case.seq_len, grad_ckpt=True,
        attn=case.attn, loss=case.loss, kernels=case.kernels,
    )  # fmt: skip
    work = Workload(None, 1.0, 1, float(case.seq_len), case.micro_batch, "gpu_check")
    return estimate_time(shape, s, trainable, work, ACCELERATORS[key], 1, "n/a").tokens_per_s


def throughput_table(results: list[Result]) -> str:
    """Measured tokens/s next to the time model's (orchestrator/sizing/throughput.py, calibrated constants)."""
    rows = [
        "| case | device | paths | micro-batch x seq | measured tokens/s | MFU | time model tokens/s | model/measured |"
    ]
    rows.append("|---|---|---|---|---|---|---|---|")
    for r in results:
        if r.skipped or r.error:
            continue
        case = next(c for c in GPU_CASES + CPU_CASES if c.name == r.case)
        pred = r.predicted_tokens_per_s
        shown = ("n/a", "n/a") if pred is None else (f"{pred:,.0f}", f"{pred / r.tokens_per_s:.2f}")
        rows.append(
            f"| {r.case} | {r.device} | {r.paths} | {case.micro_batch} x {r.seq_len} | {r.tokens_per_s:,.0f} | "
            f"{'n/a' if r.mfu is None else f'{r.mfu:.1%}'} | {shown[0]} | {shown[1]} |"
        )
    return "\n".join(rows)


def table(results: list[Result]) -> str:
    def gib(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    rows = [
        "| case | device | params | trainable | seq | allocated GiB: measured / traced / estimated | "
        "reserved GiB: measured / traced / estimated | peak RSS GiB (/ host estimate) | estimate + context GiB (phase) | "
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
        if r.error:
            rows.append(f"| {r.case} | {r.device} | | | {r.seq_len} | failed: {r.error} | | | | | |")
            continue
        if r.skipped:
            rows.append(
                f"| {r.case} | {r.device} | | | {r.seq_len} | skipped: {r.skipped}; {allocated} | {reserved} "
                f"| | {r.estimate_gib:.2f} | | |"
            )
            continue
        mfu = "n/a" if r.mfu is None else f"{r.mfu:.1%}"
        host = r.estimate_host_gib if r.estimate_host_gib else None  # offload: the host side, per machine
        rss = f"{r.peak_rss_gib:.2f}" + ("" if host is None else f" / {host:.2f}")
        rows.append(
            f"| {r.case} | {r.device} | {r.params / 1e6:,.3f}M | {r.trainable / 1e6:,.3f}M | {r.seq_len} | "
            f"{allocated} | {reserved} | {rss} | {r.estimate_gib:.2f} ({r.estimate_phase}) | "
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
    parser.add_argument("--facts", help="write the measured facts (attempt `measured` records) here")
    parser.add_argument(
        "--learn",
        action="store_true",
        help="record the measured facts in this machine's planner history ($FTORCH_HOME; `ftorch history`)",
    )
    parser.add_argument("--out", default="gpu_check.jsonl", help="one JSON row per case, written after each")
    parser.add_argument("--case-timeout", type=float, default=240.0, help="seconds one case may take")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="the whole run's seconds: a case is cut at the end of them",
    )
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each case in its own process (default on CUDA: a CUDA error poisons the process)",
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--rank-worker", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_worker:  # one rank of a multi-rank case, started by sharded_case
        return rank_worker(args.rank_worker, args.model_dir, args.steps, args.warmup, args.cpu_tiny)
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
        wanted = args.cases.split(",")
        known = {c.name for c in cases}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            print(f"--cases: unknown case {unknown[0]!r}; known: {', '.join(sorted(known))}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.name in wanted]
    else:
        cases = [c for c in cases if c.default]
    if args.case:  # one case in this process (started by the loop below): its row into --row
        result = run_case(next(c for c in cases if c.name == args.case), device, steps, warmup)
        Path(args.row).write_text(json.dumps(asdict(result)))
        return 0
    started = time.time()
    results = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    for case in cases:
        left = args.budget_s - (time.time() - started)
        if left < 30:
            result = not_run(case, device, f"not started: the run's {args.budget_s:.0f} s were spent")
        elif args.isolate if args.isolate is not None else device.type == "cuda":
            result = isolated(case, device, steps, warmup, args, started)
        else:  # the CPU mode: in this process (a start per case costs more than the case), errors caught
            result = in_process(case, device, steps, warmup)
        results.append(result)
        with out.open("a", encoding="utf-8") as f:  # after each case: a later crash loses nothing
            f.write(json.dumps(asdict(result)) + "\n")
        state = result.error or (f"skipped: {result.skipped}" if result.skipped else "")
        print(
            f"{case.name}: {state or f'{result.tokens_per_s:,.0f} tokens/s'} ({time.time() - started:.0f}s)",
            file=sys.stderr,
            flush=True,
        )
    print(table(results))
    print()
    print(throughput_table(results))
    print(f"\ntotal {time.time() - started:.0f}s; torch {torch.__version__}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.facts:
        Path(args.facts).write_text(json.dumps(measured_facts(results), indent=1))
    if args.learn:
        print(f"history: {learn(measured_facts(results))} measured cases recorded (`ftorch history`)")
    for r in results:
        if r.skipped:
            print(f"{r.case}: skipped: {r.skipped}")
        if r.error:
            print(f"{r.case}: failed: {r.error}")
    return 0


def python() -> list[str]:
    """This interpreter, with its -S (no site-packages: the rehearsal of the GPU machine's set-up)."""
    return [sys.executable, "-S"] if sys.flags.no_site else [sys.executable]


def not_run(case: Case, device: Any, why: str) -> Result:
    """A row without figures: the case did not run (`error` says why)."""
    return Result(
        case.name, str(device), 0, 0, case.seq_len, 0, 0.0, 0.0, None, None, None, 0.0, 0.0, "", error=why
    )


def in_process(case: Case, device: Any, steps: int, warmup: int) -> Result:
    """One case in this process; an exception is the case's row, with its last line."""
    try:
        return run_case(case, device, steps, warmup)
    except Exception as exc:  # noqa: BLE001 - any failure of one case is that case's row
        return not_run(case, device, f"{type(exc).__name__}: {exc}"[:400])
    finally:
        gc.collect()


def isolated(case: Case, device: Any, steps: int, warmup: int, args: Any, started: float) -> Result:
    """One case in its own process, under a timeout: a crash (CUDA error, out of memory, a missing
    package) or a hang is that case's row, with the tail of its output, and the next case starts clean."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        row = Path(tmp, "row.json")
        cmd = [
            *python(), __file__, "--case", case.name, "--cases", case.name, "--row", str(row),
            "--steps", str(steps), "--warmup", str(warmup), *(["--cpu-tiny"] if device.type == "cpu" else []),
        ]  # fmt: skip
        try:
            limit = min(args.case_timeout, args.budget_s - (time.time() - started))
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return not_run(case, device, f"timed out after {limit:.0f} s")
        if done.returncode == 0 and row.exists():
            return Result(**json.loads(row.read_text()))
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-400:]
        return not_run(case, device, f"exit {done.returncode}: {tail}")


if __name__ == "__main__":
    sys.exit(main())
