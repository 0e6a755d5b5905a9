"""Bad data is found at launch (exit 2, `file:line`, nothing recorded or started), and the trainer treats it
as an input error too (exit 2, not a crash to retry); overlong examples are truncated and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import cli_in_process as cli
from helpers import job_dict, write_data

from orchestrator.registry import Registry
from trainer.config import DataSpec
from trainer.data.check import DataError, read_jsonl

GOOD = json.dumps({"instruction": "first", "input": "alpha bravo", "output": "alpha"}) + "\n"
CASES = [
    (
        "non-utf8",
        "instruction",
        GOOD.encode() + b'{"instruction": "caf\xe9", "output": "x"}\n',
        ":2:",
        "UTF-8",
    ),
    ("not-json", "instruction", (GOOD + "{oops\n").encode(), ":2:", "not valid JSON"),
    (
        "no-output",
        "instruction",
        (GOOD + '{"instruction": "a", "response": "b"}\n').encode(),
        ":2:",
        "'output'",
    ),
    ("text-missing", "text", b'{"text": "a"}\n{"txt": "b"}\n', ":2:", "'text'"),
    ("chat-no-assistant", "chat", b'{"messages": [{"role": "user", "content": "hi"}]}\n', ":1:", "assistant"),
    ("not-object", "text", b'{"text": "a"}\n[1, 2]\n', ":2:", "JSON object"),
]


@pytest.mark.parametrize(("fmt", "body", "where", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_data_is_refused_at_launch_with_file_and_line(
    tmp_path: Path,
    tiny_model: Path,
    ftorch_home: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    body: bytes,
    where: str,
    words: str,
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(body)
    job = job_dict(tiny_model, data, tmp_path / "runs", data={"format": fmt})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = cli(capsys, "launch", str(job_file))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{data}{where}" in lines[0] and words in lines[0], lines
    assert Registry().jobs() == [] and not (tmp_path / "runs").exists()


def test_a_non_utf8_file_is_a_data_error_for_the_trainer(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_bytes(CASES[0][2])
    with pytest.raises(DataError, match=r"d\.jsonl:2: .*UTF-8"):
        read_jsonl(str(data))


def test_overlong_examples_are_truncated_and_counted(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    from trainer.data.dataset import load_dataset

    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    huge = {"instruction": "first", "input": "alpha " * 170_000, "output": "alpha"}  # a 1 MB line
    with open(data, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(huge) + "\n")
    spec = DataSpec(path=str(data), format="instruction", max_seq_len=96)
    dataset = load_dataset(spec, AutoTokenizer.from_pretrained(tiny_model), 2, 0)
    assert max(len(e.input_ids) for e in dataset.train) <= 96
    out = capsys.readouterr().out
    assert "1 of 9 examples were longer than data.max_seq_len (96 tokens) and were truncated" in out, out


def test_remote_data_readable_at_launch_is_checked_too(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, capsys: pytest.CaptureFixture[str], s3
) -> None:
    from trainer.runstore.store import RunStore

    RunStore(s3.uri, s3.options).write_bytes("data/d.jsonl", GOOD.encode() + b'{"instruction": "a"}\n')
    job = job_dict(
        tiny_model,
        tmp_path / "unused.jsonl",
        tmp_path / "runs",
        data={"path": f"{s3.uri}/data/d.jsonl"},
        checkpoint={"storage_options": s3.options},
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = cli(capsys, "launch", str(job_file))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{s3.uri}/data/d.jsonl:2: 'output' is required" in done.stderr, done.stderr
    assert Registry().jobs() == []
