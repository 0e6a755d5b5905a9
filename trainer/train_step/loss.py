"""The training loss: token cross-entropy with the LM head applied chunk by chunk.

A causal LM's own loss materialises the logits of the whole micro-batch and, in transformers 5, three fp32
copies of them at the start of backward (about 12 bytes per token x vocabulary: 25 GB for Llama 3 at
8 x 2,048 tokens). Here the model runs its body only (`logits_to_keep` selects no position, so its head
computes nothing) and the head plus cross-entropy run over chunks of tokens, each under activation
checkpointing: the forward keeps no logits at all, and the backward recomputes one chunk's logits at a
time. Peak logit memory is one chunk's (`CHUNK_ELEMENTS` logit elements), whatever the batch.

The loss returned is a *sum* over label tokens; the caller divides by the label tokens of the whole
optimizer step (`label_tokens`), so gradient accumulation weights every token alike.

The model's root module is still what is called (its hooks run: FSDP2 gathers the root's parameters, the
head included, and keeps them until the backward, so applying the head after the call is safe).
A model whose forward takes no `logits_to_keep` falls back to its own loss, as a sum.

The path is chosen per job (`train.loss`) and, under `auto`, per micro-batch (`loss_path`): when the
micro-batch's logits fit in one chunk anyway, the head runs once without checkpointing (`plain`: the same
logits, the same memory, no recomputation in backward); when they would not, chunk by chunk (`chunked`).
`train.kernels: [liger_fused_ce]` swaps in Liger's fused linear cross-entropy (CUDA, liger-kernel installed),
which never holds more than a block of logits either (trainer/kernels.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainer.kernels import CHUNK_ELEMENTS, loss_path
from trainer.labels import IGNORE, Example


def label_tokens(examples: Sequence[Example]) -> int:
    """Tokens that carry a loss: labels after the first position (each predicts from the one before)."""
    return sum(sum(1 for label in e.labels[1:] if label != IGNORE) for e in examples)


def chunk_tokens(vocab: int, elements: int | None = None) -> int:
    """Tokens per chunk: `elements` (default `CHUNK_ELEMENTS`) logits at most."""
    return max(1, (elements or CHUNK_ELEMENTS) // max(1, vocab))


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _takes_logits_to_keep(base: torch.nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def _body(base: torch.nn.Module) -> torch.nn.Module | None:
    prefix = getattr(base, "base_model_prefix", "")
    body = getattr(base, prefix, None) if prefix else None
    return body if isinstance(body, torch.nn.Module) else None


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What the model is called with: input ids and a 2D attention mask, or input ids and the position
    ids of packed examples (trainer/data/packing.py; no mask and no cache, so transformers keeps the examples
    apart: it reads the packing from the position ids only then)."""
    inputs: dict[str, Any] = {
        k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch
    }
    if "position_ids" in batch:
        inputs["use_cache"] = False
    return inputs


def hidden_states(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The body's last hidden states (batch, seq, hidden), from a call of the root module that computes
    no logits; None when the model cannot be called that way."""
    base = base_model(model)
    body = _body(base)
    if body is None or base.get_output_embeddings() is None or not _takes_logits_to_keep(base):
        return None
    captured: dict[str, Any] = {}

    def keep(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        captured["h"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]

    handle = body.register_forward_hook(keep)
    try:
        none = torch.empty(0, dtype=torch.long, device=batch["input_ids"].device)
        model(**model_inputs(batch), logits_to_keep=none)
    finally:
        handle.remove()
    return captured.get("h")


def _logits(head: torch.nn.Module, config: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The head's fp32 logits, with what the model's forward applies after its head."""
    logits = head(hidden).float()
    scale = getattr(config, "logit_scale", None)  # Cohere
    if isinstance(scale, (int, float)) and scale != 1:
        logits = logits * scale
    softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 and 3
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def _head_loss(
    head: torch.nn.Module, config: Any, hidden: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(_logits(head, config, hidden), labels, ignore_index=IGNORE, reduction="sum")


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """Position t is scored on token t+1 (the last position on nothing), as transformers does."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE)


def loss_sum(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    chunk: int | None = None,
    path: str = "chunked",
    fused: Any = None,
) -> torch.Tensor:
    """Sum of the token cross-entropies (fp32) of the micro-batch: in chunks of `chunk` tokens (default:
    `CHUNK_ELEMENTS` logits per chunk) under checkpointing, or in one piece (`path` plain; auto: `loss_path`),
    or by `fused(head, config, hidden, labels)` (a fused linear cross-entropy, trainer/kernels.py)."""
    hidden = hidden_states(model, batch)
    if hidden is None:  # the model's own loss: sum = mean x 1 item
        return model(**model_inputs(batch), labels=batch["labels"], num_items_in_batch=1).loss
    base = base_model(model)
    head = base.get_output_embeddings()
    flat = hidden.reshape(-1, hidden.shape[-1])
    labels = shifted_labels(batch["labels"]).reshape(-1)
    if fused is not None:
        return fused(head, base.config, flat, labels)
    vocab = int(getattr(base.config, "vocab_size", 0) or CHUNK_ELEMENTS)
    if chunk is None and loss_path(path, flat.shape[0], vocab, CHUNK_ELEMENTS) == "plain":
        return _head_loss(head, base.config, flat, labels)  # nothing kept for a recomputation
    size = chunk or chunk_tokens(vocab)
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    for start in range(0, flat.shape[0], size):
        part = checkpoint(
            _head_loss,
            head,
            base.config,
            flat[start : start + size],
            labels[start : start + size],
            use_reentrant=False,
        )
        total = total + part
    return total


@torch.no_grad()
def evaluate_batch(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    """(sum of token losses, predicted next token at each position) without full-vocabulary logits."""
    hidden = hidden_states(model, batch)
    labels = shifted_labels(batch["labels"])
    if hidden is None:
        logits = model(**model_inputs(batch)).logits.float()
        loss = F.cross_entropy(logits.flatten(0, 1), labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return float(loss), logits.argmax(-1)
    base = base_model(model)
    head = base.get_output_embeddings()
    flat = hidden.reshape(-1, hidden.shape[-1])
    size = chunk_tokens(int(getattr(base.config, "vocab_size", 0) or CHUNK_ELEMENTS))
    total, predicted = 0.0, []
    for start in range(0, flat.shape[0], size):
        logits = _logits(head, base.config, flat[start : start + size])
        total += float(
            F.cross_entropy(
                logits, labels.reshape(-1)[start : start + size], ignore_index=IGNORE, reduction="sum"
            )
        )
        predicted.append(logits.argmax(-1))
    return total, torch.cat(predicted).view(labels.shape)


def plain_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own (full-logits) loss as a sum: the reference `loss_sum` is checked against."""
    return model(**batch, num_items_in_batch=1).loss
