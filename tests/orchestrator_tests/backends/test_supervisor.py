"""The local supervisor's state machine, on real trainer processes: preemption vs crash, restart limits,
cancel, resume, and a supervisor that dies."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import (
    assert_bitwise_equal,
    final_weights,
    ftorch,
    job_dict,
    prepare_run,
    run_trainer,
    write_data,
)

from orchestrator.registry import TERMINAL, Registry
from orchestrator.views import status as job_status


def write_job(tmp_path: Path, job: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def launch(job_file: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    done = ftorch("launch", str(job_file), "--json", *extra, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["job_id"]


def wait_for(job_id: str, predicate: Any, timeout: float = 180.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = job_status.status_one(job_id)
        if predicate(detail):
            return detail
        time.sleep(0.2)
    raise AssertionError(
        f"timed out; last status: {json.dumps(job_status.status_one(job_id), default=str)[:2000]}"
    )


def ended(detail: dict[str, Any]) -> bool:
    return detail["state"] in TERMINAL


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    return write_data(tmp_path / "d.jsonl", "instruction", 64)


def test_two_preemptions_recover_and_match_an_uninterrupted_run(
    tmp_path: Path, tiny_model: Path, data: Path, ftorch_home: Path
) -> None:
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        local={"chaos": {"preempt_at_steps": [8, 19], "notice": [True, False], "grace_s": 20}},
    )
    # steps slowed (a fault, not a slow machine): each preemption lands while there is training left
    job_id = launch(write_job(tmp_path, job), env={"FTORCH_FAULTS": "slow-step@200"})
    detail = wait_for(job_id, ended)
    assert detail["state"] == "SUCCEEDED", detail
    assert detail["preemptions"] == 2 and detail["attempts"] == 3
    reasons = [a["end_reason"] for a in detail["attempt_timeline"]]
    assert reasons[0].startswith("preempted (with notice") and reasons[1].startswith(
        "preempted (without notice"
    )
    assert reasons[2] == "succeeded"
    # with notice the step in flight is saved; attempt 2 starts where attempt 1 stopped
    assert detail["attempt_timeline"][1]["start_step"] >= 8
    assert detail["step"] == detail["total_steps"] == 30 and detail["last_checkpoint_step"] == 30
    assert (Path(detail["output_uri"]) / "adapter_model.safetensors").exists()

    as_json = json.loads(ftorch("status", job_id, "--json").stdout)
    for field in (
        "job_id",
        "name",
        "backend",
        "state",
        "step",
        "total_steps",
        "loss",
        "attempts",
        "preemptions",
        "cost_usd",
        "eta_s",
        "run_uri",
        "output_uri",
        "last_checkpoint_step",
        "updated_at",
    ):
        assert field in as_json, field

    reference = prepare_run({**job, "local": {"threads": 1}}, "reference")
    assert run_trainer(reference).returncode == 0
    assert_bitwise_equal(final_weights(detail["run_uri"]), final_weights(reference))

    logs = ftorch("logs", job_id).stdout
    assert logs.count("===== attempt") == 3 and "resumed from" in logs


def test_crash_is_retried_within_the_limit(
    tmp_path: Path, tiny_model: Path, data: Path, ftorch_home: Path
) -> None:
    job = job_dict(tiny_model, data, tmp_path / "runs", local={"max_restarts_on_errors": 1})
    job_id = launch(write_job(tmp_path, job), env={"FTORCH_FAULTS": "crash@12:1"})
    detail = wait_for(job_id, ended)
    assert detail["state"] == "SUCCEEDED"
    assert detail["preemptions"] == 0 and detail["attempts"] == 2
    assert detail["attempt_timeline"][0]["end_reason"].startswith("crashed (exit code 1)")


def test_repeated_crashes_end_failed(tmp_path: Path, tiny_model: Path, data: Path, ftorch_home: Path) -> None:
    job = job_dict(tiny_model, data, tmp_path / "runs", local={"max_restarts_on_errors": 1})
    job_id = launch(write_job(tmp_path, job), env={"FTORCH_FAULTS": "crash@6"})
    detail = wait_for(job_id, ended)
    assert detail["state"] == "FAILED"
    assert "crashed 2 times" in detail["reason"] and "InjectedFault" in detail["reason"]
    assert detail["attempts"] == 2


def test_bad_data_fails_at_once_without_retries(tmp_path: Path, tiny_model: Path, ftorch_home: Path) -> None:
    bad = write_data(tmp_path / "bad.jsonl", "instruction", 8)
    job = job_dict(tiny_model, bad, tmp_path / "runs")
    job_id = launch(write_job(tmp_path, job))  # checked at launch; it goes bad before the trainer reads it
    bad.write_bytes(b'{"instruction": "x", "output": "y"}\n{"instruction": "caf\xe9", "output": "y"}\n')
    detail = wait_for(job_id, ended)
    assert detail["state"] == "FAILED" and detail["attempts"] == 1
    assert "bad.jsonl:2: not UTF-8 text" in detail["reason"]


def test_cancel_keeps_checkpoints_and_resume_finishes_exactly(
    tmp_path: Path, tiny_model: Path, data: Path, ftorch_home: Path
) -> None:
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 1000}
    )
    job_id = launch(write_job(tmp_path, job))
    wait_for(job_id, lambda d: d["state"] == "RUNNING" and (d["step"] or 0) >= 3)
    done = ftorch("cancel", job_id)
    assert done.returncode == 0 and "CANCELLED" in done.stdout
    detail = job_status.status_one(job_id)
    assert detail["state"] == "CANCELLED"
    saved = detail["checkpoints"][-1]["step"]
    assert saved > 0  # the notice made the trainer save the step it was on
    assert ftorch("cancel", job_id).stdout.strip().endswith("nothing to cancel")

    assert (
        ftorch("resume", job_id, "--set", f"train.max_steps={saved + 20}", "--allow-change").returncode == 0
    )
    detail = wait_for(job_id, ended)
    assert detail["state"] == "SUCCEEDED" and detail["step"] == saved + 20
    assert detail["attempt_timeline"][-1]["start_step"] == saved


def test_dead_supervisor_is_reported_and_resume_picks_the_run_up(
    tmp_path: Path, tiny_model: Path, data: Path, ftorch_home: Path
) -> None:
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 1000}
    )
    job_id = launch(write_job(tmp_path, job))
    wait_for(job_id, lambda d: d["state"] == "RUNNING" and (d["step"] or 0) >= 3)
    registry = Registry(ftorch_home)
    supervisor = registry.get(job_id).supervisor_pid
    os.kill(supervisor, signal.SIGKILL)
    detail = wait_for(job_id, ended, timeout=30)
    assert detail["state"] == "FAILED" and "supervisor" in detail["reason"]
    trainer_pid = detail["attempt_timeline"][-1]
    # the trainer does not go on unsupervised: it got the notice, saved, and left
    time.sleep(0.5)
    deadline = time.time() + 30
    while time.time() < deadline and Path(f"/proc/{registry.attempts(job_id)[-1].pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{registry.attempts(job_id)[-1].pid}").exists(), trainer_pid

    saved = job_status.status_one(job_id)["checkpoints"][-1]["step"]
    assert saved >= 3
    assert (
        ftorch("resume", job_id, "--set", f"train.max_steps={saved + 20}", "--allow-change").returncode == 0
    )
    detail = wait_for(job_id, ended)
    assert detail["state"] == "SUCCEEDED" and detail["step"] == saved + 20
    assert detail["attempt_timeline"][-1]["start_step"] == saved
