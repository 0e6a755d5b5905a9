"""Every random stream that decides a run's future (torch CPU and CUDA, Python, NumPy): captured,
restored, and written into checkpoints in their two forms.

- whole (one-process) checkpoints: the torch states as tensors in `rng.safetensors` (`tensors`), the
  Python and NumPy states in `trainer_state.json` (`json_fields`); every CUDA device's state.
- sharded checkpoints: each rank's streams as one JSON file (`to_json`); the rank's current CUDA device.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class RngState:
    torch_cpu: torch.Tensor
    #: CUDA generator states: every device's from device 0, or (not `every_device`) the current one's
    cuda: list[torch.Tensor]
    #: [version, internal state, gauss] (random.getstate, as lists)
    python: list[Any]
    #: [kind, keys, pos, has_gauss, cached] (numpy's legacy global state, as plain numbers)
    numpy: list[Any]
    every_device: bool = True

    @classmethod
    def capture(cls, every_device: bool = True) -> RngState:
        version, internal, gauss = random.getstate()
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        cuda: list[torch.Tensor] = []
        if torch.cuda.is_available():
            cuda = list(torch.cuda.get_rng_state_all()) if every_device else [torch.cuda.get_rng_state()]
        return cls(
            torch_cpu=torch.get_rng_state(),
            cuda=cuda,
            python=[version, list(internal), gauss],
            numpy=[kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            every_device=every_device,
        )

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.cuda and torch.cuda.is_available():
            if self.every_device:
                torch.cuda.set_rng_state_all(self.cuda[: torch.cuda.device_count()])
            else:
                torch.cuda.set_rng_state(self.cuda[0])
        version, internal, gauss = self.python
        random.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = self.numpy
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))

    # ---- whole checkpoints: tensors + two fields of trainer_state.json -------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        found = {"torch_cpu": self.torch_cpu}
        found.update({f"cuda_{i}": state for i, state in enumerate(self.cuda)})
        return found

    def json_fields(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, cached = self.numpy
        numpy = {"kind": kind, "keys": keys, "pos": pos, "has_gauss": has_gauss, "cached": cached}
        return {"python_rng": self.python, "numpy_rng": numpy}

    @classmethod
    def from_whole(cls, tensors: dict[str, torch.Tensor], saved: dict[str, Any]) -> RngState:
        cuda = [tensors[f"cuda_{i}"] for i in range(len(tensors)) if f"cuda_{i}" in tensors]
        numpy = saved["numpy_rng"]
        return cls(
            torch_cpu=tensors["torch_cpu"],
            cuda=cuda,
            python=list(saved["python_rng"]),
            numpy=[numpy[k] for k in ("kind", "keys", "pos", "has_gauss", "cached")],
        )

    # ---- sharded checkpoints: one JSON object per rank -----------------------------------------
    def to_json(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "torch_cpu": _b64(self.torch_cpu),
            "python": self.python,
            "numpy": self.numpy,
        }
        if self.cuda:
            state["cuda"] = _b64(self.cuda[0])
        return state

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> RngState:
        return cls(
            torch_cpu=_tensor(state["torch_cpu"]),
            cuda=[_tensor(state["cuda"])] if "cuda" in state else [],
            python=list(state["python"]),
            numpy=list(state["numpy"]),
            every_device=False,
        )


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
