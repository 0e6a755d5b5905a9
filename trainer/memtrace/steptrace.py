"""Peak GPU memory of one real training step, measured on the CPU with fake tensors.
(Over 400 lines: the tracer, its QLoRA stand-in and the per-phase bookkeeping are one measurement;
the allocator replay is already its own module, trainer/memtrace/cuda_allocator.py.)

The trainer's own code runs: `trainer.model.load.prepare_model` (gradient checkpointing, LoRA adapters, the
dtypes of trainable weights), `trainer.model.quant.prepare_quantized` (QLoRA), `trainer.optim.build.make_optimizer`,
the trainer's step (`trainer.train_step.step.accumulate` and `update`: autocast, the chunked loss, backward, clipping,
`optimizer.step()`; with train.optimizer_in_backward each parameter's step runs in its gradient hook during
backward, trainer/optim/in_backward.py), then `zero_grad(set_to_none=True)`. Only the base model's weights are not read: it is
built from its `config.json` (`AutoModelForCausalLM.from_config`, in `trainer.model.load.base_dtype`) inside
`FakeTensorMode`, so no memory is allocated. A `TorchDispatchMode` records every new storage and its
release (weakref finalizers), rounded like the CUDA caching allocator; `trainer.memtrace.cuda_allocator` replays
that stream to get "reserved".

Storages created and freed while the model is built are left out (initialising from a config makes
temporaries that loading a checkpoint does not). What is measured is the steady state: optimizer states exist before the step (as after step 1), then
one micro-batch of full-length sequences (no padding: transformers drops an all-ones
attention mask) runs forward and backward (with the gradients of earlier micro-batches already
accumulated when grad_accum > 1), then the optimizer step.

Substitutions, each because the CPU path differs from the CUDA one (see ../shared/notes/memory-tracing.md):
- dropout goes through `torch.native_dropout` (a 1-byte mask, as on CUDA; CPU's F.dropout keeps a float
  noise tensor);
- transformers' packed-sequence detection is switched off (it only runs on fake tensors);
- a value read back to Python (`.item()`: the logged loss, the optimizer step count) is 1: fake
  tensors hold no values;
- `flash_attention_2` cannot run on a CPU: SDPA's flash path stands in (it saves the same output and
  log-sum-exp);
- QLoRA: bitsandbytes' `Params4bit` cannot wrap a fake tensor, so every linear layer bitsandbytes would
  quantize becomes `_Linear4bitStandIn`: the same packed weight (numel / 2 bytes), absmax (fp32 per
  64 values, or uint8 plus fp32 per 256 blocks with double quantization) and the 16-bit weight
  dequantized in forward and again in backward, as bitsandbytes' `MatMul4Bit` does.
- FSDP (N GPUs): sharding arithmetic on the one-process trace, not a fake process group: parameter,
  gradient and optimizer-state storages count 1/N; autocast's cached 16-bit copies of weights are
  dropped (FSDP's mixed precision gathers 16-bit units instead); during forward and backward two
  gathered decoder layers (current + prefetched) and the root's parameters in the compute dtype are
  added, and in backward one layer's unsharded gradients in fp32 (reduce-scatter input).

With `train.offload: params` the sharded parameter, gradient and optimizer-state storages count in host
RAM (`host_gib`), not on the GPU (FSDP2's CPUOffloadPolicy); the gathered units stay on the GPU.
`--load` adds QLoRA's loading, traced by trainer/memtrace/loadtrace.py (the trainer's sharded-load code on
a fake process group).

`python -m trainer.memtrace.steptrace SPEC.json CONFIG.json --gpus 1,2 [--load]` prints the result as JSON (used by
`ftorch estimate --trace` in a subprocess, so the orchestrator never imports torch).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.memory.facts import (
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    GIB,
    compute_bytes,
    fsdp_overlay_bytes,
)
from trainer.memtrace.cuda_allocator import CachingAllocator, round_size
from trainer.memtrace.live_bytes import LiveBytes
from trainer.model.load import hide_bitsandbytes, needs_bitsandbytes

PHASES = ("load", "forward", "backward", "optimizer")
SHARDED_TAGS = ("param", "grad", "optim")


class TraceUnsupported(RuntimeError):
    """This architecture or option cannot run on fake tensors: use the analytic estimate."""


@dataclass
class TraceResult:
    n_gpus: int
    peak_allocated_gib: float
    peak_reserved_gib: float
    total_gib: float  # reserved + CUDA context + cuBLAS workspace: what nvidia-smi would show
    peak_phase: str
    phases_gib: dict[str, float]
    at_peak_gib: dict[str, float]
    params: int
    trainable_params: int
    seconds: float
    cpu_seconds: float
    expandable_segments: bool
    notes: list[str] = field(default_factory=list)
    #: with train.offload: params, this rank's sharded parameters, gradients and optimizer state, which
    #: FSDP2's CPUOffloadPolicy keeps in host RAM (not counted on the GPU above)
    host_gib: float = 0.0
    #: QLoRA's loading traced (trainer/memtrace/loadtrace.py: LoadTrace as JSON), when asked for
    load: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---- the QLoRA stand-in ----------------------------------------------------------------------------
class _Dequant4bit(torch.autograd.Function):
    """bitsandbytes MatMul4Bit's memory: dequantize to 16 bit in forward, and again in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        ctx.shape = shape
        ctx.save_for_backward(packed)
        weight = torch.empty(shape, dtype=x.dtype, device=x.device)
        return x @ weight.t()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
        return grad @ weight, None, None


class _Linear4bitStandIn(torch.nn.Linear):
    """A 4-bit NF4 linear layer's memory without bitsandbytes kernels (see the module docstring)."""

    def __init__(self, lin: torch.nn.Linear, compute: torch.dtype, double_quant: bool) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = lin.in_features, lin.out_features
        numel = lin.in_features * lin.out_features
        # packed 4-bit values: uint8 here (bitsandbytes may store them in the compute dtype for FSDP: the
        # same bytes; a float stand-in would be upcast by code that spares only bitsandbytes' Params4bit)
        self.weight = torch.nn.Parameter(
            torch.empty((numel + 1) // 2, 1, dtype=torch.uint8), requires_grad=False
        )
        blocks = math.ceil(numel / 64)
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8))
            self.register_buffer("absmax2", torch.empty(math.ceil(blocks / 256), dtype=torch.float32))
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32))
        self.bias = None
        if lin.bias is not None:
            self.bias = torch.nn.Parameter(torch.empty(lin.out_features, dtype=compute), requires_grad=False)
        # named as on bitsandbytes' Linear4bit: PEFT places the adapters in this dtype (bf16 adapters under
        # pure bf16), where the uint8 weight would leave them in fp32
        self.compute_dtype = compute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Dequant4bit.apply(x.to(self.compute_dtype), self.weight, (self.out_features, self.in_features))
        return out + self.bias if self.bias is not None else out


def _quantize_standin(model: torch.nn.Module, spec: JobSpec) -> int:
    """Swap the linear layers bitsandbytes would quantize (all but the output layer) for stand-ins."""
    from trainer.model.quant import COMPUTE, quantizable_linears

    compute = COMPUTE[spec.quantization.compute_dtype]
    swapped = 0
    for name, child in quantizable_linears(model).items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, _Linear4bitStandIn(child, compute, spec.quantization.double_quant))
        swapped += 1
    model.is_loaded_in_4bit = True
    model.config.quantization_config = {"load_in_4bit": True}
    return swapped


# ---- the traced step -------------------------------------------------------------------------------
@contextlib.contextmanager
def _cuda_like() -> Iterator[None]:
    """The substitutions that make the CPU step allocate like the CUDA one (module docstring)."""
    import torch.nn.functional as F
    from transformers import masking_utils

    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0:
            return x
        return torch.native_dropout(x, p, True)[0]

    saved = (F.dropout, masking_utils.find_packed_sequence_indices, torch.nn.Module._apply)
    F.dropout = dropout
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    torch.nn.Module._apply = _apply_replacing  # type: ignore[method-assign]
    try:
        yield
    finally:
        F.dropout, masking_utils.find_packed_sequence_indices, torch.nn.Module._apply = saved


def _apply_replacing(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
    """`Module._apply` that replaces converted parameters: it cannot swap fake ones (PEFT's `.to()`)."""
    if recurse:
        for module in self.children():
            module._apply(fn)
    for key, param in self._parameters.items():
        if param is not None:
            with torch.no_grad():
                new = fn(param)
            if new is not param:
                self._parameters[key] = torch.nn.Parameter(new, requires_grad=param.requires_grad)
    for key, buf in self._buffers.items():
        if buf is not None:
            self._buffers[key] = fn(buf)
    return self


def _build(spec: JobSpec, config: dict[str, Any], attn: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.model.load import base_dtype, prepare_model
    from trainer.model.quant import COMPUTE, prepare_quantized

    cfg = {k: v for k, v in config.items() if k not in ("aliases", "quantization_config")}
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    dtype = COMPUTE[spec.quantization.compute_dtype] if spec.method == "qlora" else base_dtype(spec)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attn)
    if spec.method == "qlora":
        _quantize_standin(model, spec)
        model = prepare_quantized(model, spec)
    return prepare_model(model, spec, torch.device("cpu"))


def _run_step(spec: JobSpec, model: torch.nn.Module, live: LiveBytes, hf_loss: bool) -> tuple[int, int]:
    from trainer.data.dataset import Example
    from trainer.model.load import autocast_dtype, count_parameters
    from trainer.optim.build import make_optimizer

    params, trainable = count_parameters(model)
    for p in model.parameters():
        live.param_storages.add(id(p.untyped_storage()))
        handle = live.handle_of(p)
        if handle is not None:
            live.events[handle].tag = "param"
    for b in model.buffers():
        handle = live.handle_of(b)
        if handle is not None:
            live.events[handle].tag = "param"
    optimizer = make_optimizer(spec, model)
    train = [p for p in model.parameters() if p.requires_grad]
    for p in train:  # optimizer states as after the first step
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _tag_states(optimizer, live)
    model.train()
    _drop_attention_mask(model)
    if spec.train.grad_accum > 1:  # a later micro-batch: the earlier ones' gradients are live
        for p in train:
            p.grad = torch.zeros_like(p)
    vocab = model.get_input_embeddings().weight.shape[0]
    b, s = spec.train.micro_batch_size, spec.data.max_seq_len
    live.phase = "forward"  # the first op autograd's engine runs switches it to "backward"
    amp = autocast_dtype(spec)
    if hf_loss or _step_functions() is None:  # the model's own loss over full logits
        ids = torch.randint(0, vocab, (b, s))
        batch = {"input_ids": ids, "labels": ids.clone()}
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss = model(**batch).loss / spec.train.grad_accum
        del batch, ids
        live.phase = "backward"
        loss.backward()
        del loss
        live.phase = "optimizer"
        if spec.train.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(train, spec.train.max_grad_norm)
        optimizer.step()
    else:
        accumulate, update = _step_functions()
        example = Example(input_ids=[1] * s, labels=[1] * s)  # full length: no padding
        accumulate(model, [[example] * b], spec=spec, device=torch.device("cpu"), pad_id=0)
        live.phase = "optimizer"
        update(model, optimizer, spec.train.max_grad_norm)  # no loss scaler: its memory is one scalar
    for p in train:
        handle = live.handle_of(p.grad) if p.grad is not None else None
        if handle is not None:
            live.events[handle].tag = "grad"
    optimizer.zero_grad(set_to_none=True)
    _tag_states(optimizer, live)
    return params, trainable


def _step_functions() -> Any:
    """The trainer's step (trainer/train_step/step.py: token-normalised accumulation and the update), if present."""
    try:
        from trainer.train_step.step import accumulate, update
    except ImportError:
        return None
    return accumulate, update


def _drop_attention_mask(model: torch.nn.Module) -> None:
    """transformers drops an all-ones attention mask on a GPU (SDPA runs causal, no mask); on fake
    tensors it cannot read the values and would build a 4-D mask, so the trace drops it first (at the
    transformers models: the causal LM and its body; their layers take the mask the body builds)."""
    from transformers import PreTrainedModel

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if kwargs.get("attention_mask") is not None:
            kwargs["attention_mask"] = None
        return args, kwargs

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.register_forward_pre_hook(hook, with_kwargs=True)


def _tag_states(optimizer: torch.optim.Optimizer, live: LiveBytes) -> None:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                handle = live.handle_of(value)
                if handle is not None and live.events[handle].tag == "other":
                    live.events[handle].tag = "optim"


def _fsdp_overlay(spec: JobSpec, model: torch.nn.Module) -> tuple[int, int]:
    """(gathered bytes during forward/backward, unsharded fp32 gradients of one layer in backward)."""
    from trainer.distributed import decoder_layers

    compute = compute_bytes(spec.train.precision)
    layers = decoder_layers(model)

    def size(params: Any, only_trainable: bool = False) -> tuple[int, int]:
        chosen = [p for p in params if not only_trainable or p.requires_grad]
        n = sum(p.numel() for p in chosen)  # floating weights gather in the compute dtype, packed as they are
        return n, sum(p.numel() * (compute if p.is_floating_point() else p.element_size()) for p in chosen)

    layer_n, layer_b = max(size(layer.parameters()) for layer in layers)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    _root_n, root_b = size([p for p in model.parameters() if id(p) not in in_layers])
    grads_n, _ = max(size(layer.parameters(), True) for layer in layers)
    gather, grads = fsdp_overlay_bytes(layer_b, root_b, grads_n)
    return int(gather), int(grads)


def _replay(
    live: LiveBytes, n: int, overlay: tuple[int, int], expandable: bool, offload: bool = False
) -> tuple[int, int, str, dict[str, int], dict[str, int], int]:
    """Peak allocated and reserved on one GPU of `n`, its phase, the phase peaks, the parts at the peak,
    and the peak host RAM of this rank's offloaded state (`offload`: sharded tags live on the host)."""
    alloc = CachingAllocator(expandable_segments=expandable)
    events = live.events
    sharded = n > 1 or offload  # offload is FSDP2's: one GPU runs as a world of one
    gather, reduce_grads = overlay if sharded else (0, 0)
    size, on_host = {}, set()
    for ev in events:
        nbytes = ev.nbytes
        if sharded and ev.tag in SHARDED_TAGS:
            nbytes = math.ceil(nbytes / n)
            if offload:
                on_host.add(ev.handle)
        elif sharded and ev.tag == "cast":
            nbytes = 0
        if ev.phase == "load" and ev.freed_phase == "load":
            nbytes = 0  # building from a config allocates temporaries loading a checkpoint does not
        size[ev.handle] = nbytes
    host = host_peak = 0
    phase_peaks = dict.fromkeys(PHASES, 0)
    by_tag = dict.fromkeys(("param", "grad", "optim", "cast", "other"), 0)
    best: tuple[int, str, dict[str, int]] = (0, "load", dict(by_tag))
    extra_handle = len(events)
    phase = "load"
    for is_alloc, handle in live.stream:
        ev = events[handle]
        if is_alloc and ev.phase != phase:
            phase = _enter(alloc, phase, ev.phase, gather, reduce_grads, extra_handle)
        if size[handle] == 0:
            continue
        if handle in on_host:
            host += size[handle] if is_alloc else -size[handle]
            host_peak = max(host_peak, host)
            continue
        if is_alloc:
            alloc.malloc(handle, size[handle])
            by_tag[ev.tag] += round_size(size[handle])
        else:
            alloc.free(handle)
            by_tag[ev.tag] -= round_size(size[handle])
        if alloc.allocated > phase_peaks[phase]:
            phase_peaks[phase] = alloc.allocated
        if alloc.allocated > best[0]:
            best = (alloc.allocated, phase, dict(by_tag))
    peak, peak_phase, at_peak = best
    overlay_now = peak - sum(at_peak.values())
    if overlay_now:
        at_peak["fsdp_buffers"] = overlay_now
    return peak, alloc.peak_reserved, peak_phase, phase_peaks, at_peak, host_peak


def _enter(alloc: CachingAllocator, old: str, new: str, gather: int, grads: int, handle: int) -> str:
    """FSDP's buffers: gathered units from forward through backward, one layer's grads in backward."""
    if not gather:
        return new
    if new == "forward" and old in ("load", "optimizer"):
        alloc.malloc(handle, gather)
    if new == "backward" and old == "forward":
        alloc.malloc(handle + 1, grads)
    if new == "optimizer":
        alloc.free(handle)
        alloc.free(handle + 1)
    if new == "forward" and old == "backward":  # next micro-batch
        alloc.free(handle + 1)
    return new


def trace(
    spec: JobSpec,
    config: dict[str, Any],
    n_gpus: list[int] | None = None,
    expandable_segments: bool = True,
    hf_loss: bool = False,
    load: bool = False,
) -> list[TraceResult]:
    """Trace one training step of `spec` on a model built from `config` (an HF config.json mapping).
    `hf_loss` swaps the trainer's loss for the model's own (full logits), the HF Trainer's stack that
    published measurements ran (bench/calibrate_memory.py). `load` also traces QLoRA's loading on each
    GPU count (trainer/memtrace/loadtrace.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started, cpu = time.perf_counter(), time.process_time()
    notes = []
    from trainer.model.attention import planned

    attn = planned(spec.train.attn_implementation)  # auto: traced as SDPA, as the estimate counts it
    if attn == "flash_attention_2":
        attn = "sdpa"
        notes.append("flash_attention_2 traced as SDPA's flash path (same saved tensors)")
    if spec.method == "qlora":
        notes.append("4-bit linear layers traced with a stand-in of bitsandbytes' memory (packed + absmax)")
    offload = spec.train.offload == "params"
    if offload:
        notes.append("CPU offload: sharded parameters, gradients and optimizer state counted in host RAM")
    live = LiveBytes()
    try:
        with _cuda_like(), FakeTensorMode(allow_non_fake_inputs=True), live:
            torch.manual_seed(spec.train.seed)
            model = _build(spec, config, attn)
            params, trainable = _run_step(spec, model, live, hf_loss)
            sharded = offload or any(n > 1 for n in n_gpus or [1])
            overlay = _fsdp_overlay(spec, model) if sharded else (0, 0)
    except TraceUnsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of an architecture on fake tensors
        raise TraceUnsupported(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    results = []
    for n in n_gpus or [1]:
        peak, reserved, phase, phases, at_peak, host = _replay(live, n, overlay, expandable_segments, offload)
        reserved_total = reserved + CUBLAS_WORKSPACE_BYTES
        results.append(
            TraceResult(
                n_gpus=n,
                peak_allocated_gib=peak / GIB,
                peak_reserved_gib=reserved_total / GIB,
                total_gib=(reserved_total + CUDA_CONTEXT_BYTES) / GIB,
                peak_phase=phase,
                phases_gib={k: v / GIB for k, v in phases.items()},
                at_peak_gib={k: v / GIB for k, v in at_peak.items() if v},
                params=params,
                trainable_params=trainable,
                seconds=time.perf_counter() - started,
                cpu_seconds=time.process_time() - cpu,
                expandable_segments=expandable_segments,
                notes=notes + ([f"FSDP x{n}: sharding arithmetic on the one-process trace"] if n > 1 else []),
                host_gib=host / GIB,
            )
        )
    if load and spec.method == "qlora":
        from trainer.memtrace.loadtrace import trace_load

        for result in results:
            try:
                result.load = trace_load(spec, config, result.n_gpus).to_json()
            except Exception as exc:  # noqa: BLE001 - the step's trace stands; the load stays estimated
                result.notes.append(f"load not traced ({type(exc).__name__}: {str(exc)[:120]})")
    return results


def main(argv: list[str]) -> int:
    """`python -m trainer.memtrace.steptrace SPEC.json CONFIG.json [--gpus 1,2] [--classic-allocator] [--load]`."""
    spec = JobSpec.model_validate(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    config = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    gpus = [1]
    if "--gpus" in argv:
        gpus = [int(x) for x in argv[argv.index("--gpus") + 1].split(",")]
    torch.set_num_threads(1)
    if not needs_bitsandbytes(spec):  # peft imports it when installed: a second for nothing
        hide_bitsandbytes()
    try:
        results = trace(
            spec,
            config,
            gpus,
            expandable_segments="--classic-allocator" not in argv,
            load="--load" in argv,
        )
    except TraceUnsupported as exc:
        sys.stdout.write(json.dumps({"error": str(exc)}) + "\n")
        return 3
    sys.stdout.write(json.dumps({"results": [r.to_json() for r in results]}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
