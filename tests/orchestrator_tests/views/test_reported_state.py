"""What status, the attempts table and the messages say must match what happened (issue 23 point 6):
saved progress from the store's newest checkpoint, steps credited to the attempt that trained them, a
requested stop or a lost supervisor named as such, counts in words that agree, a resume without a
checkpoint that says it starts over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakejobs import add_job
from helpers import job_dict, prepare_run, write_data

from orchestrator.registry import JobState, Registry
from orchestrator.views import status as job_status
from orchestrator.views.job_facts import timeline
from trainer.runstore.store import RunStore
from trainer.stops.interruptions import how_it_ended, request_stop


def test_a_failed_job_shows_the_newest_checkpoint_the_store_holds(tmp_path: Path, ftorch_home: Path) -> None:
    registry = Registry()
    runs = tmp_path / "runs"
    job_id = add_job(registry, runs, "lagging-abc123", "FAILED", step=10, total=60, checkpoints=[30],
                     attempts=[{"start": 0, "end": 33, "reason": "failed: killed", "seconds": 60}])  # fmt: skip
    progress_file = runs / job_id / "progress.json"
    progress = json.loads(progress_file.read_text())
    progress.update(step=10, last_checkpoint_step=10)  # written before checkpoint 30 became durable
    progress_file.write_text(json.dumps(progress))

    detail = job_status.status_one(job_id)
    assert (detail["step"], detail["last_checkpoint_step"]) == (30, 30)
    (row,) = job_status.status_all(registry)
    assert (row["step"], row["last_checkpoint_step"]) == (30, 30)


def _attempt(registry: Registry, job_id: str, start: int, **fields: object) -> None:
    attempt = registry.start_attempt(job_id, start)
    if fields:
        registry.update_attempt(job_id, attempt.n, **fields)


def test_steps_are_credited_to_the_attempt_that_trained_them(tmp_path: Path, ftorch_home: Path) -> None:
    """Attempt 2 died while loading (no step taken) with a start step read from a lagging progress file:
    the steps 20..30 are attempt 1's (its checkpoint 30 is where attempt 3 resumed), not attempt 2's."""
    registry = Registry()
    job_id = "credit-abc123"
    registry.create_job(job_id, "credit", "local", str(tmp_path / job_id), str(tmp_path / "out"), {})
    now = time.time()
    _attempt(registry, job_id, 0, first_step_at=now - 300, ended_at=now - 200, end_step=35,
             end_reason="preempted (without notice, step 35)", outcome="preempted")  # fmt: skip
    _attempt(registry, job_id, 20, ended_at=now - 150, end_step=35, end_reason="crashed (exit code 1)",
             outcome="crashed")  # fmt: skip
    _attempt(registry, job_id, 30, first_step_at=now - 100, ended_at=now, end_step=60,
             end_reason="succeeded", outcome="succeeded")  # fmt: skip
    rows = timeline(registry.attempts(job_id), JobState.SUCCEEDED, now)
    assert [r["steps_gained"] for r in rows] == [30, 0, 30]
    assert [r["steps_lost"] for r in rows] == [5, 0, 0]


def test_a_recovering_attempt_does_not_show_the_previous_attempts_step(
    tmp_path: Path, ftorch_home: Path
) -> None:
    registry = Registry()
    job_id = "recover-abc123"
    registry.create_job(job_id, "recover", "local", str(tmp_path / job_id), str(tmp_path / "out"), {})
    now = time.time()
    _attempt(registry, job_id, 0, first_step_at=now - 300, ended_at=now - 20, end_step=35,
             end_reason="preempted (without notice, step 35)", outcome="preempted")  # fmt: skip
    _attempt(registry, job_id, 30)  # loading the model; progress.json is still attempt 1's
    progress = {"attempt": 1, "step": 35}
    rows = timeline(registry.attempts(job_id), JobState.RECOVERING, now, progress)
    assert rows[1]["start_step"] == 30 and not rows[1]["steps_gained"]
    rows = timeline(registry.attempts(job_id), JobState.RUNNING, now, {"attempt": 2, "step": 33})
    assert rows[1]["steps_gained"] == 3


def test_a_cancel_during_the_trainers_start_is_a_requested_stop(tmp_path: Path) -> None:
    """The stop request lands while the trainer loads (before it claims its epoch): still a stop."""
    store = RunStore(str(tmp_path / "run"))
    request_stop(store, "cancel")
    time.sleep(0.02)
    store.claim_epoch({"attempt": 1})
    assert how_it_ended(store) == {"ended": "stopped", "stop_reason": "cancel"}


def test_a_stop_request_from_an_earlier_attempt_is_not_this_ones(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_json("control/stop.json", {"reason": "cancel", "at": time.time() - 3600})
    store.claim_epoch({"attempt": 2})
    assert how_it_ended(store) == {"ended": "notice"}


def test_a_lost_supervisor_is_not_a_preemption_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store = RunStore(str(tmp_path / "run"))
    store.claim_epoch({"attempt": 1})
    monkeypatch.setenv("FTORCH_SUPERVISOR_PID", str(gone.pid))
    assert how_it_ended(store) == {"ended": "stopped", "stop_reason": "supervisor lost"}
    monkeypatch.setenv("FTORCH_SUPERVISOR_PID", str(os.getpid()))  # alive: a SIGTERM is a notice
    assert how_it_ended(store) == {"ended": "notice"}


def test_one_crash_is_counted_in_words_that_agree(tmp_path: Path, ftorch_home: Path) -> None:
    from orchestrator.backends.local_supervisor import Supervisor
    from orchestrator.jobfile.spec import validate_job
    from orchestrator.logtail import LogTail

    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    spec = validate_job(
        job_dict(tmp_path / "model", data, tmp_path / "runs", local={"max_restarts_on_errors": 0})
    )
    registry = Registry()
    registry.create_job("crash-abc123", "crash", "local", str(tmp_path / "runs" / "crash-abc123"),
                        str(tmp_path / "out"), spec.model_dump(mode="json"))  # fmt: skip
    log = tmp_path / "attempt.log"
    log.write_text("RuntimeError: boom\n")
    end = Supervisor("crash-abc123").classify(1, None, {}, LogTail(log))
    assert "crashed once" in end.reason and "times" not in end.reason, end.reason


def test_a_simulated_preemption_that_lands_after_the_run_finished_is_no_preemption(
    tmp_path: Path, ftorch_home: Path
) -> None:
    """local.chaos fires when the supervisor sees the step, which on a busy machine can be after the
    trainer wrote its output and exited 0: the attempt succeeded (no second attempt, no `preempted` post
    after the trainer's `succeeded`); one that lands before the end is a preemption."""
    from orchestrator.backends.local_supervisor import Supervisor
    from orchestrator.jobfile.spec import validate_job
    from orchestrator.logtail import LogTail
    from orchestrator.states import AttemptEnd, Outcome

    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    spec = validate_job(job_dict(tmp_path / "model", data, tmp_path / "runs"))
    Registry().create_job("late-abc123", "late", "local", str(tmp_path / "runs" / "late-abc123"),
                          str(tmp_path / "out"), spec.model_dump(mode="json"))  # fmt: skip
    log = tmp_path / "attempt.log"
    log.write_text("done\n")
    chaos = AttemptEnd(Outcome.PREEMPTED, "preempted (with notice, step 6)")
    supervisor = Supervisor("late-abc123")
    late = supervisor.classify(0, chaos, {"state": "finished"}, LogTail(log))
    assert late.outcome is Outcome.SUCCEEDED, late
    in_time = supervisor.classify(75, chaos, {"state": "preempted"}, LogTail(log))
    assert in_time.outcome is Outcome.PREEMPTED, in_time


def test_resume_without_a_checkpoint_says_it_starts_from_step_0(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    from orchestrator.jobs import lifecycle as jobs

    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    job = job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 4})
    run_uri = prepare_run(job, "fresh-abc123")
    spec = json.loads((Path(run_uri) / "spec.json").read_text())["job"]
    registry = Registry()
    registry.create_job("fresh-abc123", "fresh", "local", run_uri, f"{run_uri}/output", spec)
    registry.set_state("fresh-abc123", "FAILED", "the trainer crashed before its first checkpoint")
    said = jobs.resume("fresh-abc123", [])
    assert "step 0" in said and "newest checkpoint" not in said, said
    deadline = time.time() + 180
    while not registry.get("fresh-abc123").state.terminal and time.time() < deadline:
        time.sleep(0.3)
    assert registry.get("fresh-abc123").state == "SUCCEEDED"
