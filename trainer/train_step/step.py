"""One optimizer step: gradient accumulation normalised by the step's label tokens, mixed precision
(autocast, and fp16's gradient scaler), clipping and the update.

Normalisation: every micro-batch contributes the *sum* of its token losses divided by the label tokens of
the whole optimizer step (all micro-batches, all ranks), so the accumulated gradient is the gradient of one
big batch holding the same tokens; a mean of micro-batch means would weight a token of a short
micro-batch more than one of a long micro-batch. Every rank reads the same global micro-batches (then
keeps its slice, `Parallel.local`), so the step's token count is known on every rank without a collective.
Under FSDP the loss is also multiplied by the world size, because FSDP averages gradients over ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainer.config import JobSpec
from trainer.data.dataset import Example, collate
from trainer.data.packing import uses_flat_batches
from trainer.kernels import fused_loss
from trainer.model.load import autocast_dtype
from trainer.optim.in_backward import in_backward
from trainer.train_step.loss import label_tokens, loss_sum


def make_scaler(spec: JobSpec, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (fp16 gradients underflow without it); None for every other precision.
    Plain `torch.amp.GradScaler` also serves FSDP2: its inf check on DTensor gradients is all-reduced."""
    if spec.train.precision != "fp16-mixed":
        return None
    return torch.amp.GradScaler(device.type)


def save_scaler(scaler: torch.amp.GradScaler | None, kept: dict[str, Any] | None) -> dict[str, Any] | None:
    """The scaler state to checkpoint (`TrainerState.scaler`: scale, growth tracker, plain numbers): the
    scaler's now, or `kept` (the state as it was) without a scaler."""
    return scaler.state_dict() if scaler is not None else kept


def restore_scaler(scaler: torch.amp.GradScaler | None, saved: dict[str, Any] | None) -> None:
    """The checkpoint's scaler state (`TrainerState.scaler`) into the scaler, when both are there."""
    if scaler is not None and saved:
        scaler.load_state_dict(saved)


def accumulate(
    model: torch.nn.Module,
    micro_batches: Sequence[Sequence[Example]],
    *,
    spec: JobSpec,
    device: torch.device,
    pad_id: int,
    local: Callable[[list[Example]], list[Example]] = list,
    world: int = 1,
    scaler: torch.amp.GradScaler | None = None,
    tokens: Callable[[dict[str, torch.Tensor]], int] | None = None,
) -> tuple[float, int]:
    """Forward and backward over the step's global micro-batches; gradients are left in `.grad`.
    Returns (this rank's share of the step's mean token loss, input tokens seen)."""
    items = max(1, sum(label_tokens(examples) for examples in micro_batches))
    amp = autocast_dtype(spec)
    step_loss, seen = 0.0, 0
    flat = uses_flat_batches(spec.train.attn_implementation)
    fused = fused_loss(spec.train.kernels, device.type)  # train.kernels (None: the portable paths)
    for examples in micro_batches:
        mine = local(list(examples))
        batch = collate(mine, pad_id, device, flat=flat)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_sum(model, batch, path=spec.train.loss, fused=fused) * (world / items)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        step_loss += float(loss.detach())
        seen += tokens(batch) if tokens is not None else sum(len(e.input_ids) for e in mine)
    return step_loss, seen


def update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
    scaler: torch.amp.GradScaler | None = None,
    go: Callable[[float | None], bool] | None = None,
) -> float | None:
    """Clip (after unscaling) and step; with a scaler the step is skipped when gradients overflowed.
    `go(grad_norm)` (the health checks) may skip the step: False leaves the weights and optimizer state
    as they were. Returns the gradient norm before clipping (None without clipping or health checks)."""
    if in_backward(optimizer):  # train.optimizer_in_backward: the hooks stepped; no whole gradient to clip
        optimizer.step()  # steps nothing (keeps the LR scheduler's order check quiet)
        if go is not None:
            go(None)  # the loss is still judged; the weights have stepped already
        return None
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = None
    params = [p for p in model.parameters() if p.requires_grad]
    if max_grad_norm or go is not None:  # the health checks need the norm even without clipping
        norm = (
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            if max_grad_norm
            else torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        )
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # DTensor: FSDP
    if go is not None and not go(grad_norm):
        if scaler is not None:
            scaler.update()  # its own bookkeeping (unscale_ was called); the step itself is skipped
        return grad_norm
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return grad_norm
