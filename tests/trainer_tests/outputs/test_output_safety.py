"""What ftorch writes never replaces a user's files nor follows a link out of the run store (issue 23
point 3), and `export --to` a place it cannot write is one line, exit 2 (point 5)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import cli_in_process as cli
from helpers import job_dict, prepare_run, run_trainer, write_data

from orchestrator.registry import Registry
from trainer.runstore.storage import StoreError
from trainer.runstore.store import RunStore


def _one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def registered(tmp_path: Path, tiny_model: Path, ftorch_home: Path) -> tuple[str, str]:
    """A run (no checkpoint needed: the target is checked first) in this FTORCH_HOME's registry."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "runs"), run_id="tiny-abc123")
    spec = RunStore(run_uri).read_spec()["job"]
    Registry().create_job("tiny-abc123", "tiny", "local", run_uri, f"{run_uri}/output", spec, 0.0)
    return "tiny-abc123", run_uri


def test_export_refuses_a_folder_with_the_users_files(
    registered: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id, _run_uri = registered
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "README.md").write_text("my own notes\n")
    line = _one_line_error(cli(capsys, "export", job_id, "--to", str(mine)), "--to", "not empty", "--force")
    assert str(mine) in line
    assert (mine / "README.md").read_text() == "my own notes\n" and os.listdir(mine) == ["README.md"]


@pytest.mark.parametrize("kind", ["file", "read-only folder"])
def test_export_to_a_place_it_cannot_write_is_one_line(
    registered: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    job_id, _run_uri = registered
    target = made = tmp_path / "target"
    if kind == "file":
        target.write_text("a file\n")
    else:
        made.mkdir()
        made.chmod(0o500)
        if os.geteuid() == 0:  # root writes anyway: a folder under /proc is read-only for everyone
            target = Path("/proc/self/ftorch-export")
    try:
        _one_line_error(cli(capsys, "export", job_id, "--to", str(target)), "--to")
    finally:
        made.chmod(0o700)
    if kind == "file":
        assert target.read_text() == "a file\n"


def test_output_store_never_follows_a_linked_output_folder(tmp_path: Path) -> None:
    from trainer.runstore.store import output_store

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run / "output").symlink_to(outside)
    store = output_store(str(run / "output"), str(run))
    with pytest.raises(StoreError, match="link"):
        store.write_bytes("README.md", b"card")
    assert os.listdir(outside) == []
    # an output.uri outside the run store is the user's own choice of folder: written as before
    own = tmp_path / "own-output"
    output_store(str(own), str(run)).write_bytes("README.md", b"card")
    assert (own / "README.md").read_bytes() == b"card"


def test_the_trainer_refuses_a_linked_output_folder_before_training(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "runs"))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (Path(run_uri) / "output").symlink_to(outside)
    done = run_trainer(run_uri)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stdout.splitlines() if "error:" in line]
    assert len(errors) == 1 and "output" in errors[0] and "link" in errors[0], errors
    assert os.listdir(outside) == [] and not (Path(run_uri) / "checkpoints").exists()
