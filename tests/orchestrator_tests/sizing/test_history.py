"""What runs measured feeds the next plan: fit `measured` with its job, the time scale, CPU runs ignored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.planner_jobs import catalog, job  # the planner tests' fixed catalog

from orchestrator.registry import Registry
from orchestrator.sizing import history
from orchestrator.sizing.history import History, catalog_gpu, learn_from_job, load_history, measurement_row
from orchestrator.sizing.planner import make_plan
from trainer.runstore.store import RunStore

GIB = 1024**3


@pytest.fixture(autouse=True)
def _home(ftorch_home: Any) -> None:
    """A private FTORCH_HOME for every test here (the history lives in its registry)."""


def measured(**over: Any) -> dict[str, Any]:
    """An epoch record's `measured`, as a 1-GPU attempt on an A100-80GB writes it."""
    base = {
        "device": "cuda", "gpu_name": "NVIDIA A100-SXM4-80GB", "world_size": 1, "micro_batch_size": 1,
        "grad_accum": 8, "gradient_checkpointing": True, "peak_allocated_bytes": 28 * GIB,
        "peak_reserved_bytes": 30 * GIB, "peak_rss_bytes": 5 * GIB, "steps": 100, "tokens": 1_638_400,
        "tokens_per_s": 1000.0, "step_s": 16.4, "checkpoint_blocking_s": 0.5, "checkpoint_upload_s": 3.0,
        "phases": {"process_start_s": 4.0, "model_load_s": 20.0, "checkpoint_read_s": 2.0, "first_step_s": 9.0},
    }  # fmt: skip
    return {**base, **over}


def test_catalog_names_of_cuda_devices() -> None:
    assert catalog_gpu("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert catalog_gpu("NVIDIA A100-SXM4-40GB") == "A100"
    assert catalog_gpu("NVIDIA H100 80GB HBM3") == "H100"
    assert catalog_gpu("NVIDIA H100 PCIe") == "H100-PCIE"
    assert catalog_gpu("NVIDIA H200") == "H200"
    assert catalog_gpu("NVIDIA GeForce RTX 4090") == "RTX4090"
    assert catalog_gpu("NVIDIA RTX A6000") == "RTXA6000"
    assert catalog_gpu("NVIDIA RTX 6000 Ada Generation") == "RTX6000-Ada"
    assert catalog_gpu("Tesla T4") == "T4"
    assert catalog_gpu("Some Accelerator 9000") is None


def _a100(plan: Any) -> Any:
    return next(c for c in plan.candidates if c.accelerator == "A100-80GB")


def _run_with(tmp_path: Any, registry: Registry, spec: Any, job_id: str, **over: Any) -> Any:
    """A job whose run store holds one attempt's epoch record with `measured` (as the trainer writes it)."""
    run_uri = str(tmp_path / job_id)
    job_row = registry.create_job(
        job_id, "x", "local", run_uri, run_uri + "/out", spec.model_dump(mode="json")
    )
    RunStore(run_uri).claim_epoch(
        {"attempt": 1, "ended": "finished", "step": 100, "measured": measured(**over)}
    )
    return job_row


def test_a_second_plan_after_a_run_shows_fit_measured(tmp_path: Any) -> None:
    spec = job()
    first = make_plan(spec, catalog=catalog())
    assert _a100(first).fit == "estimated"
    registry = Registry()
    assert learn_from_job(registry, _run_with(tmp_path, registry, spec, "job-a100")) == 1
    assert learn_from_job(registry, registry.get("job-a100")) == 0  # kept once
    second = make_plan(spec, catalog=catalog())
    a100 = _a100(second)
    assert (a100.fit, a100.fit_job) == ("measured", "job-a100")
    assert abs(a100.peak_gib_per_gpu - (30 + 0.5)) < 1e-6  # reserved + the CUDA context
    assert any("measured 30.5 GiB per GPU by job job-a100" in n for n in second.notes)
    # the measured peak decides on other GPUs too: 30.5 GiB does not fit an L4's 20 usable GiB
    l4 = next(r for r in second.rejected if r.accelerator == "L4")
    assert "measured by job job-a100" in l4.reason
    assert all(c.accelerator != "L4" for c in second.candidates)


def test_a_cpu_measurement_never_overrides_a_gpu_estimate(tmp_path: Any) -> None:
    spec = job()
    registry = Registry()
    cpu = dict(device="cpu", gpu_name=None, peak_allocated_bytes=None, peak_reserved_bytes=None)
    learn_from_job(registry, _run_with(tmp_path, registry, spec, "job-cpu", **cpu))
    unknown = dict(gpu_name="Mystery GPU 1")
    learn_from_job(registry, _run_with(tmp_path, registry, spec, "job-odd", **unknown))
    rows = load_history().rows
    assert [r["plausible"] for r in rows] == [False, False]
    assert "cpu" in rows[0]["why"] and "unknown to the catalog" in rows[1]["why"]
    plan = make_plan(spec, catalog=catalog())
    assert {c.fit for c in plan.candidates} == {"estimated"}
    assert {c.time_scale for c in plan.candidates} == {1.0}


def test_measured_throughput_scales_the_time_model_on_that_gpu() -> None:
    spec = job()
    base = _a100(make_plan(spec, catalog=catalog(), history=History()))
    row = measurement_row(spec.model_dump(mode="json"), measured())
    assert row is not None and row["predicted_tokens_per_s"]
    row = {**row, "tokens_per_s": row["predicted_tokens_per_s"] * 0.5, "job_id": "slow", "attempt": 1}
    plan = make_plan(spec, catalog=catalog(), history=History([row]))
    a100 = _a100(plan)
    assert abs(a100.time_scale - 0.5) < 1e-9
    assert abs(a100.est_hours - 2 * base.est_hours) < 1e-6 * base.est_hours
    l40s = next(c for c in plan.candidates if c.accelerator == "L40S")
    assert l40s.time_scale == 1.0  # measured on another GPU: not scaled
    assert any("A100-80GB runs at x0.50" in n for n in plan.notes)


def test_ftorch_history_lists_what_was_learned(tmp_path: Any) -> None:
    from helpers import ftorch

    spec = job()
    registry = Registry()
    learn_from_job(registry, _run_with(tmp_path, registry, spec, "job-a100"))
    learn_from_job(
        registry, _run_with(tmp_path, registry, spec, "job-cpu", device="cpu", peak_reserved_bytes=None)
    )
    out = ftorch("history", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["measurements"]
    assert [(r["job_id"], r["gpu"], r["plausible"]) for r in rows] == [
        ("job-a100", "A100-80GB", True),
        ("job-cpu", "cpu", False),
    ]
    table = ftorch("history")
    assert "job-a100" in table.stdout and "no: device 'cpu'" in table.stdout


def test_gpu_check_results_feed_the_history(tmp_path: Any) -> None:
    spec = job().model_dump(mode="json")
    row = history.record_gpu_check(spec, measured(gpu_name="NVIDIA H200"), "gpu-check-1")
    assert row is not None and row["gpu"] == "H200" and row["plausible"]
    assert [(r["job_id"], r["source"]) for r in load_history().rows] == [("gpu-check-1", "gpu_check")]


def test_status_of_a_running_job_teaches_nothing_until_it_ends(tmp_path: Any) -> None:
    """The history keeps an attempt's first row: a running attempt's partial figures must not be it
    (`ftorch status JOB` computes the ledger, which feeds the history, on every call)."""
    from orchestrator.views.status import ledger_for

    registry = Registry()
    _run_with(tmp_path, registry, job(), "job-run")
    registry.set_state("job-run", "RUNNING")
    ledger_for(registry, registry.get("job-run"), [], {}, [], {})
    assert load_history().rows == []
    registry.set_state("job-run", "SUCCEEDED")
    ledger_for(registry, registry.get("job-run"), [], {}, [], {})
    assert [r["job_id"] for r in load_history().rows] == ["job-run"]
