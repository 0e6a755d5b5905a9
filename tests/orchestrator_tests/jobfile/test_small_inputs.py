"""The small ones of issue 30 (S3 S4 C3 C4 F11): secrets never printed, webhook URLs validated at launch,
`~` expanded the same way everywhere, local multi-node refused, step counts bounded, long values quoted
short. Each refusal: exit 2, one line naming the field, nothing recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import cli_in_process as cli
from helpers import job_dict, write_data

from orchestrator.registry import Registry
from trainer.recording.notify import post

TOKEN = "T0KEN-abc123-secret"


@pytest.fixture()
def job_file(tmp_path: Path, tiny_model: Path) -> Path:
    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(tiny_model, data, tmp_path / "runs")))
    return path


def _refused(done: object, field: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr  # type: ignore[attr-defined]
    lines = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize(
    "url",
    [
        f"https://hooks.example.com/services/{TOKEN} x",  # a space
        f"https://hooks.example.com/services/{TOKEN}\nX-Evil: 1",  # a newline
        f"https://hooks.example.com/ser\tvices/{TOKEN}",
        f"https:///services/{TOKEN}",  # no host
        f"ftp://hooks.example.com/{TOKEN}",
        f"https://hooks.example.com/{TOKEN}\x07",
    ],
)
def test_a_webhook_url_that_cannot_be_delivered_is_refused_without_echoing_it(
    job_file: Path, ftorch_home: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """S4: refused at launch and validate (exit 2, naming notify.webhook), the token never shown."""
    for command in ("validate", "launch"):
        line = _refused(
            cli(capsys, command, str(job_file), "--set", f"notify.webhook={json.dumps(url)}"),
            "notify.webhook",
        )
        assert TOKEN not in line and "control characters" in line, line
    assert Registry().jobs() == []


def test_a_delivery_error_never_shows_the_webhook_path() -> None:
    """S4: what a failed post reports (logged by the trainer and the supervisor) has scheme and host only."""
    said = post(f"http://127.0.0.1:9/services/{TOKEN}", b"{}", timeout_s=2.0) or ""
    assert said and TOKEN not in said and "/services" not in said, said
    odd = post(f"http://127.0.0.1:9/services/{TOKEN} x", b"{}", timeout_s=2.0) or ""
    assert odd and TOKEN not in odd, odd


def test_the_dry_run_hides_the_webhook(ftorch_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """S3: `launch --dry-run` of a SkyPilot job shows <hidden: notify.webhook>, never the URL."""
    url = f"https://hooks.example.com/services/{TOKEN}"
    args = ("launch", "examples/llama3-8b-qlora-deadline.yaml", "--backend", "skypilot", "--dry-run")
    for extra in ((), ("--json",)):
        done = cli(
            capsys, *args, *extra, "--set", f"notify.webhook={url}", "--set", "notify.on=[failed,cancelled]"
        )
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout + done.stderr
        assert "<hidden: notify.webhook>" in done.stdout


def test_a_home_folder_is_expanded_the_same_way_everywhere(
    job_file: Path,
    ftorch_home: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """C3: `checkpoint.uri: ~/x` is the home's x (no literal `~` folder), in the job file and by --set."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    from orchestrator.jobfile.spec import load_job, validate_job

    spec = load_job(job_file, ["checkpoint.uri=~/runs", "output.uri=~/out"])
    assert spec.checkpoint.uri == str(tmp_path / "home" / "runs") and spec.output.uri == str(
        tmp_path / "home" / "out"
    )
    data = yaml.safe_load(job_file.read_text())
    data["checkpoint"]["uri"] = "~/runs"
    assert validate_job(data).checkpoint.uri == str(tmp_path / "home" / "runs")
    launched = cli(capsys, "launch", str(job_file), "--set", "checkpoint.uri=~/runs", "--json", "--dry-run")
    assert launched.returncode == 0, launched.stderr
    assert json.loads(launched.stdout)["run_uri"].startswith(str(tmp_path / "home" / "runs") + "/")
    assert not list(tmp_path.rglob("~"))


def test_local_nodes_above_one_are_refused(
    job_file: Path, ftorch_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """C4: the local backend runs on one machine: resources.nodes: 2 is refused, not run on one node."""
    for command in ("validate", "launch"):
        line = _refused(cli(capsys, command, str(job_file), "--set", "resources.nodes=2"), "resources.nodes")
        assert "local backend" in line
    assert Registry().jobs() == []


@pytest.mark.parametrize(
    "setting",
    [
        "train.max_steps=100000000000000000000000000",
        "train.max_steps=10000000000",
        "train.warmup_steps=100000000000000000000",
        "train.eval_every=1.0e+12",
        "checkpoint.every=100000000000",
        "train.log_every=1.0e+15",
    ],
)
def test_step_counts_are_bounded(
    job_file: Path, ftorch_home: Path, capsys: pytest.CaptureFixture[str], setting: str
) -> None:
    """F11: a step count past a billion is refused, naming the field."""
    line = _refused(cli(capsys, "validate", str(job_file), "--set", setting), setting.split("=")[0])
    assert "1000000000" in line, line


def test_a_refusal_quotes_at_most_about_200_characters_of_a_value(
    job_file: Path, ftorch_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F11: a 120 KB value is quoted short, with its length."""
    huge = "x" * 120_000
    for setting in (f"train.precision={huge}", f"name={huge}", f"resources.clouds=[{huge}]"):
        done = cli(capsys, "validate", str(job_file), "--set", setting)
        assert done.returncode == 2 and len(done.stderr) < 600, len(done.stderr)
        assert "characters" in done.stderr, done.stderr
