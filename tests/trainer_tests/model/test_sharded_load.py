"""Sharded loading under FSDP (trainer/model/sharded_load.py): rank 0 loads on the CPU, the others build the
model on the meta device, and every rank materialises only its shards. On 2 ranks (gloo, CPU) the model
it gives is bitwise the one the whole-model path gave (every rank loading everything, then sharding):
parameters (local shards), buffers, dtypes, what trains, and each rank's RNG after loading."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from helpers import job_dict

RANKS = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    out: dict[str, Any] = {}
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        out[name] = (local.detach().clone(), p.dtype, p.requires_grad, tuple(p.shape))
    for name, b in model.named_buffers():
        out[f"buffer:{name}"] = (b.detach().clone(), b.dtype, False, tuple(b.shape))
    out["rng"] = (torch.get_rng_state(), torch.uint8, False, ())
    for name, module in model.named_modules():  # QLoRA: each 4-bit layer's quant state, whole on every rank
        state = getattr(module, "quant_state", None)
        if state is not None:
            for key, tensor in state.as_dict(packed=True).items():
                out[f"quant:{name}.{key}"] = (
                    tensor.detach().clone(),
                    tensor.dtype,
                    False,
                    tuple(tensor.shape),
                )
            out[f"quant:{name}"] = (
                torch.zeros(1, dtype=torch.uint8),
                module.compute_dtype,
                False,
                (str(module.quant_storage),),
            )
    return out


def _compare(rank: int, port: int, jobs: list[dict[str, Any]]) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )  # fmt: skip
    torch.set_num_threads(1)
    from trainer.config import JobSpec
    from trainer.distributed import Sharded
    from trainer.model.load import load_model

    cpu = torch.device("cpu")
    par = Sharded(cpu)
    for job in jobs:
        tied = job.pop("tied", False)
        spec = JobSpec.model_validate(job)
        old = _snapshot(par.wrap(load_model(spec, cpu), spec))  # every rank loads all, then shards
        new_model = par.load(spec, cpu)
        new = _snapshot(new_model)
        assert old.keys() == new.keys(), (spec.method, set(old) ^ set(new))
        for key, (tensor, dtype, trains, shape) in old.items():
            got = new[key]
            assert (got[1], got[2], got[3]) == (dtype, trains, shape), (
                spec.method,
                key,
                got[1:],
                (dtype, trains, shape),
            )
            assert torch.equal(got[0].view(torch.uint8), tensor.view(torch.uint8)), (spec.method, key)
        if tied:
            base = new_model.get_base_model() if hasattr(new_model, "get_base_model") else new_model
            assert base.lm_head.weight is base.model.embed_tokens.weight
    par.dist.destroy_process_group()


def test_sharded_load_gives_the_whole_model_paths_parameters_bitwise(
    tmp_path: Path, tiny_model: Path
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = True
    tied = tmp_path / "tied"
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(tied)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            (tied / name).write_bytes((tiny_model / name).read_bytes())
    data, ck = tmp_path / "d.jsonl", tmp_path / "ck"
    jobs = [
        job_dict(tiny_model, data, ck, lora={"dropout": 0.0}),  # fp32, adapters on q/v/lm_head
        job_dict(tiny_model, data, ck, train={"precision": "bf16-mixed"}),  # bf16 base, fp32 adapters
        job_dict(tiny_model, data, ck, method="full", train={"precision": "bf16-mixed"}),  # fp32 master
        job_dict(tied, data, ck, method="full", train={"precision": "bf16"}),  # tied embeddings
    ]
    jobs[-1]["tied"] = True
    mp.spawn(_compare, args=(_free_port(), jobs), nprocs=RANKS, join=True)


def test_sharded_qlora_load_gives_the_whole_model_paths_4bit_weights_and_quant_state_bitwise(
    tmp_path: Path, tiny_model: Path
) -> None:
    """QLoRA: rank 0 quantizes once on its CPU and every rank receives its shards of the packed 4-bit
    weights (stored in bf16), the bf16 rest and the adapters, and every layer's quant state (absmax, code,
    nested absmax, offset): bitwise what each rank quantizing the whole model gives."""
    pytest.importorskip("bitsandbytes")
    data, ck = tmp_path / "d.jsonl", tmp_path / "ck"
    qlora = {"method": "qlora", "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}}
    jobs = [
        job_dict(tiny_model, data, ck, **qlora, train={"precision": "bf16-mixed"}),  # fp32 adapters
        job_dict(tiny_model, data, ck, **qlora, train={"precision": "bf16"}),  # bf16 adapters
    ]
    jobs[0]["quantization"] = {"double_quant": True}
    jobs[1]["quantization"] = {"double_quant": False}
    mp.spawn(_compare, args=(_free_port(), jobs), nprocs=RANKS, join=True)


def _watch_rank_0_release(rank: int, port: int, job: dict[str, Any]) -> None:
    """On each of 2 ranks: load with CPU offload; on rank 0, record how much of its copy's already sent
    tensors is still held each time it sends the next one."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )  # fmt: skip
    torch.set_num_threads(1)
    from trainer.config import JobSpec
    from trainer.distributed import Sharded
    from trainer.model import sharded_load

    copies: list[torch.nn.Module] = []
    load_model, receive_tensor = sharded_load.load_model, sharded_load.receive_tensor
    sent: list[torch.Tensor] = []
    still_held: list[int] = []

    def keep_the_copy(*args: Any, **kwargs: Any) -> torch.nn.Module:
        copies.append(load_model(*args, **kwargs))
        return copies[-1]

    def watch(target: torch.Tensor, source: torch.Tensor | None, device: torch.device) -> None:
        if isinstance(source, torch.nn.Parameter):
            still_held.append(sum(t.untyped_storage().nbytes() for t in sent))
            sent.append(source)
        receive_tensor(target, source, device)

    sharded_load.load_model, sharded_load.receive_tensor = keep_the_copy, watch
    cpu = torch.device("cpu")
    par = Sharded(cpu, offload=True)
    model = par.load(JobSpec.model_validate(job), cpu)
    par.dist.destroy_process_group()
    assert all(p.to_local().device.type == "cpu" and p.to_local().numel() for p in model.parameters())
    if rank == 0:
        (copy,) = copies
        params = list(copy.parameters())
        assert len(sent) == len(params) > 10, (len(sent), len(params))
        assert still_held == [0] * len(sent), f"sent tensors of rank 0's copy still held: {still_held}"
        assert sum(p.untyped_storage().nbytes() for p in params) == 0  # its module lives, its memory not
    else:
        assert not copies and not sent


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_rank_0_releases_each_tensor_of_its_copy_once_sent(
    method: str, tmp_path: Path, tiny_model: Path
) -> None:
    """With CPU offload the shards and rank 0's loading copy share one host's RAM. Rank 0 frees each
    parameter of its copy as soon as it is sent, so the machine holds the copy or the shards of what was
    sent, never both (the estimate's host peak, trainer/memory/load_memory.py `host_peak_bytes`): when a
    tensor is sent, every tensor sent before it holds no memory, and after loading none does."""
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    extra = {"method": "qlora", "lora": {"r": 4, "alpha": 8, "dropout": 0.0}} if method == "qlora" else {}
    train = {"offload": "params", "precision": "bf16-mixed"}
    job = job_dict(tiny_model, tmp_path / "d.jsonl", tmp_path / "ck", train=train, **extra)
    mp.spawn(_watch_rank_0_release, args=(_free_port(), job), nprocs=RANKS, join=True)
