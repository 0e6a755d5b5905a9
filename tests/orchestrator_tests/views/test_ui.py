"""`ftorch status` and `status JOB`: rendering at phone, laptop and wide widths (rich's recording console),
the JSON fields, the cache that keeps 1,000 jobs fast, no heavy imports, the charts and the PNG plot."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakejobs import bulk_registry, demo_registry
from helpers import REPO, ftorch
from rich.console import Console

from orchestrator.registry import Registry
from orchestrator.views import status as job_status
from orchestrator.views.charts import MARK, loss_chart
from orchestrator.views.job_detail import render_detail
from orchestrator.views.job_facts import lost_time_per_preemption
from orchestrator.views.jobs_table import render_jobs

WIDTHS = (40, 80, 160)
#: what `ftorch status` must not load (typer itself brings pydantic; the job-file schema stays out)
HEAVY = ("torch", "sky", "fsspec", "matplotlib", "yaml", "trainer.config", "transformers")


def flat(text: str) -> str:
    """The text without whitespace, so that wrapped long paths still match."""
    return re.sub(r"\s+", "", text)


def render(renderable: object, width: int) -> str:
    out = Console(record=True, width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    out.print(renderable)
    text = out.export_text()
    assert all(len(line) <= width for line in text.splitlines()), f"a line is wider than {width}:\n{text}"
    return text


@pytest.fixture()
def demo(tmp_path: Path, ftorch_home: Path) -> Registry:
    return demo_registry(ftorch_home, tmp_path / "runs")


@pytest.mark.parametrize("width", WIDTHS)
def test_jobs_table_answers_at_a_glance_at_every_width(demo: Registry, width: int) -> None:
    text = render(render_jobs(job_status.status_all(), width), width)
    # the running job, the one stopped on its budget, the recent success; the old failure collapses
    assert "RUNNING" in text and "STOPPED·budget" in text and "SUCCEEDED" in text
    assert "llama3-8b-support-a" in text and "qwen-7b-sql-d4e5f6" in text
    assert "212/600" in text and "140/400" in text and "300/300" in text
    assert "█" in text and "░" in text  # the progress bar
    assert "$3.0" in text  # cost so far (2 attempts at $2.50/h)
    assert "old-experiment" not in text and "1 older job hidden (1 failed): --all" in text
    if width >= 120:
        assert "WHERE" in text and "aws:g5.2xlarge (spot)" in text and "(on-demand)" in text
        assert "→$8." in text  # projected total at the current price
        assert "35%" in text and "210, " in text and " ago" in text
    elif width >= 80:
        assert "PROGRESS" in text and "WHERE" not in text and "CKPT" in text
    else:  # a phone: one card per job, nothing cut off that matters
        assert "PROGRESS" not in text
        assert "loss 0.4910" in text and "eta 2h" in text and "on aws:g5.2xlarge (spot)" in text
        assert "preempted 1" in text and "ckpt 210," in text


def test_all_shows_old_finished_jobs(demo: Registry) -> None:
    text = render(render_jobs(job_status.status_all(), 160, show_all=True), 160)
    assert "old-experiment-111111" in text and "FAILED" in text and "hidden" not in text


def test_only_the_newest_finished_jobs_are_listed_and_the_rest_collapse(demo: Registry) -> None:
    """A day of sweeps and retries leaves dozens of finished jobs: the table keeps the active ones and the
    RECENT_MAX newest finished ones; the rest collapse into the one line `--all` expands."""
    from orchestrator.views.jobs_table import RECENT_MAX

    rows = job_status.status_all()
    done = next(r for r in rows if r["state"] == "SUCCEEDED")
    now = time.time()
    many = [{**done, "job_id": f"run-{i:03d}", "ended_at": now - 60.0 * i} for i in range(RECENT_MAX + 15)]
    text = render(render_jobs([*rows, *many], 160), 160)
    assert "RUNNING" in text and "run-000" in text and f"run-{RECENT_MAX - 2:03d}" in text
    assert f"run-{RECENT_MAX:03d}" not in text  # older than the newest RECENT_MAX finished ones
    hidden = re.search(r"(\d+) older jobs hidden \((\d+) succeeded", text)
    # the 15 beyond RECENT_MAX, the demo's own two recent ended ones (older than these) and its old failure
    assert hidden and int(hidden.group(1)) == 18, text[-300:]
    everything = render(render_jobs([*rows, *many], 160, show_all=True), 160)
    assert f"run-{RECENT_MAX + 14:03d}" in everything and "hidden" not in everything


def test_no_jobs_says_how_to_start_one(ftorch_home: Path) -> None:
    assert "ftorch launch" in render(render_jobs(job_status.status_all(), 80), 80)


@pytest.mark.parametrize("width", WIDTHS)
def test_detail_shows_timeline_checkpoints_chart(demo: Registry, width: int) -> None:
    detail = job_status.status_one("llama3")
    text = render(render_detail(detail, width), width)
    assert "llama3-8b-support-a1b2c3" in text and "RUNNING" in text and "212/600" in text
    assert "attempts" in text and "preempted (with notice" in text and "running" in text
    assert "checkpoints" in text and "4.0 KiB" in text
    assert "loss" in text and "█" in text and MARK in text  # the chart, with the preemption marked
    assert "projected $8." in text
    if width >= 80:
        assert "step-00000210" in text and "GAINED" in text and "LOST" in text
        assert "+130" in text and "1 st + " in text  # 131 steps run, 130 kept: one step and time lost
        # issue 32: the 80 s from the notice to the next attempt's first step, plus the step redone (19.85 s)
        assert "time lost per preemption: 1m39s" in text


def test_detail_of_a_budget_stop_says_how_to_continue(demo: Registry) -> None:
    detail = job_status.status_one("qwen")
    assert detail["stop_reason"] == "budget" and detail["budget_usd"] == 2.0
    text = render(render_detail(detail, 100), 100)
    assert "STOPPED·budget" in text and "budget $2.00" in text
    assert flat("ftorch resume qwen-7b-sql-d4e5f6") in flat(text) and "--setresources.budget_usd=" in flat(
        text
    )


def test_detail_of_a_success_says_where_the_output_is(demo: Registry) -> None:
    detail = job_status.status_one("mistral")
    text = render(render_detail(detail, 80), 80)
    assert flat(f"output: {detail['output_uri']}") in flat(text) and "SUCCEEDED" in text
    assert detail["projected_cost_usd"] == detail["cost_usd"] and detail["eta_s"] == 0.0


def test_status_json_carries_the_contract_fields_and_more(demo: Registry) -> None:
    done = ftorch("status", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["job_id"]: r for r in json.loads(done.stdout)}
    running = rows["llama3-8b-support-a1b2c3"]
    for field in (
        "job_id", "name", "backend", "state", "step", "total_steps", "loss", "attempts", "preemptions",
        "cost_usd", "eta_s", "run_uri", "output_uri", "last_checkpoint_step", "updated_at",
        "projected_cost_usd", "last_checkpoint_age_s", "where", "market", "stop_reason", "budget_usd",
    ):  # fmt: skip
        assert field in running, field
    assert running["preemptions"] == 1 and running["market"] == "spot" and running["step"] == 212
    assert running["projected_cost_usd"] > running["cost_usd"] > 0
    assert 0 < running["last_checkpoint_age_s"] < 600
    assert rows["qwen-7b-sql-d4e5f6"]["stop_reason"] == "budget"
    one = json.loads(ftorch("status", "llama3", "--json").stdout)
    assert one["preemption_steps"] == [131] and one["attempt_timeline"][0]["steps_lost"] == 1
    assert len(one["loss_curve"]) == 212 and len(one["cost_curve"]) == 212


def test_a_finished_jobs_progress_is_cached_and_invalidated_on_resume(demo: Registry, tmp_path: Path) -> None:
    job_status.status_all()  # reads the stores of finished jobs once and caches what they said
    (tmp_path / "runs" / "mistral-7b-chat-0a9b8c" / "progress.json").unlink()
    rows = {r["job_id"]: r for r in job_status.status_all()}
    assert rows["mistral-7b-chat-0a9b8c"]["step"] == 300  # from the registry, not the store
    demo.set_state("mistral-7b-chat-0a9b8c", "RUNNING")
    demo.set_state("mistral-7b-chat-0a9b8c", "SUCCEEDED")  # a new end: the old cache no longer holds
    rows = {r["job_id"]: r for r in job_status.status_all()}
    assert rows["mistral-7b-chat-0a9b8c"]["step"] == 0


def test_status_with_1000_jobs_is_fast_and_loads_nothing_heavy(tmp_path: Path, ftorch_home: Path) -> None:
    bulk_registry(ftorch_home, tmp_path / "runs", n=1000, active=10)
    job_status.status_all()  # warm the page cache
    best = min(_timed(job_status.status_all) for _ in range(3))
    assert best < 0.3, f"status_all over 1,000 jobs took {best:.3f} s"
    script = (
        f"import sys; sys.argv = ['ftorch', 'status']; HEAVY = {HEAVY!r}\n"
        "from orchestrator.cli import app as cli\n"
        "try:\n    cli.main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "heavy = [m for m in HEAVY if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
    assert "job0999-" in done.stdout and "RUNNING" in done.stdout
    assert re.search(r"\n9\d\d older jobs hidden \(", done.stdout), done.stdout


def test_an_ended_jobs_savings_are_computed_once_and_kept_with_its_progress(
    tmp_path: Path, ftorch_home: Path
) -> None:
    from orchestrator.views.status import CACHE_KIND

    registry = bulk_registry(ftorch_home, tmp_path / "runs", n=40, active=0)
    first = {r["job_id"]: (r["savings_usd"], r["savings_pct"]) for r in job_status.status_all()}
    _jobs, _attempts, details = registry.snapshot(CACHE_KIND)
    kept = {job_id: json.loads(d).get("savings") for job_id, d in details.items()}
    assert len(kept) == 40 and all(isinstance(v, list) for v in kept.values())  # one write, every ended job
    assert {k: tuple(v) for k, v in kept.items()} == first
    again = {r["job_id"]: (r["savings_usd"], r["savings_pct"]) for r in job_status.status_all()}
    assert again == first
    table_only = job_status.status_all(savings=False)  # the narrow table does not ask for them
    assert all("savings_usd" not in r for r in table_only)


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def test_loss_chart_fits_and_marks_preemptions() -> None:
    curve = [[s, 3.0 / (1 + s / 20)] for s in range(1, 201)]
    for width in (30, 60, 150):
        lines = loss_chart(curve, width, height=5, markers=[80, 170])
        assert all(len(line) <= width for line in lines), lines
        assert len(lines) == 5 + 2 and lines[-2].count(MARK) == 2
        assert lines[0].lstrip().startswith("2.86") and lines[-1].rstrip().endswith("200")
        assert lines[0].count("█") < lines[4].count("█")  # the loss falls: the top row is mostly empty
    assert loss_chart([], 40) == ["(no loss logged yet)"]


def test_plot_png(demo: Registry, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "loss.png"
    done = ftorch("status", "llama3", "--plot", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 10_000
    assert f"loss plot: {target}" in done.stdout
    no_job = ftorch("status", "--plot", str(target))
    assert no_job.returncode == 2 and "--plot" in no_job.stderr


def test_the_fast_registry_read_matches_the_registry_dataclasses() -> None:
    """orchestrator.views.status reads rows positionally; if the registry's Job or Attempt changes, this says so."""
    import dataclasses

    from orchestrator import registry
    from orchestrator.registry import Attempt, Job

    job_fields = tuple(f.name for f in dataclasses.fields(Job))
    assert job_fields == tuple("spec" if c == "spec_json" else c for c in registry.JOB_COLUMNS)
    attempt_fields = tuple(f.name for f in dataclasses.fields(Attempt))
    assert attempt_fields[: len(registry.ATTEMPT_COLUMNS)] == registry.ATTEMPT_COLUMNS


def test_the_status_fast_path_parses_like_typer(demo: Registry) -> None:
    from orchestrator.cli.app import _fast_status

    assert _fast_status(["status"]) == {
        "job": None, "as_json": False, "show_all": False, "watch": False, "plot": None,
    }  # fmt: skip
    assert _fast_status(["status", "abc", "--json", "--plot", "x.png"]) == {
        "job": "abc", "as_json": True, "show_all": False, "watch": False, "plot": "x.png",
    }  # fmt: skip
    for other in (["status", "--help"], ["status", "a", "b"], ["status", "--plot"], ["logs", "x"], []):
        assert _fast_status(other) is None, other  # typer handles these (help, usage errors)
    assert ftorch("status", "--bogus").returncode == 2


def test_a_kill_before_any_checkpoint_counts_the_steps_redone_as_lost_time() -> None:
    """Issue 32: an attempt killed without notice before its first checkpoint loses all its steps; the
    preemption's lost time is the gap to the next attempt's first step plus the time those steps took."""
    from orchestrator.registry import Outcome

    killed = {"outcome": Outcome.PREEMPTED, "ended_at": 100.0, "time_lost_s": 89 * 0.15 + 5.2}
    following = {"outcome": None, "ended_at": None, "first_step_at": 105.2, "time_lost_s": None}
    assert lost_time_per_preemption([killed, following]) == [round(89 * 0.15 + 5.2, 2)]
    noticed = {**killed, "time_lost_s": None}  # a notice saved every step: the gap alone
    assert lost_time_per_preemption([noticed, following]) == [5.2]


def test_the_table_is_the_same_when_collapsed_jobs_are_only_counted(
    tmp_path: Path, ftorch_home: Path
) -> None:
    """`ftorch status` builds full rows only for the jobs its table shows (issue 32: with 1,000 jobs the
    collapsed ones were most of the work); the table, its hidden-jobs line and the counts are unchanged."""
    from rich.console import Console

    from orchestrator.views.jobs_table import render_jobs

    bulk_registry(ftorch_home, tmp_path / "runs", n=60, active=5)  # 19 ended within a day, 36 before

    def drawn(rows: list[dict]) -> str:
        out = Console(width=140, record=True, file=io.StringIO())
        out.print(render_jobs(rows, 140))
        return out.export_text()

    full, brief = (
        job_status.status_all(savings=False),
        job_status.status_all(savings=False, brief_hidden=True),
    )
    assert drawn(brief) == drawn(full)
    assert "36 older jobs hidden" in drawn(brief)
    assert sum(1 for r in brief if "step" not in r) == 36  # counted only
