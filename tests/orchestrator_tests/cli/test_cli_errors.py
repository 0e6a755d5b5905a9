"""Bad input: exit code 2, one line naming the field and what would be valid, no traceback, nothing
recorded or started."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ftorch, job_dict, write_data

from orchestrator.errors import SpecError
from orchestrator.jobfile.spec import load_job, parse_override


def _set(job: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node = job
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return job


def _drop(job: dict[str, Any], path: str) -> dict[str, Any]:
    node = job
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    del node[last]
    return job


# (id, how to break a valid job, the field the message must name, words the message must contain)
MISTAKES: list[tuple[str, Any, str, str]] = [
    ("unknown-top-level", lambda j: _set(j, "epochs", 3), "epochs", "unknown field"),
    (
        "unknown-nested",
        lambda j: _set(j, "train.learning_rate", 0.1),
        "train.learning_rate",
        "valid fields here",
    ),
    ("bad-method", lambda j: _set(j, "method", "dora"), "method", "'full', 'lora' or 'qlora'"),
    ("missing-model", lambda j: _drop(j, "model"), "model", "required"),
    ("missing-data", lambda j: _drop(j, "data"), "data", "required"),
    ("missing-checkpoint", lambda j: _drop(j, "checkpoint"), "checkpoint", "required"),
    ("negative-lr", lambda j: _set(j, "train.lr", -1), "train.lr", "greater than 0"),
    (
        "zero-batch",
        lambda j: _set(j, "train.micro_batch_size", 0),
        "train.micro_batch_size",
        "greater than or equal to 1",
    ),
    ("string-steps", lambda j: _set(j, "train.max_steps", "many"), "train.max_steps", "integer"),
    ("bad-format", lambda j: _set(j, "data.format", "csv"), "data.format", "'text', 'instruction' or 'chat'"),
    ("bad-precision", lambda j: _set(j, "train.precision", "fp8"), "train.precision", "'fp32', 'bf16'"),
    ("dropout-one", lambda j: _set(j, "lora.dropout", 1.0), "lora.dropout", "less than 1"),
    ("bad-every", lambda j: _set(j, "checkpoint.every", "often"), "checkpoint.every", "duration"),
    ("keep-zero", lambda j: _set(j, "checkpoint.keep", 0), "checkpoint.keep", "greater than or equal to 1"),
    (
        "secret-in-file",
        lambda j: _set(j, "checkpoint.storage_options", {"secret": "x"}),
        "checkpoint.storage_options",
        "environment",
    ),
    (
        "bad-backend",
        lambda j: _set(j, "resources.backend", "slurm"),
        "resources.backend",
        "'local' or 'skypilot'",
    ),
    ("bad-cloud", lambda j: _set(j, "resources.clouds", ["aws", "oracle"]), "resources.clouds[1]", "'aws'"),
    (
        "bad-fallback",
        lambda j: _set(j, "resources.fallback", "yes"),
        "resources.fallback",
        "'none' or 'on-demand'",
    ),
    (
        "deadline-no-zone",
        lambda j: _set(j, "resources.deadline", "2026-12-01T07:00"),
        "resources.deadline",
        "time zone",
    ),
    (
        "chaos-notice-mismatch",
        lambda j: _set(j, "local.chaos", {"preempt_at_steps": [5, 9], "notice": [True]}),
        "local.chaos",
        "one per step",
    ),
    (
        "chaos-step-zero",
        lambda j: _set(j, "local.chaos", {"preempt_at_steps": [0]}),
        "local.chaos.preempt_at_steps[0]",
        "greater than or equal to 1",
    ),
    ("bad-name", lambda j: _set(j, "name", "has space"), "name", "pattern"),
    (
        "data-missing-file",
        lambda j: _set(j, "data.path", "/nonexistent/x.jsonl"),
        "data.path",
        "does not exist",
    ),
    ("model-dir-without-config", lambda j: _set(j, "model", "/tmp"), "model", "config.json"),
    ("lora-empty-targets", lambda j: _set(j, "lora.target_modules", []), "lora.target_modules", "non-empty"),
    ("webhook-not-url", lambda j: _set(j, "notify", {"webhook": "ftp://x"}), "notify.webhook", "http"),
]


@pytest.fixture()
def valid_job(tmp_path: Path, tiny_model: Path) -> dict[str, Any]:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    return job_dict(tiny_model, data, tmp_path / "runs")


@pytest.mark.parametrize(("mistake", "breaker", "field", "words"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_names_its_field(
    valid_job: dict, tmp_path: Path, mistake: str, breaker: Any, field: str, words: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(breaker(valid_job)))
    with pytest.raises(SpecError) as caught:
        load_job(path)
    assert caught.value.field == field, str(caught.value)
    assert words in caught.value.message, str(caught.value)


def test_cli_bad_input_exit_2_one_line_nothing_recorded(
    valid_job: dict, tmp_path: Path, ftorch_home: Path
) -> None:
    """Through the real CLI, for a sample of mistakes and for file-level problems."""
    cases: dict[str, str] = {}
    for mistake, breaker, _field, _words in MISTAKES[::3]:
        cases[mistake] = yaml.safe_dump(breaker(copy.deepcopy(valid_job)))  # one mistake per file
    cases["not-yaml"] = "model: [unclosed\n"
    cases["empty"] = ""
    cases["a-list"] = "- model\n- data\n"
    for mistake, text in cases.items():
        path = tmp_path / f"{mistake}.yaml"
        path.write_text(text)
        done = ftorch("launch", str(path))
        assert done.returncode == 2, (mistake, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (mistake, done.stderr)
        assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "runs").exists()  # no run store written
    if (ftorch_home / "registry.db").exists():  # no job recorded
        from orchestrator.registry import Registry

        assert Registry(ftorch_home).jobs() == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["launch", "/no/such/job.yaml"], "JOB: /no/such/job.yaml does not exist"),
        (["launch", "JOB", "--set", "train.max_steps"], "--set: 'train.max_steps' is not key.path=value"),
        (["launch", "JOB", "--set", "train.max_steps=-3"], "train.max_steps"),
        (["launch", "JOB", "--set", "train=5"], "train"),
        (["launch", "JOB", "--backend", "mars"], "resources.backend"),
        (["status", "no-such-job"], "JOB: no job 'no-such-job'"),
        (["resume", "no-such-job"], "JOB: no job 'no-such-job'"),
        (["launch"], "Missing argument"),
    ],
)
def test_cli_usage_errors(
    valid_job: dict, tmp_path: Path, ftorch_home: Path, args: list[str], expected: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(valid_job))
    done = ftorch(*[str(path) if a == "JOB" else a for a in args])
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_set_overrides_are_yaml_typed(valid_job: dict, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(valid_job))
    spec = load_job(
        path,
        [
            "train.max_steps=100",
            "local.chaos=null",
            "train.lr=1e-3",
            "lora.target_modules=[q_proj]",
            "resources.clouds=[aws, gcp]",
            "name=renamed",
        ],
    )
    assert spec.train.max_steps == 100 and spec.train.lr == pytest.approx(1e-3)
    assert spec.local.chaos is None and spec.lora.target_modules == ["q_proj"]
    assert spec.resources.clouds == ["aws", "gcp"] and spec.name == "renamed"
    assert parse_override("a.b=") == (["a", "b"], None)


def test_relative_paths_resolve_against_the_job_file(tmp_path: Path, tiny_model: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    write_data(folder / "train.jsonl", "text", 8)
    (folder / "job.yaml").write_text(
        yaml.safe_dump(
            {"model": str(tiny_model), "data": {"path": "train.jsonl"}, "checkpoint": {"uri": "runs"}}
        )
    )
    spec = load_job(folder / "job.yaml")
    assert spec.data.path == str(folder / "train.jsonl")
    assert spec.checkpoint.uri == str(folder / "runs")
