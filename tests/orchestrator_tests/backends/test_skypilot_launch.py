"""A SkyPilot launch goes through the Backend interface and plans once (no SkyPilot server needed).

Faults injected: SkyPilot's API server is unreachable at submission (the submit call raises), and its
cloud list is what a machine with AWS and GCP credentials reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

from orchestrator.backends import skypilot_sdk
from orchestrator.backends.base import backend_for
from orchestrator.errors import UserError
from orchestrator.jobfile.spec import load_job
from orchestrator.registry import JobState, Registry
from orchestrator.sizing import planner


def test_a_cloud_launch_plans_once_and_a_failed_submission_leaves_the_job_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans: list[Any] = []
    real_make_plan = planner.make_plan

    def counting_make_plan(*args: Any, **kwargs: Any) -> Any:
        plans.append(args)
        return real_make_plan(*args, **kwargs)

    def unreachable(*_args: Any, **_kwargs: Any) -> int:
        raise ConnectionError("cannot reach the SkyPilot API server at http://127.0.0.1:46580")

    monkeypatch.setattr(planner, "make_plan", counting_make_plan)
    monkeypatch.setattr(skypilot_sdk, "enabled_clouds", lambda: ["aws", "gcp"])
    monkeypatch.setattr(skypilot_sdk, "submit", unreachable)
    for name in ("HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)

    # the bucket cannot be asked offline: the job file says where it is (a launch refuses otherwise)
    spec = load_job(REPO / "examples/mistral-7b-lora.yaml", ["checkpoint.region=us-east-1"])
    backend = backend_for(spec.resources.backend)
    run_uri = "s3://my-bucket/ftorch/m-1"
    prepared = backend.prepare(spec, "m-1", run_uri)  # plan, render, clouds, secrets
    registry = Registry(tmp_path / "home")
    job = registry.create_job("m-1", spec.name, "skypilot", run_uri, f"{run_uri}/output", spec.model_dump())
    with pytest.raises(UserError) as caught:
        backend.start(registry, job, prepared)
    assert len(plans) == 1  # start submits what prepare planned
    kept = backend.plan_record(prepared)  # what the run store keeps for `ftorch report` (plan.json)
    assert kept is not None and kept["chosen"] == prepared.plan.chosen.to_json()
    assert kept["top_offers"][0]["instance_type"] == prepared.plan.chosen.instance_type
    assert backend_for("local").plan_record(None) is None
    assert str(caught.value).startswith("SkyPilot launch failed: ConnectionError: cannot reach")
    job = registry.get("m-1")
    assert job.state is JobState.FAILED and job.backend_job_id is None
