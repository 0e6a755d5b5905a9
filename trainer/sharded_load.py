"""Loading a model sharded for FSDP (full fine-tuning and LoRA): no GPU ever holds the whole model.

Rank 0 loads the model on the CPU (`trainer.model.load_model`: the same weights and the same seeded
adapters as one process gets); every rank builds the same model on the meta device, shards it
(`shard`: fully_shard per decoder layer, then the root), allocates only its own shards on its device
(`to_empty`), and receives rank 0's weights one tensor at a time (`set_model_state_dict` with
`broadcast_from_rank0`: a rank holds its shards plus one full tensor in flight). Buffers, which the state
dict may leave out (the rotary tables are not persistent), are broadcast from rank 0 too.

QLoRA still loads whole on each rank (bitsandbytes quantizes as it loads on the device); what each
loading holds per GPU is in trainer/memory/load_memory.py, which the planner's estimate asks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.config import JobSpec
from trainer.model import base_dtype, hide_bitsandbytes, load_model, needs_bitsandbytes, prepare_model

META = torch.device("meta")


def meta_model(spec: JobSpec) -> torch.nn.Module:
    """The job's model (adapters included) with every tensor on the meta device: structure, no memory."""
    if not needs_bitsandbytes(spec):
        hide_bitsandbytes()
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(spec.model)
    with META:
        model = AutoModelForCausalLM.from_config(
            config, dtype=base_dtype(spec), attn_implementation=spec.train.attn_implementation
        )
        return prepare_model(model, spec, META)


def load_sharded(
    spec: JobSpec, device: torch.device, rank: int, shard: Callable[[torch.nn.Module], None]
) -> torch.nn.Module:
    """The job's model, sharded by `shard` over the process group, with rank 0's loaded weights."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = load_model(spec, torch.device("cpu")) if rank == 0 else None
    model = meta_model(spec)
    shard(model)
    model.to_empty(device=device)
    set_model_state_dict(
        model,
        full.state_dict() if full is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    source = dict(full.named_buffers()) if full is not None else {}
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if full is not None:
                buffer.copy_(source[name])
            dist.broadcast(buffer, src=0)
    del full
    return model
