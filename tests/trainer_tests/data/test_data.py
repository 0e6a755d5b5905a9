"""Data: the three formats, loss masks, truncation, and a sampler whose order depends only on seed and epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import DataSpec
from trainer.data.dataset import IGNORE, DataError, encode_row, load_dataset


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _learned(tokenizer, example) -> str:
    return tokenizer.decode(
        [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE]
    )


def test_text_format_learns_every_token(tokenizer) -> None:
    example = encode_row({"text": "alpha bravo", "_line": 1}, "text", tokenizer)
    assert example.labels == example.input_ids
    assert example.input_ids[-1] == tokenizer.eos_token_id


def test_instruction_format_learns_only_the_response(tokenizer) -> None:
    row = {"instruction": "first", "input": "kilo lima", "output": "kilo", "_line": 1}
    example = encode_row(row, "instruction", tokenizer)
    assert _learned(tokenizer, example) == "kilo" + tokenizer.eos_token
    prompt = tokenizer.decode(
        [t for t, lab in zip(example.input_ids, example.labels, strict=True) if lab == IGNORE]
    )
    assert "### Input:\nkilo lima" in prompt and prompt.endswith("### Response:\n")


def test_chat_format_learns_only_assistant_turns(tokenizer) -> None:
    row = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "alpha"},
            {"role": "assistant", "content": "bravo"},
            {"role": "user", "content": "charlie"},
            {"role": "assistant", "content": "delta"},
        ],
        "_line": 1,
    }
    example = encode_row(row, "chat", tokenizer)
    learned = _learned(tokenizer, example)
    assert "bravo" in learned and "delta" in learned
    assert "alpha" not in learned and "charlie" not in learned and "be brief" not in learned
    whole = tokenizer.decode(example.input_ids)
    assert whole == tokenizer.apply_chat_template(
        [{k: m[k] for k in ("role", "content")} for m in row["messages"]], tokenize=False
    )


@pytest.mark.parametrize(
    ("row", "fmt", "message"),
    [
        ({"txt": "x"}, "text", "'text' is required"),
        ({"instruction": "x", "response": "y"}, "instruction", "'output' is required"),
        ({"messages": []}, "chat", "'messages' must be a non-empty list"),
        ({"messages": [{"role": "user", "content": "x"}]}, "chat", "no assistant message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "chat", "role must be"),
    ],
)
def test_bad_rows_name_the_line(tokenizer, row: dict, fmt: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        encode_row({**row, "_line": 7}, fmt, tokenizer, "d.jsonl")


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_truncation_and_skipping(tmp_path: Path, tokenizer) -> None:
    long_prompt = " ".join(["alpha"] * 200)
    rows = [{"instruction": long_prompt, "output": "bravo"}] + [{"instruction": "x", "output": "kilo"}] * 6
    spec = DataSpec(
        path=_write(tmp_path / "d.jsonl", rows), format="instruction", max_seq_len=64, eval_examples=2
    )
    data = load_dataset(spec, tokenizer, micro_batch_size=2, seed=1)
    assert data.skipped == 1  # the response was cut off entirely: nothing to learn from
    assert len(data.train) == 4 and len(data.held_out) == 2
    assert all(len(e.input_ids) <= 64 for e in data.train)


def test_sampler_order_depends_only_on_seed_and_epoch(tmp_path: Path, tokenizer) -> None:
    rows = [{"text": f"alpha {i}"} for i in range(20)]
    spec = DataSpec(path=_write(tmp_path / "d.jsonl", rows), format="text")
    a = load_dataset(spec, tokenizer, micro_batch_size=4, seed=3)
    b = load_dataset(spec, tokenizer, micro_batch_size=4, seed=3)
    c = load_dataset(spec, tokenizer, micro_batch_size=4, seed=4)
    assert a.micro_batches_per_epoch == 5
    assert list(a.order(0)) == list(b.order(0)) and list(a.order(1)) == list(b.order(1))
    assert list(a.order(0)) != list(a.order(1)) and list(a.order(0)) != list(c.order(0))
    epoch0 = [id(e) for i in range(5) for e in a.micro_batch(i)]
    assert sorted(epoch0) == sorted(id(e) for e in a.train)  # each example once per epoch
    assert [e.input_ids for e in a.micro_batch(7)] == [e.input_ids for e in b.micro_batch(7)]


def test_too_few_examples_is_a_clear_error(tmp_path: Path, tokenizer) -> None:
    spec = DataSpec(path=_write(tmp_path / "d.jsonl", [{"text": "alpha"}]), format="text")
    with pytest.raises(DataError, match="fewer than train.micro_batch_size"):
        load_dataset(spec, tokenizer, micro_batch_size=4, seed=0)
