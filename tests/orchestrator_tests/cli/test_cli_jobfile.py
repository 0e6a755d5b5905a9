"""`ftorch init` writes starter jobs that `ftorch validate` accepts; `-f`; `resume --follow` prints only
what is new."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from fakejobs import add_job
from helpers import REPO, ftorch

from orchestrator.cli import follow
from orchestrator.cli import jobfile as cli_jobfile
from orchestrator.cli.app import app
from orchestrator.errors import SpecError, UserError
from orchestrator.registry import Registry


@pytest.mark.parametrize("backend", ["local", "skypilot"])
@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_every_starter_job_validates(
    tmp_path: Path, method: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a local job's model must be on this machine: its config in the Hugging Face cache, as `hf download`
    # leaves it (the local preflight refuses a model that is neither cached nor reachable)
    import json

    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    from orchestrator.sizing.shapes import bundled_configs

    repo = tmp_path / "hf" / repo_folder_name(repo_id="meta-llama/Llama-3.1-8B", repo_type="model")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("e" * 40)
    (repo / "snapshots" / ("e" * 40)).mkdir(parents=True)
    cfg = {k: v for k, v in bundled_configs()["llama-3.1-8b"].items() if k != "aliases"}
    (repo / "snapshots" / ("e" * 40) / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    out = tmp_path / "job.yaml"
    cli_jobfile.init_cmd(str(out), model="meta-llama/Llama-3.1-8B", method=method, backend=backend)
    text = out.read_text()
    assert text.count("#") > 15  # commented
    job = yaml.safe_load(text)
    assert job["method"] == method and job["resources"]["backend"] == backend
    checked = cli_jobfile.check_job(str(out), [])
    assert checked["method"] == method and checked["backend"] == backend
    if backend == "skypilot":
        assert checked["plan"]["adequate_offers"] > 0 and checked["plan"]["cheapest"]


def test_validate_reads_the_data_as_launch_does(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        '{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n'
    )
    cli_jobfile.init_cmd(str(tmp_path / "job.yaml"), model="Qwen/Qwen2.5-0.5B")
    with pytest.raises(SpecError, match=r"data.path.*train.jsonl:2"):
        cli_jobfile.check_job(str(tmp_path / "job.yaml"), [])


def test_init_refuses_bad_choices_and_existing_files(tmp_path: Path) -> None:
    out = tmp_path / "job.yaml"
    with pytest.raises(UserError, match="--method"):
        cli_jobfile.init_cmd(str(out), method="dpo")
    assert not out.exists()
    out.write_text("mine")
    with pytest.raises(UserError, match="exists; --force"):
        cli_jobfile.init_cmd(str(out))
    assert out.read_text() == "mine"
    with pytest.raises(SpecError, match="model"):  # the starter is validated before it is written
        cli_jobfile.init_cmd(str(out), model="", force=True)
    assert out.read_text() == "mine"


def test_validate_on_the_command_line(tmp_path: Path) -> None:
    done = ftorch("init", str(tmp_path / "job.yaml"), "--model", "Qwen/Qwen2.5-0.5B")
    assert done.returncode == 0 and "put your data at data/train.jsonl" in done.stdout, done
    bad = ftorch("validate", str(tmp_path / "job.yaml"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: data.path:"), bad
    assert len(bad.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("runs*"))
    good = ftorch("validate", str(REPO / "examples/mistral-7b-lora.yaml"))
    assert good.returncode == 0 and good.stdout.startswith("ok: ") and "adequate offers" in good.stdout


def test_f_is_short_for_follow_everywhere() -> None:
    group = typer.main.get_command(app)
    for name in ("launch", "resume", "logs"):
        opts = next(p for p in group.commands[name].params if p.name == "follow").opts
        assert set(opts) == {"--follow", "-f"}, name


def test_resume_follow_prints_only_what_is_new(tmp_path: Path, ftorch_home: Path, capsys) -> None:
    registry = Registry()
    job_id = add_job(registry, tmp_path / "runs", "old-run-abc123", "SUCCEEDED", 50, total=50)
    logs = registry.job_dir(job_id) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "attempt-001.log").write_text("10:00:00 [trainer] first attempt's line\n")
    registry.event(job_id, "state", "SUCCEEDED: the first run")
    seen = follow.mark(job_id)
    with open(logs / "attempt-001.log", "a") as handle:
        handle.write("10:05:00 [trainer] a line after the mark\n")
    (logs / "attempt-002.log").write_text("10:06:00 [trainer] the resumed attempt\n")
    registry.event(job_id, "resume", "train.max_steps=60")
    follow._stream(job_id, 0.01, seen)
    out = capsys.readouterr().out
    assert "first attempt's line" not in out and "the first run" not in out
    assert (
        "a line after the mark" in out and "the resumed attempt" in out and "resume: train.max_steps" in out
    )
    follow._stream(job_id, 0.01)  # without a mark: the whole history, as `launch --follow` shows it
    assert "first attempt's line" in capsys.readouterr().out
