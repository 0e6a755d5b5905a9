"""A local run on simulated spot capacity (a trace replayed through local.chaos) follows the decisions
`ftorch simulate` predicts for the same trace: the same policy objects drive both."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from helpers import ftorch, job_dict, write_data

from orchestrator.registry import TERMINAL
from orchestrator.spot.policy import make_policy
from orchestrator.spot.simulator import JobNumbers, simulate
from orchestrator.spot.traces import load_zones
from orchestrator.views import status as job_status

GAP_S = 60.0
SPEEDUP = 60.0  # one trace tick per wall second
TRACE = [1] * 6 + [0] * 6 + [1] * 400  # spot goes away at tick 6 and comes back at tick 12


@pytest.mark.parametrize("policy", ["spot-only", "spot-fallback"])
def test_local_run_follows_the_simulated_policy(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, policy: str
) -> None:
    trace = tmp_path / "zone-a.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": GAP_S}, "data": TRACE}))
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        train={"max_steps": 2000, "log_every": 50},
        checkpoint={"every": 100},
        resources={"policy": policy},
        local={
            "chaos": {"trace": [str(trace)], "speedup": SPEEDUP, "restart_overhead_s": 300, "notice": True}
        },
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    done = ftorch("launch", str(path), "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    deadline = time.time() + 240
    while job_status.status_one(job_id)["state"] not in TERMINAL and time.time() < deadline:
        time.sleep(0.5)
    detail = job_status.status_one(job_id)
    assert detail["state"] == "SUCCEEDED", detail
    modes = [a["instance"] for a in detail["attempt_timeline"]]

    # what the simulator predicts for the same trace, policy and job
    first, last = detail["attempt_timeline"][0], detail["attempt_timeline"][-1]
    work_s = max(60.0, (last["ended_at"] - first["started_at"]) * SPEEDUP / 3)  # order of magnitude only
    numbers = JobNumbers(
        work_s=work_s,
        spot_hourly_usd=1.0,
        ondemand_hourly_usd=3.0,
        checkpoint_interval_s=60.0,
        restart_overhead_s=300.0,
    )
    predicted = simulate(make_policy(policy), numbers, load_zones([str(trace)]))
    assert predicted.preemptions == detail["preemptions"] == 1
    assert predicted.starts == len(modes) == 2
    assert modes[0] == "local (spot, simulated)"
    if policy == "spot-only":  # waits for spot to come back
        assert predicted.ondemand_s == 0 and modes[1] == "local (spot, simulated)"
        assert any(e["kind"] == "policy" and e["detail"].startswith("wait") for e in detail["events"])
    else:  # on demand as soon as spot is gone, and never back
        assert predicted.ondemand_s > 0 and modes[1] == "local (on-demand, simulated)"
