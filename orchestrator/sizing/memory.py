"""Peak GPU memory per GPU for a fine-tuning job: full, LoRA and QLoRA, with or without FSDP sharding.
(Over 400 lines: each term below mirrors one part of the trainer's step, with the trace-derived
constants; keeping them in one place is what lets tests/orchestrator_tests/sizing/test_memory_trace.py hold it to the trace.)

This is the fast, analytic twin of `ftorch estimate --trace` (trainer/memtrace/steptrace.py, one real training step
of ftorch's trainer on fake tensors). The planner sizes hundreds of offers with it. Its terms follow the
trainer as it runs:

- weights as stored: a full fine-tune's weights in the trainable dtype (fp32 master under mixed
  precision); LoRA's frozen base in the compute dtype and fp32 adapters; QLoRA's NF4 projections (packed
  4 bit + absmax) with the rest of the base in the compute dtype;
- gradients and optimizer states of the trainable parameters (exact sizes);
- autocast's cached 16-bit copies of fp32 weights during the forward (full fine-tuning, mixed precision);
- saved activations from an op-by-op count of one decoder layer (the layer layout of the architecture,
  checkpointed or not), times a factor per regime; eager attention's s x s matrices at their exact size;
- the loss: one chunk of logits (the trainer's chunked cross-entropy), times bytes per logit element;
- the optimizer step's temporaries (single-tensor AdamW: about two copies of the largest trainable tensor);

taking the *peak over phases* (forward/backward, backward with gradients filled, optimizer step, and the
load before the first step: trainer/memory/load_memory.py says what the trainer's loading puts on each GPU;
QLoRA loads its whole 4-bit model on every rank, so under FSDP a QLoRA model that does not fit one GPU
is refused for its load), then
reserved = allocated x (1 + allocator slack) + the cuBLAS workspace, and the CUDA context on top
(`peak_gib_per_gpu`, what the device must hold). The factors are fitted by bench/derive_memory_constants.py
to traces over a grid of architectures and settings (orchestrator/data/memory_constants.json), never to a
published benchmark; tests/orchestrator_tests/sizing/test_memory_trace.py holds this estimate within 10% of those traces.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.sizing.shapes import ModelShape, resolve_shape
from trainer.memory import facts
from trainer.memory.facts import GIB
from trainer.memory.load_memory import (
    NF4_BYTES,
    NF4_DATA_BYTES,
    NF4_DQ_BYTES,
    WeightCounts,
    host_peak_bytes,
    load_host_bytes,
    load_peak_bytes,
)
from trainer.model.attention import planned as planned_attention
from trainer.model.attention import planned_packing

CONSTANTS_FILE = "memory_constants.json"


@dataclass(frozen=True)
class Constants:
    """The estimator's constants; RAW holds first-principles values, the fitted ones come from traces."""

    #: CUDA context and kernels: on the device, invisible to torch's counters (trainer/memory/facts.py)
    cuda_context_gib: float = facts.CUDA_CONTEXT_BYTES / GIB
    #: cuBLAS workspace, taken through the allocator (trainer/memory/facts.py)
    workspace_gib: float = facts.CUBLAS_WORKSPACE_BYTES / GIB
    #: caching-allocator slack (reserved above allocated) with expandable segments
    alloc_slack: float = 0.03
    #: factors on the op-by-op activation count, per regime (adapters or full; checkpointed or not)
    act_adapter_ckpt: float = 1.0
    act_adapter: float = 1.0
    act_full_ckpt: float = 1.0
    act_full: float = 1.0
    #: factor on eager attention's s x s matrices (fp32 softmax + 16-bit copy per layer)
    eager_factor: float = 1.0
    #: bytes per logit element of one loss chunk at the loss's peak (three fp32 copies: 12)
    logits_bytes: float = 12.0
    #: logit elements per chunk of the trainer's chunked cross-entropy (trainer/train_step/loss.py)
    chunk_elements: float = float(1 << 26)
    #: fraction of the 16-bit weight copies autocast keeps through a full fine-tune's forward
    cast_factor: float = 1.0
    #: optimizer-step temporaries, in units of the largest trainable tensor
    step_temp: float = 2.0


RAW = Constants()
#: stated, not fitted (trainer/memory/facts.py): the calibration file's copies are not read
STATED = ("cuda_context_gib", "workspace_gib")


@lru_cache(maxsize=1)
def calibrated_constants() -> Constants:
    """The constants bench/derive_memory_constants.py fitted to traces (RAW if the file is missing)."""
    try:
        text = resources.files("orchestrator").joinpath(f"data/{CONSTANTS_FILE}").read_text("utf-8")
    except (FileNotFoundError, OSError):
        return RAW
    fitted = json.loads(text).get("constants", {})
    known = {
        k: float(v) for k, v in fitted.items() if k in Constants.__dataclass_fields__ and k not in STATED
    }
    return replace(RAW, **known)


@dataclass(frozen=True)
class Settings:
    """What decides memory, independent of the job file (the calibration script builds these directly)."""

    method: str = "lora"  # full | lora | qlora
    precision: str = "bf16-mixed"  # fp32 | bf16 | bf16-mixed | fp16-mixed
    optimizer: str = "adamw"  # adamw | adamw_8bit | paged_adamw_8bit | sgd | adafactor
    micro_batch: int = 1
    seq_len: int = 512
    grad_ckpt: bool = False
    attn: str = "sdpa"  # sdpa | flash_attention_2 | eager
    packing: bool = False  # data.packing: a block-diagonal mask for sdpa / eager (trainer/data/packing.py)
    lora_r: int = 16
    lora_targets: str | tuple[str, ...] = "all-linear"
    lora_dropout: float = 0.05
    double_quant: bool = True
    quant_compute: str = "bf16"
    n_gpus: int = 1
    grad_accum: int = 1
    offload: str = "none"  # train.offload: none | params (FSDP2's CPUOffloadPolicy)
    nodes: int = 1  # machines the n_gpus ranks are spread over (host RAM is per machine)
    #: train.optimizer_in_backward: each parameter steps in its gradient hook (one GPU, no accumulation)
    optimizer_in_backward: bool = False
    #: train.loss (auto | chunked | plain) and train.kernels (trainer/train_step/loss.py, trainer/kernels.py)
    loss: str = "auto"
    kernels: tuple[str, ...] = ()


@dataclass
class MemoryEstimate:
    model: str
    method: str
    n_gpus: int
    peak_gib_per_gpu: float  # reserved + CUDA context: what the device must hold
    breakdown_gib: dict[str, float]
    params: int
    trainable_params: int
    #: the phase that sets the peak: forward_backward | backward_grads | optimizer_step | load
    peak_phase: str
    #: paged optimizer states live in unified memory and are evicted to the host under pressure
    paged_optimizer_gib: float = 0.0
    sharding: str = "none"
    settings: dict[str, Any] = field(default_factory=dict)
    phases_gib: dict[str, float] = field(default_factory=dict)
    #: torch.cuda.max_memory_allocated and max_memory_reserved as the estimate predicts them
    peak_allocated_gib: float = 0.0
    peak_reserved_gib: float = 0.0
    #: what the trainer's loading holds per GPU at its peak (reserved + CUDA context), before the step
    load_gib_per_gpu: float = 0.0
    #: host RAM per machine (the one rank 0 loads on): offloaded state of its ranks, rank 0's loading
    #: copy, and each trainer process; its parts in `host_breakdown_gib`
    host_gib: float = 0.0
    host_breakdown_gib: dict[str, float] = field(default_factory=dict)
    offload: str = "none"

    def fits(self, gpu_memory_gib: float, headroom: float) -> bool:
        return self.peak_gib_per_gpu <= gpu_memory_gib * (1.0 - headroom)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "method": self.method,
            "n_gpus": self.n_gpus,
            "sharding": self.sharding,
            "peak_gib_per_gpu": round(self.peak_gib_per_gpu, 3),
            "peak_allocated_gib": round(self.peak_allocated_gib, 3),
            "peak_reserved_gib": round(self.peak_reserved_gib, 3),
            "peak_phase": self.peak_phase,
            "load_gib_per_gpu": round(self.load_gib_per_gpu, 3),
            "breakdown_gib": {k: round(v, 3) for k, v in self.breakdown_gib.items()},
            "phases_gib": {k: round(v, 3) for k, v in self.phases_gib.items()},
            "paged_optimizer_gib": round(self.paged_optimizer_gib, 3),
            "offload": self.offload,
            "host_gib": round(self.host_gib, 3),
            "host_breakdown_gib": {k: round(v, 3) for k, v in self.host_breakdown_gib.items()},
            "params": self.params,
            "trainable_params": self.trainable_params,
            "settings": self.settings,
        }


# ---- pieces ------------------------------------------------------------------------------------------
def trainable_params(shape: ModelShape, s: Settings) -> int:
    if s.method == "full":
        return shape.params
    targets = s.lora_targets if isinstance(s.lora_targets, str) else list(s.lora_targets)
    return shape.lora_params(s.lora_r, targets)


def _compute_bytes(s: Settings) -> int:
    """The dtype the forward computes in (QLoRA follows the precision too: it cannot be fp32)."""
    return facts.compute_bytes(s.precision)


def _state_bytes(s: Settings) -> int:
    """dtype of trainable weights, grads and optimizer states: bf16 only in pure-bf16 training."""
    return facts.state_bytes(s.precision)


def _residual_bytes(s: Settings) -> int:
    """The residual stream's dtype: fp32 when the weights are (a full fine-tune's fp32 master weights)."""
    return facts.state_bytes(s.precision) if s.method == "full" else facts.compute_bytes(s.precision)


def _targets(shape: ModelShape, s: Settings) -> list[Any]:
    if s.method == "full":
        return []
    return shape.lora_targets(s.lora_targets if isinstance(s.lora_targets, str) else list(s.lora_targets))


def _largest_trainable(shape: ModelShape, s: Settings) -> int:
    if s.method == "full":
        return max([shape.vocab * shape.hidden] + [lin.d_in * lin.d_out for lin in shape.linears])
    return max(s.lora_r * lin.rank_mult * max(lin.d_in, lin.d_out) for lin in _targets(shape, s))


def _optimizer_bytes(shape: ModelShape, s: Settings, trainable: int) -> tuple[float, bool]:
    """(persistent state bytes, paged) for the trainable parameters (trainer/memory/facts.py's rules)."""
    if s.optimizer not in facts.OPTIMIZERS:
        raise SpecError("train.optimizer", f"unknown optimizer {s.optimizer!r}")
    return facts.optimizer_state_bytes(
        s.optimizer, s.precision, trainable, lambda: _adafactor_bytes(shape, s)
    )


def checkpoint_bytes(shape: ModelShape, s: Settings) -> float:
    """Bytes of one checkpoint of this job: its trainable weights and optimizer state (the planner's
    checkpoint cost; the same optimizer rules as the memory estimate)."""
    if s.optimizer not in facts.OPTIMIZERS:
        raise SpecError("train.optimizer", f"unknown optimizer {s.optimizer!r}")
    trainable = trainable_params(shape, s)
    return facts.checkpoint_bytes(s.optimizer, s.precision, trainable, lambda: _adafactor_bytes(shape, s))


def _adafactor_bytes(shape: ModelShape, s: Settings) -> float:
    """Factored second moments: a row and a column vector per matrix (fp32), full for vectors."""
    if s.method == "full":
        matrices = sum((lin.d_in + lin.d_out) * lin.per_layer for lin in shape.linears) * shape.layers
        matrices += shape.vocab + shape.hidden  # embedding
        if not shape.tie_embeddings:
            matrices += shape.vocab + shape.hidden
        return 4.0 * (matrices + shape.norm_params)
    per_layer = sum(
        (2 * s.lora_r * lin.rank_mult + lin.d_in + lin.d_out) * lin.per_layer for lin in _targets(shape, s)
    )
    return 4.0 * per_layer * shape.layers


def layer_activation_bytes(shape: ModelShape, s: Settings, tokens: int) -> float:
    """Bytes one decoder layer saves for backward, counted op by op from its layout (before the factor)."""
    c, r = _compute_bytes(s), _residual_bytes(s)
    h, q, kv, inter = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    norm = (4 + r) * h  # the fp32 upcast and the input of the weight multiply
    attn = c * h + c * (2 * q + 2 * kv) + 4 * shape.heads  # qkv input; q, k, v, output; log-sum-exp
    two_matrix = shape.family in ("falcon", "gpt_neox", "phi")
    if shape.experts:
        k = shape.experts_per_token
        mlp = c * h + k * (c * h + 4 * c * inter) + 4 * shape.experts  # routed copies; router logits
    else:
        mlp = c * h + (2 if two_matrix else 4) * c * inter  # input; gate/up/act/product or fc1/act
    per_token = shape.norms_per_layer * norm + attn + mlp
    for lin in _targets(shape, s):  # each adapter keeps its input (dropout output and mask) and A's output
        drop = (c + 1) * lin.d_in if s.lora_dropout > 0 else 0
        per_token += (drop + c * s.lora_r * lin.rank_mult) * lin.per_layer * lin.active
    return float(per_token * tokens)


def _attention_matrix_bytes(shape: ModelShape, s: Settings, k: Constants) -> float:
    """Eager attention keeps the softmax output in fp32 (for its backward) and in 16 bit (for A @ V)."""
    if s.attn != "eager":
        return 0.0  # flash / memory-efficient SDPA keep no s x s matrices
    return (
        float((4 + _compute_bytes(s)) * shape.heads * s.seq_len * s.seq_len * s.micro_batch) * k.eager_factor
    )


def activation_bytes(shape: ModelShape, s: Settings, k: Constants) -> float:
    """Saved activations of one micro-batch (not sharded by FSDP: each GPU keeps its own)."""
    tokens = s.micro_batch * s.seq_len
    layer = layer_activation_bytes(shape, s, tokens)
    scores = _attention_matrix_bytes(shape, s, k)
    adapter = s.method != "full"
    if s.grad_ckpt:  # each layer keeps its input; one layer is recomputed in full during backward
        factor = k.act_adapter_ckpt if adapter else k.act_full_ckpt
        saved = shape.layers * _residual_bytes(s) * shape.hidden * tokens + factor * layer + scores
    else:
        factor = k.act_adapter if adapter else k.act_full
        saved = shape.layers * (factor * layer + scores)
    if s.attn == "eager":
        saved += _compute_bytes(s) * s.seq_len * s.seq_len * s.micro_batch  # the 4-D causal mask
    if s.packing:
        from trainer.data.packing import mask_bytes

        saved += mask_bytes(s.micro_batch, s.seq_len, s.attn, _compute_bytes(s))
    return saved + (4 + 2 * _compute_bytes(s)) * shape.hidden * tokens  # final norm, head input


#: Liger's fused linear cross-entropy: bytes per logit element of its block (the block's logits in the
#: compute dtype, their fp32 gradient written in place; modelled from its source, not measured)
LIGER_LOGIT_BYTES = 6.0


def liger_block_tokens(tokens: int, shape: ModelShape) -> int:
    """Liger's block: the next power of two of tokens / ceil(vocab / hidden), so that a block's logits
    are about the size of the hidden states."""
    rows = math.ceil(tokens / max(1, math.ceil(shape.vocab / max(1, shape.hidden))))
    return min(tokens, 1 << max(0, rows - 1).bit_length())


def logits_bytes(shape: ModelShape, s: Settings, k: Constants) -> float:
    """The loss's logits at its peak: one chunk of the chunked cross-entropy (its logits, upcast and
    gradient), at most the batch; the whole micro-batch's with `train.loss: plain` (under `auto` plain
    runs only where they fit in one chunk: the same bytes); Liger's block with its fused kernel."""
    tokens = s.micro_batch * s.seq_len
    if "liger_fused_ce" in s.kernels:
        return LIGER_LOGIT_BYTES * liger_block_tokens(tokens, shape) * shape.vocab
    if s.loss == "plain":
        return k.logits_bytes * tokens * shape.vocab
    chunk = max(1, int(k.chunk_elements) // shape.vocab)
    return k.logits_bytes * min(tokens, chunk) * shape.vocab


def _weights(shape: ModelShape, s: Settings, trainable: int) -> tuple[float, float, float, float]:
    """(stored bytes, one decoder layer as gathered, the root as gathered, QLoRA's dequantized buffers)."""
    c, sb, psi = _compute_bytes(s), _state_bytes(s), shape.params
    if s.method == "full":
        stored = sb * psi
        return stored, c * shape.layer_params, c * (psi - shape.layers * shape.layer_params), 0.0
    adapter = sb * trainable
    root = c * (psi - shape.layers * shape.layer_params)
    if s.method == "lora":
        return c * psi + adapter, c * shape.layer_params, root, 0.0
    qb = NF4_DQ_BYTES if s.double_quant else NF4_BYTES
    quant = shape.quantizable_params
    layer_quant = quant / shape.layers
    biggest = max(lin.d_in * lin.d_out for lin in shape.linears)
    return (
        qb * quant + c * (psi - quant) + adapter,
        qb * layer_quant + c * (shape.layer_params - layer_quant),
        root,
        2.0 * c * biggest,  # one dequantized weight in flight, plus the next one
    )


# ---- the estimate ------------------------------------------------------------------------------------
def estimate(shape: ModelShape, s: Settings, constants: Constants | None = None) -> MemoryEstimate:
    """Peak memory per GPU for `shape` trained with settings `s` (FSDP FULL_SHARD when n_gpus > 1)."""
    k = constants or calibrated_constants()
    if s.method not in ("full", "lora", "qlora"):
        raise SpecError("method", f"unknown method {s.method!r}")
    n = max(1, s.n_gpus)
    trainable = trainable_params(shape, s)
    held, host, sharding = _held_bytes(shape, s, k, trainable)
    parts_by_phase = _phase_parts(shape, s, k, held)
    load_allocated = sum(load_parts(shape, s, trainable).values())
    settings = asdict(s)
    if isinstance(settings["lora_targets"], tuple):
        settings["lora_targets"] = list(settings["lora_targets"])
    return MemoryEstimate(
        model=shape.name,
        method=s.method,
        n_gpus=n,
        params=shape.params,
        trainable_params=trainable,
        paged_optimizer_gib=held.paged_optim / GIB,
        sharding=sharding,
        settings=settings,
        host_gib=sum(host.values()) / GIB,
        host_breakdown_gib={key: val / GIB for key, val in host.items()},
        offload=s.offload,
        **_peak(parts_by_phase, load_allocated, k),
    )


@dataclass(frozen=True)
class _Held:
    """Bytes one GPU holds for the step, by what they are (before the phases pick them)."""

    stored: float  # the weights as stored (a shard under FSDP)
    gather: float  # FSDP's gathered units in forward and backward
    dequant: float  # QLoRA's dequantized weights in flight
    cast: float  # autocast's cached 16-bit copies of fp32 weights
    grads: float
    optim: float  # the optimizer's state resident on the GPU
    step_temp: float  # the optimizer step's temporaries
    reduce_buf: float  # FSDP's reduce-scatter buffer in backward
    paged_optim: float  # the optimizer's state paged to unified memory instead (not resident)


def _held_bytes(
    shape: ModelShape, s: Settings, k: Constants, trainable: int
) -> tuple[_Held, dict[str, float], str]:
    """(what each GPU holds, host RAM by part, the sharding): FSDP shards the weights, gradients and
    optimizer state over the GPUs; CPU offload moves them to host RAM."""
    n = max(1, s.n_gpus)
    sb = _state_bytes(s)
    stored, layer_gathered, root_gathered, dequant = _weights(shape, s, trainable)
    cast = 0.0  # autocast's 16-bit copies of fp32 weights, cached through the forward
    if s.method == "full" and s.precision in facts.MIXED:
        cast = k.cast_factor * _compute_bytes(s) * (shape.linear_params + shape.vocab * shape.hidden)
    grads = float(sb * trainable)
    optim, paged = _optimizer_bytes(shape, s, trainable)
    resident_optim = 0.0 if paged else optim
    step_temp = k.step_temp * sb * _largest_trainable(shape, s) if s.optimizer == "adamw" else 0.0
    offload = s.offload == "params"
    if n > 1 or offload:  # offload is FSDP2's: one rank runs as a world of one
        stored, grads, resident_optim, step_temp = stored / n, grads / n, resident_optim / n, step_temp / n
        layer_trainable = trainable / shape.layers if s.method != "full" else shape.layer_params
        gather, reduce_buf = facts.fsdp_overlay_bytes(layer_gathered, root_gathered, layer_trainable)
        cast = 0.0  # FSDP's mixed precision gathers 16-bit units instead
        sharding = f"fsdp-full-shard x{n}" + (" + cpu offload" if offload else "")
    else:
        gather = reduce_buf = 0.0
        sharding = "none"
    host = host_parts(shape, s, trainable, (stored, grads, resident_optim, step_temp))
    if offload:  # the shards, gradients, optimizer state and its step live in host RAM
        stored = _quant_state_bytes(shape, s)  # bitsandbytes' quant state is no parameter: it stays
        grads = resident_optim = step_temp = 0.0
    paged_optim = optim / n if paged else 0.0
    held = _Held(stored, gather, dequant, cast, grads, resident_optim, step_temp, reduce_buf, paged_optim)
    return held, host, sharding


def _phase_parts(shape: ModelShape, s: Settings, k: Constants, held: _Held) -> dict[str, dict[str, float]]:
    """Bytes per GPU by part in each phase of the step: forward/backward, backward with the gradients
    filled, and the optimizer step."""
    acts = activation_bytes(shape, s, k)
    logit = logits_bytes(shape, s, k)
    weights_fb = held.stored + held.gather + held.dequant
    accumulated = held.grads if s.grad_accum > 1 else 0.0
    grads, step_temp, after_step = _in_backward(shape, s, held.grads, held.step_temp)
    return {
        "forward_backward": {
            "weights": weights_fb + held.cast,
            "gradients": accumulated,
            "optimizer": held.optim,
            "activations": acts,
            "logits": logit,
        },
        "backward_grads": {
            "weights": weights_fb,
            "gradients": grads + held.reduce_buf,
            "optimizer": held.optim + (step_temp if s.optimizer_in_backward else 0.0),
            "activations": acts / 2,
            "logits": 0.0,
        },
        "optimizer_step": {
            "weights": held.stored,
            "gradients": after_step,
            "optimizer": held.optim + (0.0 if s.optimizer_in_backward else step_temp),
            "activations": 0.0,
            "logits": 0.0,
        },
    }


def _peak(parts_by_phase: dict[str, dict[str, float]], load_allocated: float, k: Constants) -> dict[str, Any]:
    """MemoryEstimate's peak fields: the phase with the most allocated, reserved = allocated x (1 +
    allocator slack) + the cuBLAS workspace, the CUDA context on top; the load instead when loading the
    model needs more than the step (the trainer could not start)."""
    phases = {p: sum(parts.values()) for p, parts in parts_by_phase.items()}
    phase = max(phases, key=lambda p: phases[p])
    allocated = phases[phase]
    reserved = allocated * (1.0 + k.alloc_slack) + k.workspace_gib * GIB
    context = k.cuda_context_gib * GIB
    parts = dict(parts_by_phase[phase])
    parts["overhead"] = step_extra = reserved - allocated + context
    load_reserved = load_allocated * (1.0 + k.alloc_slack)  # no matmul yet: no cuBLAS workspace
    if load_reserved > reserved:  # the trainer cannot start: loading needs more than the step
        phase, allocated, reserved = "load", load_allocated, load_reserved
        parts = {key: 0.0 for key in parts}
        parts["weights"] = load_allocated
        parts["overhead"] = reserved - allocated + context
    phases_gib = {p: (v + step_extra) / GIB for p, v in phases.items()}
    phases_gib["load"] = (load_reserved + context) / GIB
    return {
        "peak_gib_per_gpu": (reserved + context) / GIB,
        "breakdown_gib": {key: val / GIB for key, val in parts.items()},
        "peak_phase": phase,
        "phases_gib": phases_gib,
        "peak_allocated_gib": allocated / GIB,
        "peak_reserved_gib": reserved / GIB,
        "load_gib_per_gpu": (load_reserved + context) / GIB,
    }


# ---- optimizer step in backward (trainer/optim/in_backward.py) ----
def _in_backward(
    shape: ModelShape, s: Settings, grads: float, step_temp: float
) -> tuple[float, float, float]:
    """(gradients held in backward, step temporaries, gradients held at the optimizer step).

    With the step in backward each parameter steps in its gradient hook and frees its gradient at once
    (autograd runs a parameter's gradient accumulation as soon as it is ready), so about one parameter's
    gradient is held, the largest, and the step's temporaries (of that parameter) come during backward;
    after backward no gradient is left. Otherwise: every gradient, held until the step."""
    if not s.optimizer_in_backward:
        return grads, step_temp, grads
    return float(_state_bytes(s) * _largest_trainable(shape, s)), step_temp, 0.0


# ---- end optimizer step in backward ----


def _quant_state_bytes(shape: ModelShape, s: Settings) -> float:
    """QLoRA's absmax (and nested absmax): every rank keeps it whole, on the GPU (not an FSDP parameter)."""
    if s.method != "qlora":
        return 0.0
    packed = NF4_DQ_BYTES if s.double_quant else NF4_BYTES
    return (packed - NF4_DATA_BYTES) * shape.quantizable_params


def _counts(shape: ModelShape, s: Settings, trainable: int) -> WeightCounts:
    return WeightCounts(
        params=shape.params,
        quantizable=shape.quantizable_params,
        adapters=trainable if s.method != "full" else 0,
        largest_quantizable=max(lin.d_in * lin.d_out for lin in shape.linears),
        largest_tensor=max([shape.vocab * shape.hidden] + [lin.weight_params for lin in shape.linears]),
    )


def host_parts(
    shape: ModelShape, s: Settings, trainable: int, per_rank: tuple[float, float, float, float]
) -> dict[str, float]:
    """Host RAM of the machine rank 0 runs on, by part: with offload its ranks' shards ("offloaded":
    weights, gradients, optimizer state and the CPU step's temporaries, `per_rank` as sharded), what
    rank 0's loading copy holds beyond them ("loading": the copy is released tensor by tensor as the
    shards fill, so the peak is the larger of the two, trainer/memory/load_memory.py `host_peak_bytes`),
    and each trainer process ("processes", facts.HOST_PROCESS_BYTES). The parts sum to the peak."""
    n = max(1, s.n_gpus)
    nodes = s.nodes if s.nodes >= 1 and n % s.nodes == 0 else 1
    ranks_here = n // nodes
    offload = s.offload == "params"
    loading = load_host_bytes(
        s.method, s.precision, _counts(shape, s, trainable), n,
        double_quant=s.double_quant, quant_compute=s.quant_compute, offload=offload,
    )  # fmt: skip
    weights, grads, optim, temp = per_rank
    if offload:
        weights -= _quant_state_bytes(shape, s) / n  # stays on the GPU
    offloaded = ranks_here * (weights + grads + optim + temp) if offload else 0.0
    return {**host_peak_bytes(loading, offloaded), "processes": float(ranks_here * facts.HOST_PROCESS_BYTES)}


def load_parts(shape: ModelShape, s: Settings, trainable: int) -> dict[str, float]:
    """Bytes per GPU at the peak of the trainer's loading (trainer/memory/load_memory.py decides them)."""
    return load_peak_bytes(
        s.method,
        s.precision,
        _counts(shape, s, trainable),
        max(1, s.n_gpus),
        double_quant=s.double_quant,
        quant_compute=s.quant_compute,
        offload=s.offload == "params",
    )


def settings_from_spec(spec: Any, n_gpus: int | None = None, offload: str | None = None) -> Settings:
    """Settings for a validated JobSpec (n_gpus defaults to resources.gpus, else 1; offload to
    train.offload: the planner asks what an offer needs with offload on).

    The micro-batch and accumulation are those of one rank in the job's layout on n_gpus
    (trainer/layout.py): `train.micro_batch_size` per GPU at most, the effective batch kept."""
    from trainer.layout import layout_for

    targets = spec.lora.target_modules
    n = n_gpus or spec.resources.gpus or 1
    layout = layout_for(spec, n)
    return Settings(
        method=spec.method,
        precision=spec.train.precision,
        optimizer=spec.train.optimizer,
        micro_batch=layout.micro_batch,
        seq_len=spec.data.max_seq_len,
        grad_ckpt=spec.train.gradient_checkpointing,
        attn=planned_attention(spec.train.attn_implementation),  # auto counted as SDPA
        packing=planned_packing(spec.data.packing, spec.train.attn_implementation),  # the trainer's rule
        lora_r=spec.lora.r,
        lora_targets=targets if isinstance(targets, str) else tuple(targets),
        lora_dropout=spec.lora.dropout,
        double_quant=spec.quantization.double_quant,
        quant_compute=spec.quantization.compute_dtype,
        n_gpus=n,
        grad_accum=layout.accum,
        offload=offload or ("params" if spec.train.offload == "params" else "none"),
        nodes=spec.resources.nodes if n % spec.resources.nodes == 0 else 1,
        optimizer_in_backward=getattr(spec.train, "optimizer_in_backward", False),
        loss=spec.train.loss,
        kernels=tuple(spec.train.kernels),
    )


def estimate_memory(
    spec: Any,
    n_gpus: int | None = None,
    *,
    shape: ModelShape | None = None,
    constants: Constants | None = None,
    online: bool = False,
) -> MemoryEstimate:
    """Peak memory per GPU for a job (public interface used by the planner and `ftorch estimate`)."""
    if n_gpus is not None and n_gpus < 1:
        raise SpecError("--gpus", f"must be at least 1 (got {n_gpus})")
    shape = shape or resolve_shape(spec.model, online=online)
    return estimate(shape, settings_from_spec(spec, n_gpus), constants)
