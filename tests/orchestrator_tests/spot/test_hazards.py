"""The spot hazard model: traces measured, the bundled prior, evidence moving the posterior, nodes
correlated, fallbacks that say so, `ftorch hazards` and `ftorch hazards import`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from orchestrator.spot.hazards import (
    Evidence,
    HazardTable,
    bundled,
    correlation_factor,
    evidence_from_run,
    load_table,
    measure,
)

SHARED = REPO.parent / "shared" / "data" / "spot-traces"


def ftorch(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FTORCH_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.app", *args], capture_output=True, text=True, cwd=REPO, env=env,
        timeout=120,
    )  # fmt: skip


def trace(path: Path, counts: list[int], gap: float = 600.0) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": counts}))
    return path


def test_a_trace_is_measured_as_hours_held_interruptions_and_capacity() -> None:
    # up 3 ticks, down 2, up 1, down 1, up 3 at 600 s a tick; 2 nodes needed in the second case
    stats = measure([1, 1, 1, 0, 0, 1, 0, 1, 1, 1], 600.0)
    assert (stats.hours, stats.interruptions) == (7 * 600 / 3600, 2)
    assert stats.availability == pytest.approx(0.7) and stats.mean_down_s == pytest.approx(900.0)
    two = measure([2, 2, 1, 2, 3, 1], 600.0, nodes=2)  # 2 -> 1 loses a node of the job; 3 -> 1 too
    assert (two.hours, two.interruptions) == (4 * 600 / 3600, 2)


def test_the_bundled_prior_is_built_from_the_shared_traces_with_provenance() -> None:
    payload = bundled()
    files = {f["path"]: f["sha256"] for f in payload["provenance"]["files"]}
    assert len(payload["measured"]) == 9 and len(files) == 9
    if SHARED.is_dir():  # the file each rate came from, byte for byte
        for rel, digest in files.items():
            assert hashlib.sha256((SHARED / rel).read_bytes()).hexdigest() == digest
    table = HazardTable.from_json(payload)
    for row in payload["measured"]:
        (zone,) = [
            z for z in table.zones_of("aws", "p3.2xlarge", "V100", 1, row["region"]) if z.name == row["zone"]
        ]
        measured = row["interruptions"] / row["hours"]
        assert zone.gamma.mean == pytest.approx(measured, rel=0.02)  # hundreds of hours: the data speak
        assert zone.gamma.quantile(0.05) < measured < zone.gamma.quantile(0.95)
    rates = sorted(r["interruptions"] / r["hours"] for r in payload["measured"])
    assert rates[-1] / rates[0] > 10  # the zones differ more than any one constant could say


def test_importing_a_trace_moves_the_rate_toward_it_by_the_posterior_weight(tmp_path: Path) -> None:
    home = tmp_path / "home"
    before = load_table(home).zones_of("aws", "p3.2xlarge", "V100", 1, "eu-west-1")
    assert [z.level for z in before] == ["cloud"]  # never measured there: borrowed, and said
    prior = before[0].gamma
    # 60 days held, 10 interruptions: 10 / 1440 h, far below the pool's mean
    counts = ([1] * 143 + [0]) * 10 + [1] * (8640 - 1440)
    path = trace(tmp_path / "team.json", counts)
    out = ftorch(home, "hazards", "import", str(path), "--cloud", "aws", "--instance-type", "p3.2xlarge",
                 "--zone", "eu-west-1a", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["imported"]
    hours, events = row["hours"], row["interruptions"]
    assert events == 10 and hours == pytest.approx((8640 - 10) * 600 / 3600)
    (after,) = load_table(home).zones_of("aws", "p3.2xlarge", "V100", 1, "eu-west-1")
    weight = hours / (prior.beta + hours)
    assert after.level == "zone" and after.name == "eu-west-1a"
    assert after.gamma.mean == pytest.approx(weight * events / hours + (1 - weight) * prior.mean)
    assert events / hours < after.gamma.mean < prior.mean
    # a second import of the same file adds nothing
    again = ftorch(home, "hazards", "import", str(path), "--cloud", "aws", "--instance-type", "p3.2xlarge",
                   "--zone", "eu-west-1a", "--json")  # fmt: skip
    assert json.loads(again.stdout)["added"] == 0
    shown = ftorch(home, "hazards", "--json")
    rows = json.loads(shown.stdout)["rows"]
    assert any(r["zone"] == "eu-west-1a" for r in rows)
    (east,) = [r for r in rows if r["region"] == "us-east-1" and r["zone"] == "any (failover)"]
    failover = bundled()["failover"]
    (measured,) = [f for f in failover if f["regions"] == ["us-east-1"]]
    assert east["rate_per_hour"] == pytest.approx(measured["interruptions"] / measured["hours"], rel=0.02)
    assert east["expected_wait_s"] > 0
    assert east["expected_wait_s"] == pytest.approx((1 - east["availability"]) * east["mean_down_s"])


def test_recorded_attempts_move_the_rate_by_the_posterior_weight(tmp_path: Path) -> None:
    spec = {"resources": {"nodes": 1, "gpus": 1, "accelerators": ["V100"]}}
    where = {"cloud": "AWS", "region": "us-west-2", "zone": "us-west-2b", "num_nodes": 1}
    attempts = {n: {"cluster_info": where} for n in (1, 2, 3)}
    epochs = {
        1: {"attempt": 1, "market": "spot", "started_at": 0.0, "ended_at": 36000.0, "ended": "notice"},
        2: {"attempt": 2, "market": "spot", "started_at": 40000.0, "alive_at": 76000.0},  # gone: no end
        3: {"attempt": 3, "market": "spot", "started_at": 80000.0, "ended_at": 116000.0, "ended": "finished"},
        4: {"attempt": 4, "market": "on-demand", "started_at": 120000.0, "ended_at": 130000.0},
    }
    found = evidence_from_run("j1", spec, attempts, epochs)
    assert [(e.hours, e.interruptions) for e in found] == [(10.0, 1), (10.0, 1), (10.0, 0)]
    prior = HazardTable.from_json(bundled())
    before = next(
        z for z in prior.zones_of("aws", "p3.2xlarge", "V100", 1, "us-west-2") if z.name == "us-west-2b"
    )
    mine = HazardTable.from_json(bundled(), found)
    after = next(
        z for z in mine.zones_of("aws", "p3.2xlarge", "V100", 1, "us-west-2") if z.name == "us-west-2b"
    )
    weight = 30.0 / (before.gamma.beta + 30.0)
    assert after.gamma.mean == pytest.approx(weight * 2 / 30 + (1 - weight) * before.gamma.mean)
    assert after.gamma.mean < before.gamma.mean  # 0.067/h observed under the zone's 0.095/h


def test_nodes_are_correlated_not_independent() -> None:
    table = load_table(Path("/nonexistent-home"))
    one = table.for_offer("aws", "p5.48xlarge", "H100", 8, ["us-east-1"], nodes=1)
    four = table.for_offer("aws", "p5.48xlarge", "H100", 8, ["us-east-1"], nodes=4)
    assert four.rate_per_hour == pytest.approx(one.rate_per_hour * correlation_factor(4, table.rho))
    assert one.rate_per_hour < four.rate_per_hour < 2 * one.rate_per_hour  # not 4x: they go together
    assert "nodes" in four.source


def test_what_was_never_measured_borrows_with_wider_uncertainty_and_says_so() -> None:
    table = load_table(Path("/nonexistent-home"))
    measured = table.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-west-2"])
    same_cloud = table.for_offer("aws", "p5.48xlarge", "H100", 8, ["us-west-2"])
    other_cloud = table.for_offer("gcp", "a3-highgpu-8g", "H100", 8, ["us-central1"])
    assert (measured.level, same_cloud.level, other_cloud.level) == ("failover", "class", "borrowed")
    assert "no measurement" in same_cloud.source and "nothing measured on gcp" in other_cloud.source

    def width(h):  # relative width of the 90% interval
        return (h.high_per_hour - h.low_per_hour) / h.rate_per_hour

    assert width(measured) < width(same_cloud) < width(other_cloud)
    assert measured.capacity_source == "measured"
    # capacity never measured for the offer: the mean of the cloud's measured regions, and said so; not
    # "always obtainable" (which priced every real plan's spot as instant)
    regions = [r for r in bundled()["regions"] if r["cloud"] == "aws" and int(r["nodes"]) == 1]
    mean = sum(float(r["availability"]) for r in regions) / len(regions)
    assert same_cloud.availability == pytest.approx(mean) and same_cloud.wait_s > 0
    assert same_cloud.capacity_source.startswith("capacity not measured for p5.48xlarge in us-west-2")
    assert f"obtainable {mean:.0%}" in same_cloud.capacity_source
    assert other_cloud.availability == pytest.approx(mean)  # nothing on gcp: other clouds' regions
    assert "on other clouds" in other_cloud.capacity_source


def test_capacity_where_the_job_is_pinned() -> None:
    table = load_table(Path("/nonexistent-home"))
    east = table.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-east-1"])
    west = table.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-west-2"])
    both = table.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-west-2", "us-east-1"])
    payload = {(r["region"]): r for r in bundled()["regions"]}
    assert east.availability == pytest.approx(payload["us-east-1"]["availability"])  # measured jointly
    assert east.wait_s > west.wait_s > both.wait_s > 0
    assert dict(both.region_share)["us-west-2"] > 0.9  # tried first, and it stays there longer


def test_a_bad_trace_is_refused_in_one_line_and_nothing_is_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    good = trace(tmp_path / "good.json", [1, 1, 0, 1])
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [1, 0]}')
    out = ftorch(home, "hazards", "import", str(good), str(bad), "--cloud", "aws", "--instance-type",
                 "p3.2xlarge", "--zone", "us-east-1a")  # fmt: skip
    assert (
        out.returncode == 2
        and out.stderr.strip().count("\n") == 0
        and "bad.json is not a trace" in out.stderr
    )
    assert not (home / "hazards.json").exists()
    wrong = ftorch(home, "hazards", "import", str(good), "--cloud", "aws", "--instance-type", "p9.huge",
                   "--zone", "us-east-1a")  # fmt: skip
    assert wrong.returncode == 2 and "--instance-type" in wrong.stderr


def test_evidence_round_trips() -> None:
    e = Evidence("aws", "p3.2xlarge", "us-east-1", "us-east-1a", 1, 2.0, 1, "x", "V100", 1, 0.5, 60.0)
    assert Evidence.from_json(e.to_json()) == e


def test_failover_is_measured_over_the_zones_together() -> None:
    from orchestrator.spot.hazards import failover, no_capacity_after_loss

    a, b = [1, 1, 0, 0, 1, 1], [0, 1, 1, 0, 0, 1]
    stats = failover([a, b], 3600.0)
    # A, A, lost -> B, lost (none up), A, A
    assert (stats.hours, stats.interruptions) == (5.0, 2) and stats.availability == pytest.approx(5 / 6)
    # of the two losses (A at tick 2, B at tick 3) one found no zone up
    assert no_capacity_after_loss([a, b]) == pytest.approx(0.5)
    assert stats.no_capacity_after_loss == pytest.approx(0.5)  # the failover job's own: B's loss stranded it


def test_regions_measured_together_give_the_capacity_not_their_product() -> None:
    """Spot is lost across regions together: on the shared traces no region of the three has spot 0.79%
    of the time, 3.6x what the regions' own figures multiplied say (0.22%), and a relaunch after a loss
    finds none far more often. Where the table measured the regions together, that is the plan's figure."""
    from orchestrator.spot.hazards import load_table

    table = load_table()
    order = ("us-west-2", "us-east-2", "us-east-1")
    joint = table.joint_capacity[("aws", "p3.2xlarge", order, 1)]
    one_by_one = [table.capacity[("aws", "p3.2xlarge", r, 1)][0] for r in order]
    product = (1 - one_by_one[0]) * (1 - one_by_one[1]) * (1 - one_by_one[2])
    assert 1 - joint[0] > 2 * product  # measured: more often without spot than independence says
    h = table.for_offer("aws", "p3.2xlarge", "V100", 1, order)
    assert h.no_capacity == pytest.approx(1 - joint[0]) and h.relaunch_no_capacity == pytest.approx(joint[2])
    assert h.capacity_source == "measured together over us-west-2, us-east-2, us-east-1"
    table.joint_capacity.clear()  # without the joint measurement: composed as independent regions
    assert table.for_offer("aws", "p3.2xlarge", "V100", 1, order).no_capacity == pytest.approx(
        product, rel=0.05
    )


def test_regions_never_measured_together_are_taken_as_dependent_as_the_sets_that_were() -> None:
    """Where a set of regions was never measured on one clock, the plan composes the regions' own
    figures with the dependence fitted on the sets that were. Checked leaving each measured set out of
    the fit and predicting it: the dependent figures are far closer to what was measured than
    independence (no spot anywhere at a random moment, and right after a loss), and an offer whose
    capacity is borrowed gets them, saying so."""
    import math
    import statistics

    from orchestrator.spot import region_dependence
    from orchestrator.spot.hazards import load_table

    table = load_table()
    sets = {frozenset(k[2]) for k in table.joint_capacity if len(k[2]) > 1}
    assert len(sets) == 4  # three pairs and the triple of the shared traces' regions
    errors: dict[str, list[float]] = {"dependent": [], "independent": [], "after": [], "after indep": []}
    for left_out in sets:
        fitted = region_dependence.fit(table.capacity, table.joint_capacity, leave_out=left_out)
        assert fitted is not None and 0.5 < fitted.alpha < 1.0 and 0.0 <= fitted.beta < 1.0
        for (cloud, itype, order, _n), (avail, _down, after) in table.joint_capacity.items():
            if frozenset(order) != left_out:
                continue
            downs = [1 - table.capacity[(cloud, itype, r, 1)][0] for r in order]
            own_after = table.capacity[(cloud, itype, order[0], 1)][2]
            errors["dependent"].append(abs(math.log(fitted.none_up(downs) / (1 - avail))))
            errors["independent"].append(abs(math.log(math.prod(downs) / (1 - avail))))
            errors["after"].append(abs(math.log(own_after * fitted.others_down(downs[1:]) / after)))
            errors["after indep"].append(abs(math.log(own_after * math.prod(downs[1:]) / after)))
    mean = {k: statistics.mean(v) for k, v in errors.items()}
    assert mean["dependent"] < 0.5 * mean["independent"], mean
    assert mean["after"] < 0.25 * mean["after indep"], mean

    regions = ("us-east-1", "us-east-2", "us-west-2")
    h = table.for_offer("aws", "g6e.2xlarge", "L40S", 1, regions)  # capacity borrowed, never joint
    own = [table.for_offer("aws", "g6e.2xlarge", "L40S", 1, (r,)).no_capacity for r in regions]
    assert h.no_capacity > 2 * math.prod(own) and h.no_capacity <= min(own)
    assert "taken as dependent as 4 region set(s) measured together" in h.capacity_source
    assert h.relaunch_no_capacity > 5 * h.no_capacity  # a loss seldom leaves the other regions up


def test_multi_node_traces_measure_the_correlation(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    from build_hazards import build

    one = ([1] * 99 + [0]) * 10
    two = [2 if x else 0 for x in one]
    two[50] = two[250] = 1  # two more losses of one node of the pair
    for nodes, counts in ((1, one), (2, two)):
        folder = tmp_path / "availability" / f"{nodes}-node" / "aws-01-01-2024"
        folder.mkdir(parents=True)
        trace(folder / "us-east-1a_v100_1.json", counts)
    payload = build(tmp_path)
    single, pair = measure(one, 600.0), measure(two, 600.0, nodes=2)
    factor = pair.rate_per_hour / single.rate_per_hour
    assert payload["correlation"]["source"].startswith("measured: 1 multi-node")
    assert payload["correlation"]["rho"] == pytest.approx(1 - (factor - 1), abs=1e-4)
    assert 0 < payload["correlation"]["rho"] < 1


def test_imported_multi_node_evidence_moves_the_correlation_by_its_hours(tmp_path: Path) -> None:
    """rho is the published figure until the user brings N-node evidence beside one-node evidence of the
    same zone: a 4-node trace in us-east-1a (where the bundled one-node traces are) whose losses come
    as if the nodes were independent pulls rho toward 0 by its hours against RHO_PRIOR_HOURS."""
    from orchestrator.spot.hazards import RHO_PRIOR_HOURS

    home = tmp_path / "home"
    before = load_table(home)
    assert before.rho == pytest.approx(float(bundled()["correlation"]["rho"]))
    counts = ([4] * 10 + [3]) * 600  # a node lost every 10 minutes held: ~6/h for the job
    out = ftorch(home, "hazards", "import", str(trace(tmp_path / "four.json", counts, gap=60.0)),
                 "--cloud", "aws", "--instance-type", "p3.2xlarge", "--zone", "us-east-1a", "--nodes", "4",
                 "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["imported"]
    ones = [e for e in before.measured if e.zone == "us-east-1a" and e.nodes == 1]
    rate_1 = sum(e.interruptions for e in ones) / sum(e.hours for e in ones)
    factor = (row["interruptions"] / row["hours"]) / rate_1
    estimate = min(1.0, max(0.0, 1 - (factor - 1) / 3))
    after = load_table(home)
    expected = (before.rho * RHO_PRIOR_HOURS + estimate * row["hours"]) / (RHO_PRIOR_HOURS + row["hours"])
    assert after.rho == pytest.approx(expected) and after.rho < before.rho
    assert after.correlation_source.startswith("1 multi-node record(s) of yours")
    four = after.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-east-1"], nodes=4)
    assert (
        four.rate_per_hour
        > before.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-east-1"], nodes=4).rate_per_hour
    )


def test_the_rate_a_job_meets_spreads_as_much_as_the_weeks_of_the_traces_do(tmp_path: Path) -> None:
    """A zone's mean is known to a few percent after weeks of traces, but the rate a job meets next month
    is not (traces of other seasons: bench/hazards_unseen.py). build_hazards measures the week-to-week
    spread beyond Poisson noise; intervals carry it, means do not move."""
    sys.path.insert(0, str(REPO / "scripts"))
    from build_hazards import build

    week = 7 * 24 * 6  # ticks of 600 s
    calm, stormy = ([1] * 71 + [0]) * (week // 72), ([1] * 11 + [0]) * (week // 12)
    steady = ([1] * 23 + [0]) * (4 * week // 24)  # the same mean rate every week
    for zone, counts in (("us-east-1a", calm + stormy + calm + stormy), ("us-east-1b", steady)):
        folder = tmp_path / "s" / "availability" / "1-node" / "aws-01-01-2024"
        folder.mkdir(parents=True, exist_ok=True)
        trace(folder / f"{zone}_v100_1.json", counts)
    payload = build(tmp_path / "s")
    # weekly rates (per hour held) 0.085 and 0.545 around the zone's 0.307: relative variance 0.752 less
    # Poisson's 0.020; the steady zone's weeks are alike (0 less Poisson's 0.024); averaged as variances:
    # sqrt((0.732 - 0.024) / 2) = 0.595
    assert payload["drift"]["cv"] == pytest.approx(0.595, abs=0.005), payload["drift"]
    assert payload["drift"]["source"].startswith("measured: the week-to-week spread of 2 zones")
    # availability: the calm weeks' 71/72 and the stormy weeks' 11/12 around the zone's 0.951 are logit
    # deviations +1.289 and -0.576, the steady zone's 0; pooled over 8 weeks less 2 zones:
    # sqrt((2 x 1.289^2 + 2 x 0.576^2) / 6) = 0.815; a stormy week is a week with less spot: corr -1
    assert payload["drift"]["availability_logit_sd"] == pytest.approx(0.815, abs=0.005), payload["drift"]
    assert payload["drift"]["availability_rate_corr"] < -0.99

    table = HazardTable.from_json(bundled())
    assert table.drift_cv == pytest.approx(bundled()["drift"]["cv"]) and 0.3 < table.drift_cv < 1.5
    (zone,) = [
        z for z in table.zones_of("aws", "p3.2xlarge", "V100", 1, "us-west-2") if z.name == "us-west-2b"
    ]
    low, high = table.interval(zone.gamma)
    mean_only = (zone.gamma.quantile(0.05), zone.gamma.quantile(0.95))
    assert high / low > 5 * (mean_only[1] / mean_only[0]), (low, high, mean_only)  # the weeks, not the count
    assert low < zone.gamma.mean < high
    shown = json.loads(ftorch(tmp_path / "home", "hazards", "--json").stdout)
    assert shown["drift"]["cv"] == table.drift_cv and "week-to-week" in shown["drift"]["source"]
    assert shown["drift"]["availability_logit_sd"] == table.availability_logit_sd > 0.5
    assert shown["drift"]["availability_rate_corr"] == table.availability_rate_corr < -0.5
    (row,) = [r for r in shown["rows"] if r["zone"] == "us-west-2b"]
    assert (row["low_per_hour"], row["high_per_hour"]) == pytest.approx((low, high))
    hazard = table.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-west-2"])
    table.drift_cv = 0.0
    without = table.for_offer("aws", "p3.2xlarge", "V100", 1, ["us-west-2"])
    assert hazard.rate_per_hour == without.rate_per_hour  # the plan's cost rests on the mean: unchanged
    assert hazard.low_per_hour < without.low_per_hour and hazard.high_per_hour > 2 * without.high_per_hour
