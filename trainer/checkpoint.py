"""What a checkpoint holds, and how it is turned into bytes and back without unpickling objects.

- `weights.safetensors`: the trainable parameters by name (LoRA adapters, or every weight for full FT)
- `optimizer.pt`: optimizer and LR-scheduler state dicts (tensors and numbers only; read back with
  `torch.load(weights_only=True)`)
- `rng.safetensors`: torch CPU and CUDA generator states
- `trainer_state.json`: step, data position, python and numpy RNG, evaluation results, bookkeeping
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from trainer.model import trainable_parameters

WEIGHTS = "weights.safetensors"
OPTIMIZER = "optimizer.pt"
RNG = "rng.safetensors"
STATE = "trainer_state.json"


@dataclass
class TrainerState:
    step: int
    micro_batches: int
    tokens_seen: int
    extra: dict[str, Any] = field(default_factory=dict)


def _python_rng() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_python_rng(state: list[Any]) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def _numpy_rng() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "kind": kind,
        "keys": keys.tolist(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _set_numpy_rng(state: dict[str, Any]) -> None:
    np.random.set_state(
        (
            state["kind"],
            np.array(state["keys"], dtype=np.uint32),
            state["pos"],
            state["has_gauss"],
            state["cached"],
        )
    )


def capture(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, state: TrainerState
) -> dict[str, bytes]:
    """Everything that decides the rest of the run, as bytes (copied off the training tensors)."""
    weights = {
        name: p.detach().to("cpu", copy=True).contiguous() for name, p in trainable_parameters(model).items()
    }
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    rng: dict[str, torch.Tensor] = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda_{index}"] = cuda_state
    trainer_state = {
        "step": state.step,
        "micro_batches": state.micro_batches,
        "tokens_seen": state.tokens_seen,
        "python_rng": _python_rng(),
        "numpy_rng": _numpy_rng(),
        "extra": state.extra,
    }
    return {
        WEIGHTS: safetensors_save(weights),
        OPTIMIZER: buffer.getvalue(),
        RNG: safetensors_save(rng),
        STATE: json.dumps(trainer_state).encode(),
    }


def restore(
    blobs: dict[str, bytes], model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> TrainerState:
    """Load a verified checkpoint into the freshly built model, optimizer and scheduler."""
    weights = safetensors_load(blobs[WEIGHTS])
    params = trainable_parameters(model)
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(set(weights) - set(params))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(weights[name].to(param.device, param.dtype))
    states = torch.load(io.BytesIO(blobs[OPTIMIZER]), map_location="cpu", weights_only=True)
    optimizer.load_state_dict(states["optimizer"])
    scheduler.load_state_dict(states["scheduler"])
    rng = safetensors_load(blobs[RNG])
    torch.set_rng_state(rng["torch_cpu"])
    cuda_states = [rng[f"cuda_{i}"] for i in range(len(rng)) if f"cuda_{i}" in rng]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
    saved = json.loads(blobs[STATE])
    _set_python_rng(saved["python_rng"])
    _set_numpy_rng(saved["numpy_rng"])
    return TrainerState(
        step=int(saved["step"]),
        micro_batches=int(saved["micro_batches"]),
        tokens_seen=int(saved["tokens_seen"]),
        extra=saved.get("extra") or {},
    )
