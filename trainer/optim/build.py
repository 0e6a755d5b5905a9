"""The job's optimizer (train.optimizer, train.optimizer_in_backward), and AdamW's implementation per
device: fused on CUDA, the per-tensor loop elsewhere.

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


def make_optimizer(spec: JobSpec, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.train.optimizer_in_backward:  # one optimizer per parameter, stepped in its gradient hook
        from trainer.optim.in_backward import InBackwardOptimizer

        return InBackwardOptimizer(params, lambda group: optimizer_for(spec, group))
    return optimizer_for(spec, params)


def optimizer_for(spec: JobSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The job's optimizer (train.optimizer) over `params`."""
    if spec.train.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        from trainer.model.quant import make_8bit_optimizer

        return make_8bit_optimizer(spec, params)
    if spec.train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.train.lr, momentum=0.9, weight_decay=spec.train.weight_decay)
    if spec.train.optimizer == "adafactor":  # factored second moments, no first moment: ~4 B/param or less
        return torch.optim.Adafactor(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    return adamw(spec, params)  # fused on CUDA, the per-tensor loop elsewhere (trainer/optim/build.py)
