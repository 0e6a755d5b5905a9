"""The supervisor knows the step from the trainer's progress, not from its log lines: RUNNING from the
first step, chaos acts on the exact step even when the trainer logs rarely; a user's cancel is its own
reason (the trainer logs a stop, not a preemption notice, and nothing counts it as a preemption)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml
from helpers import ftorch, job_dict, write_data

from orchestrator.jobs import lifecycle as jobs
from orchestrator.registry import TERMINAL, Registry
from orchestrator.views import status as job_status
from trainer.runstore.store import RunStore
from trainer.stops.interval import History


def _wait(job_id: str, predicate: Any, timeout: float = 240.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = job_status.status_one(job_id)
        if predicate(detail):
            return detail
        time.sleep(0.1)
    raise AssertionError(json.dumps(job_status.status_one(job_id), default=str)[:3000])


def test_progress_drives_state_chaos_and_cancel(tmp_path: Path, tiny_model: Path, ftorch_home: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        train={"max_steps": 100000, "log_every": 100000},  # the trainer logs no step line at all
        checkpoint={"every": 1000},
        local={"chaos": {"preempt_at_steps": [4], "notice": [False]}},
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(job_file), "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    try:
        _check(job_id)
    finally:  # never leave a 100000-step trainer behind
        if Registry().get(job_id).state not in TERMINAL:
            jobs.cancel(job_id, wait_s=60)


def _check(job_id: str) -> None:
    detail = _wait(job_id, lambda d: len(d["attempt_timeline"]) >= 2)
    first = detail["attempt_timeline"][0]
    assert first["end_reason"].startswith("preempted (without notice, step 4)"), first
    # killed at the step it reached (the trainer logs no step line at all); a loaded machine lets the tiny
    # model (milliseconds a step) run a few steps more before the kill lands
    assert 4 <= first["end_step"] <= 40, first

    detail = _wait(job_id, lambda d: d["state"] == "RUNNING")
    assert detail["attempt_timeline"][1]["first_step_at"] is not None

    cancelled = ftorch("cancel", job_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stdout
    detail = job_status.status_one(job_id)
    assert detail["preemptions"] == 1 and detail["attempt_timeline"][-1]["end_reason"] == "cancelled"
    registry = Registry()
    log = (registry.job_dir(job_id) / "logs" / "attempt-002.log").read_text()
    assert "stop requested" in log and "preemption notice" not in log, log[-2000:]
    store = RunStore(detail["run_uri"])
    records = store.epoch_records()
    assert records[max(records)]["ended"] == "stopped"
    history = History.from_epochs(records, max(records) + 1, time.time())
    assert history.interruptions == 1 and history.with_notice == 0  # the chaos kill only
