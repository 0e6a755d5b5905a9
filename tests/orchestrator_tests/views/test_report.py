"""`ftorch report JOB --html FILE`: a real run (preempted once, held-out loss measured) drawn as one
self-contained page, checked as text and in real headless Chromium (no console errors, no request beyond
the file itself, the charts drawn)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from browser import chromium, open_page
from helpers import ftorch, job_dict, write_data

from orchestrator.registry import TERMINAL, Registry
from orchestrator.views import report

NO_BROWSER = "Debian's chromium is not installed (scripts/test.sh installs it: apt-get install -y chromium)"

PROBE = """(() => {
  const chart = document.querySelector('svg#loss-chart');
  const box = chart ? chart.getBoundingClientRect() : null;
  const train = document.querySelector('#train-loss');
  return {
    chart_w: box ? box.width : 0, chart_h: box ? box.height : 0,
    train_len: train ? train.getTotalLength() : 0,
    train_w: train ? train.getBBox().width : 0,
    held_out: document.querySelectorAll('#loss-chart circle').length,
    preemptions: document.querySelectorAll('#loss-chart line.preemption').length,
    attempt_bars: [...document.querySelectorAll('#attempts-chart rect.attempt')].map(r => r.getBBox().width),
    attempt_rows: document.querySelectorAll('#attempts tbody tr').length,
    ledger_rows: document.querySelectorAll('#ledger tbody tr').length,
    scripts: document.scripts.length,
  };
})()"""


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[str, Path, Path]:
    tmp = tmp_path_factory.mktemp("report")
    home = tmp / "home"
    data = write_data(tmp / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model,
        data,
        tmp / "runs",
        name="rep",
        data={"eval_examples": 8},
        train={"max_steps": 16, "eval_every": 5, "log_every": 1},
        checkpoint={"every": 4},
        local={"hourly_usd": 3.6, "chaos": {"preempt_at_steps": [9], "notice": True, "grace_s": 20}},
    )
    job_file = tmp / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    env = {"FTORCH_HOME": str(home)}
    # steps slowed (a fault): the supervisor sees step 9 while there is training left to preempt
    done = ftorch("launch", str(job_file), "--json", env={**env, "FTORCH_FAULTS": "slow-step@300"})
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    deadline = time.time() + 600
    while Registry(home).get(job_id).state not in TERMINAL and time.time() < deadline:
        time.sleep(0.5)
    assert Registry(home).get(job_id).state == "SUCCEEDED", Registry(home).get(job_id).reason
    page = tmp / "report.html"
    made = ftorch("report", job_id, "--html", str(page), env=env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"report: {page} (a copy in ")
    return job_id, page, home


def test_the_report_holds_the_run_and_is_kept_in_the_store(
    finished_job: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, page, home = finished_job
    monkeypatch.setenv("FTORCH_HOME", str(home))
    text = page.read_text(encoding="utf-8")
    job = Registry().get(job_id)
    assert (Path(job.run_uri) / report.REPORT_FILE).read_text(encoding="utf-8") == text
    attempts = Registry().attempts(job_id)
    assert [a.outcome for a in attempts] == ["preempted", "succeeded"]
    for must in (
        '<svg id="loss-chart"',
        'id="held-out-loss"',
        "preempted at step ",
        '<svg id="attempts-chart"',
        "<td>spent</td>",
        "local backend: this machine",
        "SUCCEEDED",
    ):
        assert must in text, must
    # self-contained: nothing to fetch, nothing to run
    for never in ("<script", "src=", "href=", "@import", "url("):
        assert never not in text, never


def test_the_report_renders_in_headless_chromium(finished_job: tuple[str, Path, Path]) -> None:
    if chromium() is None:
        pytest.skip(NO_BROWSER)
    _job_id, page, _home = finished_job
    run = open_page(page, PROBE)
    assert run.errors == [], run.errors
    assert run.requests == [page.resolve().as_uri()], run.requests  # the file itself, nothing else
    v = run.value
    assert v["chart_w"] > 800 and v["chart_h"] > 250, v
    assert v["train_len"] > 100 and v["train_w"] > 700, v  # the loss line spans the chart
    assert v["held_out"] >= 3, v  # eval every 5 of 16 steps, and after training
    assert v["preemptions"] == 1, v
    assert len(v["attempt_bars"]) == 2 and all(w > 1 for w in v["attempt_bars"]), v
    assert v["attempt_rows"] == 2 and v["ledger_rows"] >= 3 and v["scripts"] == 0, v


def test_the_browser_check_catches_console_errors_and_requests(tmp_path: Path) -> None:
    if chromium() is None:
        pytest.skip(NO_BROWSER)
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
        "<script>console.error('boom'); undefined_name();</script></body></html>"
    )
    run = open_page(bad, "document.title")
    assert any("boom" in e for e in run.errors) and any("undefined_name" in e for e in run.errors), run.errors
    assert "http://127.0.0.1:9/x.png" in run.requests


def test_a_recorded_plan_is_shown() -> None:
    detail = {
        "job_id": "j-1", "state": "RUNNING", "backend": "skypilot", "attempt_timeline": [], "loss_curve": [],
        "step": 0, "attempts": 0, "preemptions": 0,
    }  # fmt: skip
    plan = {
        "chosen": {"count": 1, "accelerator": "L4", "cloud": "gcp", "instance_type": "g2-standard-8",
                   "spot": True, "hourly_usd": 0.31, "est_hours": 1.5, "expected_cost_usd": 0.52},
        "top_offers": [{"cloud": "gcp", "instance_type": "g2-standard-8", "gpus": "1x L4", "spot": True,
                        "hourly_usd": 0.31, "est_hours": 1.5, "expected_cost_usd": 0.52}],
        "candidates": 7, "rejected": 40, "catalog": "bundled",
    }  # fmt: skip
    page = report.render(detail, [], {"model": "m"}, plan)
    assert "chosen: 1x L4 on gcp g2-standard-8 (spot, $0.31/h, ~1.5 h, expected $0.52)" in page
    assert "7 adequate offers, 40 rejected" in page and '<table id="offers">' in page


def test_a_report_to_a_wrong_place_is_refused(finished_job: tuple[str, Path, Path], tmp_path: Path) -> None:
    job_id, _page, home = finished_job
    env = {"FTORCH_HOME": str(home)}
    for target, says in [
        (str(tmp_path / "r.txt"), "must end in .html"),
        (str(tmp_path / "nowhere" / "r.html"), "does not exist"),
    ]:
        done = ftorch("report", job_id, "--html", target, env=env)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert not Path(target).exists()
