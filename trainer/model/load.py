"""Loading the causal LM and its tokenizer; wrapping it for full fine-tuning or LoRA."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.faults import maybe_slow
from trainer.memory.load_memory import base_dtype_name
from trainer.stops.sources import check_setup

#: the dtype the forward computes in, per train.precision
COMPUTE_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "bf16-mixed": torch.bfloat16,
    "fp16-mixed": torch.float16,
}
MIXED = ("bf16-mixed", "fp16-mixed")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(preference: str) -> torch.device:
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            from trainer.model.check import DeviceUnavailable

            raise DeviceUnavailable("local.device: cuda was asked for but no CUDA device is visible")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def autocast_dtype(spec: JobSpec) -> torch.dtype | None:
    """The autocast dtype under mixed precision; None when the weights already are the compute dtype."""
    return COMPUTE_DTYPES[spec.train.precision] if spec.train.precision in MIXED else None


def base_dtype(spec: JobSpec) -> torch.dtype:
    """The dtype the model loads in (trainer/memory/load_memory.py decides it, for the planner's estimate too):
    fp32 master weights for a full fine-tune under mixed precision, the compute dtype otherwise."""
    return DTYPES[base_dtype_name(spec.method, spec.train.precision)]


def load_tokenizer(spec: JobSpec) -> Any:
    from transformers import AutoTokenizer

    from trainer.model.check import from_hub

    tokenizer = from_hub(spec, AutoTokenizer.from_pretrained)
    if spec.data.chat_template:  # data.chat_template replaces the model's (and is saved with the output)
        from trainer.data.check import chat_template_text

        tokenizer.chat_template = chat_template_text(spec.data.chat_template)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def needs_bitsandbytes(spec: JobSpec) -> bool:
    return spec.method == "qlora" or spec.train.optimizer in ("adamw_8bit", "paged_adamw_8bit")


def resolve(requested: str, device_type: str) -> str:
    """train.attn_implementation for this device (trainer/model/attention.py; the trainer passes it resolved)."""
    from trainer.model.attention import resolve as resolve_attention

    return resolve_attention(requested, device_type)


def hide_bitsandbytes() -> None:
    """peft imports bitsandbytes whenever it is installed (about a second, mostly torch._inductor), on every
    attempt's start. A job that does not use it gets it hidden: `import` fails and find_spec says None."""
    if "bitsandbytes" not in sys.modules:
        sys.modules["bitsandbytes"] = None  # type: ignore[assignment]


def load_model(spec: JobSpec, device: torch.device) -> torch.nn.Module:
    """The base model, then LoRA adapters (seeded, so every attempt builds the same model). A notice
    between the two (the armed stop flag: trainer/stops/sources.py `check_setup`) raises `Interrupted`."""
    if not needs_bitsandbytes(spec):
        hide_bitsandbytes()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.train.seed)
    if spec.method == "qlora":  # the base in 4-bit NF4 (trainer/model/quant.py), adapters below
        from trainer.model.quant import load_quantized

        model = load_quantized(spec, device)
    else:
        from trainer.model.check import from_hub

        model = from_hub(
            spec,
            AutoModelForCausalLM.from_pretrained,
            dtype=base_dtype(spec),
            attn_implementation=resolve(spec.train.attn_implementation, device.type),
        )
    maybe_slow("slow-load")  # FTORCH_FAULTS=slow-load@MS (tests: a long model load)
    check_setup("loading the model")  # a notice between the base and its adapters ends the attempt here
    return prepare_model(model, spec, device)


def prepare_model(model: torch.nn.Module, spec: JobSpec, device: torch.device) -> torch.nn.Module:
    """Gradient checkpointing and LoRA adapters on a loaded base, placed on `device`.

    trainer/memtrace/steptrace.py runs this same function on a base built from the config on fake tensors, so
    everything that decides memory after loading (dtypes of trainable weights, checkpointing, adapters)
    belongs here or in `base_dtype`, not in `load_model`.
    """
    model.config.use_cache = False
    if spec.train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.method in ("lora", "qlora"):
        from peft import get_peft_model

        from trainer.model.check import check_targets

        check_targets(model, spec.lora.target_modules, spec.model)
        if spec.train.gradient_checkpointing:
            model.enable_input_require_grads()
        torch.manual_seed(spec.train.seed)
        # fp32 adapters under mixed precision (PEFT's autocast_adapter_dtype), the base's dtype otherwise
        model = get_peft_model(model, lora_config(spec), autocast_adapter_dtype=spec.train.precision in MIXED)
    return model if spec.method == "qlora" else model.to(device)  # 4-bit weights are placed as they load


def lora_config(spec: JobSpec) -> Any:
    from peft import LoraConfig

    lora = spec.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters by name (tied weights appear once)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total, trainable
