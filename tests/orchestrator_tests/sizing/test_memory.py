"""The memory estimator: monotonic where it must be, consistent with sharding, agreeing with known facts."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from helpers import REPO

from orchestrator.jobfile.spec import validate_job
from orchestrator.sizing.memory import Settings, estimate, estimate_memory
from orchestrator.sizing.shapes import bundled_shape

CALIBRATION_CSV = REPO.parent / "shared" / "data" / "vram" / "calibration.csv"
LORA = Settings(
    method="lora", precision="bf16-mixed", optimizer="adamw", micro_batch=1, seq_len=2048, grad_ckpt=True
)


def peak(name: str, s: Settings) -> float:
    return estimate(bundled_shape(name), s).peak_gib_per_gpu


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("ckpt", [True, False])
def test_monotonic_in_batch_and_sequence(method, ckpt):
    base = replace(LORA, method=method, grad_ckpt=ckpt, precision="bf16")
    batches = [peak("llama-3.1-8b", replace(base, micro_batch=b)) for b in (1, 2, 4, 8)]
    seqs = [peak("llama-3.1-8b", replace(base, seq_len=s)) for s in (256, 1024, 4096, 16384)]
    assert batches == sorted(batches) and batches[-1] > batches[0]
    assert seqs == sorted(seqs) and seqs[-1] > seqs[0]


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_monotonic_in_rank(method):
    peaks = [peak("llama-3.1-8b", replace(LORA, method=method, lora_r=r)) for r in (4, 16, 64, 256)]
    assert peaks == sorted(peaks) and peaks[-1] > peaks[0]
    counts = [
        estimate(bundled_shape("llama-3.1-8b"), replace(LORA, lora_r=r)).trainable_params for r in (8, 16)
    ]
    assert counts[1] == 2 * counts[0]


def test_sharding_divides_model_states_not_activations():
    shape = bundled_shape("llama-3.1-8b")
    full = Settings(method="full", precision="bf16-mixed", optimizer="adamw", seq_len=2048, grad_ckpt=True)
    one = estimate(shape, full)
    peaks = [estimate(shape, replace(full, n_gpus=n)).peak_gib_per_gpu for n in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True)
    eight = estimate(shape, replace(full, n_gpus=8))
    assert eight.sharding.startswith("fsdp") and eight.n_gpus == 8
    # model states shard 1/N; the all-gather buffers and activations do not shrink
    adam_states = 8 * shape.params / 2**30  # fp32 exp_avg and exp_avg_sq
    assert one.peak_phase == "optimizer_step" and one.breakdown_gib["optimizer"] > adam_states
    fwd = [estimate(shape, replace(full, n_gpus=n, micro_batch=16)) for n in (8, 32)]  # above the load
    assert all(e.peak_phase == "forward_backward" for e in fwd)
    assert fwd[0].breakdown_gib["optimizer"] == pytest.approx(adam_states / 8, rel=1e-6)
    assert fwd[0].breakdown_gib["activations"] == pytest.approx(fwd[1].breakdown_gib["activations"])
    assert eight.breakdown_gib["weights"] > one.breakdown_gib["weights"] / 8  # gathered units on top


def test_orderings_that_everyone_knows():
    q, lo, fu = (peak("llama-2-7b", replace(LORA, method=m)) for m in ("qlora", "lora", "full"))
    assert q < lo < fu
    assert peak("llama-2-7b", replace(LORA, grad_ckpt=True)) < peak(
        "llama-2-7b", replace(LORA, grad_ckpt=False)
    )
    eager = replace(LORA, attn="eager", grad_ckpt=False, seq_len=4096)
    assert peak("llama-2-7b", replace(eager, attn="sdpa")) < peak("llama-2-7b", eager)
    full = Settings(method="full", precision="bf16-mixed", seq_len=512, grad_ckpt=True)
    by_opt = {
        o: peak("llama-3.2-1b", replace(full, optimizer=o))
        for o in ("adamw", "adamw_8bit", "paged_adamw_8bit", "sgd", "adafactor")
    }
    assert by_opt["paged_adamw_8bit"] < by_opt["adamw_8bit"] < by_opt["adamw"]
    assert by_opt["sgd"] < by_opt["adamw"] and by_opt["adafactor"] < by_opt["adamw"]
    assert peak("llama-3.2-1b", replace(full, precision="bf16")) < peak("llama-3.2-1b", full)
    assert peak("llama-3.2-1b", replace(full, precision="fp32")) > peak(
        "llama-3.2-1b", replace(full, precision="bf16")
    )


def test_qlora_65b_fits_one_48gb_gpu_at_short_sequences():
    """Dettmers et al. 2023: Guanaco-65B (r=64 on all linear layers, paged optimizer) on one 48 GB GPU."""
    guanaco = Settings(
        method="qlora",
        precision="bf16",
        optimizer="paged_adamw_8bit",
        micro_batch=1,
        seq_len=512,
        grad_ckpt=True,
        lora_r=64,
    )
    est = estimate(bundled_shape("llama-65b"), guanaco)
    assert est.fits(48, headroom=0.10)
    assert est.paged_optimizer_gib > 0 and est.breakdown_gib["optimizer"] == 0
    assert 30 < est.breakdown_gib["weights"] < 40  # ~0.52 bytes/param NF4+DQ plus 16-bit embeddings


def test_full_finetune_8b_adamw_mixed_does_not_fit_80gb():
    s = Settings(
        method="full", precision="bf16-mixed", optimizer="adamw", micro_batch=1, seq_len=512, grad_ckpt=True
    )
    est = estimate(bundled_shape("llama-3.1-8b"), s)
    assert not est.fits(80, headroom=0.0)
    assert est.peak_gib_per_gpu > 16 * 8.03e9 / 2**30  # at least the 16 bytes/param of ZeRO's count


def test_estimate_memory_from_a_job_spec_and_json_fields():
    spec = validate_job(
        {
            "model": "meta-llama/Llama-3.1-8B",
            "method": "qlora",
            "data": {"path": "s3://b/d.jsonl", "max_seq_len": 2048, "tokens": 1000},
            "checkpoint": {"uri": "s3://b/ck"},
            "train": {"precision": "bf16", "optimizer": "paged_adamw_8bit", "gradient_checkpointing": True},
            "resources": {"backend": "skypilot"},
        },
        check_support=False,
    )
    out = estimate_memory(spec).to_json()
    for key in ("n_gpus", "peak_gib_per_gpu", "breakdown_gib", "params", "trainable_params"):
        assert key in out
    assert set(out["breakdown_gib"]) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "logits",
        "overhead",
    }
    assert sum(out["breakdown_gib"].values()) == pytest.approx(out["peak_gib_per_gpu"], abs=0.01)
    assert estimate_memory(spec, 4).n_gpus == 4


def test_estimator_imports_no_torch():
    code = (
        "import sys; import orchestrator.sizing.memory, orchestrator.sizing.planner, orchestrator.cli.sizing; "
        "assert 'torch' not in sys.modules and 'sky' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_load_phase_is_part_of_the_peak():
    """What the trainer's loading holds per GPU (trainer/memory/load_memory.py) is part of the estimate.
    Every method loads sharded under FSDP (a shard and one tensor in flight; QLoRA's quant state whole):
    Llama-2-13B LoRA and Llama-2-70B QLoRA, whose steps fit 4 x 24 GB, run there (70B QLoRA was refused
    for its load while every rank loaded the whole 4-bit model); on one GPU nothing changes."""
    from orchestrator.sizing.catalog import Catalog, parse_offers
    from orchestrator.sizing.planner import HEADROOM, TRACE_MARGIN, make_plan
    from orchestrator.sizing.tracing import TraceConfirmation
    from trainer.memory.load_memory import WeightCounts, load_peak_bytes

    shape = bundled_shape("llama-2-13b")
    for method in ("full", "lora", "qlora"):
        for precision in ("bf16", "bf16-mixed"):
            s = replace(LORA, method=method, precision=precision)
            one, eight = estimate(shape, s), estimate(shape, replace(s, n_gpus=8))
            assert one.peak_phase != "load" and one.load_gib_per_gpu < one.peak_gib_per_gpu
            step = max(g for p, g in one.phases_gib.items() if p != "load")
            assert one.peak_gib_per_gpu == pytest.approx(step)
            assert eight.peak_phase != "load" and eight.load_gib_per_gpu < one.load_gib_per_gpu / 4
    counts = WeightCounts(
        params=1000, quantizable=800, adapters=10, largest_quantizable=100, largest_tensor=150
    )
    assert load_peak_bytes("full", "bf16-mixed", counts, 1) == {
        "weights": 4000,
        "adapters": 0,
        "in_flight": 0,
    }
    assert load_peak_bytes("full", "bf16-mixed", counts, 4) == {
        "weights": 1000,
        "adapters": 0,
        "in_flight": 600,
    }
    assert load_peak_bytes("lora", "bf16-mixed", counts, 4) == {
        "weights": 500,
        "adapters": 10,
        "in_flight": 300,
    }
    qlora = load_peak_bytes("qlora", "bf16", counts, 1)  # one process: quantized whole on the GPU
    assert qlora == pytest.approx({"weights": 0.516 * 800 + 400, "adapters": 20, "in_flight": 200})
    qlora = load_peak_bytes("qlora", "bf16", counts, 4)  # a shard of the packed data and the 16-bit rest,
    # the whole absmax, and the largest tensor in flight (the 16-bit embedding of 150 elements) with this
    # rank's quarter of it (distribute_tensor's chunk, traced: tests/trainer_tests/memtrace/test_loadtrace.py)
    assert qlora == pytest.approx(
        {"weights": (0.5 * 800 + 400) / 4 + 0.016 * 800, "adapters": 5, "in_flight": 300 * 1.25}
    )
    wide = replace(counts, largest_tensor=100)  # no 16-bit tensor larger than a projection: one packed one
    assert load_peak_bytes("qlora", "bf16", wide, 4)["in_flight"] == pytest.approx(50 * 1.25)

    def job(model: str, method: str) -> Any:
        train = {"precision": "bf16", "optimizer": "adamw", "gradient_checkpointing": True, "grad_accum": 8}
        return validate_job(
            {
                "model": model,
                "method": method,
                "data": {"path": "s3://b/d.jsonl", "max_seq_len": 512, "tokens": 1_000_000},
                "checkpoint": {"uri": "s3://b/ck"},
                "lora": {"r": 64},
                "train": train,
                "resources": {"backend": "skypilot", "allow_pcie": True, "fallback": "none"},
            },
            check_support=False,
        )

    header = (
        "cloud,instance_type,accelerator,count,gpu_memory_gib,ondemand_usd,spot_usd,regions,interconnect\n"
    )
    offers = header + "aws,a10g.x4,A10G,4,22.35,5.70,2.00,us-east-1,PCIe\n"
    catalog = Catalog(tuple(parse_offers(offers)), "test")
    usable = 22.35 * (1 - HEADROOM)
    lora = make_plan(job("llama-2-13b", "lora"), catalog=catalog)
    assert lora.chosen is not None and lora.chosen.peak_gib_per_gpu < usable, lora.why_none()

    spec = job("llama-2-70b", "qlora")
    four, two, one = (estimate_memory(spec, n) for n in (4, 2, 1))
    assert max(g for p, g in four.phases_gib.items() if p != "load") < usable  # the step fits
    assert four.peak_phase != "load" and four.load_gib_per_gpu < four.peak_gib_per_gpu
    whole = 0.516 * 68e9 / 2**30  # what every rank held while it loaded the whole 4-bit model
    assert one.load_gib_per_gpu > whole
    # sharded: about a quarter (a half) of the packed model, plus the absmax and the embedding in flight
    assert whole / 4 < four.load_gib_per_gpu < whole / 4 + 5 < two.load_gib_per_gpu < whole / 2 + 5
    plan = make_plan(spec, catalog=catalog)
    assert plan.chosen is not None and not plan.rejected, plan.why_none()

    # the trace measures the step only: a traced step below the load leaves the load in charge
    mem = replace(four, peak_gib_per_gpu=21.0, peak_phase="backward_grads", load_gib_per_gpu=20.5)
    confirm = TraceConfirmation(spec, shape, [], lambda n: mem, HEADROOM, TRACE_MARGIN)
    confirm.traced = {4: {"total_gib": 19.5}}
    assert confirm.peak(4, 22.35) == (20.5, "estimated")
    confirm.traced = {4: {"total_gib": 20.7}}
    assert confirm.peak(4, 22.35) == (20.7, "traced")


def test_packing_adds_its_attention_mask_where_the_kernel_needs_one():
    """A packed micro-batch carries a block-diagonal mask (trainer.data.packing.mask_bytes) for sdpa and
    eager; flash attention reads position ids instead. 8 x 8,192 tokens: 0.5 GiB of booleans, and sdpa's
    bf16 bias copy on top."""
    shape = bundled_shape("meta-llama/Meta-Llama-3-8B")
    base = Settings(method="lora", micro_batch=8, seq_len=8192, grad_ckpt=True)
    gib = 2**30
    for attn, extra in (("sdpa", 8 * 8192 * 8192 * 3), ("eager", 8 * 8192 * 8192), ("flash_attention_2", 0)):
        plain = estimate(shape, replace(base, attn=attn))
        packed = estimate(shape, replace(base, attn=attn, packing=True))
        grown = (packed.peak_allocated_gib - plain.peak_allocated_gib) * gib
        assert grown == pytest.approx(extra, rel=0.02, abs=2**20), attn
    job = validate_job(
        {
            "name": "p",
            "model": "meta-llama/Meta-Llama-3-8B",
            "data": {"path": "d.jsonl", "max_seq_len": 8192, "packing": True},
            "train": {"micro_batch_size": 8, "gradient_checkpointing": True},
            "checkpoint": {"uri": "/tmp/x"},
        }
    )
    assert (
        estimate_memory(job).peak_gib_per_gpu
        > estimate_memory(
            job.model_copy(update={"data": job.data.model_copy(update={"packing": False})})
        ).peak_gib_per_gpu
    )


def test_one_source_per_memory_fact():
    """Precision -> bytes, the CUDA context, the cuBLAS workspace and FSDP's buffers are stated once, in
    trainer/memory/facts.py; the estimate reads them from there, and no module writes a second copy."""
    import re

    from orchestrator.sizing.memory import RAW, calibrated_constants
    from trainer.memory import facts as memory_facts
    from trainer.memory import load_memory

    for k in (RAW, calibrated_constants()):  # the calibration file's copies are not read
        assert k.cuda_context_gib * memory_facts.GIB == memory_facts.CUDA_CONTEXT_BYTES
        assert k.workspace_gib * memory_facts.GIB == memory_facts.CUBLAS_WORKSPACE_BYTES
    assert load_memory.DTYPE_BYTES is memory_facts.DTYPE_BYTES
    assert load_memory.COMPUTE_NAMES is memory_facts.COMPUTE_NAMES
    copies = re.compile(
        r"(512|33) \* 1024\s*\*\*\s*2|33 / 1024|\bGIB = |1024\s*\*\*\s*3|2\s*\*\*\s*30"  # context, workspace, GiB
        r'|"(fp32|bf16|fp16)":\s*\d'  # a dtype -> bytes table
        r"|\b[24]\.?0? if [\w.]*precision|precision (==|in) .* else [24]\b"  # precision -> bytes
    )
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for folder in ("orchestrator", "trainer")
        for p in sorted((REPO / folder).rglob("*.py"))
        if p != REPO / "trainer" / "memory" / "facts.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if copies.search(line)
    ]
    assert found == [], "a second copy of a memory fact (use trainer/memory/facts.py):\n" + "\n".join(found)


def test_checkpoint_bytes_follow_the_optimizer_rules_of_the_estimate():
    """The planner's checkpoint size: the trainable weights in their dtype plus the optimizer state the
    estimate holds resident (one rule for both)."""
    from orchestrator.sizing.memory import checkpoint_bytes

    shape = bundled_shape("llama-2-7b")
    for optimizer in ("adamw", "adamw_8bit", "sgd", "adafactor"):
        for precision, weight_bytes in (("bf16", 2), ("bf16-mixed", 4)):
            s = replace(LORA, optimizer=optimizer, precision=precision)
            est = estimate(shape, s)
            assert est.peak_phase == "forward_backward"  # its optimizer term is the resident state alone
            optim = est.breakdown_gib["optimizer"] * 2**30
            assert checkpoint_bytes(shape, s) == pytest.approx(weight_bytes * est.trainable_params + optim)
