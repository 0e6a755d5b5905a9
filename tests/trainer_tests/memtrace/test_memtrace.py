"""Tracing one training step on fake tensors: the allocator model, what the trace counts, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from support.tiny_model import TINY_LLAMA as TINY

from trainer.memtrace.cuda_allocator import CachingAllocator, round_size

MIB = 1 << 20


def test_allocator_rounds_pools_and_reuses_like_cuda():
    assert [round_size(n) for n in (1, 512, 513, 4096)] == [512, 512, 1024, 4096]
    a = CachingAllocator()
    a.malloc(0, 1000)  # small pool: a 2 MiB segment
    assert (a.allocated, a.reserved) == (1024, 2 * MIB)
    a.malloc(1, 3 * MIB)  # large, under 10 MiB: a 20 MiB segment
    assert a.reserved == 22 * MIB
    a.malloc(2, 15 * MIB)  # the rest of that segment fits (17 MiB free): no new segment
    assert a.reserved == 22 * MIB
    a.malloc(3, 30 * MIB)  # 30 MiB rounded to 2 MiB
    assert a.reserved == 52 * MIB and a.peak_allocated == 1024 + 48 * MIB
    for h in (1, 2):
        a.free(h)
    a.malloc(4, 18 * MIB)  # freed neighbours merged back into one 20 MiB block: reused
    assert a.reserved == 52 * MIB


def test_expandable_segments_reserve_less_when_fragmented():
    def pattern(alloc: CachingAllocator) -> int:
        for i in range(8):  # interleaved long- and short-lived 12 MiB blocks, then a bigger request
            alloc.malloc(i, 12 * MIB)
        for i in range(0, 8, 2):
            alloc.free(i)
        alloc.malloc(99, 40 * MIB)
        return alloc.peak_reserved

    classic, expandable = pattern(CachingAllocator()), pattern(CachingAllocator(expandable_segments=True))
    assert classic == 136 * MIB and expandable <= classic


def _spec(**train):
    from trainer.config import JobSpec

    job = {
        "name": "t",
        "model": "tiny",
        "method": train.pop("method", "full"),
        "data": {"path": "x.jsonl", "max_seq_len": train.pop("seq", 64)},
        "train": {"micro_batch_size": 2, "precision": "fp32", **train},
        "checkpoint": {"uri": "/tmp/unused"},
    }
    return JobSpec.model_validate(job)


def test_trace_counts_exact_model_states_and_shards_them():
    pytest.importorskip("transformers")
    from trainer.memtrace.steptrace import GIB, trace

    one, two = trace(_spec(optimizer="adamw"), TINY, [1, 2])
    params = one.params
    assert one.at_peak_gib["param"] * GIB == pytest.approx(4 * params, rel=0.02)  # fp32 weights
    assert one.peak_allocated_gib * GIB >= 16 * params  # weights, grads, exp_avg, exp_avg_sq
    assert one.peak_phase in ("backward", "optimizer")
    assert two.at_peak_gib["param"] == pytest.approx(one.at_peak_gib["param"] / 2, rel=0.05)
    assert one.peak_reserved_gib >= one.peak_allocated_gib
    assert one.total_gib > one.peak_reserved_gib


def test_qlora_stand_in_holds_packed_weights():
    pytest.importorskip("transformers")
    from trainer.memtrace.steptrace import GIB, trace
    from trainer.model.load import base_dtype

    specs = {m: _spec(method=m, precision="bf16-mixed") for m in ("lora", "qlora")}
    lora, qlora = (trace(s, TINY)[0] for s in specs.values())
    base = base_dtype(specs["lora"]).itemsize  # LoRA's frozen base
    shapes = [64 * 64, 64 * 32, 64 * 32, 64 * 64, 64 * 128, 64 * 128, 128 * 64]  # q k v o gate up down
    lora_b = sum(round_size(base * n) for n in shapes)
    q_b = sum(  # packed 4 bit, uint8 absmax per 64, fp32 absmax per 256 blocks (double quantization)
        round_size((n + 1) // 2) + round_size(-(-n // 64)) + round_size(4 * -(-n // (64 * 256)))
        for n in shapes
    )
    saved = (lora.at_peak_gib["param"] - qlora.at_peak_gib["param"]) * GIB
    assert saved == pytest.approx(2 * (lora_b - q_b), rel=0.02)  # two layers
    # pure bf16: PEFT puts the adapters in bitsandbytes' compute dtype, so their AdamW states are 16-bit too
    pure = trace(_spec(method="qlora", precision="bf16"), TINY)[0]
    assert pure.at_peak_gib["optim"] < 0.6 * qlora.at_peak_gib["optim"]  # half, but for the step counts


def test_offload_moves_the_sharded_state_to_host_ram():
    """train.offload: params (FSDP2's CPUOffloadPolicy): the sharded weights, gradients and optimizer state
    count in host RAM (`host_gib`), not on the GPU; the gathered units and activations stay on the GPU."""
    pytest.importorskip("transformers")
    from trainer.memtrace.steptrace import GIB, trace

    kept, off = (trace(_spec(optimizer="adamw", offload=o), TINY, [2])[0] for o in ("none", "params"))
    params = kept.params
    assert kept.host_gib == 0.0
    # fp32 weights, gradients and AdamW's two states, each half on a rank of 2
    assert off.host_gib * GIB == pytest.approx(16 * params / 2, rel=0.05)
    assert off.peak_allocated_gib < kept.peak_allocated_gib - 0.5 * off.host_gib
    assert "param" not in off.at_peak_gib and "optim" not in off.at_peak_gib
    assert any("offload" in note for note in off.notes)


def _ftorch(tmp_path: Path, config: dict, *args: str, method: str = "lora") -> subprocess.CompletedProcess:
    import os

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: t\nmodel: {tmp_path / 'm'}\nmethod: lora\n"
        f"data: {{path: {tmp_path / 'd.jsonl'}, max_seq_len: 64}}\n"
        f"checkpoint: {{uri: {tmp_path / 'ck'}}}\n"
    )
    env = {**os.environ, "FTORCH_HOME": str(tmp_path / "home")}
    if method != "lora":
        job.write_text(job.read_text().replace("method: lora", f"method: {method}"))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.app", "estimate", str(job), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=240,
    )


def test_estimate_trace_json_and_fallback(tmp_path: Path):
    out = _ftorch(tmp_path, TINY, "--trace", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["trace"]["peak_allocated_gib"] > 0 and data["trace"]["peak_phase"] in (
        "forward",
        "backward",
        "optimizer",
    )
    assert {"peak_allocated_gib", "peak_reserved_gib", "peak_gib_per_gpu"} <= set(data)
    odd = tmp_path / "odd"
    odd.mkdir()
    out = _ftorch(odd, {**TINY, "model_type": "not-a-transformers-model"}, "--trace")
    assert out.returncode == 0, out.stderr
    assert "not traced" in out.stdout and "analytic estimate stands" in out.stdout


def test_estimate_trace_shows_qlora_loading_and_host_ram_with_offload(tmp_path: Path):
    """`ftorch estimate --trace` on a QLoRA job with offload: the traced load (the trainer's sharded QLoRA
    loading on a fake process group) and host RAM beside the analytic figures, in JSON and in the view."""
    pytest.importorskip("bitsandbytes")
    sets = ["--gpus", "2", "--set", "train.offload=params", "--set", "train.precision=bf16"]
    out = _ftorch(tmp_path, TINY, "--trace", "--json", *sets, method="qlora")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    load = data["trace"]["load"]
    assert load["path"] == "sharded" and load["ranks"] == 2 and load["peak_allocated_gib"] > 0
    assert load["host_gib"] > 0 and load["rank0_copy_gib"] > load["host_gib"]  # shards vs the whole copy
    assert data["trace"]["host_gib"] > 0 and data["offload"] == "params" and data["host_gib"] > 0
    (tmp_path / "again").mkdir()
    shown = _ftorch(tmp_path / "again", TINY, "--trace", *sets, method="qlora")
    assert shown.returncode == 0, shown.stderr
    assert "load (+ context)" in shown.stdout and "host RAM (machine)" in shown.stdout, shown.stdout
    assert "traced load (sharded" in shown.stdout
