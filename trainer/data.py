"""Training data: JSONL in text / instruction / chat formats, tokenised, with a stateless sampler.

The order of examples depends only on (seed, epoch), and the data position is just the count of
micro-batches consumed, so resuming needs nothing but the step number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainer.config import DataSpec
from trainer.data_check import DataError, check_row, read_jsonl, text_field
from trainer.packing import Packed, pack
from trainer.packing import collate as _collate_packed

__all__ = ["DataError", "Dataset", "Example", "collate", "encode_row", "load_dataset", "read_jsonl"]

IGNORE = -100

INSTRUCTION_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
INSTRUCTION_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _bos(tokenizer: Any) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None and getattr(tokenizer, "add_bos_token", True) else []


def _eos(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if eos is not None else []


def encode_row(row: dict[str, Any], fmt: str, tokenizer: Any, path: str = "data") -> Example:
    """One JSONL row -> token ids and labels (prompt tokens masked for instruction and chat)."""
    check_row(row, fmt, path)
    if fmt == "text":
        ids = _bos(tokenizer) + _ids(tokenizer, row["text"]) + _eos(tokenizer)
        return Example(ids, list(ids))
    if fmt == "instruction":
        instruction = row["instruction"]
        extra = text_field(row, "input", path, fmt, required=False)
        template = INSTRUCTION_PROMPT_WITH_INPUT if extra else INSTRUCTION_PROMPT
        prompt = _bos(tokenizer) + _ids(tokenizer, template.format(instruction=instruction, input=extra))
        answer = _ids(tokenizer, row["output"]) + _eos(tokenizer)
        return Example(prompt + answer, [IGNORE] * len(prompt) + answer)
    return _encode_chat(row, tokenizer, path)


def _encode_chat(row: dict[str, Any], tokenizer: Any, path: str) -> Example:
    messages = row["messages"]
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("data.format: chat needs a tokenizer with a chat template")
    clean = [{"role": m["role"], "content": m["content"]} for m in messages]

    def render(upto: int, generation_prompt: bool) -> str:
        if upto == 0:
            return ""
        return tokenizer.apply_chat_template(
            clean[:upto], tokenize=False, add_generation_prompt=generation_prompt
        )

    ids: list[int] = []
    labels: list[int] = []
    rendered = ""
    for i, message in enumerate(clean):
        if message["role"] == "assistant":
            prompt_text = render(i, True)
            segment = prompt_text[len(rendered) :] if prompt_text.startswith(rendered) else prompt_text
            seg_ids = _ids(tokenizer, segment)
            ids += seg_ids
            labels += [IGNORE] * len(seg_ids)
            full = render(i + 1, False)
            answer = full[len(prompt_text) :] if full.startswith(prompt_text) else full
            answer_ids = _ids(tokenizer, answer)
            ids += answer_ids
            labels += answer_ids
            rendered = full
        else:
            full = render(i + 1, False)
            segment = full[len(rendered) :] if full.startswith(rendered) else full
            seg_ids = _ids(tokenizer, segment)
            ids += seg_ids
            labels += [IGNORE] * len(seg_ids)
            rendered = full
    return Example(ids, labels)


@dataclass
class Dataset:
    train: list[Example]
    held_out: list[Example]
    skipped: int
    micro_batch_size: int
    seed: int
    pad_id: int

    @property
    def micro_batches_per_epoch(self) -> int:
        return len(self.train) // self.micro_batch_size

    @property
    def tokens(self) -> int:
        return sum(len(e.input_ids) for e in self.train)

    def order(self, epoch: int) -> np.ndarray:
        """The example order of an epoch: a pure function of (seed, epoch)."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.train))

    def micro_batch(self, index: int) -> list[Example]:
        """The index-th micro-batch of the whole run (epochs follow one another)."""
        epoch, i = divmod(index, self.micro_batches_per_epoch)
        order = self.order(epoch)
        start = i * self.micro_batch_size
        return [self.train[int(j)] for j in order[start : start + self.micro_batch_size]]


def load_dataset(
    spec: DataSpec,
    tokenizer: Any,
    micro_batch_size: int,
    seed: int,
    storage_options: dict[str, Any] | None = None,
    cache_store: Any = None,
) -> Dataset:
    """Tokenise the data file; with `cache_store` (a RunStore), reuse an earlier attempt's result."""
    encoded, held, skipped = _tokenise_cached(spec, tokenizer, storage_options, cache_store)
    if spec.packing:  # recomputed every attempt (cheap, deterministic): trainer/packing.py
        examples = len(encoded)
        encoded = pack(encoded, spec.max_seq_len)  # type: ignore[assignment]
        _log(f"packed {examples} examples into {len(encoded)} sequences of up to {spec.max_seq_len} tokens")
    if len(encoded) < micro_batch_size:
        raise DataError(
            f"data.path: {len(encoded)} usable training {'sequences' if spec.packing else 'examples'}, "
            f"fewer than train.micro_batch_size ({micro_batch_size})"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Dataset(encoded, held, skipped, micro_batch_size, seed, int(pad if pad is not None else 0))


def _tokenise_cached(
    spec: DataSpec, tokenizer: Any, storage_options: dict[str, Any] | None, cache_store: Any
) -> tuple[list[Example], list[Example], int]:
    from trainer import data_cache

    if cache_store is None or not data_cache.enabled():
        return _tokenise(spec, tokenizer, storage_options)
    key = data_cache.cache_key(spec, tokenizer, storage_options)
    hit = data_cache.load(cache_store, key)
    if hit is not None:
        _log(f"tokenised data from the run store's cache ({key[:12]}): {len(hit.train)} examples")
        train = [Example(i, lab) for i, lab in hit.train]
        return train, [Example(i, lab) for i, lab in hit.held_out], hit.skipped
    encoded, held, skipped = _tokenise(spec, tokenizer, storage_options)
    try:
        data_cache.save(
            cache_store,
            key,
            data_cache.Tokenised(
                [(e.input_ids, e.labels) for e in encoded], [(e.input_ids, e.labels) for e in held], skipped
            ),
        )
    except Exception as exc:  # noqa: BLE001 - the cache is an optimisation
        _log(f"could not cache the tokenised data ({exc.__class__.__name__}: {exc})")
    return encoded, held, skipped


def _log(message: str) -> None:
    from trainer.progress import log

    log(message)


def _tokenise(
    spec: DataSpec, tokenizer: Any, storage_options: dict[str, Any] | None
) -> tuple[list[Example], list[Example], int]:
    rows = read_jsonl(spec.path, storage_options, fmt=spec.format)
    if spec.eval_examples >= len(rows):
        raise DataError(
            f"data.eval_examples: {spec.eval_examples} leaves no training examples (the file has {len(rows)})"
        )
    cut = len(rows) - spec.eval_examples
    encoded: list[Example] = []
    held: list[Example] = []
    skipped = 0
    truncated = 0
    from trainer.progress import PhaseProgress

    phase = PhaseProgress("tokenising", len(rows), "examples")
    for n, row in enumerate(rows):
        if n % 256 == 0:
            phase.update(n)
        example = encode_row(row, spec.format, tokenizer, spec.path)
        if len(example.input_ids) > spec.max_seq_len:
            truncated += 1
            example = Example(example.input_ids[: spec.max_seq_len], example.labels[: spec.max_seq_len])
        if not any(label != IGNORE for label in example.labels[1:]):
            skipped += 1  # truncation left nothing to learn from
            continue
        (encoded if n < cut else held).append(example)
    phase.done(f"{sum(len(e.input_ids) for e in encoded):,} training tokens")
    if truncated:
        _log(
            f"{truncated} of {len(rows)} examples were longer than data.max_seq_len ({spec.max_seq_len} "
            f"tokens) and were truncated{f'; {skipped} left nothing to learn and were dropped' if skipped else ''}"
        )
    return encoded, held, skipped


def collate(
    examples: list[Example], pad_id: int, device: torch.device | str = "cpu", flat: bool = False
) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example of the micro-batch (packs: trainer/packing.py, `flat` for
    flash attention)."""
    if examples and isinstance(examples[0], Packed):
        return _collate_packed(examples, pad_id, device, flat)  # type: ignore[arg-type]
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        ids[row, :n] = torch.tensor(example.input_ids, dtype=torch.long)
        labels[row, :n] = torch.tensor(example.labels, dtype=torch.long)
        mask[row, :n] = 1
    return {"input_ids": ids.to(device), "labels": labels.to(device), "attention_mask": mask.to(device)}
