"""What the trainer's loading holds on each GPU at its peak, before the first step (no torch: the
planner's memory estimate, orchestrator/memory.py, asks this module; trainer/model.py takes its load
dtype from here, so the two cannot drift apart).

As trainer/model.py and trainer/quant.py load a model today, every rank puts the *whole* model on its
GPU, and FSDP shards it only afterwards (`Sharded.wrap`, trainer/distributed.py):

- full fine-tuning and LoRA: `from_pretrained` on the CPU in `base_dtype_name` (fp32 master weights for a
  full fine-tune under mixed precision, the compute dtype otherwise), adapters added, then `.to(device)`:
  every weight and adapter on the GPU at once;
- QLoRA: `from_pretrained(device_map={"": device})` quantizes each projection on the GPU as it arrives:
  the packed 4-bit weights and their absmax, the rest of the base (embeddings, head, norms) in the
  quantization compute dtype, and the 16-bit copy of the projection being quantized; adapters then.

On one GPU the step holds all of that and more (the estimate's weights term), so the load phase sets the
peak only under FSDP, where the step keeps one shard: a job whose whole model does not fit one GPU cannot
load there, whatever the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass

#: bytes per quantized weight in NF4: 4 bits + the absmax (8/64 bits, and 32/(64*256) with double
#: quantization; 32/64 bits without it) (QLoRA paper, section 3)
NF4_DQ_BYTES = 0.516
NF4_BYTES = 0.5625

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: the dtype the forward computes in, per train.precision
COMPUTE_NAMES = {"fp32": "fp32", "bf16": "bf16", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}
MIXED = ("bf16-mixed", "fp16-mixed")


def base_dtype_name(method: str, precision: str) -> str:
    """The dtype the model loads in (full fine-tuning and LoRA). Mixed precision keeps fp32 only what
    trains: a full fine-tune's weights (the fp32 master copy), never the frozen base of LoRA/QLoRA, which
    stays in the compute dtype (PEFT then makes the adapters fp32). Pure bf16 keeps everything in bf16."""
    if method == "full" and precision in MIXED:
        return "fp32"
    return COMPUTE_NAMES[precision]


def adapter_bytes(precision: str) -> int:
    """Bytes per LoRA adapter parameter: fp32 (PEFT's autocast_adapter_dtype) except under pure bf16."""
    return 2 if precision == "bf16" else 4


@dataclass(frozen=True)
class WeightCounts:
    """The model's parameters as loading sees them."""

    params: int  # every parameter of the base model (tied weights once)
    quantizable: int  # those in the projections bitsandbytes quantizes (QLoRA)
    adapters: int = 0  # LoRA parameters (0 for a full fine-tune)
    largest_quantizable: int = 0  # elements of the largest quantized projection


def load_peak_bytes(
    method: str,
    precision: str,
    counts: WeightCounts,
    ranks: int = 1,
    *,
    double_quant: bool = True,
    quant_compute: str = "bf16",
) -> dict[str, float]:
    """Bytes one GPU holds at the peak of the trainer's loading, by part ("weights", "adapters",
    "quantizing"), on `ranks` GPUs. Today every rank loads the whole model before FSDP shards it, so the
    figure does not depend on `ranks` (see the module docstring)."""
    del ranks  # every rank holds the whole model until Sharded.wrap
    if method == "qlora":
        packed = NF4_DQ_BYTES if double_quant else NF4_BYTES
        c = DTYPE_BYTES[quant_compute]
        weights = packed * counts.quantizable + c * (counts.params - counts.quantizable)
        quantizing = float(c * counts.largest_quantizable)  # the 16-bit projection being quantized
    else:
        weights = float(DTYPE_BYTES[base_dtype_name(method, precision)] * counts.params)
        quantizing = 0.0
    adapters = float(adapter_bytes(precision) * counts.adapters) if method != "full" else 0.0
    return {"weights": float(weights), "adapters": adapters, "quantizing": quantizing}
