"""One interruption model: the planner's per-offer rate reaches the trainer through the rendered task, and
a requested stop (cancel, budget) is not counted as an interruption by the checkpoint interval."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, job_dict, prepare_run, trainer_cmd, write_data

from orchestrator.backends.skypilot_render import interruption_envs
from orchestrator.jobfile.spec import validate_job
from orchestrator.sizing.catalog import Catalog, parse_offers
from orchestrator.sizing.planner import make_plan
from trainer.runstore.store import RunStore
from trainer.stops.interruptions import NEVER_S, prior_mtbf_s, request_stop
from trainer.stops.interval import AutoInterval, History

OFFERS = (
    "cloud,instance_type,accelerator,count,gpu_memory_gib,ondemand_usd,spot_usd,regions,interconnect\n"
    "aws,l40s.one,L40S,1,44.7,1.90,0.90,us-east-1,n/a\n"
    "gcp,a100.one,A100-80GB,1,80,3.30,1.60,us-central1,n/a\n"
    "lambda,h100.one,H100,1,80,2.49,,us-tx-1,n/a\n"
)


def spec() -> object:
    return validate_job(
        {
            "model": "llama-3.1-8b",
            "method": "lora",
            "data": {"path": "s3://b/d.jsonl", "max_seq_len": 1024, "tokens": 10_000_000},
            "checkpoint": {"uri": "s3://b/ck"},
            "train": {"micro_batch_size": 1, "grad_accum": 8, "gradient_checkpointing": True},
            "resources": {"backend": "skypilot", "fallback": "on-demand"},
        },
        check_support=False,
    )


def test_the_planner_rate_of_the_offer_reaches_the_trainer() -> None:
    plan = make_plan(spec(), catalog=Catalog(tuple(parse_offers(OFFERS)), "test"))
    envs = interruption_envs(plan)
    by_cloud = {c.cloud: c for c in plan.candidates}
    for cloud, gpus in (("aws", 1), ("gcp", 1)):
        info = json.dumps({"cluster": "c", "cloud": cloud.upper(), "region": "r"})
        env = {**envs, "SKYPILOT_CLUSTER_INFO": info, "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus)}
        mtbf, source = prior_mtbf_s(env)
        assert mtbf == pytest.approx(3600.0 / by_cloud[cloud].interruption_rate_per_hour, rel=1e-3)
        assert f"{cloud}:1" in source
        assert AutoInterval(history=History()).mtbf_prior_s > 0
    lam = {
        **envs,
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "Lambda"}),
        "SKYPILOT_NUM_GPUS_PER_NODE": "1",
    }
    assert prior_mtbf_s(lam)[0] == NEVER_S  # on demand only: never interrupted
    chosen = plan.chosen
    assert chosen is not None and chosen.spot
    assert float(envs["FTORCH_AUTO_MTBF_S"]) == pytest.approx(3600 / chosen.interruption_rate_per_hour, abs=1)
    assert prior_mtbf_s({"FTORCH_AUTO_MTBF_S": "1234"}) == (1234.0, "FTORCH_AUTO_MTBF_S")
    assert prior_mtbf_s({})[0] == 3600.0


def test_requested_stops_are_not_interruptions() -> None:
    records = {
        1: {"claimed_at": 0.0, "ended": "stopped", "stop_reason": "cancel"},
        2: {"claimed_at": 100.0, "ended": "notice"},
        3: {"claimed_at": 200.0},  # killed without a record: an interruption
        4: {"claimed_at": 300.0},  # this attempt
    }
    history = History.from_epochs(records, 4, 400.0)
    assert history.interruptions == 2 and history.with_notice == 1


def test_a_cancelled_attempt_records_a_requested_stop(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    run_uri = prepare_run(job_dict(tiny_model, data, tmp_path / "runs", train={"max_steps": 200}), "cancel")
    store = RunStore(run_uri)
    proc = subprocess.Popen(
        trainer_cmd(run_uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "] step 2/" in line:
            request_stop(store, "cancel")  # what the supervisor does before its SIGTERM
            proc.terminate()
    assert proc.wait(timeout=120) == 75, "".join(lines)
    assert any("stop requested (cancel)" in line for line in lines), "".join(lines)
    records = store.epoch_records()
    assert records[1]["ended"] == "stopped" and records[1]["stop_reason"] == "cancel"
    assert History.from_epochs(records, 2, records[1]["claimed_at"] + 60).interruptions == 0
