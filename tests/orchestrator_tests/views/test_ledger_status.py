"""The cost ledger in `ftorch status JOB` (JSON `ledger`), the jobs table's savings column by width, and
the on-demand price of the offer a SkyPilot job ran on."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from orchestrator.backends.skypilot_cost import ondemand_price
from orchestrator.registry import Registry
from orchestrator.views.jobs_table import render_jobs
from orchestrator.views.status import status_one
from trainer.runstore.store import RunStore


def test_status_of_a_job_carries_its_ledger(ftorch_home: Any, tmp_path: Any) -> None:
    registry = Registry()
    run_uri = str(tmp_path / "run")
    registry.create_job("job-l", "x", "local", run_uri, run_uri + "/out", {"local": {"hourly_usd": 1.0}}, 1.0)
    first = registry.start_attempt("job-l", 0, hourly_usd=1.0)
    registry.update_attempt("job-l", first.n, ended_at=first.started_at + 100, end_step=50, outcome="preempted",
                            end_reason="preempted")  # fmt: skip
    second = registry.start_attempt("job-l", 40, hourly_usd=1.0)
    registry.update_attempt("job-l", second.n, ended_at=second.started_at + 200, end_step=100,
                            outcome="succeeded", end_reason="succeeded")  # fmt: skip
    registry.set_state("job-l", "SUCCEEDED")
    store = RunStore(run_uri)
    phases = {"process_start_s": 3.0, "model_load_s": 10.0, "checkpoint_read_s": 1.0, "first_step_s": 2.0}
    store.claim_epoch(
        {"attempt": 1, "ended": "notice", "step": 50, "measured": {"step_s": 1.5, "tokens": 500}}
    )
    store.claim_epoch(
        {"attempt": 2, "ended": "finished", "step": 100, "measured": {"phases": phases, "tokens": 600}}
    )
    detail = status_one("job-l")
    ledger = detail["ledger"]
    assert ledger["spent_usd"] == detail["cost_usd"] > 0
    assert ledger["ondemand_usd"] is None and ledger["savings_usd"] is None  # local: no on-demand price
    assert ledger["tokens"] == 1100
    (loss,) = ledger["preemptions"]
    assert (loss["setup_s"], loss["loading_s"], loss["steps_redone"], loss["redo_s"]) == (3.0, 11.0, 10, 15.0)
    assert loss["provisioning_s"] is not None and loss["detection_s"] is None  # no logged step: unknown


def _row(**over: Any) -> dict[str, Any]:
    row = {"job_id": "job-s", "name": "x", "state": "SUCCEEDED", "step": 10, "total_steps": 10,
           "fraction_done": 1.0, "loss": 1.0, "eta_s": 0, "cost_usd": 2.2, "projected_cost_usd": 2.2,
           "preemptions": 1, "last_checkpoint_at": None, "ended_at": 9e18, "where": "aws", "spot": True,
           "savings_usd": 1.2, "savings_pct": 35.3}  # fmt: skip
    return {**row, **over}


def _draw(width: int, rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False).print(render_jobs(rows, width))
    return out.getvalue()


def test_the_jobs_table_shows_savings_where_it_fits() -> None:
    wide = _draw(160, [_row(), _row(job_id="job-t", savings_usd=None, savings_pct=None)])
    assert "SAVED" in wide and "$1.20 (35%)" in wide
    assert max(len(line) for line in wide.splitlines()) <= 160
    narrow = _draw(80, [_row()])
    assert "SAVED" not in narrow and "(35%)" not in narrow
    assert max(len(line) for line in narrow.splitlines()) <= 80


def test_the_on_demand_price_of_the_offer_a_skypilot_job_ran_on() -> None:
    offers = [
        {
            "cloud": "aws",
            "accelerator": "A100-80GB",
            "count": 1,
            "spot": True,
            "hourly_usd": 1.6,
            "per": "node",
        },
        {
            "cloud": "aws",
            "accelerator": "A100-80GB",
            "count": 1,
            "spot": False,
            "hourly_usd": 3.3,
            "per": "node",
        },
        {"cloud": "gcp", "accelerator": "L4", "count": 1, "spot": True, "hourly_usd": 0.3, "per": "node"},
    ]
    placed = {
        "n": 0,
        "offset_s": 0,
        "hourly_usd": 3.2,
        "where": "aws/us-east-1 1x A100-80GB spot",
        "nodes": 2,
    }
    assert ondemand_price({"offers": offers, "segments": [placed]}) == 6.6  # two nodes
    assert ondemand_price({"offers": offers, "segments": [{**placed, "where": "gcp/x", "hourly_usd": 0.3,
                                                           "nodes": 1}]}) is None  # fmt: skip
    assert ondemand_price({"offers": offers}) is None
