"""QLoRA's loading traced on fake tensors (trainer/memtrace/loadtrace.py) against a real load: the sharded
path's bytes on rank 1 of a real 2-rank gloo run of trainer/model/sharded_load.py, counted storage by storage,
equal the trace's within a few percent; the trace follows the analytic estimate
(trainer/memory/load_memory.py) on the published 70B shape; CPU offload moves the shards to host RAM."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from helpers import job_dict

from trainer.config import JobSpec

pytest.importorskip("bitsandbytes")

GIB = 2**30


def _spec(model: Path, tmp: Path, ranks: int, offload: str = "none", **train: Any) -> JobSpec:
    job = job_dict(
        model, tmp / "d.jsonl", tmp / "ck", method="qlora",
        lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
        train={"precision": "bf16", "optimizer": "adamw", "offload": offload, **train},
    )  # fmt: skip
    job["local"] = {**job["local"], "nproc": ranks}
    return JobSpec.model_validate(job)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _real_load(rank: int, port: int, job: dict[str, Any], out: str) -> None:
    """A real sharded QLoRA load on 2 gloo ranks; rank 1 counts every storage it creates and frees."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    from trainer.distributed import Sharded
    from trainer.memtrace.loadtrace import _peaks, _recorder
    from trainer.model import sharded_load

    spec = JobSpec.model_validate(job)
    par = Sharded(torch.device("cpu"))
    shard = lambda m: par.shard_model(m, spec)  # noqa: E731
    if rank != 1:
        sharded_load.load_sharded_quantized(spec, torch.device("cpu"), rank, shard)
    else:
        counting = type(_recorder())

        class Real(counting):  # real tensors: .item() and every op run as they are
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                result = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(result):
                    if isinstance(t, torch.Tensor):
                        self.track(t)
                return result

        live = Real()
        with live:
            model = sharded_load.load_sharded_quantized(spec, torch.device("cpu"), rank, shard)
        peak, _reserved, _host = _peaks(live, set())  # the trace's own accounting (CUDA's rounding)
        Path(out).write_text(json.dumps({"peak": peak, "params": len(list(model.parameters()))}))
    par.dist.destroy_process_group()


def test_the_traced_sharded_load_matches_a_real_two_rank_load(tmp_path: Path, tiny_model: Path) -> None:
    from trainer.memtrace.loadtrace import trace_load, trace_whole

    spec = _spec(tiny_model, tmp_path, 2)
    out = tmp_path / "real.json"
    mp.spawn(_real_load, args=(_free_port(), spec.model_dump(mode="json"), str(out)), nprocs=2)
    real = json.loads(out.read_text())
    config = json.loads((tiny_model / "config.json").read_text())
    traced = trace_load(spec, config, 2)
    assert traced.path == "sharded" and traced.ranks == 2
    assert traced.peak_allocated_gib * GIB == pytest.approx(real["peak"], rel=0.05), real
    # a rank holds a shard and one tensor in flight (on this tiny model the embedding is most of it)
    whole = trace_whole(spec, config)
    assert traced.peak_allocated_gib < 0.9 * whole.peak_allocated_gib
    assert traced.rank0_copy_gib == pytest.approx(whole.peak_allocated_gib)


def test_the_load_trace_follows_the_estimate_on_the_70b_shape(tmp_path: Path) -> None:
    """The analytic load (trainer/memory/load_memory.py, which the planner uses) against the traced one
    for Llama-3.1-70B QLoRA: whole on one GPU, sharded on 2 and 4, and with CPU offload on 2."""
    from orchestrator.sizing.memory import estimate, settings_from_spec
    from orchestrator.sizing.shapes import bundled_shape
    from trainer.memtrace.loadtrace import trace_load

    shape = bundled_shape("llama-3.1-70b")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(shape.config))
    for ranks, offload in ((1, "none"), (2, "none"), (4, "none"), (2, "params")):
        spec = _spec(model, tmp_path, ranks, offload)
        traced = trace_load(spec, shape.config, ranks)
        est = estimate(shape, settings_from_spec(spec, ranks))
        # the estimate adds the step's allocator slack: it may err high, by little, never low
        assert traced.total_gib <= est.load_gib_per_gpu <= traced.total_gib * 1.2 + 0.5, (ranks, offload)
        assert traced.path == ("whole" if ranks == 1 and offload == "none" else "sharded")
        if offload == "params":  # the shards live in host RAM: a GPU holds one tensor and the quant state
            assert traced.host_gib > 33.9 / 2 * 0.9 and traced.peak_allocated_gib < 4
