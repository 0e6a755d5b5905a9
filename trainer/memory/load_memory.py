"""What the trainer's loading holds on each GPU at its peak, before the first step (no torch: the
planner's memory estimate, orchestrator/sizing/memory.py, asks this module; trainer/model/load.py takes its load
dtype from here, so the two cannot drift apart).

How the trainer loads (trainer/model/load.py, trainer/model/quant.py, trainer/model/sharded_load.py):

- one process (full fine-tuning and LoRA): `from_pretrained` on the CPU in `base_dtype_name` (fp32 master
  weights for a full fine-tune under mixed precision, the compute dtype otherwise), adapters added, then
  `.to(device)`: every weight and adapter on the GPU, as the step holds them;
- full fine-tuning and LoRA under FSDP: sharded loading. Rank 0 loads on the CPU, every rank builds the
  model on the meta device, shards it, allocates only its shards and receives rank 0's weights one tensor
  at a time: a GPU holds its shard of everything plus one full tensor in flight (the largest: the
  embedding or the largest projection group), never the whole model;
- QLoRA on one process: `from_pretrained(device_map={"": device})` quantizes each projection on the GPU
  as it arrives, so the GPU holds the whole packed 4-bit base and its absmax, the rest of the base
  (embeddings, head, norms) in the quantization compute dtype, and the 16-bit copy of the projection
  being quantized; adapters then;
- QLoRA under FSDP: sharded loading too. Rank 0 quantizes the base once on its CPU; every rank builds
  the 4-bit skeleton on the meta device, shards it, and receives rank 0's tensors one at a time: a GPU
  holds its shard of the packed 4-bit weights (half a byte each), of the 16-bit rest and of the adapters,
  every layer's quant state whole (FSDP does not shard bitsandbytes' absmax: the bytes of `NF4_DQ_BYTES`
  beyond the half byte), and one full tensor in flight (the 16-bit embedding, or the largest packed
  projection) with this rank's chunk of it (`distribute_tensor` cuts it before the copy into the shard).
  trainer/memtrace/loadtrace.py traces this path with the trainer's own code; docs/benchmarks.md compares. With a bitsandbytes that cannot run on the CPU the trainer falls back to loading whole on
  each rank (trainer/distributed.py); the estimate counts the sharded path.

With CPU offload (`train.offload: params`, FSDP2's CPUOffloadPolicy; one rank loads as a world of one)
every rank materializes its shards in host RAM, not on the GPU: a GPU holds only what is in flight (and
QLoRA's quant state, which is not a parameter). `load_host_bytes` says what the loading holds in host
RAM: rank 0's whole CPU copy (sharded loading, and one process loading LoRA/full on the CPU first).
Rank 0 releases each tensor of that copy once it is sent, and the shards' pages are only touched as
they are filled, so a machine's host RAM peaks at the larger of the copy and the offloaded state
(`host_peak_bytes`), not at their sum.

On one GPU the step holds all of that and more (the estimate's weights term), so the load rarely sets the
peak; under FSDP every method now holds a shard plus one tensor while loading.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.memory.facts import COMPUTE_NAMES, DTYPE_BYTES, MIXED, state_bytes

#: bytes per quantized weight in NF4: 4 bits + the absmax (8/64 bits, and 32/(64*256) with double
#: quantization; 32/64 bits without it) (QLoRA paper, section 3)
NF4_DQ_BYTES = 0.516
NF4_BYTES = 0.5625


def base_dtype_name(method: str, precision: str) -> str:
    """The dtype the model loads in (full fine-tuning and LoRA). Mixed precision keeps fp32 only what
    trains: a full fine-tune's weights (the fp32 master copy), never the frozen base of LoRA/QLoRA, which
    stays in the compute dtype (PEFT then makes the adapters fp32). Pure bf16 keeps everything in bf16."""
    if method == "full" and precision in MIXED:
        return "fp32"
    return COMPUTE_NAMES[precision]


def adapter_bytes(precision: str) -> int:
    """Bytes per LoRA adapter parameter: fp32 (PEFT's autocast_adapter_dtype) except under pure bf16."""
    return state_bytes(precision)


@dataclass(frozen=True)
class WeightCounts:
    """The model's parameters as loading sees them."""

    params: int  # every parameter of the base model (tied weights once)
    quantizable: int  # those in the projections bitsandbytes quantizes (QLoRA)
    adapters: int = 0  # LoRA parameters (0 for a full fine-tune)
    largest_quantizable: int = 0  # elements of the largest quantized projection
    largest_tensor: int = 0  # elements of the largest parameter tensor (sharded loading's one in flight)


def load_peak_bytes(
    method: str,
    precision: str,
    counts: WeightCounts,
    ranks: int = 1,
    *,
    double_quant: bool = True,
    quant_compute: str = "bf16",
    offload: bool = False,
) -> dict[str, float]:
    """Bytes one GPU holds at the peak of the trainer's loading, by part ("weights", "adapters",
    "in_flight": the 16-bit projection being quantized, or the full tensor being broadcast), on `ranks`
    GPUs (see the module docstring); with `offload` the shards are in host RAM."""
    adapters = float(adapter_bytes(precision) * counts.adapters) if method != "full" else 0.0
    if offload:  # sharded loading into host RAM: the GPU sees the tensor in flight (+ QLoRA's quant state)
        parts = load_peak_bytes(
            method, precision, counts, max(2, ranks), double_quant=double_quant, quant_compute=quant_compute
        )
        packed = NF4_DQ_BYTES if double_quant else NF4_BYTES
        state = (packed - NF4_DATA_BYTES) * counts.quantizable if method == "qlora" else 0.0
        return {"weights": state, "adapters": 0.0, "in_flight": parts["in_flight"]}
    if method == "qlora":
        return _qlora_load_peak(counts, ranks, adapters, double_quant, quant_compute)
    size = DTYPE_BYTES[base_dtype_name(method, precision)]
    if ranks <= 1:
        return {"weights": float(size * counts.params), "adapters": adapters, "in_flight": 0.0}
    # sharded loading: this rank's shards, and one full tensor broadcast from rank 0
    return {
        "weights": float(size * counts.params) / ranks,
        "adapters": adapters / ranks,
        "in_flight": float(size * counts.largest_tensor),
    }


#: rank 0's resident memory per byte of the 4-bit projections it quantizes on the CPU (from_pretrained with
#: bitsandbytes' CPU backend), measured: 1.33 after building the copy and 1.40 at the peak while sending it,
#: as the slope between two model sizes (`PYTHONPATH=. python bench/host_ram.py --method qlora --layers
#: 4,20 --hidden 2048`, docs/benchmarks.md). What the extra third is was not found (not the parameters,
#: which the release frees); it is counted, not explained. A full fine-tune's fp32 copy measured 1.00.
QLORA_CPU_BUILD_FACTOR = 1.40

#: bytes of the packed 4-bit data per quantized weight (two NF4 values per byte); the rest of
#: `NF4_DQ_BYTES` / `NF4_BYTES` is the quant state (absmax), which every rank keeps whole
NF4_DATA_BYTES = 0.5


def _qlora_load_peak(
    counts: WeightCounts, ranks: int, adapters: float, double_quant: bool, quant_compute: str
) -> dict[str, float]:
    """QLoRA's load peak per GPU: the whole 4-bit model on one process; under FSDP (trainer/model/sharded_load.py)
    a shard of the packed data, of the 16-bit rest and of the adapters, the whole quant state, and one
    full tensor in flight."""
    packed = NF4_DQ_BYTES if double_quant else NF4_BYTES
    c = DTYPE_BYTES[quant_compute]
    rest = c * (counts.params - counts.quantizable)
    if ranks <= 1:  # quantized on the GPU as it loads, with the 16-bit projection being quantized
        weights = packed * counts.quantizable + rest
        return {"weights": weights, "adapters": adapters, "in_flight": float(c * counts.largest_quantizable)}
    state = (packed - NF4_DATA_BYTES) * counts.quantizable
    # the largest tensor broadcast whole: a 16-bit one (the embedding) when it is larger than every
    # projection, else the largest projection, packed; with it, this rank's chunk of it that
    # distribute_tensor cuts before the copy into the shard (traced: trainer/memtrace/loadtrace.py)
    largest_16bit = counts.largest_tensor if counts.largest_tensor > counts.largest_quantizable else 0
    whole = max(c * largest_16bit, NF4_DATA_BYTES * counts.largest_quantizable)
    in_flight = whole * (1 + 1 / ranks)
    return {
        "weights": (NF4_DATA_BYTES * counts.quantizable + rest) / ranks + state,
        "adapters": adapters / ranks,
        "in_flight": float(in_flight),
    }


def load_host_bytes(
    method: str,
    precision: str,
    counts: WeightCounts,
    ranks: int = 1,
    *,
    double_quant: bool = True,
    quant_compute: str = "bf16",
    offload: bool = False,
) -> float:
    """Host RAM the loading holds on rank 0's machine besides the shards: rank 0's whole CPU copy of the
    model (trainer/model/sharded_load.py; one process loading LoRA or a full fine-tune builds it on the CPU
    too, then moves it), or for QLoRA on one process nothing (it streams onto the GPU)."""
    adapters = float(adapter_bytes(precision) * counts.adapters) if method != "full" else 0.0
    sharded = ranks > 1 or offload
    if method == "qlora":
        if not sharded:
            return 0.0
        packed = NF4_DQ_BYTES if double_quant else NF4_BYTES
        c = DTYPE_BYTES[quant_compute]
        rest = c * (counts.params - counts.quantizable)
        # the 4-bit model rank 0 quantizes (with what quantizing on the CPU leaves resident beside it,
        # measured), and the 16-bit projection being quantized
        built = packed * counts.quantizable * QLORA_CPU_BUILD_FACTOR
        return built + rest + adapters + c * counts.largest_quantizable
    return float(DTYPE_BYTES[base_dtype_name(method, precision)] * counts.params) + adapters


def host_peak_bytes(loading: float, offloaded: float) -> dict[str, float]:
    """A machine's host RAM at its peak, as the parts that make it up: the offloaded state of its ranks
    (`offloaded`: shards, gradients, optimizer state, the CPU step's temporaries) and what rank 0's
    loading copy (`loading`, `load_host_bytes`) holds beyond it.

    The two never peak together: rank 0 frees each tensor of its copy as soon as it is sent
    (trainer/model/sharded_load.py `send_tensors`), while the shards it fills were reserved untouched
    (`to_empty`), so during loading copy + filled shards stay at about the copy; the gradients and the
    optimizer state come only with the first step, after the copy is gone. The peak is the larger."""
    return {"offloaded": offloaded, "loading": max(0.0, loading - offloaded)}
