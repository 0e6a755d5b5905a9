"""The job's data is read once per launch (orchestrator/jobfile/data_check.py): the check reads every row,
and the planner's token count takes the rows the check read; a changed file is read again."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import cli_in_process as cli
from helpers import job_dict, write_data

from orchestrator.jobfile import data_check
from trainer.data import source


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the trainer's loader is asked to read, in this process."""
    seen: list[str] = []
    real = source.load

    def counted(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(source, "load", counted)
    monkeypatch.setattr(data_check, "_ROWS", {})
    return seen


def test_a_launch_reads_the_data_once(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, reads: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"epochs": 1})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = cli(capsys, "launch", str(job_file), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert reads == [str(data)], reads  # the check read it; the plan's token count took its rows
    done = cli(capsys, "plan", str(job_file))  # a command that only plans counts tokens from one read too
    assert done.returncode == 0, done.stderr
    assert reads == [str(data)], reads


def test_a_file_changed_since_it_was_read_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    data = write_data(tmp_path / "d.jsonl", "text", 10)
    first = data_check.load_rows(str(data), "text")
    assert data_check.load_rows(str(data), "text") is first and reads == [str(data)]
    write_data(data, "text", 12, seed=1)
    assert len(data_check.load_rows(str(data), "text")) == 12 and reads == [str(data)] * 2


def test_quick_fail_settings_apply_to_s3_only_and_the_users_own_win() -> None:
    assert data_check.quick_fail("/data/x.jsonl", {"anon": True}) == {"anon": True}
    options = data_check.quick_fail("s3://b/x.jsonl", {"config_kwargs": {"read_timeout": 99}})
    assert options["config_kwargs"] == {
        "connect_timeout": 3,
        "read_timeout": 99,
        "retries": {"max_attempts": 2},
    }
