"""Training data: JSONL in text / instruction / chat formats, tokenised, with a stateless sampler.

The order of examples depends only on (seed, epoch), and the data position is just the count of
micro-batches consumed, so resuming needs nothing but the step number.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainer.config import DataSpec
from trainer.data.check import DataError, check_row, read_jsonl, text_field
from trainer.data.packing import Packed, pack
from trainer.data.packing import collate as _collate_packed
from trainer.faults import maybe_slow
from trainer.labels import IGNORE, Example
from trainer.stops.sources import check_setup

__all__ = ["DataError", "Dataset", "Example", "collate", "encode_row", "load_dataset", "read_jsonl"]

INSTRUCTION_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
INSTRUCTION_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _bos(tokenizer: Any) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None and getattr(tokenizer, "add_bos_token", True) else []


def _eos(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if eos is not None else []


def encode_row(
    row: dict[str, Any], fmt: str, tokenizer: Any, path: str = "data", train_on_inputs: bool = False
) -> Example:
    """One record -> token ids and labels (prompt tokens masked for instruction and chat, unless
    `train_on_inputs`)."""
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
        masked = prompt if train_on_inputs else [IGNORE] * len(prompt)
        return Example(prompt + answer, masked + answer)
    example = _encode_chat(row, tokenizer, path)
    return Example(example.input_ids, list(example.input_ids)) if train_on_inputs else example


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
    identity: str | None = None,
) -> Dataset:
    """Tokenise the data file; with `cache_store` (a RunStore), reuse an earlier attempt's result.
    `identity`: data.path's (trainer.data.cache.data_identity), when the caller has it already."""
    encoded, held, skipped = _tokenise_cached(spec, tokenizer, storage_options, cache_store, identity)
    examples = len(encoded)
    # recomputed every attempt (cheap, deterministic): trainer/data/packing.py. The trainer hands `auto`
    # resolved (trainer/train_step/packing_check.py); unresolved here, no attention is known: off (SDPA's rule)
    if spec.packing is True:
        encoded = pack(encoded, spec.max_seq_len)  # type: ignore[assignment]
        _log(f"packed {examples} examples into {len(encoded)} sequences of up to {spec.max_seq_len} tokens")
    if len(encoded) < micro_batch_size:
        raise _too_few(spec, examples, len(encoded), skipped, micro_batch_size)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Dataset(encoded, held, skipped, micro_batch_size, seed, int(pad if pad is not None else 0))


def _too_few(spec: DataSpec, examples: int, usable: int, skipped: int, micro_batch_size: int) -> DataError:
    """Fewer training sequences than one micro-batch, blamed on what caused it: packing (enough examples,
    too few packs), the chat template (it left examples nothing to learn), else the data."""
    fewer = f"fewer than train.micro_batch_size ({micro_batch_size})"
    if spec.packing is True and examples >= micro_batch_size:
        return DataError(
            f"data.packing: {examples} examples pack into {usable} sequences of up to data.max_seq_len "
            f"({spec.max_seq_len}) tokens, {fewer}; turn packing off, lower train.micro_batch_size or add data",
            "data.packing",
        )
    if skipped and spec.format == "chat" and spec.chat_template:
        return DataError(
            f"data.chat_template: {skipped} examples have nothing to learn with this template (no assistant "
            f"tokens after rendering): {examples} usable, {fewer}",
            "data.chat_template",
        )
    return DataError(
        f"data.path: {usable} usable training {'sequences' if spec.packing is True else 'examples'}, {fewer}"
    )


def _tokenise_cached(
    spec: DataSpec,
    tokenizer: Any,
    storage_options: dict[str, Any] | None,
    cache_store: Any,
    identity: str | None = None,
) -> tuple[list[Example], list[Example], int]:
    from trainer.data import cache as data_cache

    if cache_store is None or not data_cache.enabled():
        return _tokenise(spec, tokenizer, storage_options)
    key = data_cache.cache_key(spec, tokenizer, storage_options, identity)
    if key is None:
        _log("the data's identity cannot be told (the Hub is unreachable?): tokenising without the cache")
        return _tokenise(spec, tokenizer, storage_options)
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
    from trainer.runstore.progress import log

    log(message)


def _tokenise(
    spec: DataSpec, tokenizer: Any, storage_options: dict[str, Any] | None
) -> tuple[list[Example], list[Example], int]:
    from trainer.data import source as data_source

    if data_source.looks_like_hub_id(spec.path):
        _log(f"loading {spec.path} (split {spec.split}) from the Hugging Face Hub")
    started = time.monotonic()
    rows = data_source.load(spec.path, spec.format, spec.split, spec.subset, storage_options)
    _log(f"read {len(rows):,} examples from {spec.path} in {time.monotonic() - started:.1f} s")
    train_rows, held_rows = data_source.held_out_split(spec, len(rows))
    examples, truncated = encode_dataset(rows, spec, tokenizer, spec.path, "tokenising")
    encoded = [e for e in (examples[i] for i in train_rows) if e is not None]
    held = [e for e in (examples[i] for i in held_rows) if e is not None]
    skipped = sum(e is None for e in examples)
    total = len(rows)
    source = spec.eval_source()
    if source is not None:
        path, split = source
        subset = spec.subset if path == spec.path else None
        eval_rows = data_source.load(
            path, spec.format, split, subset, storage_options, field="data.eval_path"
        )
        eval_examples, eval_truncated = encode_dataset(
            eval_rows, spec, tokenizer, path, "tokenising the held-out set"
        )
        held = [e for e in eval_examples if e is not None]
        skipped += sum(e is None for e in eval_examples)
        truncated += eval_truncated
        total += len(eval_rows)
    if truncated:
        _log(
            f"{truncated} of {total} examples were longer than data.max_seq_len ({spec.max_seq_len} "
            f"tokens) and were truncated{f'; {skipped} left nothing to learn and were dropped' if skipped else ''}"
        )
    return encoded, held, skipped


#: rows per `datasets.map` call: the log shows the share done between calls, and a notice is acted on there
CHUNK_ROWS = 50_000
#: fewer rows than this per process are tokenised by fewer processes (starting one costs more)
ROWS_PER_PROC = 500


def tokenising_processes(spec: DataSpec, rows: int) -> int:
    wanted = spec.num_proc or min(8, os.cpu_count() or 1)
    return max(1, min(wanted, rows // ROWS_PER_PROC))


def encode_dataset(
    rows: Any, spec: DataSpec, tokenizer: Any, path: str, what: str
) -> tuple[list[Example | None], int]:
    """Every record encoded through `datasets.map` (data.num_proc processes), truncated to max_seq_len;
    None for a record left with nothing to learn. Also: how many were truncated. A JSONL data set small
    enough for one process is encoded here by the same function, without importing `datasets`.

    The result does not depend on the number of processes (map keeps the order), so a cached copy and a
    fresh tokenisation are the same token for token. A notice (the armed stop flag: trainer/stops/sources.py
    `check_setup`) raises `Interrupted` between chunks of CHUNK_ROWS rows: nothing is returned, so nothing
    half-tokenised is cached."""
    from trainer.data.source import Rows
    from trainer.runstore.progress import PhaseProgress

    encode = functools.partial(
        _encode_batch,
        fmt=spec.format,
        tokenizer=tokenizer,
        path=path,
        max_len=spec.max_seq_len,
        train_on_inputs=spec.train_on_inputs,
    )
    total = len(rows)
    phase = PhaseProgress(what, total, "examples")
    in_process = isinstance(rows, Rows) and tokenising_processes(spec, total) == 1
    if isinstance(rows, Rows) and not in_process:
        rows = rows.to_dataset()
    out: list[Example | None] = []
    truncated = 0
    check_setup(what)  # a notice while the rows were read: nothing tokenised, nothing cached
    with _no_progress_bars(not in_process):  # the phase's log lines instead of a bar in the log file
        for start in range(0, total, CHUNK_ROWS):
            part = rows.select(range(start, min(total, start + CHUNK_ROWS)))
            if in_process:  # a small JSONL data set: what one map process would do, here
                mapped = encode(part.columns(), list(range(len(part))), offset=start)
            else:
                procs = tokenising_processes(spec, len(part))
                if procs > 1:  # forked workers: no tokenizer thread pool to inherit
                    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                mapped = part.map(
                    encode,
                    batched=True,
                    batch_size=256,
                    with_indices=True,
                    fn_kwargs={"offset": start},
                    remove_columns=part.column_names,
                    num_proc=procs if procs > 1 else None,
                    keep_in_memory=True,
                    load_from_cache_file=False,
                    new_fingerprint=f"ftorch-tokenise-{start}",
                ).to_dict()
            truncated += sum(mapped["truncated"])
            out += [
                Example(ids, labels) if ids else None
                for ids, labels in zip(mapped["input_ids"], mapped["labels"], strict=True)
            ]
            phase.update(start + len(part))
            maybe_slow("slow-tokenize")  # FTORCH_FAULTS=slow-tokenize@MS (tests: a long tokenisation)
            check_setup(what)  # a notice ends the attempt between chunks (trainer/stops/sources.py)
    kept = [e for e in out if e is not None]
    phase.done(f"{sum(len(e.input_ids) for e in kept):,} tokens in {len(kept):,} examples")
    return out, truncated


@contextlib.contextmanager
def _no_progress_bars(active: bool) -> Iterator[None]:
    if not active:
        yield
        return
    import datasets

    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not quiet:
            datasets.enable_progress_bars()


def _encode_batch(
    batch: dict[str, list[Any]],
    indices: list[int],
    *,
    offset: int,
    fmt: str,
    tokenizer: Any,
    path: str,
    max_len: int,
    train_on_inputs: bool,
) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"input_ids": [], "labels": [], "truncated": []}
    for i, index in enumerate(indices):
        row = {key: values[i] for key, values in batch.items()}
        if row.get("_line") is None:
            row["_line"] = offset + index + 1  # the row number, for files without lines
        example = encode_row(row, fmt, tokenizer, path, train_on_inputs)
        cut = len(example.input_ids) > max_len
        if cut:
            example = Example(example.input_ids[:max_len], example.labels[:max_len])
        if not any(label != IGNORE for label in example.labels[1:]):
            example = Example([], [])  # truncation left nothing to learn from: dropped
        out["input_ids"].append(example.input_ids)
        out["labels"].append(example.labels)
        out["truncated"].append(cut)
    return out


def collate(
    examples: list[Example], pad_id: int, device: torch.device | str = "cpu", flat: bool = False
) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example of the micro-batch (packs: trainer/data/packing.py, `flat` for
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
