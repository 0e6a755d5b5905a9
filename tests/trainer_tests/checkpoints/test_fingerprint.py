"""The spec fingerprint (trainer/checkpoints/fingerprint.py): a resume that changes the math of a job with checkpoints
is refused in one line (exit 2, nothing written) unless `--allow-change`, which is recorded and shown by
status; settings that do not change the math stay free; a data file changed between attempts is refused
by the trainer naming data.path, unless the resume allowed it."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import yaml
from helpers import ftorch, job_dict, prepare_run, run_trainer, write_data
from pydantic import BaseModel

from orchestrator.cli.follow import FOLLOW_EXIT_CODES
from orchestrator.registry import Registry
from trainer import exitcodes
from trainer.checkpoints import fingerprint
from trainer.config import JobSpec
from trainer.runstore.store import RunStore


def _dotted_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        kind = info.annotation
        inner = [a for a in getattr(kind, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        nested = (
            kind if isinstance(kind, type) and issubclass(kind, BaseModel) else (inner[0] if inner else None)
        )
        out += _dotted_fields(nested, f"{path}.") if nested is not None else [path]
    return out


def test_every_job_file_field_is_either_fingerprinted_or_free() -> None:
    classified = set(fingerprint.FIELDS) | set(fingerprint.FREE)
    unclassified = [
        f for f in _dotted_fields(JobSpec)
        if not any(f == c or f.startswith(c + ".") for c in classified)
    ]  # fmt: skip
    assert unclassified == []
    assert not set(fingerprint.FIELDS) & set(fingerprint.FREE)


def test_changes_name_the_field_and_a_kept_effective_batch_is_free(tmp_path: Path) -> None:
    job = job_dict(tmp_path / "m", tmp_path / "d.jsonl", tmp_path / "runs")
    recorded = fingerprint.record(job, "file:abc")
    seeded = {**job, "train": {**job["train"], "seed": 99}}
    (change,) = fingerprint.changes(recorded, seeded, 30)
    assert change.line() == (
        "train.seed: changed from 7 to 99 since checkpoint step 30; resuming would not continue the same "
        "run (pass --allow-change to resume anyway)"
    )
    split = {**job, "train": {**job["train"], "micro_batch_size": 2, "grad_accum": 2}}
    free = {**split, "resources": {"budget_usd": 5}, "checkpoint": {**job["checkpoint"], "every": 3}}
    assert fingerprint.changes(recorded, free, 30) == []
    bigger = {**job, "train": {**job["train"], "grad_accum": 2}}
    assert [c.field for c in fingerprint.changes(recorded, bigger, 30)] == ["train.grad_accum"]
    (data,) = fingerprint.changes(recorded, job, 30, identity="file:def")
    assert data.field == "data.path" and data.line().startswith("data.path: the data changed")


def _start_failed_job(tmp_path: Path, tiny_model: Path) -> tuple[str, Path]:
    """A job that crashed at step 12 with checkpoints at 5 and 10: FAILED, resumable."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 16}, local={"max_restarts_on_errors": 0}
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    # synchronous saves: checkpoint 10 is committed before the crash at 12, however loaded the machine
    done = ftorch(
        "launch",
        str(job_file),
        "--follow",
        env={"FTORCH_FAULTS": "crash@12:1", "FTORCH_ASYNC_CHECKPOINT": "0"},
    )
    assert done.returncode == FOLLOW_EXIT_CODES["FAILED"], done.stdout + done.stderr
    job_id = done.stdout.split()[0]
    return job_id, tmp_path / "runs" / job_id


def _wait_end(job_id: str, timeout: float = 240) -> str:
    registry = Registry()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = registry.get(job_id).state
        if state in ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED"):
            return str(state)
        time.sleep(0.3)
    raise AssertionError(f"{job_id} did not end")


def test_resume_refuses_a_changed_seed_allows_free_settings_and_records_an_allowed_change(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    job_id, run = _start_failed_job(tmp_path, tiny_model)
    spec_before = (run / "spec.json").read_bytes()
    registry = Registry()
    events_before = len(registry.events(job_id))

    refused = ftorch("resume", job_id, "--set", "train.seed=99")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: train.seed: changed from 7 to 99 since checkpoint step 10; resuming would not continue the "
        "same run (pass --allow-change to resume anyway)"
    ]
    assert (run / "spec.json").read_bytes() == spec_before  # nothing written
    assert registry.get(job_id).state == "FAILED" and len(registry.events(job_id)) == events_before

    # budget and checkpoint interval do not change the math: accepted, and the trainer resumes
    free = ftorch(
        "resume", job_id, "--set", "resources.budget_usd=100", "--set", "checkpoint.every=3",
        # synchronous saves: the step-12 checkpoint is committed before the crash at 14, however loaded
        env={"FTORCH_FAULTS": "crash@14:2", "FTORCH_ASYNC_CHECKPOINT": "0"},
    )  # fmt: skip
    assert free.returncode == 0, free.stderr
    assert _wait_end(job_id) == "FAILED"  # the injected crash at step 14 of attempt 2
    assert len(registry.attempts(job_id)) == 2
    newest = RunStore(str(run)).complete_checkpoints()[-1]
    assert newest.step == 12 and newest.meta["fingerprint"]["fields"]["train.seed"] == 7

    allowed = ftorch("resume", job_id, "--set", "train.seed=99", "--allow-change", "--follow")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "allowed change from checkpoint step 12: train.seed 7 -> 99" in allowed.stdout
    detail = json.loads(ftorch("status", job_id, "--json").stdout)
    assert detail["state"] == "SUCCEEDED"
    assert [c["field"] for c in detail["allowed_changes"][0]["changes"]] == ["train.seed"]
    timeline = detail["attempt_timeline"]
    assert timeline[2]["allowed_changes"] == [
        {"field": "train.seed", "from": 7, "to": 99, "checkpoint_step": 12}
    ]
    assert timeline[0]["allowed_changes"] == timeline[1]["allowed_changes"] == []
    text = ftorch("status", job_id).stdout
    assert "allowed change from checkpoint step 12: train.seed 7 -> 99" in text
    # the trainer's own attempt record in the run store has it too
    records = [json.loads(p.read_text()) for p in sorted((run / "fence").glob("*.json"))]
    assert records[-1]["allowed_changes"][0]["field"] == "train.seed"


def _run_crashed_at_12(tmp_path: Path, tiny_model: Path) -> tuple[str, Path]:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 16})
    run_uri = prepare_run(job)
    # synchronous saves: checkpoint 10 is committed before the crash at 12, however loaded the machine
    first = run_trainer(run_uri, 1, env={"FTORCH_FAULTS": "crash@12", "FTORCH_ASYNC_CHECKPOINT": "0"})
    assert first.returncode == exitcodes.ERROR, first.stderr[-2000:]
    return run_uri, data


def _last_line(result: Any) -> str:
    return (result.stdout + result.stderr).strip().splitlines()[-1]


def test_a_data_file_changed_between_attempts_is_refused_naming_data_path_unless_allowed(
    tmp_path: Path, tiny_model: Path
) -> None:
    run_uri, data = _run_crashed_at_12(tmp_path, tiny_model)
    original = data.read_text().splitlines(keepends=True)

    data.write_text("".join(original[:24]))  # shrunk
    shrunk = run_trainer(run_uri, 2)
    assert shrunk.returncode == exitcodes.BAD_CONFIG, shrunk.stderr[-2000:]
    assert "error: data.path: the data changed" in _last_line(shrunk)
    assert "since checkpoint step 10" in _last_line(shrunk)

    shuffled = original[:]
    random.Random(1).shuffle(shuffled)
    data.write_text("".join(shuffled))
    refused = run_trainer(run_uri, 3)
    assert refused.returncode == exitcodes.BAD_CONFIG and "data.path:" in _last_line(refused)
    store = RunStore(run_uri)
    assert [c.step for c in store.complete_checkpoints()] == [5, 10]  # nothing trained on it

    # `ftorch resume --allow-change` records the allowance in spec.json; the trainer then resumes
    before = store.complete_checkpoints()[-1].meta["fingerprint"]["data_identity"]
    resolved = store.read_spec()
    resolved[fingerprint.ALLOWED_KEY] = [{"at": time.time(), "checkpoint_step": 10, "changes": []}]
    store.write_spec(resolved)
    allowed = run_trainer(run_uri, 4)
    assert allowed.returncode == exitcodes.OK, allowed.stderr[-2000:]
    assert "with changes allowed by `ftorch resume --allow-change`: data.path" in allowed.stdout
    after = store.complete_checkpoints()[-1].meta["fingerprint"]["data_identity"]
    assert before and after and before != after  # later checkpoints record the data they trained on


def test_a_new_split_of_the_same_effective_batch_resumes_at_the_same_example() -> None:
    import pytest

    check = fingerprint.StartCheck(meta={}, resumed={"batch_split": [4, 1]})
    job = {"train": {"micro_batch_size": 2, "grad_accum": 2}}
    assert check.data_position(10, 10, job, examples=32) == 20  # 40 examples in, in units of 2
    assert check.data_position(10, 10, job, examples=33) == 20  # both splits drop 1 example an epoch
    with pytest.raises(fingerprint.SpecChanged) as refused:
        check.data_position(10, 10, job, examples=34)  # 4s drop 2 an epoch, 2s none: other epochs
    assert refused.value.field == "train.micro_batch_size"
    check.allowed = True
    assert check.data_position(10, 10, job, examples=34) == 20
