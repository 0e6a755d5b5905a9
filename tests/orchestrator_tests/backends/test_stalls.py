"""Stalls (trainer/stops/watchdog.py): a trainer frozen from outside (SIGSTOP, as a hung collective or a
dead mount looks) is killed by the local supervisor for its stale heartbeat; one hung inside (hang@K) is
ended by its own watchdog (exit 87); either is restarted once and the job ends bitwise equal to an
uninterrupted run; two stalls without progress between them end the job UNHEALTHY."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

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
from trainer.stops.watchdog import outside, stale, stall_timeout

TIMEOUT_S = 10.0  # the job's train.health.stall_timeout_s: the tiny steps take well under a second


def _job(tmp_path: Path, tiny_model: Path, name: str) -> dict[str, Any]:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    return job_dict(tiny_model, data, tmp_path / name, train={"health": {"stall_timeout_s": TIMEOUT_S}})


def _launch(tmp_path: Path, job: dict[str, Any], env: dict[str, str] | None = None) -> str:
    path = tmp_path / f"{job['checkpoint']['uri'].rsplit('/', 1)[-1]}.yaml"
    path.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(path), "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["job_id"]


def _wait(job_id: str, predicate: Any, timeout: float = 240.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        detail = job_status.status_one(job_id)
        if predicate(detail):
            return detail
        time.sleep(0.2)
    raise AssertionError(json.dumps(job_status.status_one(job_id), default=str)[:2000])


def _status_until(job_id: str, predicate: Any, timeout: float = 180.0) -> dict[str, Any]:
    """`ftorch status JOB --json`, the real CLI, until `predicate` holds."""
    deadline, shown = time.time() + timeout, {}
    while time.time() < deadline:
        done = ftorch("status", job_id, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        shown = json.loads(done.stdout)
        if predicate(shown):
            return shown
        time.sleep(0.5)
    raise AssertionError(json.dumps(shown, default=str)[:2000])


def _reference(tmp_path: Path, tiny_model: Path) -> dict[str, Any]:
    run_uri = prepare_run(_job(tmp_path, tiny_model, "reference"))
    done = run_trainer(run_uri)
    assert done.returncode == 0, done.stderr[-2000:]
    return final_weights(run_uri)


def test_the_rule() -> None:
    assert stall_timeout([]) == 300.0 and stall_timeout([0.1] * 50, given=7.0) == 7.0
    assert stall_timeout([100.0] * 5 + [80.0] * 95) == 400.0  # 5x the p95 after warm-up, over the floor
    fresh = {"state": "running", "updated_at": 100.0, "stall_timeout_s": 10.0}
    assert stale(fresh, now=117.0) is None and stale(fresh, now=118.0) == 18.0  # 1.25x + 5 s: inside first
    assert stale({**fresh, "state": "finished"}, now=500.0) is None  # only while it runs
    # what status shows: past the timeout itself (the launcher kills only after its grace)
    assert stale(fresh, now=110.0, grace=False) is None and stale(fresh, now=111.0, grace=False) == 11.0


def test_a_frozen_trainer_is_replaced_and_the_job_ends_equal_to_an_uninterrupted_run(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    # Steps slowed to 0.4 s: the freeze must land before step 30 ends the job, however loaded the machine is.
    job_id = _launch(tmp_path, _job(tmp_path, tiny_model, "frozen"), env={"FTORCH_FAULTS": "slow-step@400"})
    _wait(job_id, lambda d: (d.get("step") or 0) >= 8)
    registry = Registry()
    pid, supervisor = registry.attempts(job_id)[-1].pid, registry.get(job_id).supervisor_pid
    assert pid and supervisor
    frozen_at = time.time()
    os.kill(pid, signal.SIGSTOP)  # never continued
    # `status` calls it STALLED once the heartbeat is older than the trainer's own timeout; the supervisor
    # replaces it a grace later (`outside`). Held too, it is a watcher that has not looked yet, so what the
    # user sees meanwhile is checked however slow the machine.
    os.kill(supervisor, signal.SIGSTOP)
    try:
        shown = _status_until(job_id, lambda d: d.get("stalled_s") is not None)
        age = shown["stalled_s"]
        assert shown["state"] == "RUNNING" and TIMEOUT_S < age < time.time() - frozen_at + 60, shown
        plain = ftorch("status", job_id)
        assert plain.returncode == 0, plain.stdout + plain.stderr
        assert re.search(r"STALLED \(heartbeat \d+\S* old\)", plain.stdout), plain.stdout
        listed = ftorch("status")  # the jobs list too
        assert re.search(rf"{job_id}.*STALLED \(heartbeat", listed.stdout), listed.stdout
    finally:
        os.kill(supervisor, signal.SIGCONT)
    replaced = _wait(job_id, lambda d: d["attempts"] >= 2 or d["state"] in TERMINAL)
    detail = _wait(job_id, lambda d: d["state"] in TERMINAL)
    assert detail["state"] == "SUCCEEDED", detail
    reasons = [a["end_reason"] for a in detail["attempt_timeline"]]
    assert reasons[0].startswith("stalled: no heartbeat for") and reasons[-1] == "succeeded", reasons
    # killed for a heartbeat older than the trainer's own timeout plus the margin (`outside`), not sooner
    killed_at_age = float(re.match(r"stalled: no heartbeat for (\d+) s", reasons[0]).group(1))  # type: ignore[union-attr]
    assert killed_at_age >= round(outside(TIMEOUT_S)) - 1, reasons[0]
    assert replaced["attempts"] == 2 and detail["attempts"] == 2
    assert_bitwise_equal(final_weights(detail["run_uri"]), _reference(tmp_path, tiny_model))


def test_a_hung_step_is_ended_by_the_watchdog_restarted_and_a_second_stall_without_progress_is_unhealthy(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    once = _launch(tmp_path, _job(tmp_path, tiny_model, "hang-once"), env={"FTORCH_FAULTS": "hang@20:1"})
    detail = _wait(once, lambda d: d["state"] in TERMINAL)
    assert detail["state"] == "SUCCEEDED", detail
    first = detail["attempt_timeline"][0]
    assert first["exit_code"] == 87 and first["end_reason"].startswith("stalled: no progress for"), first
    assert_bitwise_equal(final_weights(detail["run_uri"]), _reference(tmp_path, tiny_model))

    always = _launch(tmp_path, _job(tmp_path, tiny_model, "hang-always"), env={"FTORCH_FAULTS": "hang@20"})
    detail = _wait(always, lambda d: d["state"] in TERMINAL)
    assert detail["state"] == "UNHEALTHY" and detail["attempts"] == 2, detail
    assert "stalled twice without progress" in detail["reason"]


def test_status_shows_a_stale_heartbeat_as_stalled_with_its_age() -> None:
    from orchestrator.views.cells import state_text

    assert str(state_text({"state": "RUNNING", "stalled_s": 200.0})).startswith("STALLED (heartbeat 3m")
    assert str(state_text({"state": "RUNNING", "stalled_s": None})) == "RUNNING"
