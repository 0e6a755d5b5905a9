"""The budget guard: the rule on its own, then on a real local run priced with local.hourly_usd."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from helpers import ftorch, job_dict, write_data
from http_fakes import Hook

from orchestrator.views import status as job_status
from trainer.stops.budget import MARGIN_S, BudgetGuard
from trainer.stops.interval import AutoInterval


def test_the_rule_counts_the_next_checkpoint_interval() -> None:
    guard = BudgetGuard(budget_usd=1.0, hourly_usd=360.0, every_steps=10)  # $0.10 per second
    assert guard.check(0.0) is None  # no step rate yet: only the margin counts
    assert guard.check(1.0 - MARGIN_S * 0.1 + 0.01) is not None
    guard.observe_step(0, 100.0)
    guard.observe_step(20, 110.0)  # 2 steps/s: the next 10-step interval takes 5 s
    assert guard.interval_s() == 5.0
    assert guard.check(0.29) is None
    reason = guard.check(0.31)
    assert reason is not None and reason.startswith("budget: $0.3100 spent + $0.7000 for the next")
    roomy = BudgetGuard(budget_usd=100.0, hourly_usd=3600.0, every_steps=10, prior_rate=2.0)
    assert roomy.interval_s() == 5.0 and roomy.check(92.9) is None and roomy.check(93.1) is not None
    timed = BudgetGuard(budget_usd=100.0, hourly_usd=3600.0, every_seconds=30.0)
    assert timed.check(67.9) is None and timed.check(68.1) is not None
    auto = BudgetGuard(budget_usd=100.0, hourly_usd=3600.0)
    # `auto` before two checkpoints were seen: the interval the trainer starts with (the same model and
    # prior; it was a fixed 60 s before the model was shared)
    assert auto.interval_s() == AutoInterval().choose()[0]
    calm = BudgetGuard(
        budget_usd=100.0, hourly_usd=3600.0, auto=AutoInterval(mtbf_prior_s=36000, notice_prior=0)
    )
    assert calm.interval_s() == pytest.approx(60.0)  # sqrt(2 x 50 ms first cost x 10 h)
    auto.observe_checkpoint(1000.0)
    auto.observe_checkpoint(1000.0)
    auto.observe_checkpoint(1012.0)
    assert auto.interval_s() == 12.0
    assert BudgetGuard(budget_usd=None, hourly_usd=5.0).check(1e9) is None
    assert BudgetGuard(budget_usd=1.0, hourly_usd=0.0).check(1e9) is None  # free machines never stop


def test_the_rule_leaves_room_for_the_slowest_step_and_save_and_a_restarts_load() -> None:
    from trainer.stops.budget import restart_reason

    guard = BudgetGuard(budget_usd=1.0, hourly_usd=360.0, every_steps=10)  # $0.10 per second
    for step, at in enumerate([100.0, 100.5, 101.0, 104.0, 104.5]):  # one step of 3 s among 0.5 s ones
        guard.observe_step(step, at)
    assert guard.slowest_step_s() == 3.0
    guard.observe_save(4.0)  # a periodic save of 4 s between steps 4 and 5: the save, not the step
    guard.observe_step(5, 109.0)
    assert guard.slowest_step_s() == 3.0 and guard.save_s() == 4.0
    # the next interval (10 steps at 5 steps in 9 s = 18 s, the periodic save counted in the rate) +
    # the stop's save + the reaction: a second between checks, then the slowest step (more than MARGIN_S)
    assert guard.reserve_s() == pytest.approx(18.0 + 4.0 + (1.0 + 3.0))
    timed = BudgetGuard(budget_usd=1.0, hourly_usd=360.0, every_seconds=5.0)
    timed.observe_save(4.0)  # every 5 s: a periodic save may come before the next check, then the stop's
    assert timed.reserve_s() == pytest.approx(5.0 + 4.0 + 4.0 + MARGIN_S)
    reason = guard.check(0.0)
    assert reason is not None and "with its save, a step at the slowest recent pace" in reason
    assert "kept" not in reason  # the rule does not know what is kept; its callers say
    # a restart: the load earlier attempts measured, and never less than the last budget stop's reserve
    measured = {"phases": {"process_start_s": 5.0, "model_load_s": 20.0, "checkpoint_read_s": 4.0,
                           "first_step_s": 1.0}}  # fmt: skip
    job = {"resources": {"budget_usd": 1.0}, "checkpoint": {"every": 10}}
    records = {1: {"started_at": 0.0, "ended_at": 3.0, "hourly_usd": 360.0, "measured": measured}}
    assert restart_reason(records, job, 360.0, {"steps_per_s": 10.0}) is not None  # $0.30 + 33 s: over
    assert restart_reason({1: {**records[1], "measured": {}}}, job, 360.0, {"steps_per_s": 10.0}) is None
    stopped = {1: {**records[1], "measured": {}, "stop_reason": "budget", "budget_reserve_usd": 0.75}}
    # the estimate now ($0.30 spent + 3 s) fits; the reserve the stop reckoned ($0.75) does not
    assert restart_reason(stopped, job, 360.0, {"steps_per_s": 10.0}) is not None
    assert restart_reason(stopped, {**job, "resources": {"budget_usd": 2.0}}, 360.0, {}) is None


def _wait(job_id: str, predicate, timeout: float = 150.0) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = job_status.status_one(job_id)
        if predicate(detail):
            return detail
        time.sleep(0.3)
    raise AssertionError(json.dumps(job_status.status_one(job_id), default=str)[:3000])


def test_a_real_run_stops_at_its_budget_and_resumes_with_a_higher_one(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    hook = Hook()
    try:
        data = write_data(tmp_path / "d.jsonl", "instruction", 64)
        budget = 0.5  # at $72/h: 25 s of this machine, trainer start-up included
        job = job_dict(
            tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 10},
            resources={"budget_usd": budget}, local={"hourly_usd": 72.0},
            notify={"webhook": hook.url, "on": ["budget", "cancelled"]},
        )  # fmt: skip
        job_file = tmp_path / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        done = ftorch("launch", str(job_file), "--json")
        assert done.returncode == 0, done.stderr
        job_id = json.loads(done.stdout)["job_id"]

        detail = _wait(job_id, lambda d: d["state"] in ("STOPPED", "FAILED", "SUCCEEDED", "CANCELLED"))
        assert detail["state"] == "STOPPED" and detail["stop_reason"] == "budget", detail["reason"]
        assert detail["reason"].startswith("budget: $") and "would pass budget_usd $0.5" in detail["reason"]
        assert detail["cost_usd"] <= budget, detail["cost_usd"]  # stopped before the budget, not after
        assert detail["cost_usd"] > budget * 0.8  # ...and not long before it
        # the trainer got its notice and saved where it stopped: nothing lost
        stopped_at = detail["step"]
        assert stopped_at > 0 and detail["last_checkpoint_step"] == stopped_at
        assert detail["checkpoints"][-1]["step"] == stopped_at
        assert [e["kind"] for e in detail["events"]].count("budget") == 1
        # ...and said so: status, the webhook
        table = ftorch("status", env={"COLUMNS": "120"}).stdout
        assert "STOPPED·budget" in table
        body = hook.received[0]["body"]
        assert body["event"] == "budget" and body["job_id"] == job_id and body["budget_usd"] == budget

        # resuming with the same budget stops again at once, without starting an attempt
        assert ftorch("resume", job_id).returncode == 0
        again = _wait(
            job_id, lambda d: d["state"] == "STOPPED" and len(d["events"]) > len(detail["events"]) + 2
        )
        assert again["attempts"] == 1 and again["stop_reason"] == "budget"

        # a higher budget continues from the checkpoint
        assert ftorch("resume", job_id, "--set", "resources.budget_usd=50").returncode == 0
        more = _wait(job_id, lambda d: d["state"] == "RUNNING" and d["step"] > stopped_at + 2)
        assert more["attempt_timeline"][1]["start_step"] == stopped_at and more["budget_usd"] == 50
        assert ftorch("cancel", job_id).returncode == 0
        assert job_status.status_one(job_id)["state"] == "CANCELLED"
        assert [r["body"]["event"] for r in hook.received] == ["budget", "budget", "cancelled"]
    finally:
        hook.close()


def test_a_frozen_supervisor_does_not_stop_the_budget_stop(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    """A sleeping laptop freezes the local supervisor (SIGSTOP): the trainer still stops itself at the
    budget with a checkpoint; when the supervisor wakes (SIGCONT) the job ends STOPPED (budget) with no
    new attempt, and the frozen time is not billed."""
    import os
    import signal

    from orchestrator.registry import Registry
    from trainer.runstore.store import RunStore

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    budget = 0.5  # at $72/h: 25 s of this machine
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 10},
        resources={"budget_usd": budget}, local={"hourly_usd": 72.0},
    )  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(job_file), "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    _wait(job_id, lambda d: d["state"] == "RUNNING" and (d["step"] or 0) > 0)
    registry = Registry()
    supervisor = registry.get(job_id).supervisor_pid
    trainer = registry.attempts(job_id)[-1].pid
    store = RunStore(registry.get(job_id).run_uri)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # the trainer ends on its own: a zombie its frozen parent keeps
            with open(f"/proc/{trainer}/stat", encoding="ascii") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.3)
        else:
            raise AssertionError("the trainer did not stop itself with its supervisor frozen")
        record = next(r for r in store.epoch_records().values() if r.get("attempt") == 1)
        assert record["stop_reason"] == "budget" and record["step"] > 0
        assert store.complete_checkpoints()[-1].step == record["step"]  # the checkpoint of the stop
        assert registry.get(job_id).state.value == "RUNNING"  # nobody told the registry yet
        time.sleep(3.0)  # the laptop sleeps on: at $72/h these 3 s would cost $0.06
    finally:
        os.kill(supervisor, signal.SIGCONT)
    detail = _wait(job_id, lambda d: d["state"] in ("STOPPED", "FAILED", "SUCCEEDED", "CANCELLED"))
    assert detail["state"] == "STOPPED" and detail["stop_reason"] == "budget", detail["reason"]
    assert detail["reason"] == record["stop_detail"]
    assert detail["attempts"] == 1  # no new attempt
    assert detail["last_checkpoint_step"] == record["step"]
    assert detail["cost_usd"] <= budget, detail["cost_usd"]  # the frozen time is not billed


def test_a_kill_in_the_budget_stops_checkpoint_never_reports_a_checkpoint(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    """B2: the trainer is killed inside the checkpoint of its budget stop (FTORCH_FAULTS
    checkpoint-partial@*: its first checkpoint, whatever the step; no periodic one came before). The
    job ends STOPPED at its budget, without a second attempt, and says no checkpoint was saved."""
    from trainer.runstore.store import RunStore

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 100000},
        resources={"budget_usd": 0.4}, local={"hourly_usd": 72.0},
    )  # fmt: skip  # at $72/h: 20 s of this machine, start-up included; it stops after a step at least
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(job_file), "--json", env={"FTORCH_FAULTS": "checkpoint-partial@*:1"})
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    detail = _wait(job_id, lambda d: d["state"] in ("STOPPED", "FAILED", "SUCCEEDED", "CANCELLED"))
    assert detail["state"] == "STOPPED" and detail["stop_reason"] == "budget", detail["reason"]
    assert detail["checkpoints"] == [] and RunStore(detail["run_uri"]).complete_checkpoints() == []
    assert "kept" not in detail["reason"], detail["reason"]
    assert detail["reason"].endswith("no checkpoint was saved: a resume starts from step 0")
    assert detail["attempts"] == 1  # the restart was not begun: the run is at its budget
    record = next(r for r in RunStore(detail["run_uri"]).epoch_records().values() if r.get("attempt") == 1)
    assert record["stop_detail"].startswith("budget: $") and "kept" not in record["stop_detail"]
