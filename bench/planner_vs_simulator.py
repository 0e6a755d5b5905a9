"""The planner's expected cost against the simulator's on the shared spot traces (docs/benchmarks.md).

    .venv/bin/python bench/planner_vs_simulator.py [--starts 40]

For three jobs (examples/llama3-8b-lora.yaml, llama3-8b-full.yaml, llama3-70b-qlora.yaml, each on
AWS with `fallback: on-demand`), the planner's chosen AWS offer is put in the traces' regions, with the
hazard of the traces relabelled to it (the traces are p3.2xlarge's: "what if this instance had that
hazard"), and the plan's expected cost (GPU hours; storage and egress are left out, the simulator has
neither) is set against the mean cost of the simulator replaying the traces (policy spot-fallback: spot
while it can be had, on demand for good from the first launch that finds none, as SkyPilot does with
an on-demand fallback) from `--starts` start offsets. The job's numbers (compute hours, prices,
checkpoint interval, restart overhead) are the plan's, so the ratio measures the hazard and capacity
model, not the time model.

Three checks: `in-sample` (hazards fitted on the whole traces, simulated on the whole traces),
`held-out` (fitted on the first half of the 45 days, simulated on the second half: traces the model
never saw) and `each week` (fitted on all, simulated from starts in one week at a time: how often a
week's cost falls inside the plan's 90% band, orchestrator/spot/season.py). `--unseen DIR` replays the
plans on other seasons' traces instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.jobfile.spec import load_job  # noqa: E402
from orchestrator.sizing.catalog import Catalog, Offer, bundled_catalog  # noqa: E402
from orchestrator.sizing.history import History  # noqa: E402
from orchestrator.sizing.planner import make_plan, ordered_regions  # noqa: E402
from orchestrator.spot.hazards import (  # noqa: E402
    Evidence,
    HazardTable,
    bundled,
    failover,
    measure,
    no_capacity_after_loss,
    region_capacity,
)
from orchestrator.spot.policy import make_policy  # noqa: E402
from orchestrator.spot.region_order import lost_hours  # noqa: E402
from orchestrator.spot.simulator import JobNumbers, simulate, start_ticks  # noqa: E402
from orchestrator.spot.traces import Zones, load_zones  # noqa: E402

TRACES = ROOT.parent / "shared/data/spot-traces/availability/1-node/aws-02-15-2023"
TRACED = ("us-east-1", "us-east-2", "us-west-2")  # the regions of the bundled traces
JOBS = ("llama3-8b-lora.yaml", "llama3-8b-full.yaml", "llama3-70b-qlora.yaml")
SETS = {"us-east-1": ("us-east-1",), "us-east-2": ("us-east-2",), "us-west-2": ("us-west-2",),
        "all 3 regions": ("us-east-1", "us-east-2", "us-west-2")}  # fmt: skip


def table_for(zones: Zones, itype: str, acc: str, count: int) -> HazardTable:
    """A hazard table measured on `zones`, labelled as the instance `itype`."""
    rows, regions = [], {}
    for name, up in zip(zones.names, zones.up, strict=True):
        zone = name.split("_")[0]
        s = measure(up.astype(float), zones.gap_s)
        rows.append(Evidence("aws", itype, zone[:-1], zone, 1, s.hours, s.interruptions, f"trace {zone}", acc,
                             count, s.availability, s.mean_down_s))  # fmt: skip
        regions.setdefault(zone[:-1], []).append(up.astype(float))
    prior = bundled()
    rho, drift = float(prior["correlation"]["rho"]), prior["drift"]
    # the week-to-week spreads are the bundled table's (measured on all 45 days): the plan's 90% band
    table = HazardTable(rows, rho, "bundled", drift_cv=float(drift["cv"]),
                        availability_logit_sd=float(drift["availability_logit_sd"]),
                        availability_rate_corr=float(drift["availability_rate_corr"]))  # fmt: skip
    from itertools import permutations

    for k in range(1, len(regions) + 1):
        for order in permutations(sorted(regions), k):
            stats = failover([t for r in order for t in regions[r]], zones.gap_s)
            table.failovers[("aws", itype, order, 1)] = (stats.hours, stats.interruptions)
            table.joint_capacity[("aws", itype, order, 1)] = (stats.availability, stats.mean_down_s,
                                                              stats.no_capacity_after_loss)  # fmt: skip
    for region, traces in regions.items():
        cap = region_capacity(traces, zones.gap_s)
        table.capacity[("aws", itype, region, 1)] = (cap.availability, cap.mean_down_s,
                                                     no_capacity_after_loss(traces))  # fmt: skip
    return table


def subset(zones: Zones, regions: tuple[str, ...], lo: int, hi: int) -> Zones:
    """The zones of `regions`, in that order of regions (the simulator tries zones in this order)."""
    keep = [i for r in regions for i, n in enumerate(zones.names) if n.split("_")[0][:-1] == r]
    return Zones([zones.names[i] for i in keep], zones.gap_s, zones.up[keep, lo:hi])


def compare(
    job_file: str,
    zones: Zones,
    fit: tuple[int, int],
    test: tuple[int, int],
    starts: int,
    replays: dict[str, tuple[tuple[str, ...], Zones]] | None = None,
) -> list[str]:
    """One row per region set: the plan fitted on `zones[fit]`, replayed on `zones[test]`; or, with
    `replays` (label -> (regions, other traces)), replayed on those other traces whole."""
    spec = load_job(ROOT / "examples" / job_file, ["resources.clouds=[aws]", "resources.fallback=on-demand",
                                                   "resources.spot=true", f"resources.regions=[{','.join(TRACED)}]"],
                    check_support=False)  # fmt: skip
    base = make_plan(spec, history=History())
    c = base.chosen
    assert c is not None and c.cloud == "aws", job_file
    # one price in every region (the simulator has one): the catalog's median over the traces' regions
    (listed,) = [
        o for o in bundled_catalog().offers if o.cloud == "aws" and o.instance_type == c.instance_type
    ]
    od, spot, _ = listed.prices_in(list(TRACED))
    assert od is not None and spot is not None, c.instance_type
    lines = []
    sets = {label: (regions, zones) for label, regions in SETS.items()} if replays is None else replays
    for label, (regions, played) in sets.items():
        fitted = table_for(subset(zones, regions, *fit), c.instance_type, c.accelerator, c.count)
        offer = Offer("aws", c.instance_type, c.accelerator, c.count, c.gpu_memory_gib, od, spot, c.interconnect,
                      regions, None, c.host_memory_gib, region_prices={r: (od, spot) for r in regions})  # fmt: skip
        pinned = spec.model_copy(deep=True)
        pinned.checkpoint.region = regions[0]
        plan = make_plan(pinned, catalog=Catalog((offer,), "bench"), history=History(), hazards=fitted)
        p = plan.candidates[0]
        moved = (p.storage_usd or 0.0) + (p.egress_usd or 0.0)
        predicted = p.expected_cost_usd - moved
        low, high = p.expected_cost_low_usd - moved, p.expected_cost_high_usd - moved
        job = JobNumbers(p.est_hours * 3600.0, p.spot_hourly_usd or 0.0, p.ondemand_hourly_usd or 0.0,
                         p.checkpoint_interval_s, p.restart_overhead_s)  # fmt: skip
        # the simulator tries the regions in the order the launch would (the plan's region_order rule)
        order = ordered_regions(offer, regions, True, c.nodes, data_usd_per_hour=p.data_usd_per_hour,
                                rates_per_hour=p.region_rates_per_hour,
                                lost_h=lost_hours(p.restart_overhead_s, p.checkpoint_interval_s))  # fmt: skip
        replay = subset(played, order, *test) if replays is None else subset(played, order, 0, played.n_ticks)
        ticks = start_ticks(replay, starts, job.ondemand_only_s() * 3)
        results = [simulate(make_policy("spot-fallback"), job, replay, t) for t in ticks]
        simulated = sum(r.cost_usd for r in results) / len(results)
        preempt = sum(r.preemptions for r in results) / len(results)
        od_share = sum(r.ondemand_s for r in results) / max(
            1e-9, sum(r.ondemand_s + r.spot_s for r in results)
        )
        lines.append(
            f"| {job_file.removesuffix('.yaml')} | {c.instance_type} | {label} | {p.est_hours:.1f} | "
            f"{p.interruption_rate_per_hour:.2f} | {p.expected_interruptions:.1f} / {preempt:.1f} | "
            f"{p.fallback_share:.0%} / {od_share:.0%} | ${predicted:,.2f} | ${low:,.2f}-${high:,.2f} | "
            f"${simulated:,.2f} | {predicted / simulated:.2f} | {'yes' if low <= simulated <= high else 'NO'} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--unseen", type=Path, help="a checkout of skypilot-org/spot-traces: also replay "
                        "the plans (fitted on all 45 bundled days) on its other seasons' availability traces")  # fmt: skip
    args = parser.parse_args()
    zones = load_zones([str(TRACES)])
    if args.unseen:
        unseen(zones, args.unseen, args.starts)
        return
    n, mid = zones.n_ticks, zones.n_ticks // 2
    head = (
        "| job | instance | zones | compute h | rate/h | interruptions plan / sim | on demand plan / sim | "
        "plan $ | plan 90% | simulated $ | plan / sim | sim in 90% |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for title, fit, test in (("in-sample (fitted and replayed on all 45 days)", (0, n), (0, n)),
                             ("held-out (fitted on days 1-22, replayed on days 23-45)", (0, mid), (mid, n))):  # fmt: skip
        print(f"\n{title}\n\n{head}")
        lines = [line for job_file in JOBS for line in compare(job_file, zones, fit, test, args.starts)]
        print("\n".join(lines) + "\n\n" + inside(lines), flush=True)
    weekly(zones, args.starts)


def weekly(zones: Zones, starts: int) -> None:
    """The band's width: the plan fitted on all 45 days against the simulator started in each week (runs
    may end in the next half week), every job and region set; the rows outside the band are printed."""
    per, n = int(7 * 86400 / zones.gap_s), zones.n_ticks
    lines = []
    for job_file in JOBS:
        for week in range(n // per):
            rows = compare(job_file, zones, (0, n), (week * per, min(n, (week + 1) * per + per // 2)), starts)
            lines += [f"week {week + 1}: {row}" for row in rows]
    print("\neach week of the 45 days (fitted on all of them, started in that week)\n")
    print("\n".join(line for line in lines if not line.endswith("| yes |")) + "\n\n" + inside(lines))


#: availability traces of other seasons in skypilot-org/spot-traces (p3.2xlarge too): label -> (region,
#: files); a 16-node trace counts instances obtainable, and a one-node job is up with one
UNSEEN = {
    "us-west-2, Oct-Nov 2022 (2a, 2b)": ("us-west-2", ["availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json",
                                                       "availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json"]),
    "us-west-2, Aug-Sep 2023 (2a, 2c)": ("us-west-2", ["availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json",
                                                       "availability/16-node/aws-08-27-2023/us-west-2c_v100_1.json"]),
    "us-east-2, Aug-Sep 2023 (2b)": ("us-east-2", ["availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json"]),
}  # fmt: skip


def unseen(zones: Zones, root: Path, starts: int) -> None:
    """The plan as ftorch makes it (the bundled 45 days, pinned to the region) against the simulator on
    another season's traces of that region, which ftorch never read."""
    replays = {}
    for label, (region, files) in UNSEEN.items():
        played = load_zones([str(root / f) for f in files])
        played.names = [Path(f).stem for f in files]
        replays[label] = ((region,), played)
    head = (
        "| job | instance | replayed on | compute h | rate/h | interruptions plan / sim | on demand plan / sim | "
        "plan $ | plan 90% | simulated $ | plan / sim | sim in 90% |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    print(f"\nfitted on the bundled 45 days (Feb-Mar 2023), replayed on traces ftorch never read\n\n{head}")
    lines = [
        line
        for job_file in JOBS
        for line in compare(job_file, zones, (0, zones.n_ticks), (0, 0), starts, replays)
    ]
    print("\n".join(lines) + "\n\n" + inside(lines), flush=True)


def inside(lines: list[str]) -> str:
    """How many rows' simulated cost fell inside the plan's 90% band."""
    hits = sum(line.endswith("| yes |") for line in lines)
    return f"simulated cost inside the plan's 90% band: {hits} of {len(lines)}"


if __name__ == "__main__":
    main()
