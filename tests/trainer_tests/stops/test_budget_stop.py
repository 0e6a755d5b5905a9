"""The budget stop in the trainer itself (trainer/stops/budget.py): the price each attempt runs at, the
spend from the run store's epoch records, the stop with a checkpoint and exit 0, a resume at the budget
leaving at once, a higher budget going on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import job_dict, prepare_run, run_trainer, write_data
from http_fakes import FakeMetadata

from trainer.runstore.store import RunStore
from trainer.stops import budget

PRICES = {
    budget.price_key("aws", "us-east-1", "H100", 8, True): 30.0,
    budget.price_key("aws", "us-east-1", "H100", 8, False): 98.0,
    budget.price_key("aws", "*", "H100", 8, True): 32.0,
    budget.price_key("gcp", "*", "L4", 1, False): 0.7,
    budget.price_key("aws", "us-east-1", "A100", 8, True): 20.0,
}


def _env(cloud: str, region: str, gpus: int, nodes: int = 1) -> dict[str, str]:
    info = {"cloud": cloud, "region": region, "num_nodes": nodes}
    return {
        "FTORCH_PRICES": json.dumps(PRICES),
        "SKYPILOT_CLUSTER_INFO": json.dumps(info),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
    }


@pytest.mark.parametrize(("market", "usd"), [("spot", 30.0), ("on-demand", 98.0)])
def test_the_attempt_price_comes_from_the_instance_metadata(
    market: str, usd: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeMetadata("aws") as meta:
        meta.market = market
        monkeypatch.setenv("FTORCH_AWS_METADATA_URL", meta.url)
        price = budget.attempt_price(_env("aws", "us-east-1", 8), accelerator="NVIDIA H100 80GB HBM3")
    assert price == {"hourly_usd": usd, "market": market, "price_source": "instance metadata"}


def test_gcp_metadata_and_the_offer_list_without_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeMetadata("gcp") as meta:
        meta.market = "on-demand"
        monkeypatch.setenv("FTORCH_GCP_METADATA_URL", meta.url)
        assert budget.market_from_metadata("gcp") == "on-demand"
    # one market listed for the offer: no metadata needed; two nodes cost twice one
    price = budget.attempt_price(_env("gcp", "us-central1", 1, nodes=2), market_probe=lambda _c: None)
    assert price == {"hourly_usd": 1.4, "market": "on-demand", "price_source": "offer list"}
    # the cloud does not say: the dearest market that matches, never an under-count
    dear = budget.attempt_price(_env("aws", "us-east-1", 8), "H100", market_probe=lambda _c: None)
    assert dear["hourly_usd"] == 98.0 and dear["price_source"] == "offer list (dearest market)"
    # a region without its own price: the offer's dearest region ("*")
    other = budget.attempt_price(_env("aws", "eu-west-1", 8), "H100", market_probe=lambda _c: "spot")
    assert other["hourly_usd"] == 32.0
    assert budget.attempt_price({"FTORCH_HOURLY_USD": "72"}) == {
        "hourly_usd": 72.0,
        "price_source": "local.hourly_usd",
    }
    assert budget.attempt_price({}) == {}  # nothing says: no price, no budget stop


def test_spend_is_alive_time_times_each_attempts_price() -> None:
    records = {
        1: {"started_at": 0.0, "claimed_at": 5.0, "ended_at": 3600.0, "hourly_usd": 2.0},
        2: {"claimed_at": 4000.0, "alive_at": 5800.0, "hourly_usd": 6.0},  # killed: billed to alive_at
        3: {"claimed_at": 9000.0},  # no price known
        4: {"started_at": 10000.0, "hourly_usd": 3.6},
    }
    assert budget.spend_usd(records) == pytest.approx(2.0 + 3.0)
    assert budget.spend_usd(records, own_epoch=4, now=11000.0) == pytest.approx(2.0 + 3.0 + 1.0)


def _record(run_uri: str, attempt: int) -> dict:
    return next(r for r in RunStore(run_uri).epoch_records().values() if r.get("attempt") == attempt)


def test_the_trainer_stops_at_its_budget_resumes_at_once_and_goes_on_with_more(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": 10},
        resources={"budget_usd": 0.3},
    )  # fmt: skip
    run_uri = prepare_run(job)
    env = {"FTORCH_HOURLY_USD": "72"}  # $0.02 a second: the budget is 15 s of this machine

    first = run_trainer(run_uri, 1, env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    record = _record(run_uri, 1)
    assert record["ended"] == "stopped" and record["stop_reason"] == "budget"
    assert record["hourly_usd"] == 72.0 and record["stop_detail"].startswith("budget: $")
    store = RunStore(run_uri)
    stopped_at = record["step"]
    assert stopped_at > 0 and store.complete_checkpoints()[-1].step == stopped_at  # nothing lost
    assert (store.read_progress() or {})["state"] == "stopped"
    spent = budget.spend_usd(store.epoch_records())
    assert 0.3 * 0.5 < spent <= 0.3, spent  # inside the budget, from the trainer's start to its exit

    again = run_trainer(run_uri, 2, env)
    assert again.returncode == 0, again.stdout[-2000:]
    lines = [line for line in again.stdout.splitlines() + again.stderr.splitlines() if "at once" in line]
    assert len(lines) == 1 and "budget_usd $0.3" in lines[0]
    assert f"checkpoint at step {stopped_at} kept" in lines[0]  # said of the checkpoint the store holds
    assert "loading the model" not in again.stdout + again.stderr  # it left before any work
    assert _record(run_uri, 2)["stop_reason"] == "budget"
    assert store.complete_checkpoints()[-1].step == stopped_at

    spec = store.read_spec()  # what `ftorch resume --set resources.budget_usd=...` writes
    spec["job"]["resources"]["budget_usd"] = round(budget.spend_usd(store.epoch_records()) + 0.5, 4)
    store.write_spec(spec)
    started = time.time()
    more = run_trainer(run_uri, 3, env)
    assert more.returncode == 0, more.stdout[-2000:]
    third = _record(run_uri, 3)
    assert third["stop_reason"] == "budget" and third["step"] > stopped_at
    assert budget.spend_usd(RunStore(run_uri).epoch_records()) <= spec["job"]["resources"]["budget_usd"]
    assert time.time() - started > 3  # it trained again


def test_the_budget_holds_when_steps_and_saves_are_slow(tmp_path: Path, tiny_model: Path) -> None:
    """Every step 1 s and every save 4 s slower (FTORCH_FAULTS slow-step / slow-save: a slow machine
    and store on demand, outside the writer's own timer), a checkpoint every second. The stop leaves room
    for the next interval, two saves at the slowest seen (a periodic one may come before the next check,
    then the stop's own) and the reaction (a second, then the slowest step): the run ends inside its budget. The
    rule before reserved the interval, the margin and the writer's blocking time only (3 s here), so its
    last save always ended past the budget."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    budget_usd = 1.0  # at $72/h: 50 s of this machine, start-up included (the first save must come first)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", train={"max_steps": 100000}, checkpoint={"every": "1s"},
        resources={"budget_usd": budget_usd},
    )  # fmt: skip
    run_uri = prepare_run(job)
    env = {"FTORCH_HOURLY_USD": "72", "FTORCH_FAULTS": "slow-step@1000,slow-save@4000"}
    first = run_trainer(run_uri, 1, env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    record = _record(run_uri, 1)
    assert record["stop_reason"] == "budget" and record["step"] > 0, record
    store = RunStore(run_uri)
    assert store.complete_checkpoints()[-1].step == record["step"]  # the stop's checkpoint
    assert record["stop_detail"].endswith(f"; checkpoint at step {record['step']} kept")
    # it reserved two slow saves (4 s each at $0.02 a second), the interval and the reaction (a second,
    # then a slow step of 1 s)
    assert record["budget_reserve_usd"] > (2 * 4.0 + 1.0 + 2.0) * 0.02, record
    spent = budget.spend_usd(store.epoch_records())
    assert spent <= budget_usd, (spent, record["stop_detail"], record)
