"""AdamW's implementation per device: fused on CUDA, the per-tensor loop elsewhere.

torch's AdamW has three implementations with the same math: the per-tensor loop (`foreach=False`), the
multi-tensor `foreach` (CUDA: a few kernels per parameter group instead of several per tensor) and `fused`
(CUDA: one kernel per group, the fastest). All three are deterministic run to run, so a resume on the same
kind of device stays bitwise; they round differently from each other, so a run moved from one to another
(a CPU run resumed on a GPU) continues the same math up to rounding, not bitwise. On the CPU the loop is
what torch picks anyway (foreach and fused are CUDA paths; fused CPU AdamW exists but is not faster at the
trainer's sizes), and it is what CPU-offloaded state steps with.
"""

from __future__ import annotations

from typing import Literal

import torch

from trainer.config import JobSpec

Impl = Literal["fused", "foreach", "loop"]


def adamw_impl(params: list[torch.nn.Parameter]) -> Impl:
    """fused when every parameter is a floating CUDA tensor (DTensor shards included), else loop."""
    on_cuda = bool(params) and all(p.device.type == "cuda" and p.is_floating_point() for p in params)
    return "fused" if on_cuda else "loop"


def adamw(spec: JobSpec, params: list[torch.nn.Parameter], impl: Impl | None = None) -> torch.optim.AdamW:
    """The job's AdamW over `params`, in `impl` (default: `adamw_impl`)."""
    impl = impl or adamw_impl(params)
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[impl]
    return torch.optim.AdamW(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay, **flags)
