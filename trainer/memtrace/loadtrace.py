"""Peak memory of the trainer's QLoRA loading, per GPU, traced on fake tensors (no weights, no GPU).

Two loadings, each traced for one rank:
- **sharded** (trainer/model/sharded_load.py, the trainer's path under FSDP): the trainer's own functions run on
  one rank (rank 1) of torch's fake process group (`FakeProcessGroup`: every collective returns at once, as
  torchtitan's memory estimation uses it): the quantized skeleton (`quantized_meta_model`) is sharded by
  the trainer's FSDP wrapper, `materialize` allocates this rank's shards, and `receive_weights` receives
  every parameter, buffer and quant state one tensor at a time. Rank 0's GPU allocates the same (its
  `whole` is a copy of its CPU tensor instead of an empty one).
- **whole** (the path before sharded loading, and today's fallback when bitsandbytes cannot run on the
  CPU: each rank quantizes the whole base on its GPU as `from_pretrained(device_map={"": device})` streams
  it in): replayed in the model's parameter order, each projection arriving in 16 bit and packed by
  bitsandbytes' own `quantize_4bit` (its fake kernel), the 16-bit copy freed after it; then the adapters.

Each trace records every storage the ops create and free (trainer/memtrace/live_bytes.py) and
replays that stream through the CUDA caching allocator model for "reserved". With `train.offload: params`
the parameters' shards are materialized in host RAM (`materialize`): they count as host, the rest (the
tensor in flight, the quant state, the rotary buffers) as GPU. Rank 0's host also holds its whole CPU copy
of the 4-bit model during the sharded load: the whole replay's final bytes (`rank0_copy_gib`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.memory.facts import CUDA_CONTEXT_BYTES, GIB
from trainer.memtrace.cuda_allocator import CachingAllocator


@dataclass
class LoadTrace:
    ranks: int
    path: str  # "sharded" or "whole"
    peak_allocated_gib: float
    peak_reserved_gib: float
    total_gib: float  # reserved + CUDA context: what nvidia-smi would show at the load's peak
    host_gib: float  # host RAM this rank's loading keeps (offloaded shards; rank 0's copy not included)
    rank0_copy_gib: float  # rank 0's whole CPU copy of the 4-bit model (sharded path), 0 otherwise
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _recorder() -> Any:
    """The storage recorder, counting only storages that hold memory: a DTensor is a wrapper whose own
    storage is nominal (its global size; the local shard is recorded as it is made), and meta tensors
    hold nothing."""
    from torch.distributed.tensor import DTensor

    from trainer.memtrace.live_bytes import LiveBytes

    class _LoadBytes(LiveBytes):
        def track(self, tensor: torch.Tensor, tag: str = "other") -> None:
            if not isinstance(tensor, DTensor) and tensor.device.type != "meta":
                super().track(tensor, tag)

    return _LoadBytes()


def _hf_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    cfg = {k: v for k, v in config.items() if k not in ("aliases", "quantization_config")}
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def _quantized_names(hf_config: Any) -> dict[str, tuple[int, int]]:
    """The linear layers bitsandbytes quantizes (trainer/model/quant.py), with their (out, in) shapes."""
    from transformers import AutoModelForCausalLM

    from trainer.model.quant import quantizable_linears

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    return {name: (m.out_features, m.in_features) for name, m in quantizable_linears(plain).items()}


def _quantize(shape: tuple[int, int], spec: JobSpec, storage: torch.dtype) -> tuple[torch.Tensor, Any]:
    """bitsandbytes' quantize_4bit of one fake 16-bit weight: (packed data, QuantState)."""
    import bitsandbytes.functional as bf

    from trainer.model.quant import COMPUTE

    weight = torch.empty(shape, dtype=COMPUTE[spec.quantization.compute_dtype])
    q = spec.quantization
    packed, state = bf.quantize_4bit(
        weight, quant_type=q.quant_type, compress_statistics=q.double_quant, quant_storage=storage
    )
    del weight
    return packed, state


def _warm_bitsandbytes() -> None:
    """bitsandbytes builds its 8-bit code map from Python numbers on first use: do it on real tensors."""
    import bitsandbytes.functional as bf

    bf.quantize_blockwise(torch.ones(256))


def _peaks(live: Any, host: set[int]) -> tuple[int, int, int]:
    """(peak allocated, peak reserved) on the GPU and bytes in host RAM, from the recorded stream."""
    alloc = CachingAllocator(expandable_segments=True)
    host_bytes = 0
    peak = 0
    for is_alloc, handle in live.stream:
        nbytes = live.events[handle].nbytes
        if handle in host:
            host_bytes += nbytes if is_alloc else -nbytes
            continue
        if nbytes == 0:
            continue
        if is_alloc:
            alloc.malloc(handle, nbytes)
        else:
            alloc.free(handle)
        peak = max(peak, alloc.allocated)
    return peak, alloc.peak_reserved, host_bytes


def _adapter_dtype(spec: JobSpec) -> torch.dtype:
    from trainer.memory.load_memory import adapter_bytes
    from trainer.model.quant import COMPUTE

    return (
        COMPUTE[spec.quantization.compute_dtype]
        if adapter_bytes(spec.train.precision) == 2
        else torch.float32
    )


_WHOLE: dict[str, LoadTrace] = {}


def trace_whole(spec: JobSpec, config: dict[str, Any]) -> LoadTrace:
    """One GPU quantizing the whole base as it streams in (see the module docstring), then the adapters.
    Traced once per model and settings in a process: every sharded trace needs it for rank 0's copy."""
    key = json.dumps([config, spec.quantization.model_dump(mode="json"), spec.lora.model_dump(mode="json"),
                      spec.train.precision], sort_keys=True, default=str)  # fmt: skip
    if key not in _WHOLE:
        _WHOLE[key] = _trace_whole(spec, config)
    return _WHOLE[key]


def _trace_whole(spec: JobSpec, config: dict[str, Any]) -> LoadTrace:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainer.model.quant import COMPUTE

    started = time.perf_counter()
    hf_config = _hf_config(config)
    quantized = _quantized_names(hf_config)
    compute = COMPUTE[spec.quantization.compute_dtype]
    _warm_bitsandbytes()
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(hf_config, dtype=compute)
    adapters = _adapter_shapes(spec, hf_config)
    live, kept = _recorder(), []
    with FakeTensorMode(allow_non_fake_inputs=True), live, torch.no_grad():
        for name, param in plain.named_parameters():
            module = name.rsplit(".", 1)[0]
            if module in quantized and name.endswith(".weight"):
                packed, state = _quantize(quantized[module], spec, compute)
                kept.append((packed, state))
            else:
                kept.append(torch.empty(param.shape, dtype=compute))
        kept += [torch.empty(shape, dtype=_adapter_dtype(spec)) for shape in adapters]
    peak, reserved, _ = _peaks(live, set())
    del kept
    return LoadTrace(
        1, "whole", peak / GIB, reserved / GIB, (reserved + CUDA_CONTEXT_BYTES) / GIB, 0.0, 0.0,
        time.perf_counter() - started,
    )  # fmt: skip


def _adapter_shapes(spec: JobSpec, hf_config: Any) -> list[torch.Size]:
    """The LoRA parameters' shapes, from the trainer's own `prepare_model` on a meta model."""
    from transformers import AutoModelForCausalLM

    from trainer.model.load import prepare_model

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
        model = prepare_model(plain, spec, torch.device("meta"))
    return [p.shape for n, p in model.named_parameters() if p.requires_grad]


def trace_sharded(spec: JobSpec, config: dict[str, Any], ranks: int) -> LoadTrace:
    """One rank of `ranks` running trainer/model/sharded_load.py's QLoRA loading on a fake process group."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainer.distributed import Sharded
    from trainer.model import sharded_load
    from trainer.model.quant import COMPUTE

    started = time.perf_counter()
    hf_config = _hf_config(config)
    compute = COMPUTE[spec.quantization.compute_dtype]
    quantized = _quantized_names(hf_config)
    _warm_bitsandbytes()
    offload = spec.train.offload == "params"
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=1 if ranks > 1 else 0, world_size=ranks)
    try:
        par = Sharded.on_group(torch.device("cpu"))
        packed, states = {}, {}
        with FakeTensorMode(allow_non_fake_inputs=True), _recorder():  # it answers .item() too
            for name, shape in quantized.items():
                data, state = _quantize(shape, spec, compute)
                packed[name], states[name] = data.shape, _layout(state)
        model = sharded_load.quantized_meta_model(spec, packed, hf_config)
        layouts = {
            name: states[name.removeprefix("base_model.model.").removesuffix(".base_layer")]
            for name, module in model.named_modules()
            if type(module).__name__ == "Linear4bit"
        }
        adapter = _adapter_dtype(spec)
        sharded_load.match_dtypes(
            model, {n: adapter if "lora_" in n else p.dtype for n, p in model.named_parameters()}
        )
        par.shard_model(model, spec)
        live = _recorder()
        device = torch.device("cpu")
        with FakeTensorMode(allow_non_fake_inputs=True), live:
            sharded_load.materialize(model, device, offload)
            host = {live.handle_of(_local(p)) for p in model.parameters()} if offload else set()
            sharded_load.receive_weights(model, None, layouts, device, make_state=lambda got, _d: got)
        peak, reserved, host_bytes = _peaks(live, {h for h in host if h is not None})
    finally:
        dist.destroy_process_group()
    copy = trace_whole(spec, config)
    return LoadTrace(
        ranks, "sharded", peak / GIB, reserved / GIB, (reserved + CUDA_CONTEXT_BYTES) / GIB,
        host_bytes / GIB, copy.peak_allocated_gib, time.perf_counter() - started,
    )  # fmt: skip


def _local(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def _layout(state: Any) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    from trainer.model.sharded_load import quant_state_layout

    return quant_state_layout(type("Layer", (), {"quant_state": state})())


def trace_load(spec: JobSpec, config: dict[str, Any], ranks: int) -> LoadTrace:
    """The trainer's QLoRA loading on `ranks` GPUs: sharded under FSDP (or offload), else whole."""
    if spec.method != "qlora":
        raise ValueError("the load trace covers QLoRA (full and LoRA loading is estimated)")
    if ranks > 1 or spec.train.offload == "params":
        return trace_sharded(spec, config, ranks)
    return trace_whole(spec, config)
