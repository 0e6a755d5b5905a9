"""train.health through the CLI (`ftorch launch`, `status`, `metrics`) and the local supervisor: a transient
NaN is rolled back and shown; with the checks off the same fault is no crash; two FSDP ranks of which one
sees a non-finite gradient end UNHEALTHY together, never restarted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from helpers import final_weights, ftorch, job_dict, write_data

#: --follow's exit code per end state (orchestrator/cli/follow.py)
SUCCEEDED, UNHEALTHY = 0, 6
#: synchronous checkpoints: none is skipped for an upload still in flight on a loaded machine, so the
#: healthy checkpoint a rollback goes to is the same every run
SYNC = {"FTORCH_ASYNC_CHECKPOINT": "0"}


def _launch(tmp_path: Path, job: dict[str, Any], faults: str, timeout: float = 300) -> tuple[str, Any]:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    launched = ftorch(
        "launch", str(job_file), "--follow", env={**SYNC, "FTORCH_FAULTS": faults}, timeout=timeout
    )
    return launched.stdout.splitlines()[0].strip(), launched


def _out(done: Any) -> str:
    return done.stdout[-4000:] + done.stderr[-3000:]


def test_a_transient_nan_through_the_cli_is_rolled_back_and_shown(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job_id, launched = _launch(tmp_path, job_dict(tiny_model, data, tmp_path / "runs"), "nan@12")
    assert launched.returncode == SUCCEEDED, _out(launched)
    shown = ftorch("status", job_id, "--json")
    assert shown.returncode == 0, _out(shown)
    detail = json.loads(shown.stdout)
    assert detail["state"] == "SUCCEEDED" and detail["attempts"] == 1, detail
    health = detail["ledger"]["health"]
    assert health["skipped_steps"] == 4, health  # steps 12-15, the fourth in a row rolled back
    assert [(r["at_step"], r["to_step"]) for r in health["rollbacks"]] == [(15, 10)], health
    plain = ftorch("status", job_id)
    assert plain.returncode == 0, _out(plain)
    assert re.search(r"rollback: at step 15 to the healthy checkpoint of step 10 \(loss NaN", plain.stdout), (
        plain.stdout
    )
    metrics = ftorch("metrics", job_id)
    assert metrics.returncode == 0, _out(metrics)
    loss = {}
    for line in metrics.stdout.splitlines()[1:]:
        cells = line.split()
        loss[int(cells[0])] = cells[2]
    assert [loss[s] for s in (12, 13, 14, 15)] == ["-"] * 4, metrics.stdout  # not finite: no number
    assert all(re.fullmatch(r"\d+\.\d{4}", loss[s]) for s in (11, 16, 30)), metrics.stdout
    rows = {r["step"]: r for r in json.loads(ftorch("metrics", job_id, "--json").stdout)}
    assert rows[12]["loss"] is None and rows[16]["loss"] is not None
    assert all(bool(t.isfinite().all()) for t in final_weights(detail["run_uri"]).values())


def test_with_the_checks_off_a_nan_run_finishes_and_is_no_crash(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"health": {"enabled": False}, "max_steps": 16})
    job_id, launched = _launch(tmp_path, job, "nan@12")
    assert launched.returncode == SUCCEEDED, _out(launched)
    shown = ftorch("status", job_id, "--json")
    assert shown.returncode == 0, _out(shown)
    detail = json.loads(shown.stdout)
    assert detail["state"] == "SUCCEEDED" and detail["attempts"] == 1, detail  # never restarted
    assert detail["ledger"]["health"] == {"skipped_steps": 0, "rollbacks": []}, detail["ledger"]
    for args in ((job_id,), ("--all",)):
        assert ftorch("status", *args).returncode == 0
    assert ftorch("metrics", job_id).returncode == 0
    log = ftorch("logs", job_id).stdout
    assert "step 16/16 loss nan" in log and "[trainer] health:" not in log, log[-3000:]
    # nothing guarded the weights: the output holds the NaN the fault put in (what the checks are for)
    assert not all(bool(t.isfinite().all()) for t in final_weights(detail["run_uri"]).values())


def test_two_fsdp_ranks_launched_locally_end_unhealthy_once_on_a_non_finite_gradient_of_rank_1(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    from fsdp_helpers import ENV, fsdp_job

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = fsdp_job(tiny_model, data, tmp_path / "runs", checkpoint={"every": 2, "keep": 2},
                   train={"max_steps": 24})  # fmt: skip
    assert job["local"]["nproc"] == 2
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    faults = ",".join(f"nan-grad-rank1@{k}" for k in range(8, 24))  # rank 1 only, every step from 8
    launched = ftorch(
        "launch", str(job_file), "--follow", env={**ENV, **SYNC, "FTORCH_FAULTS": faults}, timeout=600
    )
    job_id = launched.stdout.splitlines()[0].strip()
    assert launched.returncode == UNHEALTHY, _out(launched)
    detail = json.loads(ftorch("status", job_id, "--json").stdout)
    assert detail["state"] == "UNHEALTHY" and detail["attempts"] == 1, detail  # never restarted
    assert detail["reason"].startswith("unhealthy: gradient norm inf at step"), detail["reason"]
    assert "after 2 rollbacks" in detail["reason"], detail["reason"]
    from trainer.runstore.store import RunStore

    kept = RunStore(detail["run_uri"]).complete_checkpoints()
    healthy = [c.step for c in kept if c.meta.get("healthy") is not False]
    assert detail["reason"].endswith(f"; newest healthy checkpoint: step {healthy[-1]}"), (detail, kept)
    log = ftorch("logs", job_id).stdout
    assert "gradient norm inf at step 8: optimizer step 8 skipped" in log, log[-3000:]
    assert "(rollback 1 of 2)" in log and "(rollback 2 of 2)" in log, log[-3000:]
