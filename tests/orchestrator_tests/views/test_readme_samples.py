"""The README's and docs/status.md's `$ ftorch status` and `$ ftorch status tiny-demo2` samples are what
the CLI prints: the same jobs are written into a registry and run stores (tests/fakejobs.py), rendered by the
real `ftorch` at 120 columns, and compared line by line with the samples, with what differs between runs
and machines blanked (ids, paths, clock times, durations, costs, losses, sizes, alignment); the counts
stay (steps, totals, percentages, preemptions, checkpoint steps, steps gained and redone)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakejobs import add_job
from helpers import REPO

from orchestrator.registry import Registry

DOCS = {"README.md": REPO / "README.md", "docs/status.md": REPO / "docs" / "status.md"}
#: the loss chart's own characters (its rows hold the data; only its frame is compared)
CHART = re.compile(r"[┤│]")


def _shape(line: str) -> str:
    line = re.sub(r"-[0-9a-f]{6}\b", "-ID", line)
    line = re.sub(r"(/\S*)?/runs/", "PATH/runs/", line)
    line = re.sub(r"\b\d\d:\d\d:\d\d\b", "HH:MM:SS", line)
    line = re.sub(r"\b(\d+h)?(\d+m)?\d+(\.\d+)?s\b|\b\d+h\d+m\b", "DUR", line)  # 13m24s, 2h11m, 5.2s
    line = re.sub(r"\d+\.\d+", "F", line)  # losses, dollars, KiB
    line = re.sub(r"[█░▇▆▅▄▃▂▁]+", "BAR", line)  # a progress bar, as long as the column
    line = re.sub(r"─+", "─", line)  # the chart's axis: where the ▲ marks stand depends on the width
    return " ".join(line.split())


def _shapes(text: str) -> list[str]:
    return [_shape(line) for line in text.splitlines() if line.strip() and not CHART.search(line)]


def _sample(doc: str, command: str) -> list[str]:
    """The lines of the doc's fenced block that starts with `$ COMMAND`, up to the next `$ ` or the fence."""
    text = DOCS[doc].read_text(encoding="utf-8")
    for block in text.split("```")[1::2]:
        lines = block.strip("\n").splitlines()
        for i, line in enumerate(lines):
            if line == f"$ {command}":
                end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("$ ")), len(lines))
                return lines[i + 1 : end]
    raise AssertionError(f"{doc} has no `$ {command}` sample")


def _epochs(run_uri: str, attempts: list[dict]) -> None:
    """What each attempt's trainer measured (its epoch record): steps, tokens, step time, restart phases."""
    fence = Path(run_uri) / "fence"
    fence.mkdir(parents=True, exist_ok=True)
    for n, a in enumerate(attempts, start=1):
        phases = {"process_start_s": 3.1, "model_load_s": 0.3, "checkpoint_read_s": 0.02, "first_step_s": 0.2}
        steps = a["end"] - a["start"]
        record = {
            "epoch": n, "attempt": n, "start_step": a["start"], "claimed_at": time.time() - 600,
            "ended": "finished" if a["reason"] == "succeeded" else ("notice" if "with notice" in a["reason"] else None),
            "measured": {
                "device": "cpu", "peak_rss_bytes": 0.58 * 2**30, "micro_batch_size": 16, "grad_accum": 1,
                "steps": steps, "tokens": steps * 620, "tokens_per_s": 6912, "step_s": 0.09, "phases": phases,
            },
        }  # fmt: skip
        (fence / f"epoch-{n:08d}.json").write_text(
            json.dumps({k: v for k, v in record.items() if v is not None})
        )


def _tiny_demo(registry: Registry, runs: Path, job_id: str, ended_ago_s: float) -> None:
    """The quickstart-like run preempted twice (with a notice, then without one), on this machine."""
    attempts = [
        {"start": 0, "end": 50, "reason": "preempted (with notice, step 40)", "seconds": 9},
        {"start": 50, "end": 85, "reason": "preempted (without notice, step 85)", "seconds": 8},
        {"start": 80, "end": 120, "reason": "succeeded", "seconds": 8},
    ]
    add_job(
        registry, runs, job_id, "SUCCEEDED", 120, total=120, attempts=attempts, instance="local", spot=None,
        hourly_usd=0.9, checkpoints=[110, 120], steps_per_s=11.0, ended_ago_s=ended_ago_s,
    )  # fmt: skip
    _epochs(str(runs / job_id), attempts)
    with registry._connect() as db:  # on this machine the next attempt starts within seconds, not a minute
        rows = db.execute(
            "SELECT n, ended_at FROM attempts WHERE job_id = ? ORDER BY n", (job_id,)
        ).fetchall()
        start = rows[0][1] - attempts[0]["seconds"]
        for (n, _ended), a in zip(rows, attempts, strict=True):
            db.execute(
                "UPDATE attempts SET started_at = ?, first_step_at = ?, ended_at = ? WHERE job_id = ? AND n = ?",
                (start, start + 3.4, start + a["seconds"], job_id, n),
            )
            start += a["seconds"] + 1.6


def _jobs(home: Path, runs: Path) -> None:
    """The samples' jobs: two running, two done, two stopped at their budget (one before its first step)."""
    registry = Registry(home)
    pid = os.getpid()  # alive: the running jobs' supervisor
    local = {"instance": "local", "spot": None, "hourly_usd": 0.9}
    add_job(
        registry, runs, "support-bot-e6a937", "RUNNING", 90, total=250, checkpoints=[81], steps_per_s=0.2,
        attempts=[{"start": 0, "end": 60, "reason": "preempted (with notice, step 58)", "seconds": 300},
                  {"start": 60, "end": 90, "reason": None, "seconds": 150}],
        supervisor_pid=pid, **local,
    )  # fmt: skip
    add_job(
        registry, runs, "long-run-eb7c2f", "RUNNING", 76, total=1500, checkpoints=[74], steps_per_s=0.19,
        attempts=[{"start": 0, "end": 40, "reason": "preempted (without notice, step 40)", "seconds": 210},
                  {"start": 38, "end": 76, "reason": None, "seconds": 200}],
        supervisor_pid=pid, **local,
    )  # fmt: skip
    _tiny_demo(registry, runs, "tiny-demo2-52df17", ended_ago_s=20)
    _tiny_demo(registry, runs, "tiny-demo-e54874", ended_ago_s=200)
    for job_id, step, ago in (("sql-tuner-4390f6", 7, 250), ("sql-tuner-038376", 0, 400)):
        add_job(
            registry, runs, job_id, "STOPPED", step, total=250, budget_usd=0.05, ended_ago_s=ago,
            reason="budget: $0.039 spent + $0.012 for the next checkpoint interval would pass budget_usd $0.05",
            attempts=[{"start": 0, "end": step, "reason": "budget", "seconds": 150}],
            checkpoints=[step] if step else [], **local,
        )  # fmt: skip
    with registry._connect() as db:  # stopped at launch: the budget did not cover the first interval
        db.execute("DELETE FROM attempts WHERE job_id = ?", ("sql-tuner-038376",))


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What `ftorch status` and `ftorch status tiny-demo2` print at 120 columns for the samples' jobs."""
    tmp = tmp_path_factory.mktemp("samples")
    home, runs = tmp / "home", tmp / "runs"
    before = os.environ.get("FTORCH_HOME")
    os.environ["FTORCH_HOME"] = str(home)
    try:
        _jobs(home, runs)
    finally:
        os.environ.pop("FTORCH_HOME") if before is None else os.environ.update(FTORCH_HOME=before)
    exe = Path(sys.executable).parent / "ftorch"
    env = {**os.environ, "FTORCH_HOME": str(home), "COLUMNS": "120", "NO_COLOR": "1"}
    out = {}
    for command in ("status", "status tiny-demo2"):
        done = subprocess.run(
            [str(exe), *command.split()], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
        )
        assert done.returncode == 0, done.stderr
        out[command] = done.stdout
    return out


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_the_status_samples_are_what_status_prints(printed: dict[str, str], doc: str) -> None:
    for command in ("status", "status tiny-demo2"):
        sample = _shapes("\n".join(_sample(doc, f"ftorch {command}")))
        output = _shapes(printed[f"{command}"])
        assert len(sample) >= 3, f"{doc}: the `$ ftorch {command}` sample is gone"
        if doc == "README.md" and command == "status":  # a few of the jobs: the header, rows in order
            rows = iter(output)
            assert all(line in rows for line in sample), "\n".join(["printed:", *output, "sample:", *sample])
        else:  # every line of the sample, in order (the README's detail stops at the attempts)
            assert output[: len(sample)] == sample, "\n".join(["printed:", *output, "sample:", *sample])
