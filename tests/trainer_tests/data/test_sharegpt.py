"""ShareGPT-style chat data (`conversations` of `from`/`value` turns) reads as `data.format: chat`: the same
examples, masks included, as the same conversations written as `messages`; from JSONL and from a saved
`datasets` folder; a speaker it does not know is refused with its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import DataSpec
from trainer.data.check import DataError
from trainer.data.dataset import load_dataset

TURNS = [
    [("system", "be brief"), ("human", "alpha bravo"), ("gpt", "charlie")],
    [("human", "delta"), ("gpt", "echo foxtrot"), ("human", "golf"), ("gpt", "hotel")],
] * 6
ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _examples(spec: DataSpec, tokenizer) -> list[tuple[list[int], list[int]]]:
    data = load_dataset(spec, tokenizer, micro_batch_size=2, seed=1)
    return [(e.input_ids, e.labels) for e in [*data.train, *data.held_out]]


def test_sharegpt_rows_train_as_their_messages(tmp_path: Path, tokenizer) -> None:
    sharegpt = [{"conversations": [{"from": f, "value": v} for f, v in turns]} for turns in TURNS]
    messages = [{"messages": [{"role": ROLES[f], "content": v} for f, v in turns]} for turns in TURNS]
    as_sharegpt = DataSpec(path=_jsonl(tmp_path / "s.jsonl", sharegpt), format="chat", eval_examples=2)
    as_messages = DataSpec(path=_jsonl(tmp_path / "m.jsonl", messages), format="chat", eval_examples=2)
    expected = _examples(as_messages, tokenizer)
    assert _examples(as_sharegpt, tokenizer) == expected and len(expected) == 12

    import datasets

    saved = tmp_path / "saved"
    datasets.Dataset.from_list(sharegpt).save_to_disk(str(saved))  # a `datasets` folder, as from the Hub
    assert _examples(DataSpec(path=str(saved), format="chat", eval_examples=2), tokenizer) == expected


def test_an_unknown_sharegpt_speaker_names_its_line(tmp_path: Path, tokenizer) -> None:
    rows = [{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}] * 3
    rows.append({"conversations": [{"from": "narrator", "value": "a"}, {"from": "gpt", "value": "b"}]})
    spec = DataSpec(path=_jsonl(tmp_path / "bad.jsonl", rows), format="chat")
    with pytest.raises(DataError, match=r"bad.jsonl:4: ShareGPT speaker 'narrator' is not one of"):
        load_dataset(spec, tokenizer, micro_batch_size=2, seed=1)
