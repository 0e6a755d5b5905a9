"""The check that a loaded model keeps packed examples apart (trainer/data/packing.py), run before training
when data.packing is on: a model whose attention ignores packed position ids is refused (exit 2)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.data.check import DataError
from trainer.data.packing import Packed, collate
from trainer.train_step.loss import base_model, hidden_states, model_inputs


class NotIsolated(DataError):
    """The model lets packed examples see each other (its attention ignores the position ids): exit 2."""

    def __init__(self, model_type: str) -> None:
        super().__init__(
            f"data.packing: this model ({model_type}) does not keep packed examples apart (its attention "
            "ignores position ids, e.g. ALiBi); use data.packing: false"
        )


def verify(model: Any, flat: bool = False, amp: torch.dtype | None = None) -> None:
    """Raise NotIsolated unless an example's hidden states inside a pack match those of the example
    alone. Judged against the contaminated result (the same pack with plain causal attention), so the
    dtype's rounding does not matter. Runs as training does (`flat` batches for flash attention, autocast
    to `amp`), in eval mode (no dropout: no random numbers are drawn, exact resume is untouched)."""

    device = next(model.parameters()).device
    config = base_model(model).config
    vocab = int(getattr(config, "vocab_size", 0) or 8)
    first, second = [1 % vocab, 2 % vocab, 3 % vocab], [4 % vocab, 5 % vocab, 6 % vocab, 7 % vocab]
    pair = Packed(first + second, first + second, (len(first), len(second)))
    alone = Packed(second, second, (len(second),))
    was_training = model.training
    model.eval()
    try:
        with (
            torch.no_grad(),
            torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None),
        ):
            packed = collate([pair], 0, device, flat)
            mixed = {**packed, "attention_mask": torch.ones_like(packed["input_ids"])}
            outputs = [_outputs(model, b) for b in (packed, mixed, collate([alone], 0, device, flat))]
    except TypeError:  # its forward takes no position ids
        raise NotIsolated(str(getattr(config, "model_type", type(model).__name__))) from None
    finally:
        model.train(was_training)
    inside, contaminated, reference = (h[0, -len(second) :].float() for h in outputs)
    error = float((inside - reference).norm())
    contamination = float((contaminated - reference).norm())
    if not error <= 0.05 * contamination:
        raise NotIsolated(str(getattr(config, "model_type", type(model).__name__)))


def _outputs(model: Any, batch: dict[str, Any]) -> Any:
    """The last hidden states (the trainer's loss path), or the logits of a model without that path."""
    found = hidden_states(model, batch)
    return found if found is not None else model(**model_inputs(batch)).logits
