"""The cost the planner ranks by is the cost a user pays: measured interruption rates per offer and node
count, capacity, data movement and storage, and honest big plans (no interval shorter than its write,
wall hours shown, spot only when it is cheaper, more nodes that are slower said)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from helpers import REPO

from orchestrator.jobfile.spec import load_job
from orchestrator.sizing.catalog import Catalog, Offer
from orchestrator.sizing.history import History
from orchestrator.sizing.planner import make_plan
from orchestrator.spot.egress import per_gb
from orchestrator.spot.hazards import bundled
from orchestrator.views.sizing_tables import plan_table
from trainer.stops.interval import CHECKPOINT_GBPS

EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def _home(ftorch_home):  # nobody's own evidence or history in these plans
    return ftorch_home


def plan_of(example: str, *sets: str, catalog=None):
    spec = load_job(EXAMPLES / example, list(sets), check_support=False)
    return make_plan(spec, history=History(), catalog=catalog)


def saved_gb(c) -> float:
    """What the candidate's saves move: the checkpoint's bytes x the saves over the training."""
    per_save = c.checkpoint_write_s * CHECKPOINT_GBPS
    return per_save * (c.est_hours * 3600.0 / c.checkpoint_interval_s + 1.0)


def test_egress_is_zero_in_the_stores_region_and_paid_elsewhere() -> None:
    east = plan_of("llama3-8b-full.yaml", "checkpoint.region=us-east-1", "resources.regions=[us-east-1]",
                   "resources.clouds=[aws]")  # fmt: skip
    west = plan_of("llama3-8b-full.yaml", "checkpoint.region=us-east-1", "resources.regions=[us-west-2]",
                   "resources.clouds=[aws]")  # fmt: skip
    assert east.chosen is not None and west.chosen is not None
    assert all(c.egress_usd == 0 for c in east.candidates)
    assert all(c.storage_usd and c.storage_usd > 0 for c in east.candidates)  # kept checkpoints cost too
    inter = per_gb("aws", "us-west-2", "aws", "us-east-1")
    for c in west.candidates:
        assert c.egress_usd >= inter * saved_gb(c) > 0  # every save crosses regions
    payload = west.to_json()["chosen"]
    assert payload["egress_usd"] > 0 and payload["storage_usd"] > 0
    assert payload["interruption_rate_per_hour"] > 0 and "pool" in payload["interruption_source"]
    assert any(n.startswith("egress: $") for n in west.notes)


def test_a_cross_cloud_candidate_pays_internet_egress() -> None:
    plan = plan_of("llama3-8b-full.yaml", "checkpoint.region=us-east-1", "resources.clouds=[gcp]",
                   "resources.fallback=none")  # fmt: skip
    gcp = [c for c in plan.candidates if c.cloud == "gcp"]
    assert gcp
    internet = per_gb("gcp", "us-central1", "aws", "us-east-1")
    assert internet == pytest.approx(0.12)
    for c in gcp:
        assert c.egress_usd >= internet * saved_gb(c)


def test_unknown_store_region_is_said_not_priced_as_free() -> None:
    plan = plan_of("llama3-8b-full.yaml", "resources.clouds=[aws]")
    assert plan.chosen is not None and plan.chosen.egress_usd is None
    assert any(n.startswith("egress: not priced") and "checkpoint.region" in n for n in plan.notes)


def offer(name: str, region: str, spot: float) -> Offer:
    return Offer("aws", name, "H100", 8, 80.0, 90.0, spot, "NVLink", (region,), 192.0, 2048.0,
                 region_prices={region: (90.0, spot)})  # fmt: skip


def test_each_market_is_priced_in_the_region_the_job_lands_in_not_at_the_median() -> None:
    """The launch tries the cheapest region first (region_order), so the plan pays that region's price:
    an offer listed in three regions at spot $6, $12 and $30/h (median $12) is priced $6 where it lands;
    pinned to the dearest, $30; on demand, the price of the region the on-demand launch goes to."""
    regions = {"us-east-1": (90.0, 12.0), "eu-south-2": (95.0, 6.0), "ap-northeast-1": (110.0, 30.0)}
    listed = Offer("aws", "h100.8", "H100", 8, 80.0, 95.0, 12.0, "NVLink", tuple(regions), 192.0, 2048.0,
                   region_prices=regions)  # fmt: skip
    offers = Catalog((listed,), "test")
    full = ("llama3-8b-full.yaml", "resources.clouds=[aws]", "resources.fallback=on-demand")
    open_ = plan_of(*full, catalog=offers).chosen
    assert open_ is not None and open_.spot and open_.region_share == {"eu-south-2": 1.0}
    assert open_.hourly_usd == open_.spot_hourly_usd == 6.0 and open_.ondemand_hourly_usd == 95.0
    dear = plan_of(*full, "resources.regions=[ap-northeast-1]", catalog=offers).chosen
    assert dear is not None and dear.hourly_usd == 30.0 and dear.ondemand_hourly_usd == 110.0
    assert dear.expected_cost_usd > open_.expected_cost_usd
    on_demand = plan_of(*full, "resources.spot=false", catalog=offers).chosen
    assert on_demand is not None and not on_demand.spot and on_demand.hourly_usd == 90.0  # us-east-1's


def test_the_choice_changes_when_moving_data_costs_more_than_the_cheaper_gpu_saves() -> None:
    offers = Catalog((offer("h100.east", "us-east-1", 20.0), offer("h100.west", "us-west-2", 18.5)), "test")
    full = "llama3-8b-full.yaml"
    for_free = plan_of(full, "checkpoint.region=us-west-2", catalog=offers)
    assert for_free.chosen.instance_type == "h100.west"  # cheaper GPUs, next to the data
    moved = plan_of(full, "checkpoint.region=us-east-1", catalog=offers)
    west = next(c for c in moved.candidates if c.instance_type == "h100.west")
    east = next(c for c in moved.candidates if c.instance_type == "h100.east")
    gpu_saving = (east.expected_cost_usd - east.egress_usd - east.storage_usd) - (
        west.expected_cost_usd - west.egress_usd - west.storage_usd
    )
    assert 0 < gpu_saving < west.egress_usd  # ~100 GB per save across regions outweighs $1.50/h
    assert moved.chosen.instance_type == "h100.east"
    # a LoRA adapter is small: the cheaper GPUs win even away from the store
    lora = plan_of("llama3-8b-lora.yaml", "checkpoint.region=us-east-1", "resources.clouds=[aws]",
                   "resources.accelerators=[H100]", catalog=offers)  # fmt: skip
    assert lora.chosen.instance_type == "h100.west" and 0 < lora.chosen.egress_usd < 1


def test_the_70b_two_node_plan_writes_no_longer_than_its_interval_and_shows_its_hours() -> None:
    plan = plan_of(
        "llama3-8b-full-2nodes.yaml", "model=meta-llama/Llama-3.1-70B", "checkpoint.region=us-east-1"
    )
    assert plan.chosen is not None and plan.candidates
    for c in plan.candidates:
        assert c.checkpoint_interval_s >= c.checkpoint_write_s  # it would never stop writing otherwise
        assert c.expected_hours >= c.est_hours
        if c.spot and c.expected_cost_ondemand_usd is not None:  # fallback: on-demand in the example
            assert c.expected_cost_usd <= c.expected_cost_ondemand_usd
    assert any("shorter than one upload" in n for n in plan.notes)  # every: 20m, said and stretched
    assert any(any(a.startswith("market: on-demand") for a in c.adjustments) for c in plan.candidates)
    from rich.console import Console

    con = Console(width=220, record=True)
    con.print(plan_table(plan, plan.candidates[:3]))
    text = con.export_text()
    assert "wall h" in text and "interr." in text and f"{plan.candidates[0].expected_hours:.1f}" in text


def test_more_nodes_predicted_slower_are_said() -> None:
    # on the calibration's stack (flash-attention 2): with the default (auto, planned as SDPA at 0.9 of its
    # MFU) the slower compute hides more of the network's all-gathers, and 2 nodes come out ~3% faster
    plan = plan_of(
        "llama3-8b-full-2nodes.yaml",
        "checkpoint.region=us-east-1",
        "train.attn_implementation=flash_attention_2",
    )
    assert plan.chosen is not None and plan.chosen.nodes == 2
    (note,) = [n for n in plan.notes if n.startswith("nodes: ")]
    assert "slower than 1" in note


def test_pinned_where_spot_is_scarce_the_plan_says_so_and_prices_the_fallback() -> None:
    v100 = Offer("aws", "p3.2xlarge", "V100", 1, 16.0, 3.06, 0.92, "n/a", ("us-east-1",), 8.0, 61.0,
                 region_prices={"us-east-1": (3.06, 0.92)})  # fmt: skip
    spec = {"model": "llama-2-7b", "method": "qlora", "checkpoint": {"uri": "s3://b/ck", "region": "us-east-1"},
            "data": {"path": "s3://b/d.jsonl", "max_seq_len": 512, "tokens": 2_000_000},
            "train": {"precision": "fp16-mixed", "optimizer": "paged_adamw_8bit", "micro_batch_size": 1,
                      "gradient_checkpointing": True},
            "resources": {"backend": "skypilot", "regions": ["us-east-1"], "fallback": "on-demand"}}  # fmt: skip
    from orchestrator.jobfile.spec import validate_job

    plan = make_plan(validate_job(spec), catalog=[v100], history=History())
    c = plan.chosen
    assert c is not None and c.spot and c.spot_availability == pytest.approx(0.713, abs=0.01)
    # on demand for good from the first launch that finds no spot: at least the first launch's chance;
    # a relaunch finds none as often as the traces show right after an interruption (more than at random)
    q, f = 1 - c.spot_availability, c.fallback_share
    (east,) = [r for r in bundled()["regions"] if r["region"] == "us-east-1"]
    q1 = east["no_capacity_after_interruption"]
    assert q1 > q
    spot_i = c.expected_interruptions / (1 - f)  # the interruptions of the whole job on spot
    assert f == pytest.approx(1 - (1 - q) * (1 - math.exp(-q1 * spot_i)) / (q1 * spot_i)) and q < f < 1
    assert c.expected_cost_ondemand_usd > c.expected_cost_usd > c.expected_cost_spot_usd * 0.99
    assert any(n.startswith("capacity: spot is obtainable only 71%") for n in plan.notes)
    # measured here: the rate is the zones', not a cloud-wide constant
    assert c.interruption_rate_per_hour > 0.4 and "measured failover over the zones of us-east-1" in (
        c.interruption_source
    )


def test_capacity_never_measured_for_the_offer_is_borrowed_priced_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An offer whose spot capacity was never measured is not taken as always obtainable: it gets the
    measured regions' mean, in the hours (each launch waits, without a fallback) or in the on-demand
    share (with one), and the plan says where the figure comes from."""
    from orchestrator.jobfile.spec import validate_job

    l40s = Offer("aws", "g6e.xlarge", "L40S", 1, 48.0, 1.86, 0.75, "n/a", ("us-east-1",), 4.0, 32.0,
                 region_prices={"us-east-1": (1.86, 0.75)})  # fmt: skip
    regions = [r for r in bundled()["regions"] if r["cloud"] == "aws" and int(r["nodes"]) == 1]
    mean = sum(float(r["availability"]) for r in regions) / len(regions)

    def plan(fallback: str):
        spec = {"model": "llama-2-7b", "method": "qlora", "checkpoint": {"uri": "s3://b/ck", "region": "us-east-1"},
                "data": {"path": "s3://b/d.jsonl", "max_seq_len": 512, "tokens": 2_000_000},
                "train": {"precision": "bf16", "micro_batch_size": 1, "gradient_checkpointing": True},
                "resources": {"backend": "skypilot", "regions": ["us-east-1"], "fallback": fallback}}  # fmt: skip
        return make_plan(validate_job(spec), catalog=[l40s], history=History())

    waits, falls = plan("none"), plan("on-demand")
    for p in (waits, falls):
        c = p.chosen
        assert c is not None and c.spot and c.spot_availability == pytest.approx(mean)
        assert c.spot_capacity_source.startswith("capacity not measured for g6e.xlarge in us-east-1")
        assert any(
            n.startswith("capacity: not measured for g6e.xlarge in us-east-1: the mean of") for n in p.notes
        )
    w = waits.chosen
    assert w.spot_wait_s > 0 and w.fallback_share == 0.0
    from orchestrator.spot.hazards import HazardTable

    monkeypatch.setattr(HazardTable, "_borrowed_capacity", lambda *_a: (None, ""))  # as before: instant
    instant = plan("none").chosen
    assert instant.spot_availability is None and instant.spot_wait_s == 0
    waited = (1 + w.expected_interruptions) * w.spot_wait_s / 3600.0  # each (re)launch waits
    assert w.expected_hours - instant.expected_hours == pytest.approx(waited, rel=1e-6)
    assert falls.chosen.fallback_share > 0  # some of the work expected on demand for want of spot


def test_estimate_applies_offload_auto_and_names_the_next_gpu_count_that_fits() -> None:
    def estimate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli.app", "estimate", str(EXAMPLES / "llama3-8b-full.yaml"),
                               "--set", "model=meta-llama/Llama-3.1-70B", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=120)  # fmt: skip

    short = estimate("--set", "train.offload=none", "--gpus", "2")
    assert short.returncode == 0, short.stderr
    hint = short.stdout.strip().splitlines()[-1]
    assert "fits none" in hint and "try --gpus 8" in hint
    eight = json.loads(estimate("--set", "train.offload=none", "--gpus", "8", "--json").stdout)
    assert eight["peak_gib_per_gpu"] <= 180 * 0.9  # the count named does fit
    auto = estimate("--gpus", "8")
    assert "with CPU offload" in auto.stdout  # what plan would run on smaller GPUs


@pytest.mark.skipif(
    not (REPO.parent / "shared/data/spot-traces").is_dir(), reason="the shared traces are not here"
)
@pytest.mark.parametrize("job_file", ["llama3-8b-lora.yaml", "llama3-8b-full.yaml", "llama3-70b-qlora.yaml"])
def test_the_plans_cost_matches_the_simulators_on_the_traces(job_file: str) -> None:
    """bench/planner_vs_simulator.py's three jobs, 200 starts: in-sample every region set within
    0.8-1.25 of the simulated cost; held out (fitted on days 1-22, replayed on 23-45) the plan the
    planner makes by default, all three regions open, within 0.8-1.25 too. A job pinned to one region
    is overpriced held out (up to 1.5x: the first half of the traces was stormier everywhere, and the
    model carries what it saw forward): docs/benchmarks.md states it; here it is held under 1.6."""
    sys.path.insert(0, str(REPO / "bench"))
    from planner_vs_simulator import TRACES, compare

    from orchestrator.spot.traces import load_zones

    zones = load_zones([str(TRACES)])
    n, mid = zones.n_ticks, zones.n_ticks // 2

    def ratios(fit: tuple[int, int], test: tuple[int, int]) -> dict[str, float]:
        rows = [cells(row) for row in compare(job_file, zones, fit, test, 200)]
        assert all(row[-1] == "yes" for row in rows), rows  # inside the plan's 90% band
        return {row[2]: float(row[-2]) for row in rows}

    inside = ratios((0, n), (0, n))
    assert len(inside) == 4 and all(0.8 <= r <= 1.25 for r in inside.values()), inside
    held = ratios((0, mid), (mid, n))
    assert 0.8 <= held["all 3 regions"] <= 1.25, held
    assert all(0.8 <= r <= 1.6 for r in held.values()), held


def cells(row: str) -> list[str]:
    """A markdown table row of bench/planner_vs_simulator.py, cell by cell."""
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def dollars(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


@pytest.mark.skipif(
    not (REPO.parent / "shared/data/spot-traces").is_dir(), reason="the shared traces are not here"
)
def test_the_plans_cost_band_holds_what_each_week_cost_and_is_not_wider_than_the_weeks() -> None:
    """The plan's 90% band (the rate and spot capacity drawn as far apart as the traces' weeks were,
    orchestrator/spot/season.py) against the simulator started in each week of the 45 days, every job
    and region set: at least 90% of the weeks' costs inside it, and the band no more than 3 times as
    wide as the six weeks' own spread (a calibrated 90% band is ~1.3 times the range of 6 draws, which
    is itself uncertain: a range 2 sd below its mean makes it ~3.5 times)."""
    sys.path.insert(0, str(REPO / "bench"))
    from planner_vs_simulator import JOBS, TRACES, compare

    from orchestrator.spot.traces import load_zones

    zones = load_zones([str(TRACES)])
    per, n = int(7 * 86400 / zones.gap_s), zones.n_ticks
    weeks: dict[tuple[str, str], list[list[str]]] = {}
    for job_file in JOBS:
        for week in range(n // per):
            for row in compare(
                job_file, zones, (0, n), (week * per, min(n, (week + 1) * per + per // 2)), 100
            ):
                weeks.setdefault((job_file, cells(row)[2]), []).append(cells(row))
    rows = [row for rs in weeks.values() for row in rs]
    assert len(rows) == 3 * 4 * 6
    assert sum(row[-1] == "yes" for row in rows) >= 0.9 * len(rows), [r for r in rows if r[-1] != "yes"]
    for key, rs in weeks.items():
        low, high = (dollars(v) for v in rs[0][8].split("-"))
        costs = [dollars(r[9]) for r in rs]
        assert low < dollars(rs[0][7]) < high, key
        assert high - low <= 3 * (max(costs) - min(costs)), (key, low, high, costs)


def test_a_spot_plan_gives_the_cost_band_of_the_seasons_it_may_meet(tmp_path) -> None:
    """A spot plan's expected cost comes with its 90% over seasons (rate and capacity moved together as
    the traces' weeks moved them); each measured spread widens it, their correlation too (a stormy
    week is a week without spot); the mean is the plan's; on demand the band is the cost."""
    from orchestrator.spot.hazards import HazardTable

    sets = ("resources.clouds=[aws]", "resources.fallback=on-demand", "resources.regions=[us-west-2]")
    spec = load_job(EXAMPLES / "llama3-8b-lora.yaml", list(sets), check_support=False)

    def chosen(**spreads: float):
        table = HazardTable.from_json(bundled())
        for name, value in spreads.items():
            setattr(table, name, value)
        c = make_plan(spec, history=History(), hazards=table).chosen
        assert c is not None and c.spot
        return c

    c = chosen()
    assert c.expected_cost_low_usd < c.expected_cost_usd < c.expected_cost_high_usd
    assert c.expected_cost_high_usd > 1.2 * c.expected_cost_usd  # 83% spot there: a week without much costs
    no_capacity_spread = chosen(availability_logit_sd=0.0)
    independent = chosen(availability_rate_corr=0.0)
    for narrower in (no_capacity_spread, independent):
        assert narrower.expected_cost_usd == c.expected_cost_usd  # the mean does not move
        assert narrower.expected_cost_high_usd - narrower.expected_cost_low_usd < (
            c.expected_cost_high_usd - c.expected_cost_low_usd
        )
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.app", "plan", str(EXAMPLES / "llama3-8b-lora.yaml"),
         "--offline", *(a for s in sets for a in ("--set", s))],
        capture_output=True, text=True, env={**os.environ, "FTORCH_HOME": str(tmp_path), "COLUMNS": "300"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        f"cost: ${c.expected_cost_usd:,.2f} expected, ${c.expected_cost_low_usd:,.2f}-"
        f"${c.expected_cost_high_usd:,.2f} (90%)" in out.stdout
    ), out.stdout
    od = plan_of("llama3-8b-lora.yaml", *sets[:2], "resources.spot=false").chosen
    assert od is not None and not od.spot
    assert od.expected_cost_low_usd == od.expected_cost_usd == od.expected_cost_high_usd


def test_the_rebid_order_weighs_moving_the_checkpoints() -> None:
    from orchestrator.backends.skypilot_render import regions_of
    from orchestrator.sizing.catalog import bundled_catalog

    (node,) = [o for o in bundled_catalog().offers if o.instance_type == "p5en.48xlarge"]
    offers = Catalog((node,), "test")
    priced = plan_of("llama3-8b-full.yaml", "checkpoint.region=us-east-1", catalog=offers)
    unpriced = plan_of("llama3-8b-full.yaml", catalog=offers)
    cheap, near = regions_of(unpriced)["aws|H200|8"], regions_of(priced)["aws|H200|8"]
    assert cheap.index("us-west-2") < cheap.index("us-east-1")  # by price alone: us-west-2's spot is cheaper
    assert near.index("us-east-1") < near.index("us-west-2")  # ~100 GB per save from us-west-2 is not
    data = priced.chosen.data_usd_per_hour
    assert data["us-east-1"] == 0 < data["us-west-2"]
    c = priced.chosen
    lost_h = (c.restart_overhead_s + c.checkpoint_interval_s / 2) / 3600
    rates = c.region_rates_per_hour
    assert set(rates) == set(data) and all(r > 0 for r in rates.values())
    spot = {r: (p[1] + data[r]) * (1 + rates[r] * lost_h)
            for r, p in node.region_prices.items() if p[1] is not None and r in data}  # fmt: skip
    assert [r for r in near if r in spot] == sorted(
        spot, key=spot.get
    )  # GPU price plus moving data, per hour, times the hours the model's interruptions there lose


def test_the_rebid_order_follows_the_hazard_model(ftorch_home, tmp_path) -> None:
    """A region whose rate imported evidence raises drops in the order the controller re-bids in."""
    import os

    from orchestrator.backends.skypilot_render import regions_of
    from orchestrator.sizing.catalog import bundled_catalog

    (node,) = [o for o in bundled_catalog().offers if o.instance_type == "p5en.48xlarge"]
    offers = Catalog((node,), "test")
    before = plan_of("llama3-8b-full.yaml", "checkpoint.uri=/tmp/ck", catalog=offers)
    order = regions_of(before)["aws|H200|8"]
    spot = {r: node.region_prices[r][1] for r in order if node.region_prices.get(r, (None, None))[1]}
    pairs = [(a, b) for a, b in zip(order, order[1:], strict=False) if a in spot and b in spot]
    first, second = min(pairs, key=lambda ab: spot[ab[1]] / spot[ab[0]])  # the closest two in price
    assert spot[second] / spot[first] < 1.1
    # a team's own log in the first region: interrupted every 20 minutes for 45 days
    path = tmp_path / "team.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": ([1] * 2 + [0]) * 2160}))
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.app", "hazards", "import", str(path), "--cloud", "aws",
         "--instance-type", "p5en.48xlarge", "--zone", f"{first}a"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "FTORCH_HOME": str(ftorch_home)},
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    after = plan_of("llama3-8b-full.yaml", "checkpoint.uri=/tmp/ck", catalog=offers)
    was, now = before.chosen.region_rates_per_hour, after.chosen.region_rates_per_hour
    assert now[first] > 2 * was[first] and now[second] == pytest.approx(was[second])
    moved = regions_of(after)["aws|H200|8"]
    assert moved.index(first) > moved.index(second)  # the spot price alone still puts it first
    assert node.region_prices[first][1] <= node.region_prices[second][1]
    # the trainer's checkpoint interval starts from the same model's rate where SkyPilot placed it
    from orchestrator.backends.skypilot_render import interruption_envs
    from trainer.stops.interruptions import prior_mtbf_s

    envs = interruption_envs(after)
    for region in (first, second):
        info = json.dumps({"cloud": "AWS", "region": region})
        mtbf, source = prior_mtbf_s(
            {**envs, "SKYPILOT_CLUSTER_INFO": info, "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
        )
        assert mtbf == pytest.approx(3600 / now[region], rel=1e-3) and f"aws:{region}:8" in source


def test_the_interval_weighs_a_saves_dollars_in_planner_and_trainer_alike() -> None:
    from orchestrator.backends.skypilot_render import interruption_envs
    from trainer.stops.interruptions import mtbf_from_rate
    from trainer.stops.interval import SAVE_COST_ENV, AutoInterval

    away = plan_of("llama3-8b-lora.yaml", "checkpoint.region=us-east-1", "resources.regions=[us-west-2]",
                   "resources.clouds=[aws]", "checkpoint.every=auto")  # fmt: skip
    home = plan_of("llama3-8b-lora.yaml", "checkpoint.region=us-west-2", "resources.regions=[us-west-2]",
                   "resources.clouds=[aws]", "checkpoint.every=auto")  # fmt: skip
    c, free = away.chosen, home.chosen
    assert (c.instance_type, c.spot) == (free.instance_type, True) and free.save_cost_s == 0 < c.save_cost_s
    assert c.checkpoint_interval_s > free.checkpoint_interval_s  # saving costs money: save less often

    def trainer(save_cost_s: float) -> float:
        auto = AutoInterval(mtbf_prior_s=mtbf_from_rate(c.interruption_rate_per_hour), notice_prior=0.0,
                            save_cost_s=save_cost_s)  # fmt: skip
        auto.observe(c.checkpoint_blocking_s, c.checkpoint_write_s)
        return auto.choose()[0]

    assert trainer(c.save_cost_s) == pytest.approx(c.checkpoint_interval_s)
    assert float(interruption_envs(away)[SAVE_COST_ENV]) == pytest.approx(c.save_cost_s, abs=1e-3)
    assert SAVE_COST_ENV not in interruption_envs(home)


def test_the_ledger_records_what_each_attempt_paid_to_move_checkpoints() -> None:
    from orchestrator.spot.egress import Store, attempt_movement
    from trainer.recording.ledger import ledger_lines

    store = Store("aws", "us-east-1", "checkpoint.region")
    attempts = {1: {"cluster_info": {"cloud": "AWS", "region": "us-west-2"}},
                2: {"cluster_info": {"cloud": "AWS", "region": "us-east-1"}},
                3: {"cluster_info": {"cloud": "GCP", "region": "us-central1"}}}  # fmt: skip
    records = {1: {"attempt": 1, "measured": {"checkpoint_uploads": 3}},
               2: {"attempt": 2, "start_step": 40, "measured": {"checkpoint_uploads": 2}},
               3: {"attempt": 3, "start_step": 60, "measured": {"checkpoint_uploads": 1}}}  # fmt: skip
    moved = attempt_movement(store, attempts, records, 100e9)
    by_n = {r["attempt"]: r for r in moved["attempts"]}
    assert by_n[1]["usd"] == pytest.approx(3 * 100 * 0.02)  # three saves across regions
    assert by_n[2]["usd"] == 0  # in the store's region: saves and the restore are free
    assert by_n[3]["usd"] == pytest.approx(100 * 0.12 + 100 * 0.09)  # GCP's internet out, S3's back in
    assert moved["total_usd"] == pytest.approx(6 + 21) and moved["gb"] == pytest.approx(800)
    rows = dict(ledger_lines({"data_movement": moved}))
    assert rows["data movement"].startswith("$27.00")
    assert attempt_movement(Store("aws", None, "unknown"), attempts, records, 100e9) is None


def test_plan_json_gives_each_candidate_its_rate_source_egress_and_storage(ftorch_home) -> None:
    import os

    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.app", "plan", str(EXAMPLES / "llama3-8b-full.yaml"), "--json",
         "--no-trace", "--set", "checkpoint.region=us-east-1", "--set", "resources.clouds=[aws,gcp]"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "FTORCH_HOME": str(ftorch_home)},
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    candidates = json.loads(out.stdout)["candidates"]
    assert candidates
    for c in candidates:
        assert c["interruption_rate_per_hour"] >= 0 and c["interruption_source"]
        assert c["egress_usd"] >= 0 and c["storage_usd"] > 0
        assert set(c["region_rates_per_hour"]) == set(c["regions"])
    assert any(c["egress_usd"] > 0 for c in candidates if c["cloud"] == "gcp")  # internet egress to S3
    spot = [c for c in candidates if c["spot"]]
    assert spot and all(c["interruption_rate_per_hour"] > 0 for c in spot)


def launch_key(c) -> str:
    """The "cloud|GPU|count" key regions_of gives the candidate's launch order under."""
    from orchestrator.backends.skypilot_render import SKY_INFRA
    from orchestrator.sizing.sky_names import check_sky_name

    return f"{SKY_INFRA.get(c.cloud, c.cloud)}|{check_sky_name(c.accelerator)}|{c.count}"


def test_data_movement_is_priced_where_the_launch_tries_first() -> None:
    """Issue 29's 70B two-node plan, store in us-east-1: the plan prices the hazard's shares and the data
    movement over the launch's own region order (regions_of), not over the cheapest spot region."""
    from collections import Counter

    from orchestrator.backends.skypilot_render import regions_of

    plan = plan_of(
        "llama3-8b-full-2nodes.yaml", "model=meta-llama/Llama-3.1-70B", "checkpoint.region=us-east-1"
    )
    orders, c = regions_of(plan), plan.chosen
    assert (c.instance_type, c.nodes, c.spot) == ("p4de.24xlarge", 2, False)  # on demand
    assert "us-east-1" in c.regions and c.regions[0] != "us-east-1"  # offered elsewhere too, listed first
    assert orders[launch_key(c)][0] == "us-east-1"
    elsewhere = [v for r, v in c.data_usd_per_hour.items() if r != "us-east-1"]
    assert c.data_usd_per_hour["us-east-1"] == 0 < min(elsewhere)
    assert c.egress_usd == 0 < c.storage_usd  # was $5,571 from eu-central-1, p4de's cheapest spot region
    assert c.region_share == {"us-east-1": 1.0}
    # every candidate: priced where its launch order puts it, moving data from there when that is not the
    # store's region (p5en spot: eu-south-2's spot price outweighs moving its checkpoints to us-east-1)
    shared = Counter(launch_key(x) for x in plan.candidates)
    away = 0
    for x in (x for x in plan.candidates if shared[launch_key(x)] == 1):
        first = orders[launch_key(x)][0]
        assert max(x.region_share, key=x.region_share.get) == first, x.instance_type
        if x.region_share[first] == 1.0 and not x.fallback_share:  # (a fallback runs on demand's order)
            assert x.egress_usd == pytest.approx(x.data_usd_per_hour[first] * x.expected_hours, rel=1e-9)
            away += x.egress_usd > 0
    assert away


def test_an_on_demand_candidate_is_ordered_by_on_demand_prices() -> None:
    from orchestrator.backends.skypilot_render import regions_of
    from orchestrator.sizing.catalog import bundled_catalog

    (node,) = [o for o in bundled_catalog().offers if o.instance_type == "p4de.24xlarge"]
    offers = Catalog((node,), "test")
    od = {r: p[0] for r, p in node.region_prices.items()}
    spot = {r: p[1] for r, p in node.region_prices.items()}
    assert min(od, key=od.get) != min(spot, key=spot.get)  # us-east-1 on demand, eu-central-1 on spot
    # a run store on the machine moves nothing: the order is the price (and the re-bid loss on spot)
    demand = plan_of("llama3-8b-full.yaml", "checkpoint.uri=/tmp/ck", "resources.spot=false", catalog=offers)
    c = demand.chosen
    assert c is not None and not c.spot
    order = regions_of(demand)["aws|A100-80GB|8"]
    assert order == sorted(c.regions, key=od.get) and order[0] == min(od, key=od.get)
    assert c.region_share == {order[0]: 1.0}  # on demand it runs where the order starts
    on_spot = plan_of("llama3-8b-full.yaml", "checkpoint.uri=/tmp/ck", catalog=offers).chosen
    assert on_spot.spot and max(on_spot.region_share, key=on_spot.region_share.get) == min(spot, key=spot.get)


def test_the_egress_note_names_the_region_the_movement_was_priced_for() -> None:
    from orchestrator.backends.skypilot_render import regions_of
    from orchestrator.sizing.catalog import bundled_catalog

    (node,) = [o for o in bundled_catalog().offers if o.instance_type == "p5en.48xlarge"]
    plan = plan_of("llama3-8b-full.yaml", "checkpoint.region=us-east-1", catalog=Catalog((node,), "test"))
    c = plan.chosen
    first = regions_of(plan)["aws|H200|8"][0]
    assert first != c.regions[0] and c.egress_usd > 0  # priced away from the store, not the catalog's first
    (note,) = [n for n in plan.notes if n.startswith("egress: $")]
    assert f"between {first} and the run store (aws us-east-1)" in note
    assert max(c.region_share, key=c.region_share.get) == first  # the largest share: where it was priced
