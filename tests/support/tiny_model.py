"""The tiny Llama shape that the memory tests trace and bench/gpu_check.py's CPU mode builds: one copy.

Two layers, hidden 64, grouped-query attention (4 heads, 2 KV heads), untied embeddings: small enough to
build and step in a second on a CPU, with every part the memory model counts (attention, MLP, embeddings,
LM head). No torch here: the orchestrator tests write it as a config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "tie_word_embeddings": False,
}


def tiny_llama(**over: Any) -> dict[str, Any]:
    """A copy of the tiny shape's config, with `over` on top."""
    return {**TINY_LLAMA, **over}


def write_tiny_config(folder: Path, **over: Any) -> Path:
    """`folder`/config.json of the tiny shape (a model folder the sizing code can read); the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_llama(**over)), encoding="utf-8")
    return folder
