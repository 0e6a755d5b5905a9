"""The tokenised data set, cached in the run store so that later attempts skip tokenisation.

Key: the data's identity (sha256 of local files; objects' ETags and sizes for s3:// and other object
stores, so the data is not even read again; a hub data set's commit), the held-out set's, the tokenizer
(a hash of its full definition, special tokens and chat template), the data settings (format,
max_seq_len, the held-out split, train_on_inputs) and this module's format version. data.num_proc is
not part of it: the result does not depend on it. The entry is one safetensors file of int32 token
and label arrays with offsets: no pickle, and a damaged entry is simply tokenised again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from trainer.data import source as data_source
from trainer.runstore.store import CACHE, RunStore

FORMAT = 1


@dataclass
class Tokenised:
    train: list[tuple[list[int], list[int]]]
    held_out: list[tuple[list[int], list[int]]]
    skipped: int


def enabled() -> bool:
    return os.environ.get("FTORCH_DATA_CACHE", "1") != "0"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = json.dumps(
        [
            getattr(tokenizer, "chat_template", None),
            getattr(tokenizer, "bos_token_id", None),
            getattr(tokenizer, "eos_token_id", None),
            getattr(tokenizer, "pad_token_id", None),
            getattr(tokenizer, "add_bos_token", True),
        ],
        default=str,
    )
    return hashlib.sha256((body + extra).encode()).hexdigest()


def data_identity(spec: Any, storage_options: dict[str, Any] | None = None) -> str | None:
    """data.path's identity (`data_source.fingerprint`: sha256 of local files, ETags and sizes of remote
    ones, a hub set's revision), or None when it cannot be told. The trainer computes it once per attempt
    for the cache key and the spec fingerprint recorded with each checkpoint (trainer/checkpoints/fingerprint.py)."""
    return data_source.fingerprint(spec.path, spec.split, spec.subset, storage_options)


def cache_key(
    spec: Any, tokenizer: Any, storage_options: dict[str, Any] | None = None, identity: str | None = None
) -> str | None:
    """The entry's key, or None when the data's identity cannot be told (no cache then). `identity`:
    data.path's, when the caller has it already (`data_identity`)."""
    data = identity or data_identity(spec, storage_options)
    source = spec.eval_source()
    held = data_source.fingerprint(source[0], source[1], spec.subset, storage_options) if source else ""
    if data is None or held is None:
        return None
    parts = {
        "format": FORMAT,
        "data": data,
        "held_out": held,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "settings": [
            spec.format,
            spec.max_seq_len,
            spec.eval_examples,
            spec.eval_fraction,
            spec.train_on_inputs,
        ],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _rel(key: str) -> str:
    return f"{CACHE}/tokens-{key}.safetensors"


def _pack(examples: list[tuple[list[int], list[int]]], prefix: str) -> dict[str, np.ndarray]:
    lengths = np.array([len(ids) for ids, _ in examples], dtype=np.int64)
    ids = [np.asarray(i, dtype=np.int32) for i, _ in examples]
    labels = [np.asarray(lab, dtype=np.int32) for _, lab in examples]
    empty = np.zeros(0, dtype=np.int32)
    return {
        f"{prefix}_lengths": lengths,
        f"{prefix}_ids": np.concatenate(ids) if ids else empty,
        f"{prefix}_labels": np.concatenate(labels) if labels else empty,
    }


def _unpack(arrays: dict[str, np.ndarray], prefix: str) -> list[tuple[list[int], list[int]]]:
    lengths = arrays[f"{prefix}_lengths"]
    ids, labels = arrays[f"{prefix}_ids"], arrays[f"{prefix}_labels"]
    out, start = [], 0
    for n in lengths.tolist():
        out.append((ids[start : start + n].tolist(), labels[start : start + n].tolist()))
        start += n
    return out


def load(store: RunStore, key: str) -> Tokenised | None:
    try:
        arrays = st_load(store.read_bytes(_rel(key)))
        return Tokenised(
            train=_unpack(arrays, "train"),
            held_out=_unpack(arrays, "held"),
            skipped=int(arrays["skipped"][0]),
        )
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged entry is rebuilt
        return None


def save(store: RunStore, key: str, data: Tokenised) -> None:
    arrays = {
        **_pack(data.train, "train"),
        **_pack(data.held_out, "held"),
        "skipped": np.array([data.skipped], dtype=np.int64),
    }
    store.write_bytes(_rel(key), st_save(arrays), atomic=True)
