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


# ---- data.packing: auto, resolved per attempt (the rule: trainer/data/packing.py `resolve_packing`) ----
def probe(spec: Any, device: torch.device, attn_implementation: str) -> str | None:
    """The packing check on a one-layer model of the job's architecture (its config, random weights, on
    `device`, with `attn_implementation`), before the data is packed: None when it keeps packed examples
    apart, else why not (a check that cannot run counts as failed). Whether attention reads the packed
    position ids is the architecture's, not the weights'; the real model is checked again once loaded.
    The random numbers drawn here are put back (torch.random.fork_rng): the run is untouched."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.model.check import from_hub

    flash = attn_implementation.startswith("flash_attention")
    try:
        config = from_hub(spec, AutoConfig.from_pretrained)
        config.num_hidden_layers = 1
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:1]
        forks = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=forks), torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config,
                attn_implementation=attn_implementation,
                dtype=torch.bfloat16 if flash else torch.float32,
            )
            verify(model, flash)
            del model
    except NotIsolated as exc:
        return str(exc).split(": ", 1)[-1].split(";")[0]
    except Exception as exc:  # noqa: BLE001 - not checked is not passed: auto stays off
        return f"it could not run: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    finally:
        if device.type == "cuda":  # the probe's memory back before the model loads
            torch.cuda.empty_cache()
    return None


def resolve_for_attempt(
    spec: Any, as_run: dict[str, Any], device: torch.device, log: Any
) -> tuple[Any, dict[str, Any]]:
    """data.packing: auto resolved on this attempt's machine, after train.attn_implementation (`spec`
    has it resolved) and before the fingerprint: the spec the attempt runs and the resolved job the
    checkpoints' fingerprint records (spec.json keeps `auto`), as trainer/loop.py does for attention.
    A resume that would resolve otherwise is refused like any change (trainer/checkpoints/fingerprint.py)."""
    from trainer.data.packing import resolve_packing, uses_flat_batches

    requested = spec.data.packing
    if requested != "auto":
        return spec, as_run
    attn = spec.train.attn_implementation
    refusal = probe(spec, device, attn) if uses_flat_batches(attn) else None
    packing, why = resolve_packing(requested, attn, refusal)
    log(why)
    spec = spec.model_copy(update={"data": spec.data.model_copy(update={"packing": packing})})
    data = as_run["job"].get("data")
    data = {**data} if isinstance(data, dict) else {"path": data}
    return spec, {**as_run, "job": {**as_run["job"], "data": {**data, "packing": packing}}}
