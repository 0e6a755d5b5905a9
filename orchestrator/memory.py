"""Peak GPU memory per GPU for a fine-tuning job: full, LoRA and QLoRA, with or without FSDP sharding.

The model follows ../shared/notes/memory.md (ZeRO model states, Korthikanti activations adapted to
RMSNorm/SwiGLU/flash attention, fp32 logits at the loss, NF4 with double quantization) and takes the
*peak over phases*, not the sum of things that never coexist:

- forward/backward: weights + optimizer states + saved activations + logits at the loss
  (+ gradients already accumulated when grad_accum > 1; otherwise the largest of activations and grads,
  since backward frees one as it fills the other),
- optimizer step: weights + gradients + optimizer states + the step's temporaries (torch's foreach AdamW
  builds one temporary copy of the trainable parameters),

plus a fixed overhead (CUDA context, workspaces) and the caching allocator's slack. A handful of
constants are fitted on ../shared/data/vram/calibration.csv by bench/calibrate_memory.py and stored in
orchestrator/data/memory_calibration.json; `RAW` holds the textbook values they replace.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.shapes import ModelShape, resolve_shape

GIB = 1024**3
NF4_DQ_BYTES = 0.516  # 4 + 8/64 + 32/(64*256) bits (QLoRA paper, section 3)
NF4_BYTES = 0.5625  # 4 + 32/64 bits without double quantization


@dataclass(frozen=True)
class Constants:
    """The estimator's tunable constants; RAW are textbook values, calibrated ones are fitted."""

    #: CUDA context and kernels: on the device, invisible to torch.cuda.max_memory_reserved
    cuda_context_gib: float = 0.5
    #: workspaces (cuBLAS, NCCL) and the allocator's first blocks, seen by torch's reserved counter
    fixed_overhead_gib: float = 0.0
    #: caching-allocator slack (reserved above allocated), as a fraction of the dynamic peak
    alloc_slack: float = 0.0
    #: multiplier on the saved-activation bytes derived from the layer layout
    act_factor: float = 1.0
    #: bytes per logit element held at the loss (Korthikanti et al.: one fp32 copy = 4)
    logits_bytes: float = 4.0


RAW = Constants()


@lru_cache(maxsize=1)
def calibrated_constants() -> Constants:
    """The constants fitted by bench/calibrate_memory.py (RAW if the file is missing)."""
    try:
        text = resources.files("orchestrator").joinpath("data/memory_calibration.json").read_text("utf-8")
    except (FileNotFoundError, OSError):
        return RAW
    fitted = json.loads(text).get("constants", {})
    known = {k: float(v) for k, v in fitted.items() if k in Constants.__dataclass_fields__}
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
    lora_r: int = 16
    lora_targets: str | tuple[str, ...] = "all-linear"
    lora_dropout: float = 0.05
    double_quant: bool = True
    quant_compute: str = "bf16"
    n_gpus: int = 1
    grad_accum: int = 1


@dataclass
class MemoryEstimate:
    model: str
    method: str
    n_gpus: int
    peak_gib_per_gpu: float
    breakdown_gib: dict[str, float]
    params: int
    trainable_params: int
    #: the phase that sets the peak: forward_backward | backward_grads | optimizer_step
    peak_phase: str
    #: paged optimizer states live in unified memory and are evicted to the host under pressure
    paged_optimizer_gib: float = 0.0
    sharding: str = "none"
    settings: dict[str, Any] = field(default_factory=dict)
    phases_gib: dict[str, float] = field(default_factory=dict)

    def fits(self, gpu_memory_gib: float, headroom: float) -> bool:
        return self.peak_gib_per_gpu <= gpu_memory_gib * (1.0 - headroom)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "method": self.method,
            "n_gpus": self.n_gpus,
            "sharding": self.sharding,
            "peak_gib_per_gpu": round(self.peak_gib_per_gpu, 3),
            "peak_phase": self.peak_phase,
            "breakdown_gib": {k: round(v, 3) for k, v in self.breakdown_gib.items()},
            "phases_gib": {k: round(v, 3) for k, v in self.phases_gib.items()},
            "paged_optimizer_gib": round(self.paged_optimizer_gib, 3),
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
    if s.method == "qlora":
        return 4 if s.quant_compute == "fp32" else 2
    return 4 if s.precision == "fp32" else 2


def _state_bytes(s: Settings) -> int:
    """dtype of trainable weights, grads and optimizer states: bf16 only in pure-bf16 training."""
    return 2 if s.precision == "bf16" else 4


def _optimizer_bytes(shape: ModelShape, s: Settings, trainable: int) -> tuple[float, float, bool]:
    """(persistent state bytes, step temporaries, paged) for the trainable parameters."""
    sb = _state_bytes(s)
    if s.optimizer == "adamw":
        return 2 * sb * trainable, sb * trainable, False  # exp_avg, exp_avg_sq; foreach temporary
    if s.optimizer == "adamw_8bit":
        return 2.0 * trainable, 0.0, False
    if s.optimizer == "paged_adamw_8bit":
        return 2.0 * trainable, 0.0, True
    if s.optimizer == "sgd":
        return sb * trainable, 0.0, False  # momentum buffer
    if s.optimizer == "adafactor":
        return _adafactor_bytes(shape, s), 0.0, False
    raise SpecError("train.optimizer", f"unknown optimizer {s.optimizer!r}")


def _adafactor_bytes(shape: ModelShape, s: Settings) -> float:
    """Factored second moments: a row and a column vector per matrix (fp32), full for vectors."""
    if s.method == "full":
        matrices = sum((lin.d_in + lin.d_out) * lin.per_layer for lin in shape.linears) * shape.layers
        matrices += shape.vocab + shape.hidden  # embedding
        if not shape.tie_embeddings:
            matrices += shape.vocab + shape.hidden
        return 4.0 * (matrices + shape.norm_params)
    targets = s.lora_targets if isinstance(s.lora_targets, str) else list(s.lora_targets)
    per_layer = sum(
        (2 * s.lora_r * lin.rank_mult + lin.d_in + lin.d_out) * lin.per_layer
        for lin in shape.lora_targets(targets)
    )
    return 4.0 * per_layer * shape.layers


def _layer_activation_bytes(shape: ModelShape, s: Settings, tokens: int) -> float:
    """Bytes one decoder layer saves for backward (HF Llama-style code, read op by op)."""
    c = _compute_bytes(s)
    h, q, kv, inter = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    norm = (4 + c) * h  # RMSNorm upcasts to fp32 and saves it, plus the 16-bit input of the weight multiply
    attn = c * h + c * (2 * q + 2 * kv)  # qkv input; q, k, v after rope; attention output (o_proj input)
    if shape.experts:
        k = shape.experts_per_token
        mlp = c * h + k * (c * h + 4 * c * inter) + 4 * shape.experts  # routed copies; router logits
    else:
        mlp = c * h + 4 * c * inter  # mlp input; gate, act(gate), up, act*up (down_proj input)
    per_token = shape.norms_per_layer * norm + attn + mlp
    if s.method in ("lora", "qlora") and s.lora_dropout > 0:
        targets = s.lora_targets if isinstance(s.lora_targets, str) else list(s.lora_targets)
        for lin in shape.lora_targets(targets):  # each adapter keeps its dropout output and mask
            per_token += ((c + 1) * lin.d_in + c * s.lora_r * lin.rank_mult) * lin.per_layer * lin.active
    elif s.method in ("lora", "qlora"):
        targets = s.lora_targets if isinstance(s.lora_targets, str) else list(s.lora_targets)
        per_token += sum(
            c * s.lora_r * lin.rank_mult * lin.per_layer * lin.active for lin in shape.lora_targets(targets)
        )
    return float(per_token * tokens)


def _attention_matrix_bytes(shape: ModelShape, s: Settings) -> float:
    """Eager attention keeps the softmax output in fp32 (for its backward) and in 16 bit (for A @ V)."""
    if s.attn != "eager":
        return 0.0  # flash / memory-efficient SDPA keep no s x s matrices
    return float((4 + _compute_bytes(s)) * shape.heads * s.seq_len * s.seq_len * s.micro_batch)


def activation_bytes(shape: ModelShape, s: Settings, constants: Constants) -> float:
    """Saved activations of one micro-batch (not sharded by FSDP: each GPU keeps its own)."""
    c = _compute_bytes(s)
    tokens = s.micro_batch * s.seq_len
    layer = _layer_activation_bytes(shape, s, tokens)
    scores = _attention_matrix_bytes(shape, s)
    if s.grad_ckpt:
        # each layer keeps only its input; one layer is recomputed in full during backward
        saved = shape.layers * c * shape.hidden * tokens + layer
        matrices = scores
    else:
        saved = shape.layers * layer
        matrices = shape.layers * scores
    if s.attn == "eager":
        matrices += c * s.seq_len * s.seq_len * s.micro_batch  # the 4-D causal mask
    saved += ((4 + c) + c) * shape.hidden * tokens  # final norm and lm_head input
    # the fitted factor covers what the op-by-op count misses; the s x s matrices are exact sizes
    return saved * constants.act_factor + matrices


def logits_bytes(shape: ModelShape, s: Settings, constants: Constants) -> float:
    return constants.logits_bytes * s.micro_batch * s.seq_len * shape.vocab


# ---- the estimate ------------------------------------------------------------------------------------
def estimate(shape: ModelShape, s: Settings, constants: Constants | None = None) -> MemoryEstimate:
    """Peak memory per GPU for `shape` trained with settings `s` (FSDP FULL_SHARD when n_gpus > 1)."""
    k = constants or calibrated_constants()
    if s.method not in ("full", "lora", "qlora"):
        raise SpecError("method", f"unknown method {s.method!r}")
    n = max(1, s.n_gpus)
    c = _compute_bytes(s)
    sb = _state_bytes(s)
    psi = shape.params
    trainable = trainable_params(shape, s)

    # weights as stored (sharded by FSDP) and what a forward needs unsharded
    cast_copy = 0.0  # autocast's 16-bit copies of fp32 weights, cached through the forward
    if s.method == "full":
        stored = {"fp32": 4.0, "bf16": 2.0}.get(s.precision, 4.0) * psi
        if s.precision in ("bf16-mixed", "fp16-mixed"):
            cast_copy = 2.0 * psi
        layer_gathered = c * shape.layer_params
        root_gathered = c * (psi - shape.layers * shape.layer_params)
        dequant = 0.0
    else:
        adapter = sb * trainable
        if s.method == "lora":
            base_b = 4.0 if s.precision == "fp32" else 2.0
            stored = base_b * psi + adapter
            layer_gathered = base_b * shape.layer_params
            root_gathered = base_b * (psi - shape.layers * shape.layer_params)
            dequant = 0.0
        else:
            qb = NF4_DQ_BYTES if s.double_quant else NF4_BYTES
            quant = shape.quantizable_params
            stored = qb * quant + 2.0 * (psi - quant) + adapter
            layer_quant = quant / shape.layers
            layer_gathered = qb * layer_quant + 2.0 * (shape.layer_params - layer_quant)
            root_gathered = 2.0 * (psi - shape.layers * shape.layer_params)
            biggest = max(lin.d_in * lin.d_out for lin in shape.linears)
            dequant = 2.0 * c * biggest  # one dequantized weight in flight, plus the next one
    grads = float(sb * trainable)
    optim, step_temp, paged = _optimizer_bytes(shape, s, trainable)
    resident_optim = 0.0 if paged else optim

    if n > 1:
        stored, grads, resident_optim, step_temp = stored / n, grads / n, resident_optim / n, step_temp / n
        gather = 2.0 * layer_gathered + root_gathered  # current unit + prefetched unit; the root stays
        layer_trainable = trainable / shape.layers if s.method != "full" else shape.layer_params
        reduce_buf = sb * layer_trainable
        cast_copy = 0.0  # FSDP mixed precision casts inside the gathered units
        sharding = f"fsdp-full-shard x{n}"
    else:
        gather = reduce_buf = 0.0
        sharding = "none"

    acts = activation_bytes(shape, s, k)
    logit = logits_bytes(shape, s, k)
    weights_fb = stored + cast_copy + gather + dequant
    accumulated = grads if s.grad_accum > 1 else 0.0
    phases = {
        "forward_backward": weights_fb + resident_optim + accumulated + acts + logit,
        "backward_grads": weights_fb + resident_optim + grads + reduce_buf + acts / 2,
        "optimizer_step": stored + resident_optim + grads + step_temp,
    }
    phase = max(phases, key=lambda p: phases[p])
    dynamic = phases[phase]
    overhead = k.cuda_context_gib * GIB + k.fixed_overhead_gib * GIB + k.alloc_slack * dynamic
    if phase == "forward_backward":
        parts = {
            "weights": weights_fb,
            "gradients": accumulated,
            "optimizer": resident_optim,
            "activations": acts,
            "logits": logit,
        }
    elif phase == "backward_grads":
        parts = {
            "weights": weights_fb,
            "gradients": grads + reduce_buf,
            "optimizer": resident_optim,
            "activations": acts / 2,
            "logits": 0.0,
        }
    else:
        parts = {
            "weights": stored,
            "gradients": grads,
            "optimizer": resident_optim + step_temp,
            "activations": 0.0,
            "logits": 0.0,
        }
    parts["overhead"] = overhead
    breakdown = {key: val / GIB for key, val in parts.items()}
    settings = asdict(s)
    if isinstance(settings["lora_targets"], tuple):
        settings["lora_targets"] = list(settings["lora_targets"])
    return MemoryEstimate(
        model=shape.name,
        method=s.method,
        n_gpus=n,
        peak_gib_per_gpu=(dynamic + overhead) / GIB,
        breakdown_gib=breakdown,
        params=psi,
        trainable_params=trainable,
        peak_phase=phase,
        paged_optimizer_gib=(optim / n if paged else 0.0) / GIB,
        sharding=sharding,
        settings=settings,
        phases_gib={p: (v + overhead) / GIB for p, v in phases.items()},
    )


def settings_from_spec(spec: Any, n_gpus: int | None = None) -> Settings:
    """Settings for a validated JobSpec (n_gpus defaults to resources.gpus, else 1).

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
        attn=spec.train.attn_implementation,
        lora_r=spec.lora.r,
        lora_targets=targets if isinstance(targets, str) else tuple(targets),
        lora_dropout=spec.lora.dropout,
        double_quant=spec.quantization.double_quant,
        quant_compute=spec.quantization.compute_dtype,
        n_gpus=n,
        grad_accum=layout.accum,
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
