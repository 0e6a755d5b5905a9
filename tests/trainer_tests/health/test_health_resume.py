"""Resuming after the health checks acted (trainer/health/): a run cut after a rollback resumes to the same
weights as one never cut; an UNHEALTHY job resumes, with a saner learning rate, from its newest healthy
checkpoint and never from an unhealthy one."""

from __future__ import annotations

import json
import re
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

from trainer.runstore.store import RunStore

#: synchronous checkpoints: none is skipped for an upload still in flight on a loaded machine, so the
#: healthy checkpoint a rollback goes to, and the one a resume reads, are the same every run
SYNC = {"FTORCH_ASYNC_CHECKPOINT": "0"}


def _out(done: Any) -> str:
    return done.stdout + done.stderr


def test_a_run_cut_after_a_rollback_resumes_to_the_weights_of_one_never_cut(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    # nan@12: steps 12-14 skipped, a rollback at 15 to step 10, checkpointed at 15 (the rolled-back state)
    uncut_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "uncut"))
    uncut = run_trainer(uncut_uri, 1, {**SYNC, "FTORCH_FAULTS": "nan@12", "FTORCH_ATTEMPT": "1"})
    assert uncut.returncode == 0, _out(uncut)[-3000:]
    assert "rolled back to the healthy checkpoint of step 10" in _out(uncut)

    cut_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "cut"))
    faults = "nan@12,kill@18:1"  # attempt 1 is SIGKILLed at step 18, after the rollback's checkpoint
    first = run_trainer(cut_uri, 1, {**SYNC, "FTORCH_FAULTS": faults, "FTORCH_ATTEMPT": "1"})
    assert first.returncode == -9, _out(first)[-3000:]
    assert "rolled back to the healthy checkpoint of step 10 (rollback 1 of 2)" in _out(first)
    store = RunStore(cut_uri)
    assert [c.step for c in store.complete_checkpoints()][-1] == 15  # the rolled-back state, durable
    second = run_trainer(cut_uri, 2, {**SYNC, "FTORCH_FAULTS": faults, "FTORCH_ATTEMPT": "2"})
    out = _out(second)
    assert second.returncode == 0, out[-3000:]
    assert re.search(r"resumed from \S*step-0*15\b", out), out[-3000:]
    assert "rolled back" not in out and "skipped" not in out.replace("not skipped", "")  # no new fault
    # the health counters went on with the checkpoint: one rollback and four skipped steps in all
    from trainer.recording.ledger import compute_ledger

    records = store.epoch_records()
    assert [r.get("ended") for _n, r in sorted(records.items())] == [None, "finished"], (
        records
    )  # killed, then done
    ledger = compute_ledger(records, spent_usd=0.0, hourly_usd=0.0, ondemand_hourly_usd=None)
    assert ledger["health"]["skipped_steps"] == 4, ledger["health"]
    assert [(r["at_step"], r["to_step"]) for r in ledger["health"]["rollbacks"]] == [(15, 10)], ledger
    assert_bitwise_equal(final_weights(cut_uri), final_weights(uncut_uri))


# ---- an UNHEALTHY job resumed ---------------------------------------------------------------------
def test_an_unhealthy_job_resumes_with_a_lower_lr_from_its_newest_healthy_checkpoint(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    """Attempt 1 goes bad at step 12 (nan@12:1, a fault of that attempt only) and, with no rollback
    allowed, ends UNHEALTHY at step 15 with unhealthy checkpoints 12 and 14 newer than the healthy 10. The
    user resumes with a lower learning rate: refused as a change of the math unless --allow-change, then
    taken from step 10 (12 and 14 never read), at the new learning rate, to SUCCEEDED."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / "runs", checkpoint={"every": 2, "keep": 2},
                   train={"health": {"max_rollbacks": 0}})  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    env = {**SYNC, "FTORCH_FAULTS": "nan@12:1"}
    launched = ftorch("launch", str(job_file), "--follow", env=env)
    job_id = launched.stdout.splitlines()[0].strip()
    assert launched.returncode == 6, ftorch("logs", job_id).stdout[:6000]  # UNHEALTHY
    detail = json.loads(ftorch("status", job_id, "--json").stdout)
    assert detail["state"] == "UNHEALTHY" and detail["attempts"] == 1, detail
    store = RunStore(detail["run_uri"])
    kept = {c.step: c.meta.get("healthy") for c in store.complete_checkpoints()}
    why = f"{kept} {detail['reason']}\n{ftorch('logs', job_id).stdout[-3000:]}"
    assert kept == {10: True, 12: False, 14: False}, why
    assert "newest healthy checkpoint: step 10" in detail["reason"], why

    # a lower learning rate changes the math since the newest checkpoint: refused, nothing written ...
    refused = ftorch("resume", job_id, "--set", "train.lr=0.001", env=env)
    assert refused.returncode != 0 and "train.lr" in _out(refused), _out(refused)
    assert "--allow-change" in _out(refused), _out(refused)  # ... and the refusal says how
    assert json.loads(ftorch("status", job_id, "--json").stdout)["state"] == "UNHEALTHY"
    # ... and taken with --allow-change: on from the newest healthy checkpoint, at the new learning rate
    resumed = ftorch("resume", job_id, "--set", "train.lr=0.001", "--allow-change", "--follow", env=env)
    assert resumed.returncode == 0, _out(resumed)[-4000:]
    detail = json.loads(ftorch("status", job_id, "--json").stdout)
    assert detail["state"] == "SUCCEEDED" and detail["attempts"] == 2, detail
    log = ftorch("logs", job_id).stdout
    second = log[log.index("attempt 2 of run") :]
    assert "not resuming from unhealthy checkpoint(s): step-00000012, step-00000014" in second, second
    assert "resumed from checkpoints/step-00000010 (step 10/30)" in second, second
    assert "resumed at step 10: lr and data position as planned" in second, second
    assert "[trainer] health:" not in second and "[trainer] unhealthy:" not in second  # no fault now
    from orchestrator.jobfile.spec import validate_job
    from trainer.loop import lr_lambda_for

    factor = lr_lambda_for(validate_job(job), 30)  # the schedule: the first and the resumed attempt alike
    rows = [r for r in json.loads(ftorch("metrics", job_id, "--json").stdout) if r["lr"] is not None]
    assert {r["attempt"] for r in rows} == {1, 2} and max(r["step"] for r in rows) == 30, rows
    for r in rows:  # the step's learning rate: the job's 0.005 before, the 0.001 it was resumed with after
        base = 0.005 if r["attempt"] == 1 else 0.001
        assert r["lr"] == pytest.approx(base * factor(r["step"]), rel=1e-6), r
    from safetensors.torch import load_file

    output = Path(detail["run_uri"]) / "output" / "adapter_model.safetensors"
    assert all(bool(t.isfinite().all()) for t in load_file(str(output)).values())
