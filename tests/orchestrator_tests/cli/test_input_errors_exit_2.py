"""Input errors found by trying to break the CLI: each exits 2 with one line, nothing recorded or started;
plus the run store's own safety (owner-only local files, never following links out of itself)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from fakejobs import add_job
from helpers import cli_in_process as cli
from helpers import ftorch, job_dict, write_data  # noqa: F401

from orchestrator.registry import Registry
from trainer.runstore.store import RunStore


@pytest.fixture()
def job_file(tmp_path: Path, tiny_model: Path) -> Path:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(tiny_model, data, tmp_path / "runs")))
    return path


def _one_line_error(done: object, *words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr  # type: ignore[attr-defined]
    lines = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def test_a_non_durable_run_store_is_refused_at_launch(
    job_file: Path, ftorch_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = cli(capsys, "launch", str(job_file), "--set", "checkpoint.uri=memory://runs")
    _one_line_error(done, "checkpoint.uri", "memory://")
    assert Registry().jobs() == []


@pytest.mark.parametrize(
    "value",
    ["train.lr=" + "[" * 3000 + "]" * 3000, "train.lr=" + "{a: " * 3000 + "1" + "}" * 3000],
    ids=["list", "mapping"],
)
def test_deeply_nested_set_values_are_input_errors(
    job_file: Path, ftorch_home: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_line_error(cli(capsys, "launch", str(job_file), "--dry-run", "--set", value), "train.lr")


def test_a_corrupted_registry_says_how_to_recover(
    ftorch_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ftorch_home.mkdir(parents=True)
    (ftorch_home / "registry.db").write_bytes(b"this is not a database" * 100)
    done = cli(capsys, "status")
    _one_line_error(done, str(ftorch_home / "registry.db"), "mv ")


@pytest.fixture()
def finished_job(tmp_path: Path, ftorch_home: Path) -> str:
    return add_job(Registry(), tmp_path / "runs", "plot-aaaaaa", "SUCCEEDED", 30, ended_ago_s=5)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("missing-folder/loss.png", ["missing-folder", "does not exist"]),
        (".", ["is a folder"]),
        ("loss.txt", [".png"]),
        ("", [".png"]),
    ],
)
def test_plot_edge_cases_are_input_errors_naming_the_file(
    tmp_path: Path, finished_job: str, target: str, words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    where = str(tmp_path / target) if target not in ("", ".") else (str(tmp_path) if target else "")
    _one_line_error(cli(capsys, "status", finished_job, "--plot", where), "--plot", *words)
    assert not list(tmp_path.glob("*.png")) and not Path(f"{tmp_path}.png").exists()


def test_plot_names_the_file_it_wrote(
    tmp_path: Path, finished_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    done = cli(capsys, "status", finished_job, "--plot", str(tmp_path / "loss.png"))
    assert done.returncode == 0, done.stderr
    assert f"loss plot: {tmp_path / 'loss.png'}" in done.stdout and (tmp_path / "loss.png").exists()


def test_a_local_run_store_is_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = RunStore(str(tmp_path / "runs" / "r1"))
        store.write_json("spec.json", {"a": 1})
        store.commit_checkpoint(5, {"weights.safetensors": b"w" * 10})
        store.write_progress({"step": 5})
    finally:
        os.umask(old)
    for path in [tmp_path / "runs" / "r1", *(tmp_path / "runs" / "r1").rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, (path, oct(mode))


def test_pruning_never_follows_a_link_out_of_the_run_store(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "MANIFEST.json").write_text(
        json.dumps({"step": 1, "created_at": 1.0, "files": {"f": {"size": 1, "sha256": "x"}}})
    )
    (outside / "f").write_text("keep me")
    store = RunStore(str(tmp_path / "run"))
    for step in (10, 20):
        store.commit_checkpoint(step, {"weights.safetensors": b"w" * 10})
    os.symlink(outside, tmp_path / "run" / "checkpoints" / "step-00000001")
    store.prune_checkpoints(keep=1)
    assert (outside / "MANIFEST.json").exists() and (outside / "f").read_text() == "keep me"
    assert not (tmp_path / "run" / "checkpoints" / "step-00000001").exists()  # the link itself is gone
    assert [c.step for c in store.complete_checkpoints()] == [20]
