"""The memory facts both the estimate and the trace use, each stated once (no torch).

Precision -> bytes, the CUDA context, the cuBLAS workspace, FSDP's buffers and the optimizer's state per
trainable parameter. The analytic estimate (orchestrator/sizing/memory.py, trainer/memory/load_memory.py), the traced
step (trainer/memtrace/steptrace.py, orchestrator/sizing/tracing.py) and the planner's checkpoint size read them from
here, so they cannot drift apart (tests/orchestrator_tests/sizing/test_memory.py fails on a second copy).
"""

from __future__ import annotations

from collections.abc import Callable

GIB = 1024**3
MIB = 1024**2

#: bytes per element of the dtypes the trainer uses
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: the dtype the forward computes in, per train.precision
COMPUTE_NAMES = {"fp32": "fp32", "bf16": "bf16", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}
#: precisions with fp32 trainable weights and a 16-bit forward (autocast)
MIXED = ("bf16-mixed", "fp16-mixed")

#: CUDA context and kernels (NVML sees it, torch's counters do not); recent drivers with lazy module
#: loading show 0.3-0.6 GiB on A100/H100, older stacks up to 1.3 GB (memory.md section 5)
CUDA_CONTEXT_BYTES = 512 * MIB
#: cuBLAS workspace PyTorch allocates per handle and stream on Hopper (":4096:8" = 8 x 4 MiB), taken
#: through the caching allocator, so it shows in reserved; cuBLASLt adds 1 MiB
CUBLAS_WORKSPACE_BYTES = 33 * MIB

#: host RAM of one trainer process besides its tensors: the Python interpreter with torch, transformers
#: and the data pipeline imported, the CUDA runtime's host side and pinned staging buffers. Stated, not
#: measured on a GPU here: a CPU trainer process measures about 1 GiB resident (notes/cpu-facts.md's
#: imports), and CUDA's host-side runtime and the NCCL/gloo buffers commonly add 1-2 GiB per process
HOST_PROCESS_BYTES = 3 * GIB

#: FSDP FULL_SHARD keeps this many decoder layers gathered in forward/backward: the current unit and
#: the prefetched one (the root, embeddings and head, stays gathered as well)
FSDP_GATHERED_UNITS = 2
#: ...and reduces one layer's unsharded gradients, in fp32, during backward
FSDP_GRAD_BYTES = 4

#: optimizer state bytes per trainable parameter; "state" = the trainable dtype (state_bytes);
#: adafactor's factored moments depend on the shapes (the caller counts them)
OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw_8bit", "sgd", "adafactor")
PAGED = ("paged_adamw_8bit",)


def compute_bytes(precision: str) -> int:
    """Bytes per element of the dtype the forward computes in (QLoRA follows the precision too)."""
    return DTYPE_BYTES[COMPUTE_NAMES[precision]]


def state_bytes(precision: str) -> int:
    """Bytes per element of trainable weights, their gradients and optimizer states, and LoRA adapters
    (PEFT's autocast_adapter_dtype): fp32, except in pure-bf16 training."""
    return 2 if precision == "bf16" else 4


def fsdp_overlay_bytes(
    layer_gathered: float, root_gathered: float, layer_trainable: float
) -> tuple[float, float]:
    """(FSDP's gathered weights in forward/backward, one layer's fp32 gradients in backward), in bytes:
    `layer_gathered`/`root_gathered` are the bytes of the largest decoder layer and of the root as gathered
    (floating weights in the compute dtype), `layer_trainable` that layer's trainable parameters."""
    return FSDP_GATHERED_UNITS * layer_gathered + root_gathered, FSDP_GRAD_BYTES * layer_trainable


def optimizer_state_bytes(
    optimizer: str, precision: str, trainable: float, factored: Callable[[], float] | None = None
) -> tuple[float, bool]:
    """(persistent optimizer state bytes for `trainable` parameters, paged): AdamW's two moments and
    SGD's momentum in the trainable dtype, the 8-bit AdamWs' one byte per moment, Adafactor's factored
    moments as `factored()` counts them. ValueError for an unknown optimizer."""
    sb = state_bytes(precision)
    if optimizer == "adamw":
        return 2.0 * sb * trainable, False  # exp_avg, exp_avg_sq
    if optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        return 2.0 * trainable, optimizer in PAGED
    if optimizer == "sgd":
        return float(sb * trainable), False  # momentum buffer
    if optimizer == "adafactor":
        if factored is None:
            raise ValueError("adafactor's state depends on the shapes: pass `factored`")
        return float(factored()), False
    raise ValueError(f"unknown optimizer {optimizer!r} (one of {', '.join(OPTIMIZERS)})")


def checkpoint_bytes(
    optimizer: str, precision: str, trainable: float, factored: Callable[[], float] | None = None
) -> float:
    """Bytes of one checkpoint: the trainable weights in their dtype and the optimizer's state (the
    scheduler, RNG and data position are a few KiB)."""
    optim, _paged = optimizer_state_bytes(optimizer, precision, trainable, factored)
    return state_bytes(precision) * trainable + optim
