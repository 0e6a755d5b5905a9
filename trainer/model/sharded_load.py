"""Loading a model sharded for FSDP (every method): no GPU ever holds the whole model.

Rank 0 loads the model on the CPU (`trainer.model.load.load_model`: the same weights and the same seeded
adapters as one process gets); every rank builds the same model on the meta device, shards it
(`shard`: fully_shard per decoder layer, then the root), allocates only its own shards on its device
(`to_empty`), and receives rank 0's weights one tensor at a time (`send_tensors`, as DCP's
`set_model_state_dict` with `broadcast_from_rank0` does: a rank holds its shards plus one full tensor in
flight). Buffers, which the state dict may leave out (the rotary tables are not persistent), are
broadcast from rank 0 too. Rank 0 frees each tensor of its copy once sent, so with CPU offload its host
never holds the copy and all the shards at once.

QLoRA's 4-bit base is quantized once on rank 0's CPU and sent the same way (`load_sharded_quantized`).
What each loading holds per GPU is in trainer/memory/load_memory.py, which the planner's estimate asks,
and trainer/memtrace/loadtrace.py traces these same functions on fake tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.model.attention import planned as planned_attention  # the trainer passes auto resolved
from trainer.model.load import base_dtype, hide_bitsandbytes, load_model, needs_bitsandbytes, prepare_model

META = torch.device("meta")


def meta_model(spec: JobSpec) -> torch.nn.Module:
    """The job's model (adapters included) with every tensor on the meta device: structure, no memory."""
    if not needs_bitsandbytes(spec):
        hide_bitsandbytes()
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(spec.model)
    with META:
        model = AutoModelForCausalLM.from_config(
            config,
            dtype=base_dtype(spec),
            attn_implementation=planned_attention(spec.train.attn_implementation),
        )
        return prepare_model(model, spec, META)


def load_sharded(
    spec: JobSpec, device: torch.device, rank: int, shard: Callable[[torch.nn.Module], None]
) -> torch.nn.Module:
    """The job's model, sharded by `shard` over the process group, with rank 0's loaded weights."""
    full = load_model(spec, torch.device("cpu")) if rank == 0 else None
    model = meta_model(spec)
    shard(model)
    materialize(model, device, spec.train.offload == "params")
    send_tensors(model, full, device)
    del full
    return model


def send_tensors(model: torch.nn.Module, full: torch.nn.Module | None, device: torch.device) -> None:
    """Fill the sharded skeleton `model` from rank 0's loaded `full` (None on the other ranks): every
    parameter, then every buffer, broadcast as one whole tensor at a time, each rank keeping its shard.

    Rank 0 releases each parameter of its copy as soon as it is sent. With CPU offload the shards live
    in the same host RAM as the copy, and `to_empty` reserves them without touching a page, so the
    machine holds the copy or the shards of what was sent, not both: its loading peak is the copy, not
    the copy plus the shards (trainer/memory/load_memory.py `host_peak_bytes`)."""
    source = dict(full.named_parameters()) if full is not None else {}
    buffers = dict(full.named_buffers()) if full is not None else {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            sent = source.pop(name, None)
            receive_tensor(param, sent, device)
            if sent is not None:
                release(sent)
        for name, buffer in model.named_buffers():
            receive_tensor(buffer, buffers.get(name), device)


def release(param: torch.Tensor) -> None:
    """Free a parameter's memory while its module lives on (rank 0's copy, once sent)."""
    param.data = torch.empty(0, dtype=param.dtype, device=param.device)


def materialize(model: torch.nn.Module, device: torch.device, offload: bool) -> None:
    """Allocate the sharded meta model's memory: on `device`, or with CPU offload (FSDP2's
    CPUOffloadPolicy wants its sharded parameters materialized in host RAM) the parameters on the CPU
    and the buffers (rotary tables) on `device`, where the forward uses them."""
    if not offload:
        model.to_empty(device=device)
        return
    model.to_empty(device=torch.device("cpu"))
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = torch.empty_like(buffer, device=device)


# ---- QLoRA: the 4-bit base, quantized once on rank 0's host, sent to every rank's shards ------------


def quantized_meta_model(spec: JobSpec, packed: dict[str, torch.Size], config: Any = None) -> torch.nn.Module:
    """The job's QLoRA model on the meta device: transformers' bitsandbytes skeleton (the same Linear4bit
    layers `from_pretrained` makes), each 4-bit weight with its packed shape (`packed`, from rank 0), and
    the adapters. `config` (a transformers config) defaults to the model's own config.json."""
    import bitsandbytes as bnb
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.quantizers import AutoHfQuantizer

    from trainer.model.quant import COMPUTE, bnb_config, prepare_quantized

    config = config if config is not None else AutoConfig.from_pretrained(spec.model)
    quantization = bnb_config(spec)
    quantizer = AutoHfQuantizer.from_config(quantization, pre_quantized=False)
    with META:
        model = AutoModelForCausalLM.from_config(
            config,
            dtype=COMPUTE[spec.quantization.compute_dtype],
            attn_implementation=planned_attention(spec.train.attn_implementation),
        )
        quantizer.preprocess_model(model, device_map={"": META}, dtype=model.dtype)
        for name, module in model.named_modules():
            if isinstance(module, bnb.nn.Linear4bit):
                old = module.weight
                module.weight = bnb.nn.Params4bit(
                    torch.empty(packed[name], dtype=module.quant_storage),
                    requires_grad=False,
                    quant_type=old.quant_type,
                    compress_statistics=old.compress_statistics,
                    quant_storage=module.quant_storage,
                    bnb_quantized=True,
                    module=module,
                )
        quantizer.postprocess_model(model)
        model.hf_quantizer = quantizer
        model.config.quantization_config = quantization
        return prepare_model(prepare_quantized(model, spec), spec, META)


def load_sharded_quantized(
    spec: JobSpec, device: torch.device, rank: int, shard: Callable[[torch.nn.Module], None]
) -> torch.nn.Module:
    """The job's QLoRA model, sharded by `shard`, bitwise what every rank loading it whole would hold.

    Rank 0 quantizes the base once, on its CPU (`load_model(spec, cpu)`: bitsandbytes quantizes each
    projection as from_pretrained streams it in, so rank 0's host holds the 4-bit model plus one 16-bit
    tensor). Every rank builds the quantized skeleton on the meta device, shards it and allocates its
    shards; rank 0 then broadcasts each parameter (packed 4-bit data in the storage dtype, the 16-bit
    rest, the adapters) one tensor at a time, each rank keeping its shard, and each layer's quant state
    (absmax, code, the nested absmax), which FSDP leaves whole on every rank as today."""
    import torch.distributed as dist

    full = load_model(spec, torch.device("cpu")) if rank == 0 else None
    layers = _quant_layers(full)
    base = full.get_base_model() if full is not None else None  # the names before the adapters wrap it
    plan = [
        {n.removesuffix(".base_layer"): tuple(m.weight.shape) for n, m in _quant_layers(base).items()},
        {name: quant_state_layout(m) for name, m in layers.items()},
        {name: p.dtype for name, p in full.named_parameters()} if full is not None else {},
    ]
    dist.broadcast_object_list(plan, src=0)
    packed, layouts, dtypes = plan
    model = quantized_meta_model(spec, {n: torch.Size(s) for n, s in packed.items()})
    match_dtypes(model, dtypes)
    shard(model)
    materialize(model, device, spec.train.offload == "params")
    receive_weights(model, full, layouts, device)
    del full, layers
    return model


def receive_weights(
    model: torch.nn.Module,
    full: torch.nn.Module | None,
    layouts: dict[str, list[tuple[str, tuple[int, ...], torch.dtype]]],
    device: torch.device,
    make_state: Callable[[dict[str, torch.Tensor], torch.device], Any] | None = None,
) -> None:
    """Fill the sharded QLoRA skeleton from rank 0's model `full` (None on the other ranks): parameters
    and buffers one whole tensor at a time (`send_tensors`: rank 0's copy released as it goes), then
    each 4-bit layer's quant state (`make_state` builds it from the received tensors: bitsandbytes'
    QuantState.from_dict)."""
    import bitsandbytes as bnb

    if make_state is None:
        from bitsandbytes.functional import QuantState

        make_state = QuantState.from_dict
    layers = _quant_layers(full)
    send_tensors(model, full, device)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, bnb.nn.Linear4bit):
                got = receive_quant_tensors(layers.get(name), layouts[name], device)
                module.quant_state = make_state(got, device)


def match_dtypes(model: torch.nn.Module, dtypes: dict[str, torch.dtype]) -> None:
    """Give the meta model's parameters rank 0's dtypes: PEFT casts new adapters to the base layer's
    dtype only when that layer holds real memory (bf16 under pure bf16), so on meta they stay fp32."""
    names = {name for name, _ in model.named_parameters()}
    if names != set(dtypes):
        raise RuntimeError(
            f"the sharded QLoRA skeleton differs from rank 0's model: {sorted(names ^ set(dtypes))[:3]}"
        )
    for name, param in model.named_parameters():
        if param.dtype != dtypes[name]:
            param.data = param.data.to(dtypes[name])


def _quant_layers(model: torch.nn.Module | None) -> dict[str, torch.nn.Module]:
    import bitsandbytes as bnb

    if model is None:
        return {}
    return {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def quant_state_layout(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [(k, tuple(t.shape), t.dtype) for k, t in module.quant_state.as_dict(packed=True).items()]


def receive_tensor(target: torch.Tensor, source: torch.Tensor | None, device: torch.device) -> None:
    """Rank 0's whole `source` broadcast to every rank (one tensor in flight), each rank keeping its
    shard of it in `target` (a DTensor parameter under FSDP, or a plain tensor)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    if source is not None:
        whole = source.data.to(device, copy=True)
    else:
        whole = torch.empty(target.shape, dtype=target.dtype, device=device)
    dist.broadcast(whole, src=0)
    if isinstance(target, DTensor):
        mine = distribute_tensor(whole, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(mine.to_local())
    else:
        target.copy_(whole)


def receive_quant_tensors(
    module: torch.nn.Module | None,
    layout: list[tuple[str, tuple[int, ...], torch.dtype]],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The tensors of one layer's quant state, broadcast from rank 0 (what a rank allocates for it)."""
    import torch.distributed as dist

    sent = module.quant_state.as_dict(packed=True) if module is not None else {}
    got: dict[str, torch.Tensor] = {}
    for key, shape, dtype in layout:
        tensor = (
            sent[key].to(device, copy=True)
            if module is not None
            else torch.empty(shape, dtype=dtype, device=device)
        )
        dist.broadcast(tensor, src=0)
        got[key] = tensor
    return got
