"""What no retry can fix about a job's model: the model cannot be had (gated, missing, offline and not
cached), a LoRA target module it lacks, or a device it asked for that is not there.

The trainer exits BAD_CONFIG (not retried) on these errors; the orchestrator's launch preflight asks the
same questions first (`unknown_targets` builds the model on the meta device from its config; the device
question is trainer/model/quant.py's `device_problem`). torch and
transformers are imported inside the functions: the orchestrator imports this module cheaply.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


class ModelUnavailable(ValueError):
    """The model (config, weights or tokenizer) cannot be loaded, and trying again would not change it."""


class LoraTargetMissing(ValueError):
    """lora.target_modules names a module the model does not have."""


class DeviceUnavailable(RuntimeError):
    """local.device (or the method) needs a device this machine does not have."""


#: huggingface_hub's errors that no retry fixes (network errors and timeouts are not among them)
_FINAL = (
    "GatedRepoError",
    "RepositoryNotFoundError",
    "RevisionNotFoundError",
    "EntryNotFoundError",
    "RemoteEntryNotFoundError",
    "LocalEntryNotFoundError",
    "DisabledRepoError",
    "HFValidationError",
)


def final_cause(exc: BaseException) -> BaseException | None:
    """The huggingface_hub error behind `exc` (transformers wraps them in OSError) when no retry fixes it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ in _FINAL for cls in type(current).__mro__):
            return current
        current = current.__cause__ or current.__context__
    return None


def why_unavailable(model: str, cause: BaseException) -> str:
    """One line for the log: what is wrong and what would fix it."""
    kind = type(cause).__name__
    if kind == "GatedRepoError":
        return (
            f"model: {model} is gated on the Hugging Face Hub: accept its license on huggingface.co and "
            "give a token with access (HF_TOKEN)"
        )
    if kind == "RepositoryNotFoundError":
        return f"model: {model} was not found on the Hugging Face Hub (or is private: set HF_TOKEN)"
    if kind == "LocalEntryNotFoundError":
        return (
            f"model: {model} is not in the Hugging Face cache and the Hub is off (HF_HUB_OFFLINE) or "
            "unreachable; download it first (`hf download MODEL`) or go online"
        )
    first = " ".join(str(cause).split())[:300]
    return f"model: {model} cannot be loaded ({kind}: {first})"


#: what a training run needs of a Hub repo (not every format's duplicate of the weights)
HUB_FILES = ["*.json", "*.safetensors", "pytorch_model*.bin", "*.model", "*.txt", "*.jinja", "tokenizer*"]
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


def resolve_model(model: str) -> str:
    """The model's folder: a folder as given, or a Hub id's snapshot through huggingface_hub (its cache
    under HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN or the saved login, HF_ENDPOINT). What no
    retry fixes (gated, missing, offline and not cached, no weights) raises ModelUnavailable."""
    if os.path.isdir(os.path.expanduser(model)):
        return os.path.expanduser(model)
    from pathlib import Path

    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(model, allow_patterns=HUB_FILES)
    except Exception as exc:
        cause = final_cause(exc)
        if cause is None:
            raise  # the network: a retry may help
        raise ModelUnavailable(why_unavailable(model, cause)) from exc
    if not any(next(Path(folder).glob(p), None) for p in WEIGHTS):
        raise ModelUnavailable(
            f"model: {model}: its copy in the Hugging Face cache ({folder}) has no weights; download it "
            f"(`hf download {model}`) or go online (unset HF_HUB_OFFLINE)"
        )
    return folder


def from_hub(spec: Any, load: Any, *args: Any, **kwargs: Any) -> Any:
    """`load(folder, ...)` (a transformers from_pretrained) on the model's folder (`resolve_model`); the
    loaded object keeps the job's name for the model (what an exported adapter records as its base)."""
    loaded = load(resolve_model(spec.model), *args, **kwargs)
    config = getattr(loaded, "config", None)
    if config is not None:
        config._name_or_path = spec.model
    elif hasattr(loaded, "name_or_path"):
        loaded.name_or_path = spec.model
    return loaded


def lora_target_names(model: Any) -> tuple[set[str], list[str]]:
    """(every module's dotted name, the last names of its linear layers: what target_modules can name)."""
    import torch

    names: set[str] = set()
    linear: list[str] = []
    for name, module in model.named_modules():
        names.add(name)
        is_linear = isinstance(module, torch.nn.Linear) or type(module).__name__ in ("Conv1D", "Linear4bit")
        leaf = name.rsplit(".", 1)[-1]
        if is_linear and name and leaf not in linear:
            linear.append(leaf)
    return names, linear


def missing_targets(model: Any, target_modules: str | Iterable[str]) -> tuple[list[str], list[str]]:
    """(the targets no module matches, as PEFT matches a list: the name or its dotted suffix; the valid
    linear names). 'all-linear' always matches."""
    names, linear = lora_target_names(model)
    if isinstance(target_modules, str):
        return [], linear
    missing = [t for t in target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    return missing, linear


def check_targets(model: Any, target_modules: str | Iterable[str], model_name: str) -> None:
    """Raise LoraTargetMissing naming the targets the model lacks (PEFT would crash on none found, or
    silently adapt fewer layers than asked when only some are)."""
    missing, linear = missing_targets(model, target_modules)
    if missing:
        raise LoraTargetMissing(
            f"lora.target_modules: {', '.join(missing)} is not a module of {model_name}; "
            f"its linear layers: {', '.join(linear)} (or all-linear)"
        )


def unknown_targets(
    config: dict[str, Any], target_modules: str | Iterable[str]
) -> tuple[list[str], list[str]]:
    """`missing_targets` for a model built from its config.json on the meta device (no weights, no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in config.items() if k not in ("aliases", "quantization_config")}
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return missing_targets(model, target_modules)
