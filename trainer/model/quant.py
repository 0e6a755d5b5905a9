"""QLoRA: the frozen base in 4-bit NF4 (double quantization) through bitsandbytes, 8-bit optimizers.

The base is quantized while it loads (`BitsAndBytesConfig`); LoRA adapters (spec.lora, all linear
layers by default) train in higher precision on top, computing in bf16. Checkpoints hold only what is
trainable (`trainer.model.load.trainable_parameters`: the adapters; 4-bit weights never require grad), plus
the optimizer, RNG and data position; the base is quantized again from the model files on resume.

With several ranks (FSDP2), the 4-bit weights are stored in the compute dtype (`bnb_4bit_quant_storage`)
and sharded like any other weight; the 8-bit optimizers stay single-GPU (trainer/layout.py).

bitsandbytes >= 0.49 runs NF4 and its 8-bit optimizers on the CPU as well (slowly; paged optimizers fall
back to unpaged there). With an older build on a machine without a GPU, `check_available` stops the run
before any work with a message that says so.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.data.dataset import DataError

COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class QuantUnavailable(DataError):
    """This machine (or this bitsandbytes) cannot run the 4-bit / 8-bit path (the trainer exits 2)."""


def quantizable_linears(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The linear layers bitsandbytes quantizes when transformers loads a model in 4 bit: every plain
    `nn.Linear` but the output layer (transformers keeps `lm_head` in 16 bit), by module name."""
    head = model.get_output_embeddings()
    return {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear and m is not head}


def bitsandbytes_devices() -> set[str]:
    """The torch device types the installed bitsandbytes supports (empty if it is not installed)."""
    override = os.environ.get("FTORCH_BNB_DEVICES")  # tests: pretend a build without CPU support
    if override is not None:
        return {d for d in override.split(",") if d}
    try:
        import bitsandbytes
    except ImportError:
        return set()
    found = getattr(bitsandbytes, "supported_torch_devices", None)
    if found is None:  # builds before the multi-backend refactor were CUDA-only
        return {"cuda"}
    return set(found)


def check_available(device: torch.device, devices: set[str] | None = None) -> None:
    """Fail early, with a clear message, when 4-bit loading cannot work here."""
    devices = bitsandbytes_devices() if devices is None else devices
    if not devices:
        raise QuantUnavailable(
            "method: qlora needs bitsandbytes, which is not installed (pip install 'ftorch[qlora]')"
        )
    if device.type not in devices:
        where = "this machine has no GPU" if device.type == "cpu" else f"device {device.type}"
        raise QuantUnavailable(
            f"method: qlora cannot run here: {where} and the installed bitsandbytes supports only "
            f"{', '.join(sorted(devices))}; run it on a CUDA GPU or install bitsandbytes >= 0.49"
        )


def bnb_config(spec: JobSpec) -> Any:
    from transformers import BitsAndBytesConfig

    q = spec.quantization
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.quant_type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=COMPUTE[q.compute_dtype],
        # the packed 4-bit weights stored in the compute dtype (as Answer.AI's FSDP+QLoRA does), so that
        # FSDP shards and all-gathers them like any 16-bit weight
        bnb_4bit_quant_storage=COMPUTE[q.compute_dtype],
    )


def load_quantized(spec: JobSpec, device: torch.device) -> torch.nn.Module:
    """The base model, quantized to 4 bits as it loads, made ready for adapter training."""
    from transformers import AutoModelForCausalLM

    from trainer.model.attention import resolve as resolve_attention
    from trainer.model.check import from_hub

    check_available(device)
    model = from_hub(
        spec,
        AutoModelForCausalLM.from_pretrained,
        quantization_config=bnb_config(spec),
        dtype=COMPUTE[spec.quantization.compute_dtype],
        attn_implementation=resolve_attention(spec.train.attn_implementation, device.type),
        device_map={"": device},
    )
    return prepare_quantized(model, spec)


def prepare_quantized(model: torch.nn.Module, spec: JobSpec) -> torch.nn.Module:
    """A 4-bit base made ready for adapters (also run by trainer/memtrace/steptrace.py on a stand-in)."""

    model.config.use_cache = False
    # Not peft's prepare_model_for_kbit_training: it casts every non-4-bit parameter (embeddings, lm_head,
    # norms) to fp32, 4 bytes per frozen parameter where the compute dtype needs 2. Freezing is all that
    # is left of it; trainer.model.load enables gradient checkpointing for every method.
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def make_8bit_optimizer(spec: JobSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """bitsandbytes AdamW with 8-bit states (paged: states in unified memory, on CUDA)."""
    import bitsandbytes as bnb

    if not bitsandbytes_devices():
        raise QuantUnavailable(
            f"train.optimizer: {spec.train.optimizer} needs bitsandbytes (pip install 'ftorch[qlora]')"
        )
    cls = bnb.optim.PagedAdamW8bit if spec.train.optimizer == "paged_adamw_8bit" else bnb.optim.AdamW8bit
    return cls(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay)


def quantized_modules(model: torch.nn.Module) -> int:
    """How many 4-bit linear layers the model holds (for logs and tests)."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        return 0
    return sum(1 for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))


def device_problem(method: str, device: str) -> tuple[str, str] | None:
    """Why this machine cannot run the job: local.device: cuda needs a CUDA GPU, QLoRA a bitsandbytes
    that supports the device the job would run on (trainer/model/quant.py's own check, asked before a launch)."""
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        return "local.device", "cuda was asked for but no CUDA device is visible here; use auto or cpu"
    if method != "qlora":
        return None
    try:
        check_available(torch.device("cuda" if cuda and device != "cpu" else "cpu"))
    except QuantUnavailable as exc:
        return "method", str(exc).removeprefix("method: ")
    return None
