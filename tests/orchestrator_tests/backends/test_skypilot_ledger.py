"""The cost ledger's restart phases of a SkyPilot job from SkyPilot's own timestamps (issue 21 points 1, 4).

The records are SkyPilot 0.14.1's own: its managed-jobs state machine (sky/jobs/state.py, the calls the
jobs controller makes) on a private SQLite database, read back through the queue's own formatting
(sky/jobs/utils.py get_managed_job_queue, what `sky jobs queue` serves) in a subprocess with a private
HOME; no API server (about 2 s). The controller's timestamps are chosen so that SkyPilot's figures differ
from the registry's: the first cluster comes up 40 s after submission, the recovery takes 75 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

from orchestrator.backends import skypilot_state
from orchestrator.registry import Registry
from orchestrator.views.status import status_one
from trainer.runstore.store import RunStore

SCRIPT = """
import asyncio, json, time
from sky.jobs import state, utils
from sky.utils import common_utils
from orchestrator.backends.skypilot_sdk import QUEUE_FIELDS, _as_dict

async def callback(*_args):
    pass

job = state.set_job_info_without_job_id("ledger", "default", "ftorch", None, None, common_utils.get_user_hash())
state.set_pending(job, 0, "ledger", "1x[L40S:1][Spot]", "{}")
out = {"records": []}

def queue():
    (record,) = utils.get_managed_job_queue(job_ids=[job], fields=QUEUE_FIELDS)["jobs"]
    out["records"].append(_as_dict(record))

now = time.time()
out["submitted"], out["started"] = now - 300.0, now - 260.0
asyncio.run(state.set_starting_async(job, 0, "ts", out["submitted"], "1x[L40S:1][Spot]", {}, callback))
state.set_job_infra(job, cloud="AWS", region="us-east-1", zone="us-east-1a")
asyncio.run(state.set_started_async(job, 0, out["started"], callback))  # the job submitted on the cluster
queue()
out["recovering_from"] = time.time()
asyncio.run(state.set_recovering_async(job, 0, False, callback))  # the controller saw the preemption
out["recovering_to"] = time.time()
queue()
out["recovered"] = out["recovering_to"] + 75.0  # the new cluster's job submission time
asyncio.run(state.set_recovered_async(job, 0, out["recovered"], callback))
queue()
out["ended"] = out["recovered"] + 500.0
asyncio.run(state.set_succeeded_async(job, 0, out["ended"], callback))
queue()
print(json.dumps(out, default=str))
"""


def _skypilot_records(tmp_path: Path) -> dict[str, Any]:
    pytest.importorskip("sky")
    home = tmp_path / "sky-home"
    home.mkdir()
    env = {"HOME": str(home), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1", "PYTHONPATH": str(REPO),
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_ledger_takes_provisioning_and_setup_from_skypilots_timestamps(
    ftorch_home: Path, tmp_path: Path
) -> None:
    sky = _skypilot_records(tmp_path)
    running, recovering, recovered, succeeded = sky["records"]
    assert [r["status"] for r in sky["records"]] == ["RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
    assert recovered["recovery_count"] == 1 and recovered["last_recovered_at"] == sky["recovered"]

    registry = Registry()
    run_uri = str(tmp_path / "run")
    spec = {"checkpoint": {"uri": str(tmp_path), "storage_options": {}}, "resources": {"backend": "skypilot"}}
    job = registry.create_job("sky-l", "x", "skypilot", run_uri, run_uri + "/output", spec)
    skypilot_state.record_launch(registry, job, int(running["job_id"]), "launched")
    for record in sky["records"]:  # ftorch's status calls, each a moment after SkyPilot's change
        job = skypilot_state.apply_record(registry, job, record)
    assert job.state == "SUCCEEDED" and len(registry.attempts(job.job_id)) == 2

    # the trainers' records: attempt 1 logged its last step 12 s before SkyPilot began recovering; attempt
    # 2's process started 30 s after SkyPilot's job submission on the new cluster (the setup commands)
    store = RunStore(run_uri)
    phases = {"process_start_s": 4.0, "model_load_s": 20.0, "checkpoint_read_s": 2.0, "first_step_s": 3.0}
    store.claim_epoch({"attempt": 1, "ended": "preempted", "step": 50, "started_at": sky["started"] + 25.0,
                       "measured": {"steps": 50, "step_s": 2.0, "phases": phases}})  # fmt: skip
    store.claim_epoch({"attempt": 2, "ended": "finished", "step": 100, "started_at": sky["recovered"] + 30.0,
                       "measured": {"steps": 60, "step_s": 2.0, "phases": phases}})  # fmt: skip
    detected = sky["started"] + recovering["job_duration"]  # the span the RECOVERING record adds
    assert sky["recovering_from"] <= detected <= sky["recovering_to"]
    store.write_metrics_part(1, 0, [{"attempt": 1, "step": 50, "loss": 1.0, "time": detected - 12.0}])

    (loss,) = status_one(job.job_id)["ledger"]["preemptions"]
    assert loss["provisioning_source"] == loss["setup_source"] == loss["detection_source"] == "skypilot"
    # provisioning: from SkyPilot's RECOVERING to the job submitted on the new cluster (75 s); the
    # registry's own attempt times are both "now" (this test's apply_record calls), a second apart at most
    assert loss["provisioning_s"] == pytest.approx(sky["recovered"] - detected, abs=1e-3)
    assert 74.0 < loss["provisioning_s"] < 76.0
    assert loss["setup_s"] == pytest.approx(34.0, abs=1e-3)  # setup commands 30 s + the process start 4 s
    assert loss["detection_s"] == pytest.approx(12.0, abs=1e-3)
    assert loss["loading_s"] == 22.0  # the trainer's model load and checkpoint read, as before

    # every attempt keeps SkyPilot's timestamps (skypilot.json), the first with its submission
    times = skypilot_state.attempt_times(skypilot_state.read_state(registry, job))
    assert times[1]["submitted_at"] == sky["submitted"] and times[1]["placed_at"] == sky["started"]
    assert times[2]["placed_at"] == sky["recovered"]
    assert times[1]["detected_at"] == pytest.approx(detected, abs=1e-6)
    assert succeeded["end_at"] == sky["ended"]


def test_a_run_the_health_checks_ended_is_unhealthy_though_skypilot_says_succeeded(
    ftorch_home: Path, tmp_path: Path
) -> None:
    """The run script exits 0 for an unhealthy end (else max_restarts_on_errors relaunches it into the same
    divergence): SkyPilot's SUCCEEDED, read with the run store's epoch record, is UNHEALTHY in ftorch."""
    sky = _skypilot_records(tmp_path)
    registry = Registry()
    run_uri = str(tmp_path / "run")
    spec = {"checkpoint": {"uri": str(tmp_path), "storage_options": {}}, "resources": {"backend": "skypilot"}}
    job = registry.create_job("sky-u", "x", "skypilot", run_uri, run_uri + "/output", spec)
    skypilot_state.record_launch(registry, job, int(sky["records"][0]["job_id"]), "launched")
    store = RunStore(run_uri)
    store.claim_epoch({"attempt": 1, "ended": "preempted", "step": 50})
    store.claim_epoch({"attempt": 2, "ended": "unhealthy", "step": 61, "healthy_step": 60,
                       "stop_detail": "unhealthy: loss NaN at step 61 after 2 rollbacks"})  # fmt: skip
    for record in sky["records"]:
        job = skypilot_state.apply_record(registry, job, record)
    assert sky["records"][-1]["status"] == "SUCCEEDED"
    assert job.state == "UNHEALTHY", job.reason
    assert "loss NaN at step 61" in (job.reason or "") and "newest healthy checkpoint: step 60" in job.reason
    assert registry.attempts(job.job_id)[-1].outcome == "unhealthy"


def test_a_launch_whose_setup_refused_the_environment_is_failed_with_its_line(
    ftorch_home: Path, tmp_path: Path
) -> None:
    """The setup records a refused environment and the task exits 0 (else max_restarts_on_errors provisions
    again, to refuse again): SkyPilot's SUCCEEDED, read with the run store's record, is FAILED in ftorch,
    naming the package; the record is data (a control character is not shown); a new launch clears it."""
    from trainer.runstore.env_refusal import REFUSED

    sky = _skypilot_records(tmp_path)
    registry = Registry()
    run_uri = str(tmp_path / "run")
    spec = {"checkpoint": {"uri": str(tmp_path), "storage_options": {}}, "resources": {"backend": "skypilot"}}
    job = registry.create_job("sky-r", "x", "skypilot", run_uri, run_uri + "/output", spec)
    skypilot_state.record_launch(registry, job, int(sky["records"][0]["job_id"]), "launched")
    line = "ftorch: environment: transformers: the run's lock pins 5.24.0, 5.25.0 is installed\x1b[2J"
    RunStore(run_uri).write_json(REFUSED, {"line": line, "at": 1.0})
    for record in sky["records"]:
        job = skypilot_state.apply_record(registry, job, record)
    assert sky["records"][-1]["status"] == "SUCCEEDED"
    assert job.state == "FAILED", job.reason
    assert job.reason == "environment: transformers: the run's lock pins 5.24.0, 5.25.0 is installed [2J"
    last = registry.attempts(job.job_id)[-1]
    assert last.outcome == "failed" and last.end_reason == job.reason
    skypilot_state.clear_refusal(job)
    assert not RunStore(run_uri).exists(REFUSED) and skypilot_state.env_refusal(job) is None
