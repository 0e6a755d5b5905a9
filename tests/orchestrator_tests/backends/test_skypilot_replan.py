"""`ftorch resume` of a job that did not fit (trainer/train_step/oom.py `does_not_fit`) plans again with the
measured peak: on SkyPilot the GPU it ran on and every one with no more memory are refused, the job
relaunches on the next adequate offer, and status and the notification say so; a local job cannot move.

Faults injected: SkyPilot's API server is a double at the SDK boundary (submit returns a job id, the
queue reports it PENDING); the run store is a real S3 server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, job_dict
from http_fakes import Hook

from orchestrator.backends import skypilot_controller, skypilot_sdk
from orchestrator.backends import skypilot_state as sky_state
from orchestrator.errors import UserError
from orchestrator.jobfile.spec import load_job
from orchestrator.jobs import lifecycle as jobs
from orchestrator.registry import JobState, Registry
from orchestrator.sizing import planner
from orchestrator.views.status import status_one
from trainer.memory.facts import GIB
from trainer.runstore.store import RunStore

DOES_NOT_FIT = {
    "attempt": 1,
    "step": 12,
    "resume_step": 10,
    "effective_batch": 16,
    "world_size": 1,
    "from": {"micro_batch_per_rank": 1, "grad_accum_per_rank": 16, "gradient_checkpointing": True},
    "to": None,
    "peak_allocated_bytes": int(20.1 * GIB),
    "peak_reserved_bytes": int(21.0 * GIB),
    "gpu_total_bytes": int(22.05 * GIB),  # what torch reports for an L4 (24 GB on the label)
}


def _sky_job(s3: Any, overrides: list[str]) -> tuple[Registry, Any, RunStore]:
    """The job as launched, its run store on the S3 server (its own options: no cached filesystem of
    an earlier test without keys is reused)."""
    at = [f"checkpoint.uri={s3.uri}/ftorch", f"checkpoint.storage_options={{endpoint_url: '{s3.endpoint}'}}"]
    spec = load_job(REPO / "examples/llama3-8b-qlora.yaml", [*at, *overrides])
    bucket = s3.uri
    registry = Registry()
    run_uri = f"{bucket}/ftorch/q-1"
    job = registry.create_job("q-1", spec.name, "skypilot", run_uri, f"{run_uri}/output", spec.model_dump())
    store = RunStore(run_uri, s3.options, retry_seconds=5)
    spec_json = {"job": spec.model_dump(mode="json"), "run_id": "q-1", "output_uri": f"{run_uri}/output"}
    adapted = {
        **DOES_NOT_FIT,
        "to": DOES_NOT_FIT["from"],
        "from": {**DOES_NOT_FIT["from"], "gradient_checkpointing": False},
    }
    store.write_spec({**spec_json, "created_at": 0.0, "does_not_fit": DOES_NOT_FIT, "adaptations": [adapted]})
    return registry, job, store


def test_a_job_that_did_not_fit_on_an_l4_is_replanned_to_a_larger_gpu_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: Any
) -> None:
    monkeypatch.setenv("FTORCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)  # the s3 fixture's keys stay: the run store is on it
    hook = Hook()
    overrides = [
        "resources.clouds=[gcp]",
        "resources.regions=[us-central1]",  # where it ran (the record below)
        # the GPUs the user allows: the L4 is the cheapest of them there (an H100 spot ties it within 1%)
        "resources.accelerators=[L4, A100, A100-80GB]",
        "resources.budget_usd=200",
        f"notify={{webhook: '{hook.url}', on: [replanned]}}",
    ]
    registry, job, store = _sky_job(s3, overrides)
    first = planner.make_plan(load_job(REPO / "examples/llama3-8b-qlora.yaml", overrides), offline=True)
    assert first.chosen.accelerator == "L4"  # the launch's plan: the L4 the job then ran out of memory on
    record = {"job_id": 7, "status": "FAILED", "cloud": "gcp", "region": "us-central1",
              "accelerators": {"L4": 1}, "cluster_resources": "1x[spot](gpus=L4:1, ...)"}  # fmt: skip
    where = "gcp/us-central1 1x L4 spot"
    sky_state.write_state(registry, job, {"sky_job_id": 7, "record": record, "segments": [
        {"n": 0, "offset_s": 0.0, "hourly_usd": 0.2932, "where": where, "nodes": 1}]})  # fmt: skip
    registry.update("q-1", backend_job_id="7")
    registry.set_state("q-1", JobState.FAILED, "SkyPilot FAILED")

    submitted: list[dict[str, Any]] = []
    plans: list[Any] = []
    real_make_plan = planner.make_plan

    def keep_plan(*args: Any, **kwargs: Any) -> Any:
        plans.append(real_make_plan(*args, **kwargs))
        return plans[-1]

    def submit(_job_id: str, task: dict[str, Any], _secrets: Any) -> int:
        submitted.append(task)
        return 8

    monkeypatch.setattr(planner, "make_plan", keep_plan)
    monkeypatch.setattr(skypilot_sdk, "enabled_clouds", lambda: ["gcp"])
    monkeypatch.setattr(skypilot_sdk, "submit", submit)
    monkeypatch.setattr(skypilot_sdk, "queue", lambda *_a, **_k: [{"job_id": 8, "status": "PENDING"}])
    # the relaunched job's controller (a detached process that would outlive the test) is only recorded
    controllers: list[str] = []
    monkeypatch.setattr(skypilot_controller, "spawn", lambda _reg, j: controllers.append(j.job_id) or 1)

    jobs.resume("q-1", [])
    assert controllers == ["q-1"]  # the relaunch starts the job's controller

    # the plan refused the L4 and every GPU with no more memory, with the measured peak as the reason
    refused = {r.accelerator: r.reason for r in plans[0].rejected if r.reason.startswith("memory: measured")}
    assert refused["L4"].startswith("memory: measured 20.1 GiB by this job at step 12 on L4 (24 GiB)")
    new = plans[0].chosen
    assert new.accelerator != "L4" and new.gpu_memory_gib > 24
    assert all(c.accelerator != "L4" for c in plans[0].candidates)
    gpus = json.dumps(submitted[0]["resources"])
    assert '"L4"' not in gpus and new.accelerator in gpus  # the rendered task no longer lists the L4
    # status and the notification say so, with both prices
    said = (
        f"re-planned: from {where} to gcp 1x {new.accelerator} {'spot' if new.spot else 'on-demand'} "
        f"($0.29 -> ${new.hourly_usd:.2f} per hour) after out of memory at step 12 (measured 20.1 GiB per GPU)"
    )
    detail = status_one("q-1")
    assert detail["replanned"] == [said] and detail["replan"] is None
    assert any(e["kind"] == "replanned" and e["detail"] == said for e in detail["events"])
    hook.close()
    note = hook.received[0]["body"]
    assert note["event"] == "replanned" and said in note["text"]
    assert "does_not_fit" not in store.read_spec() and store.read_spec()["replans"][0]["step"] == 12
    # the larger GPU starts from the job's own layout again; the old GPU's adaptations stay with the re-plan
    from trainer.train_step import oom

    assert oom.current(store.read_spec()) is None and not oom.adaptations(store.read_spec())
    assert store.read_spec()["replans"][0]["adaptations"][0]["to"]["micro_batch_per_rank"] == 1


def test_a_local_job_that_did_not_fit_is_not_resumed_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTORCH_HOME", str(tmp_path / "home"))
    registry = Registry()
    run_uri = str(tmp_path / "runs" / "l-1")
    spec = job_dict(tmp_path / "model", tmp_path / "train.jsonl", tmp_path / "runs")  # refused before use
    job = registry.create_job("l-1", "t", "local", run_uri, f"{run_uri}/output", spec)
    RunStore(run_uri, {}).write_spec({"job": job.spec, "run_id": "l-1", "output_uri": run_uri,
                                      "created_at": 0.0, "does_not_fit": DOES_NOT_FIT})  # fmt: skip
    registry.set_state("l-1", JobState.FAILED, "does not fit: re-plan: ...")
    with pytest.raises(UserError) as caught:
        jobs.resume("l-1", [])
    assert str(caught.value) == (
        "JOB: l-1 does not fit this machine's GPUs even with the smallest layout (measured peak 20.1 GiB "
        "per GPU at step 12); the local backend cannot move it to a larger GPU: run it with "
        "resources.backend: skypilot or on a machine with more GPU memory"
    )
    assert registry.get("l-1").state is JobState.FAILED  # nothing claimed, nothing started
    assert status_one("l-1")["replan"].startswith("re-plan: out of memory at step 12")
