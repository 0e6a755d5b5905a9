"""How long a job takes on an offer: per micro-batch, compute + weight traffic + QLoRA dequantization,
plus the FSDP communication that compute cannot hide.

Assumptions (documented in docs/planner.md, "Time"):
- FLOPs per token: 2 x active matmul parameters (attention projections, MLP, top-k experts, lm_head)
  plus the attention scores (4 x layers x seq x q_dim, halved for causal masking with flash/SDPA).
  Full fine-tuning = forward + backward (2x forward); LoRA/QLoRA skip the frozen weights' gradients,
  so backward is about 1x forward (input gradients only) plus the adapters' own work; gradient
  checkpointing adds one more forward (textbook, not calibrated: every published row checkpoints).
- compute = tokens x FLOPs/token / (dense 16-bit peak x MFU x reach x multi-GPU efficiency), with the
  large-batch MFU per method fitted by bench/calibrate_throughput.py (orchestrator/data/
  throughput_calibration.json; `RAW` holds the uncalibrated values).
- every pass reads the 16-bit weights from HBM once per micro-batch (memory-bound, independent of the
  micro-batch): this is what makes small micro-batches slower per token. The effective MFU is
  MFU_max x T / (T + T0) with T the tokens per micro-batch per GPU and T0 about the GPU's roofline
  ridge point (peak / HBM bandwidth), so it differs between GPUs.
- QLoRA pays for dequantization: every pass reads 4-bit weights and writes 16-bit ones, ~2.5 bytes/param
  at HBM bandwidth per micro-batch, times a fitted factor (bitsandbytes' kernels are slower than that).
- FSDP across N GPUs: per micro-batch each GPU all-gathers the parameters twice (forward, backward) and
  reduce-scatters the gradients; this overlaps with compute up to OVERLAP of the compute time, over
  NVLink or PCIe bandwidth (LINK_GBPS).
- CPU offload (train.offload: params, FSDP2's CPUOffloadPolicy): per micro-batch each GPU copies its
  shard of the weights host->device for every pass and its gradient shard back (HOST_LINK_GBPS: PCIe,
  or NVLink-C2C on GH200), overlapping with compute like the collectives; per optimizer step the CPU
  steps AdamW over the rank's shard at CPU_ADAMW_GBPS_PER_VCPU x its vCPUs, not overlapped.
- `Accelerator.reach`: the fraction of a newer GPU's peak an HF stack reaches relative to an A100
  (Hopper 0.8, Ada 0.9, Blackwell 0.6). Not calibrated: the published data covers only A100-80GB.
- consumer and workstation GDDR cards (CONSUMER below): the dense 16-bit tensor peak with FP32
  accumulate (what bf16/fp16 mixed-precision training uses), from NVIDIA's datasheets and architecture
  whitepapers; each entry's `source` says which and how a sparse figure was halved. GeForce cards run
  FP16/BF16 with FP32 accumulate at half the FP16-accumulate rate, so their figure is that half.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.sizing.memory import NF4_DQ_BYTES, Settings
from orchestrator.sizing.shapes import ModelShape
from trainer.data.packing import packed_count
from trainer.kernels import loss_path
from trainer.layout import total_steps
from trainer.memory.facts import DTYPE_BYTES, FSDP_GRAD_BYTES, compute_bytes, state_bytes
from trainer.model.attention import planned_packing


@dataclass(frozen=True)
class TimeConstants:
    """The time model's fitted constants (bench/calibrate_throughput.py)."""

    #: large-micro-batch model-FLOPs utilisation per method (dense 16-bit tensor peak, A100 stack)
    mfu_full: float = 0.40
    mfu_lora: float = 0.35
    mfu_qlora: float = 0.30
    #: multiplier on the ideal NF4 dequantization traffic (2.5 bytes/param per pass)
    dequant_factor: float = 1.0
    #: bytes of 16-bit weights read from HBM per parameter per pass (0 = ignore weight traffic)
    weight_read_bytes: float = 0.0
    #: throughput kept per GPU on data-parallel FSDP runs (stragglers, synchronisation) on top of the
    #: explicit communication time
    multi_gpu_efficiency: float = 0.9

    def mfu(self, method: str) -> float:
        return {"full": self.mfu_full, "lora": self.mfu_lora, "qlora": self.mfu_qlora}[method]


#: the uncalibrated model (textbook/assumed values; what ftorch used before calibration)
RAW = TimeConstants()
CALIBRATION_FILE = "data/throughput_calibration.json"


@lru_cache(maxsize=1)
def calibrated_constants() -> TimeConstants:
    """The constants fitted by bench/calibrate_throughput.py (RAW if the file is missing)."""
    try:
        text = resources.files("orchestrator").joinpath(CALIBRATION_FILE).read_text("utf-8")
    except (FileNotFoundError, OSError):
        return RAW
    fitted = json.loads(text).get("constants", {})
    known = {k: float(v) for k, v in fitted.items() if k in TimeConstants.__dataclass_fields__}
    return replace(RAW, **known)


#: fraction of the compute time that communication can hide behind
OVERLAP = 0.8
#: effective per-GPU collective bandwidth, GB/s
LINK_GBPS = {"nvlink": 150.0, "pcie": 10.0}
#: host<->GPU copy bandwidth per GPU and direction, GB/s. PCIe: 4.0 x16 is 32 GB/s per direction
#: (PCI-SIG), pinned copies reach ~20-25 on A100/H100 hosts, 3.0 x16 (T4/V100 hosts) half that: 12 is the
#: planning figure for every PCIe machine. C2C: GH200's NVLink-C2C, 900 GB/s both directions (NVIDIA
#: GH200 datasheet), 450 each way
HOST_LINK_GBPS = {"pcie": 12.0, "c2c": 450.0}
#: CPU AdamW (torch.optim.AdamW, foreach, fp32) bytes of optimizer traffic per second per vCPU, 28 bytes
#: per parameter: measured by bench/cpu_adamw.py, one thread on the (shared, 2-core) development machine,
#: 1.29 GB/s: low for a server core, so offload is priced on the slow side
CPU_ADAMW_GBPS_PER_VCPU = 1.3
#: bytes the optimizer step reads and writes per parameter, in units of the state dtype
OPTIMIZER_STEP_WORDS = {"adamw": 7, "sgd": 5}
CHARS_PER_TOKEN = 4.0  # English-like text through a BPE tokenizer


@dataclass(frozen=True)
class Accelerator:
    name: str
    tflops_16bit: float  # dense bf16 (or fp16 where bf16 is missing) tensor peak, TFLOP/s
    hbm_gbps: float
    bf16: bool = True
    #: fraction of the peak a PyTorch/HF training stack reaches relative to an A100
    reach: float = 1.0
    #: where tflops_16bit and hbm_gbps come from (given for the consumer tier)
    source: str = ""


_GA102 = "NVIDIA Ampere GA102 architecture whitepaper (v2.1), RTX 3090 column"
_ADA = "NVIDIA Ada Lovelace architecture whitepaper (v2.1)"
_BLACKWELL = "NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 column"
_AMPERE_WS = "NVIDIA RTX {} datasheet: 'Tensor performance' {} TFLOPS is FP16 with sparsity, halved"
_ADA_WS = "NVIDIA RTX {} Ada datasheet: 'Tensor performance' {} TFLOPS is FP8 with sparsity, / 4"

#: consumer and workstation GDDR cards (RunPod and Vast names; the datacenter table below has Lambda's
#: A6000 and Quadro RTX6000 under their own names). All PCIe, no NVLink in any offer; all Ampere or
#: newer, so all have bf16.
CONSUMER: tuple[Accelerator, ...] = (
    Accelerator("RTX3090", 71, 936, source=f"{_GA102}: 71/142 dense/sparse FP16+BF16, FP32 acc.; 936 GB/s"),
    Accelerator(
        "RTX4090", 165.2, 1008, reach=0.9, source=f"{_ADA}: 165.2/330.4 FP16+BF16, FP32 acc.; 1008 GB/s"
    ),
    Accelerator(
        "RTX5090", 209.5, 1792, reach=0.6, source=f"{_BLACKWELL}: 209.5/419 FP16+BF16, FP32 acc.; 1792 GB/s"
    ),
    Accelerator("RTXA4000", 76.7, 448, source=_AMPERE_WS.format("A4000", 153.4) + "; 448 GB/s"),
    Accelerator("RTXA4500", 94.6, 640, source=_AMPERE_WS.format("A4500", 189.2) + "; 640 GB/s"),
    Accelerator("RTXA5000", 111.1, 768, source=_AMPERE_WS.format("A5000", 222.2) + "; 768 GB/s"),
    Accelerator("RTXA6000", 154.8, 768, source=_AMPERE_WS.format("A6000", 309.7) + "; 768 GB/s"),
    Accelerator("RTX2000-Ada", 48.0, 224, reach=0.9, source=_ADA_WS.format("2000", 191.9) + "; 224 GB/s"),
    Accelerator(
        "RTX4000-Ada",
        106.9,
        360,
        reach=0.9,
        source="48 SMs x 2175 MHz boost x 1024 dense FP16 FLOPs/SM/clock (the rate that reproduces the "
        "RTX 2000/6000 Ada datasheets); its own datasheet tensor figure not checked here; 360 GB/s",
    ),
    Accelerator(
        "RTX6000-Ada",
        364.2,
        960,
        reach=0.9,
        source=_ADA_WS.format("6000", 1457.0) + f" (= {_ADA}: 364.2 FP16, FP32 acc.); 960 GB/s",
    ),
)


ACCELERATORS: dict[str, Accelerator] = {
    a.name.lower(): a
    for a in (
        Accelerator("B300", 2250, 8000, reach=0.6),
        Accelerator("B200", 2250, 8000, reach=0.6),
        Accelerator("H200", 989, 4800, reach=0.8),
        Accelerator("H100", 989, 3350, reach=0.8),
        Accelerator("H100-PCIE", 756, 2000, reach=0.8),
        Accelerator("H100-MEGA", 989, 3350, reach=0.8),
        Accelerator("GH200", 989, 4000, reach=0.8),
        Accelerator("A100", 312, 1555),
        Accelerator("A100-80GB", 312, 2039),
        Accelerator("L40S", 362, 864),
        Accelerator("L40", 181, 864),
        Accelerator("L4", 121, 300),
        Accelerator("A10G", 70, 600),
        Accelerator("A10", 125, 600),
        Accelerator("A40", 150, 696),
        Accelerator("A6000", 155, 768),
        Accelerator("RTX PRO Server 6000", 500, 1600),
        Accelerator("RTX6000", 65, 672, bf16=False),
        Accelerator("V100", 125, 900, bf16=False),
        Accelerator("V100-32GB", 125, 900, bf16=False),
        Accelerator("T4", 65, 320, bf16=False),
        Accelerator("T4g", 65, 320, bf16=False),
        Accelerator("P100", 18.7, 732, bf16=False),
        Accelerator("P4", 5.5, 192, bf16=False),
        *CONSUMER,
    )
}


def accelerator(name: str, instance_type: str = "") -> Accelerator | None:
    key = name.lower()
    if key == "h100" and "pcie" in instance_type.lower():
        key = "h100-pcie"
    return ACCELERATORS.get(key)


# ---- tokens ------------------------------------------------------------------------------------------
def count_local_tokens(data: Any, lengths: list[int] | None = None) -> tuple[int, int, str]:
    """(tokens, examples, method) of local data (any source trainer/data/source.py reads), without a
    tokenizer: each example's text (its string values) is len/4 tokens, truncated at max_seq_len like the
    trainer does. A JSONL file over 64 MiB is sampled (its first 20k lines, scaled by size); other
    sources by their first 20k records, scaled by their count. Each example's estimated length is
    appended to `lengths` when given (the records read: all, or the sample)."""
    from orchestrator.jobfile.data_check import load_rows
    from trainer.data.check import DataError, iter_jsonl

    def tokens_of(row: dict[str, Any]) -> int:
        text = _strings({k: v for k, v in row.items() if k != "_line"})
        length = min(data.max_seq_len, max(1, math.ceil(len(text) / CHARS_PER_TOKEN)))
        if lengths is not None:
            lengths.append(length)
        return length

    path = data.path
    try:
        if os.path.isfile(path) and path.endswith(".jsonl") and os.path.getsize(path) > 64 * 1024**2:
            tokens = examples = read = 0
            for row in iter_jsonl(path):
                tokens += tokens_of(row)
                examples += 1
                read += len(json.dumps(row, ensure_ascii=False).encode()) + 1
                if examples >= 20_000:
                    break
            scale = os.path.getsize(path) / max(1, read)
            return int(tokens * scale), int(examples * scale), "sampled, ~4 chars/token"
        rows = load_rows(path, data.format, data.split, data.subset)  # read once by the launch's check
    except DataError as exc:
        raise SpecError(exc.field, str(exc)) from None
    sample = rows.select(range(min(len(rows), 20_000)))
    scale = len(rows) / max(1, len(sample))
    tokens = sum(tokens_of(row) for row in sample)
    how = "counted" if scale == 1 else "sampled"
    return int(tokens * scale), len(rows), f"{how}, ~4 chars/token"


def _strings(obj: Any) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return " ".join(_strings(v) for v in obj.values())
    if isinstance(obj, list):
        return " ".join(_strings(v) for v in obj)
    return ""


@dataclass(frozen=True)
class Workload:
    """Training tokens: fixed by the data x epochs, or by max_steps x the effective batch (examples per
    optimizer step, the same on every GPU count: trainer/layout.py)."""

    tokens_per_epoch: int | None
    epochs: float
    max_steps: int | None
    tokens_per_sequence: float
    sequences_per_step: int  # the effective batch
    source: str
    #: training sequences per epoch: examples, or packs with data.packing (None when not known)
    sequences_per_epoch: int | None = None

    def total_tokens(self, n_gpus: int) -> float:
        if self.max_steps is not None:
            return self.max_steps * self.sequences_per_step * self.tokens_per_sequence
        assert self.tokens_per_epoch is not None
        return self.tokens_per_epoch * self.epochs

    def steps(self, micro_batch_size: int) -> int | None:
        """Optimizer steps, counted as the trainer counts them (trainer/layout.py)."""
        if self.max_steps is None and self.sequences_per_epoch is None:
            return None
        accum = max(1, self.sequences_per_step // micro_batch_size)
        return total_steps(
            self.sequences_per_epoch or 0, micro_batch_size, accum, self.epochs, self.max_steps
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_epoch": self.tokens_per_epoch,
            "epochs": self.epochs,
            "max_steps": self.max_steps,
            "sequences_per_epoch": self.sequences_per_epoch,
            "source": self.source,
        }


def workload(spec: Any) -> Workload:
    data, train = spec.data, spec.train
    per_step = train.micro_batch_size * train.grad_accum
    local = "://" not in data.path and os.path.exists(data.path)
    tokens = examples = None
    source = ""
    lengths: list[int] = []
    if data.tokens is not None:
        tokens, source = data.tokens, "data.tokens"
    elif local:
        tokens, examples, how = count_local_tokens(data, lengths)
        source = f"{data.path} ({how})"
    sequences = examples
    # full sequences of max_seq_len: the trainer's packs (trainer/data/packing.py; `auto` by its rule)
    if planned_packing(data.packing, train.attn_implementation) and tokens:
        if lengths and examples:
            sequences = max(1, round(packed_count(lengths, data.max_seq_len) * examples / len(lengths)))
        else:
            sequences = math.ceil(tokens / data.max_seq_len)
        source += ", packed"
    per_seq = float(data.max_seq_len)
    if tokens and sequences:
        per_seq = tokens / sequences
    if train.max_steps is not None:
        return Workload(
            tokens, train.epochs, train.max_steps, per_seq, per_step, source or "max_steps x batch", sequences
        )
    if tokens is None:
        raise SpecError(
            "data.tokens",
            f"{data.path} is not local data; give data.tokens (tokens in the data "
            "set) or train.max_steps so the planner can estimate hours",
        )
    return Workload(tokens, train.epochs, None, per_seq, per_step, source, sequences)


# ---- time --------------------------------------------------------------------------------------------
#: MFU relative to the calibration's stack (flash-attention 2, a loss without recomputation), per
#: attention path: assumed, not measured (docs/planner.md, "Time"; bench/gpu_check.py measures it)
ATTENTION_MFU = {"flash_attention_2": 1.0, "sdpa": 0.9, "eager": 0.75}
#: MFU relative to the calibration's stack with Liger's fused linear cross-entropy (published: +13.5%
#: on an H100 8B run, verl; counted only on the loss's share, so this is a cap, not a multiplier)
LIGER_MFU = 1.0


def loss_chunked(shape: ModelShape, s: Settings, tokens: float) -> bool:
    """Whether the loss recomputes the LM head in backward (trainer/train_step/loss.py's chunked path)."""
    if "liger_fused_ce" in s.kernels or s.loss == "plain":
        return False
    return loss_path(s.loss, int(tokens), shape.vocab) == "chunked"


def path_mfu(s: Settings) -> float:
    """The factor on the calibrated MFU for the job's attention path."""
    return ATTENTION_MFU.get(s.attn, 1.0) * (LIGER_MFU if "liger_fused_ce" in s.kernels else 1.0)


def flops_per_token(shape: ModelShape, s: Settings, trainable: int) -> float:
    """Training FLOPs per token (forward, backward, recomputation) for the method; the chunked loss
    computes the LM head once more in backward."""
    matmul = shape.active_linear_params + shape.vocab * shape.hidden  # lm_head
    causal = 0.5 if s.attn != "eager" else 1.0
    attention = 4.0 * shape.layers * s.seq_len * shape.q_dim * causal
    forward = 2.0 * matmul + attention
    if s.method == "full":
        passes = 3.0
        adapter = 0.0
    else:
        passes = 2.0  # forward + input gradients; no weight gradients for the frozen base
        adapter = 6.0 * trainable
    if s.grad_ckpt:
        passes += 1.0
    recompute = 2.0 * shape.vocab * shape.hidden if loss_chunked(shape, s, s.micro_batch * s.seq_len) else 0.0
    return forward * passes + adapter + recompute


@dataclass(frozen=True)
class TimeEstimate:
    hours: float
    tokens: float
    tokens_per_s: float
    flops_per_token: float
    #: model FLOPs achieved / peak, after weight traffic, dequantization and communication
    utilisation: float
    compute_s_per_microbatch: float
    weights_s_per_microbatch: float
    comm_s_per_microbatch: float
    dequant_s_per_microbatch: float
    #: one micro-batch on each GPU, everything included (what an accumulation round takes)
    step_s_per_microbatch: float
    #: CPU offload: host<->GPU copies per micro-batch, and the CPU optimizer step per optimizer step
    #: (its share is in step_s_per_microbatch)
    offload_s_per_microbatch: float = 0.0
    cpu_optimizer_s_per_step: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def weight_passes(s: Settings) -> int:
    """Sweeps over the weights per micro-batch: forward, backward, + the recomputed forward."""
    return 3 if s.grad_ckpt else 2


def estimate_time(
    shape: ModelShape,
    s: Settings,
    trainable: int,
    work: Workload,
    acc: Accelerator,
    n_gpus: int,
    interconnect: str,
    constants: TimeConstants | None = None,
    *,
    vcpus_per_rank: float | None = None,
) -> TimeEstimate:
    """Hours to train `work` on `n_gpus` of `acc` (FSDP when n_gpus > 1); `s.micro_batch` is per GPU.
    With `s.offload` the CPU optimizer step runs on `vcpus_per_rank` (unknown: priced as one, the slowest)."""
    c = constants or calibrated_constants()
    util = c.mfu(s.method) * acc.reach * path_mfu(s) * (c.multi_gpu_efficiency if n_gpus > 1 else 1.0)
    fpt = flops_per_token(shape, s, trainable)
    tokens_mb = s.micro_batch * min(float(s.seq_len), work.tokens_per_sequence)
    compute = tokens_mb * fpt / (acc.tflops_16bit * 1e12 * util)
    hbm = acc.hbm_gbps * 1e9
    weights = weight_passes(s) * c.weight_read_bytes * shape.params / hbm
    dequant = 0.0
    if s.method == "qlora":
        # read 4-bit, write the compute dtype
        ideal = (
            weight_passes(s) * shape.quantizable_params * (NF4_DQ_BYTES + DTYPE_BYTES[s.quant_compute]) / hbm
        )
        dequant = c.dequant_factor * ideal
    comm = 0.0
    if n_gpus > 1:
        link = LINK_GBPS["nvlink" if interconnect.lower() == "nvlink" else "pcie"]
        # FSDP gathers weights in the compute dtype (packed 4-bit for QLoRA), reduces fp32 gradients
        gathered = compute_bytes(s.precision) if s.method != "qlora" else NF4_DQ_BYTES
        weight_bytes = gathered * shape.params
        grad_bytes = FSDP_GRAD_BYTES * trainable
        comm = (2 * weight_bytes + grad_bytes) * (n_gpus - 1) / n_gpus / (link * 1e9)
    work_s = compute + weights + dequant
    offload_s, cpu_step_s = offload_times(shape, s, trainable, acc, n_gpus, vcpus_per_rank)
    step_s = work_s + max(0.0, comm + offload_s - OVERLAP * work_s) + cpu_step_s / max(1, s.grad_accum)
    tokens_per_s = n_gpus * tokens_mb / step_s
    total = work.total_tokens(n_gpus)
    return TimeEstimate(
        hours=total / tokens_per_s / 3600.0,
        tokens=total,
        tokens_per_s=tokens_per_s,
        flops_per_token=fpt,
        utilisation=tokens_mb * fpt / step_s / (acc.tflops_16bit * 1e12),
        compute_s_per_microbatch=compute,
        weights_s_per_microbatch=weights,
        comm_s_per_microbatch=comm,
        dequant_s_per_microbatch=dequant,
        step_s_per_microbatch=step_s,
        offload_s_per_microbatch=offload_s,
        cpu_optimizer_s_per_step=cpu_step_s,
    )


def scaled(t: TimeEstimate, ratio: float) -> TimeEstimate:
    """The estimate with throughput multiplied by `ratio` (measured / predicted tokens/s of runs on this
    GPU, orchestrator/sizing/history.py): hours and per-micro-batch times divided by it."""
    if ratio == 1.0 or ratio <= 0:
        return t
    return replace(
        t,
        hours=t.hours / ratio,
        tokens_per_s=t.tokens_per_s * ratio,
        utilisation=t.utilisation * ratio,
        compute_s_per_microbatch=t.compute_s_per_microbatch / ratio,
        weights_s_per_microbatch=t.weights_s_per_microbatch / ratio,
        comm_s_per_microbatch=t.comm_s_per_microbatch / ratio,
        dequant_s_per_microbatch=t.dequant_s_per_microbatch / ratio,
        step_s_per_microbatch=t.step_s_per_microbatch / ratio,
    )


def offload_times(
    shape: ModelShape, s: Settings, trainable: int, acc: Accelerator, n_gpus: int, vcpus: float | None
) -> tuple[float, float]:
    """(host<->GPU copy seconds per micro-batch, CPU optimizer seconds per optimizer step) of CPU offload;
    (0, 0) without it. Each pass copies the rank's weight shard to the GPU as stored (fp32 master weights
    of a full fine-tune, packed 4-bit + 16-bit rest for QLoRA, the compute dtype for LoRA's base); the
    fp32 gradient shard comes back once per micro-batch."""
    if s.offload != "params":
        return 0.0, 0.0
    n = max(1, n_gpus)
    link = HOST_LINK_GBPS["c2c" if acc.name.lower() == "gh200" else "pcie"] * 1e9
    if s.method == "qlora":
        q = shape.quantizable_params
        shard = (NF4_DQ_BYTES * q + DTYPE_BYTES[s.quant_compute] * (shape.params - q)) / n
    elif s.method == "full":
        shard = state_bytes(s.precision) * shape.params / n
    else:
        shard = compute_bytes(s.precision) * shape.params / n
    copies = (weight_passes(s) * shard + FSDP_GRAD_BYTES * trainable / n) / link
    words = OPTIMIZER_STEP_WORDS.get(s.optimizer, 7)
    cpu = words * state_bytes(s.precision) * trainable / n / (CPU_ADAMW_GBPS_PER_VCPU * 1e9 * (vcpus or 1.0))
    return copies, cpu
