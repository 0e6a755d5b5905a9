"""Checks that came too late or named the wrong field (issue 23 point 5): each is refused at launch with
one line naming the right field, exit 2, no library noise, nothing recorded; and a template or packing
that leaves nothing to train names that setting, not data.path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import cli_in_process as cli
from helpers import job_dict, write_data

from orchestrator.registry import Registry


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("instruction", pa.string()), ("output", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def _case(name: str, tmp: Path) -> tuple[dict[str, Any], list[str]]:
    """(job sections, words the one error line must hold) for each bad input."""
    good = write_data(tmp / "good.jsonl", "instruction", 16)
    chat = write_data(tmp / "chat.jsonl", "chat", 16)
    if name == "template-raises":
        template = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}{{ m.content }}{% endfor %}"
        return {"data": {"path": str(chat), "format": "chat", "chat_template": template}}, [
            "data.chat_template",
            "no system role",
        ]
    if name == "template-not-a-template":
        notes = tmp / "notes.txt"
        notes.write_text("my notes about the run\n")
        return {"data": {"path": str(chat), "format": "chat", "chat_template": str(notes)}}, [
            "data.chat_template",
            str(notes),
        ]
    if name == "output-unwritable":
        return {"data": {"path": str(good)}, "output": {"uri": "/proc/ftorch-out"}}, ["output.uri"]
    if name == "eval-wrong-format":
        wrong = write_data(tmp / "eval.jsonl", "text", 4)
        return {"data": {"path": str(good), "eval_path": str(wrong)}}, ["data.eval_path", str(wrong)]
    if name == "parquet-bad-file":
        folder = tmp / "pq"
        folder.mkdir()
        _parquet(folder / "a.parquet", [{"instruction": "x", "output": "y"}] * 8)
        (folder / "b.parquet").write_bytes(b"PAR1 this is not parquet" * 10)
        return {"data": {"path": str(folder)}}, ["data.path", "b.parquet"]
    if name == "parquet-no-rows":
        empty = _parquet(tmp / "empty.parquet", [])
        return {"data": {"path": str(empty)}}, ["data.path", "no examples"]
    raise AssertionError(name)


CASES = [
    "template-raises",
    "template-not-a-template",
    "output-unwritable",
    "eval-wrong-format",
    "parquet-bad-file",
    "parquet-no-rows",
]


@pytest.mark.parametrize("command", ["launch", "validate"])
@pytest.mark.parametrize("name", CASES)
def test_refused_at_launch_naming_the_right_field(
    tmp_path: Path,
    tiny_model: Path,
    ftorch_home: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    command: str,
) -> None:
    if name == "output-unwritable" and command == "validate":
        pytest.skip("validate probes no store")
    sections, words = _case(name, tmp_path)
    job = job_dict(tiny_model, tmp_path / "unused.jsonl", tmp_path / "runs", **sections)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = cli(capsys, command, str(job_file))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()  # nothing from datasets or pyarrow before it
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], lines[0]
    assert Registry().jobs() == [] and not (tmp_path / "runs").exists()


def _tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_a_template_that_leaves_nothing_to_train_names_the_template(tmp_path: Path, tiny_model: Path) -> None:
    from trainer.config import DataSpec
    from trainer.data.dataset import DataError, load_dataset

    chat = write_data(tmp_path / "chat.jsonl", "chat", 16)
    template = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}{% endfor %}"
    spec = DataSpec(path=str(chat), format="chat", chat_template=template, max_seq_len=96)
    tokenizer = _tokenizer(tiny_model)
    tokenizer.chat_template = template
    with pytest.raises(DataError) as caught:
        load_dataset(spec, tokenizer, 4, 0)
    assert caught.value.field == "data.chat_template", caught.value


def test_packing_that_leaves_too_few_sequences_names_packing(tmp_path: Path, tiny_model: Path) -> None:
    from trainer.config import DataSpec
    from trainer.data.dataset import DataError, load_dataset

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "alpha bravo"}) + "\n" for _ in range(6)))
    spec = DataSpec(path=str(data), format="text", max_seq_len=96, packing=True)
    with pytest.raises(DataError) as caught:
        load_dataset(spec, _tokenizer(tiny_model), 4, 0)
    assert caught.value.field == "data.packing" and "train.micro_batch_size" in str(caught.value)
    assert json.dumps(str(caught.value))  # one line
