"""A trainer that hangs before its first step (a model download that stopped, a dead mount while reading
the weights or the data) has its own bound, train.health.setup_timeout_s (trainer/stops/watchdog.py
`setup_timeout`, 1 h unless set): inside, the set-up watchdog ends it with exit 87, recorded; outside, a
trainer frozen there (no thread of it runs) is killed by the local supervisor. Either is restarted once
like any stall, and the job goes on. The slow model load is a fault (slow-load@MS), not a slow machine."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ftorch, job_dict, prepare_run, run_trainer, write_data
from pydantic import ValidationError

from orchestrator.registry import TERMINAL, Registry
from orchestrator.views import status as job_status
from trainer import exitcodes
from trainer.config import HealthSpec
from trainer.runstore.store import RunStore
from trainer.stops.watchdog import SETUP_S, Watchdog, outside, setup_timeout

SETUP_TIMEOUT_S = 4.0


def _job(tmp_path: Path, tiny_model: Path, name: str) -> dict[str, Any]:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    return job_dict(
        tiny_model,
        data,
        tmp_path / name,
        train={"max_steps": 12, "health": {"setup_timeout_s": SETUP_TIMEOUT_S}},
    )


def test_the_setup_rule() -> None:
    assert setup_timeout() == SETUP_S == 3600.0 and setup_timeout(5) == 5.0
    with pytest.raises(ValidationError, match="setup_timeout_s"):
        HealthSpec(setup_timeout_s=0)
    fired: list[tuple[str, float]] = []
    now = [100.0]
    dog = Watchdog(
        setup_timeout(4.0), lambda phase, waited: fired.append((phase, waited)), clock=lambda: now[0],
        check_every_s=0.01, phase="setup",
    ).start()  # fmt: skip
    try:
        assert dog.timeout() == 4.0  # the set-up's own bound, not the first step's 900 s floor
        time.sleep(0.2)
        assert not fired
        now[0] = 105.0
        deadline = time.time() + 5
        while not fired and time.time() < deadline:
            time.sleep(0.01)
        assert fired == [("setup", 5.0)]
    finally:
        dog.close()


def test_a_model_load_that_hangs_ends_the_attempt_as_a_stall_recorded(
    tmp_path: Path, tiny_model: Path
) -> None:
    run_uri = prepare_run(_job(tmp_path, tiny_model, "load"))
    started = time.time()
    done = run_trainer(run_uri, 1, {"FTORCH_FAULTS": "slow-load@120000"}, timeout=100)
    out = done.stdout + done.stderr
    assert done.returncode == exitcodes.STALLED, out[-3000:]
    assert time.time() - started < 90  # not the 120 s load: the bound ended it
    assert "into setting up" in out and f"setup timeout {SETUP_TIMEOUT_S:.0f} s" in out, out[-3000:]
    record = next(iter(RunStore(run_uri).epoch_records().values()))
    assert record["ended"] == "stalled" and "setting up" in record["stop_detail"], record


def test_a_trainer_frozen_while_setting_up_is_killed_and_the_job_goes_on(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path
) -> None:
    job = _job(tmp_path, tiny_model, "frozen")
    path = tmp_path / "frozen.yaml"
    path.write_text(yaml.safe_dump(job))
    # attempt 1 loads its model for 60 s (so the freeze lands before any step); attempt 2 loads at once
    done = ftorch("launch", str(path), "--json", env={"FTORCH_FAULTS": "slow-load@60000:1"})
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    registry = Registry()
    deadline = time.time() + 60
    while not (registry.attempts(job_id) and registry.attempts(job_id)[-1].pid):
        assert time.time() < deadline, job_status.status_one(job_id)
        time.sleep(0.05)
    os.kill(registry.attempts(job_id)[-1].pid, signal.SIGSTOP)  # never continued: no watchdog thread runs
    deadline = time.time() + 240
    while (detail := job_status.status_one(job_id))["state"] not in TERMINAL:
        assert time.time() < deadline, detail
        time.sleep(0.3)
    assert detail["state"] == "SUCCEEDED", detail
    reasons = [a["end_reason"] for a in detail["attempt_timeline"]]
    assert reasons[0].startswith("stalled: no first step") and reasons[-1] == "succeeded", reasons
    killed_after = float(reasons[0].split("no first step ")[1].split(" s")[0])
    assert killed_after >= round(outside(SETUP_TIMEOUT_S)) - 1, reasons[0]  # its margin, not sooner
    assert detail["attempts"] == 2
