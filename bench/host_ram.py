"""Host RAM of sharded loading with CPU offload, measured: rank 0 releasing its copy as it sends, or not.

    PYTHONPATH=. python bench/host_ram.py [--method full|qlora|lora] [--layers 6,18] [--hidden 1024]

With `train.offload: params` every rank's shards live in host RAM, on the same machine as rank 0's whole
CPU copy of the model. trainer/model/sharded_load.py `send_tensors` frees each tensor of that copy once it is
sent, so the machine should peak at about the copy, not the copy plus the shards; the planner's estimate
counts it so (trainer/memory/load_memory.py `host_peak_bytes`). This runs the trainer's real loading
(`Sharded(cpu, offload=True).load`) on 2 gloo ranks, as built and with the release turned off (the
loading before this change), side by side in one run, for two model sizes.

Measured: the machine's anonymous resident memory (RssAnon of both ranks, summed, sampled together by
this process about every millisecond), its peak during loading above where it stood when loading began.
RssAnon leaves out the safetensors file rank 0 maps (clean file pages the kernel can drop). Per-tensor
costs (the tensor in flight, gloo's buffers, the allocator's slack) do not grow with the number of
layers, so the slope between the two sizes, peak growth / copy growth, is the per-byte cost the
estimate's rule is about: 2 when the copy and the shards are held together, 1 when the copy is released
as the shards fill.

The ranks run with MALLOC_MMAP_THRESHOLD_=1 MiB so that glibc treats this model's 4-11 MiB tensors as it
treats a 70B model's (each above its 32 MiB ceiling: mapped alone, returned to the kernel when freed).

What it covers: the host side of sharded loading on Linux with real tensors, a Llama-shaped model built
from a config (no download): full fine-tuning (an fp32 master copy upcast from bf16: anonymous memory),
QLoRA (rank 0's 4-bit copy, quantized by bitsandbytes on the CPU), LoRA (a bf16 copy that transformers
maps straight from the file: little anonymous memory to release). What it does not: pinned memory (CPU
offload pins only on CUDA), the training step's gradients and optimizer state, models at 70B scale.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MIB = 2**20


def _anon_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def _rank(rank: int, port: int, job: dict[str, Any], release: bool, out: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch

    torch.set_num_threads(1)
    from trainer.config import JobSpec
    from trainer.distributed import Sharded
    from trainer.model import sharded_load

    copy_bytes = []
    loaded_at = []
    load_model = sharded_load.load_model

    def measured_copy(*args: Any, **kwargs: Any) -> torch.nn.Module:
        model = load_model(*args, **kwargs)
        copy_bytes.append(sum(p.untyped_storage().nbytes() for p in model.parameters()))
        loaded_at.append(time.time())
        return model

    sharded_load.load_model = measured_copy
    if not release:  # the loading before rank 0 released its copy as it sent
        sharded_load.release = lambda _param: None
    spec = JobSpec.model_validate(job)
    cpu = torch.device("cpu")
    par = Sharded(cpu, offload=True)
    par.dist.barrier()
    time.sleep(0.2)  # the sampler sees both ranks settled before loading begins
    started = time.time()
    model = par.load(spec, cpu)
    par.dist.barrier()
    shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    result = {
        "start": started,
        "loaded": loaded_at[0] if loaded_at else started,
        "end": time.time(),
        "copy": copy_bytes[0] if copy_bytes else 0,
        "shards": shards,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    par.dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load_once(job: dict[str, Any], release: bool) -> dict[str, float]:
    """One 2-rank load; the machine's peak RssAnon above its level at the start of loading (MiB), with
    the copy's and the shards' bytes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        context = mp.spawn(_rank, args=(_port(), job, release, out), nprocs=2, join=False)
        pids = [p.pid for p in context.processes]
        samples: list[tuple[float, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                try:
                    samples.append((time.time(), sum(_anon_kib(pid) for pid in pids)))
                except OSError:
                    pass
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        while not context.join():
            pass
        done.set()
        sampler.join()
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in (0, 1)]
    start, loaded, end = max(r["start"] for r in ranks), ranks[0]["loaded"], min(r["end"] for r in ranks)
    base = next(kib for t, kib in samples if t >= start - 0.1)

    def peak(since: float, until: float) -> float:
        return (max(kib for t, kib in samples if since <= t <= until) - base) / 1024

    return {
        "peak": peak(start, end),
        "load_model": peak(start, loaded),  # rank 0 building its copy (from_pretrained)
        "send": peak(loaded, end),  # the shards filling from it
        "copy": ranks[0]["copy"] / MIB,
        "shards": (ranks[0]["shards"] + ranks[1]["shards"]) / MIB,
    }


def _model(tmp: str, layers: int, hidden: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = Path(tmp, f"model-{layers}")
    config = LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
    return model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="6,18", help="two model depths, comma-separated")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--method", choices=("full", "qlora", "lora"), default="full")
    args = parser.parse_args()
    depths = [int(n) for n in args.layers.split(",")]
    # a 70B model's tensors are hundreds of MiB, above glibc's largest mmap threshold (32 MiB): each is
    # mapped on its own and returned to the kernel when freed. This model's are 4-11 MiB; without this
    # they would come from the heap, whose freed chunks stay resident, and blur what is measured.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    rows: dict[tuple[int, bool], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "data.jsonl")
        data.write_text(json.dumps({"instruction": "hi", "output": "there"}) + "\n")
        for layers in depths:
            job = {
                "name": "host-ram",
                "model": str(_model(tmp, layers, args.hidden)),
                "method": args.method,
                "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
                "data": {"path": str(data), "format": "instruction", "max_seq_len": 64},
                "train": {"precision": "bf16-mixed", "offload": "params", "max_steps": 1},
                "checkpoint": {"uri": str(Path(tmp, "ck"))},
            }
            for release in (False, True):  # side by side, one run
                rows[layers, release] = load_once(job, release)
    print(f"{args.method}, Llama-shaped, hidden {args.hidden}, 2 gloo ranks, CPU offload; MiB of RssAnon")
    print(
        "| layers | rank 0's copy | shards (both ranks) | peak building the copy | peak sending, copy kept "
        "| peak sending, copy released | released / kept |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for layers in depths:
        keep, now = rows[layers, False], rows[layers, True]
        print(
            f"| {layers} | {now['copy']:.0f} | {now['shards']:.0f} | {now['load_model']:.0f} | "
            f"{keep['send']:.0f} | {now['send']:.0f} | {now['send'] / keep['send']:.2f} |"
        )
    small, large = depths[0], depths[-1]
    grown = rows[large, True]["copy"] - rows[small, True]["copy"]

    def slope(release: bool, phase: str) -> float:
        return (rows[large, release][phase] - rows[small, release][phase]) / grown

    print(f"slope (peak growth / copy growth), building the copy: {slope(True, 'load_model'):.2f}")
    print(f"slope, sending with the copy kept: {slope(False, 'send'):.2f}")
    print(f"slope, sending with the copy released: {slope(True, 'send'):.2f}")
    print(
        "the estimate's rule (host_peak_bytes): 1.00 released (max of copy and shards), 2.00 kept (their sum)"
    )


if __name__ == "__main__":
    main()
