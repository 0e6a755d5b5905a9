"""Build the bundled spot hazard table (orchestrator/data/hazards.json) from measured availability traces.

Source: ../shared/data/spot-traces/ ("Can't Be Late", NSDI '24, repository skypilot-org/spot-traces),
laid out as availability/<N>-node/<cloud>-<date>/<zone>_<accelerator>_<gpus>.json, each
{"metadata": {"gap_seconds": G}, "data": [instances obtainable per tick]}. What this script decides:

- a tick with at least N obtainable is time a job of N instances could hold; a fall below N while
  holding is one interruption (orchestrator/spot/hazards.py `measure`); exposure is hours held;
- the zone's region is its name less the trailing letter (us-east-1a -> us-east-1);
- the instance type comes from INSTANCE below (the data README: the AWS V100 traces were recorded for
  p3.2xlarge); a trace whose (cloud, accelerator, GPUs) is not listed there is refused, not guessed;
- correlation between nodes: where N-node traces share a zone with 1-node ones, rho is measured from
  them (N-node rate = 1-node rate x (1 + (N-1)(1-rho))); otherwise the published figure in
  PUBLISHED_RHO is bundled and said to be that.
Every source file is recorded with its sha256, so a rebuild from other data shows in the diff.

With --report, prints the markdown table of docs/benchmarks.md: each zone's measured rate against what
the model predicts for it from the other zones alone (leave-one-zone-out), with the 90% interval.

Usage: python scripts/build_hazards.py [SOURCE_DIR] [--out orchestrator/data/hazards.json] [--report]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import re
import sys
from pathlib import Path

from orchestrator.spot.hazards import Evidence, HazardTable, TraceStats, measure, read_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "data" / "spot-traces"
DEFAULT_OUT = REPO / "orchestrator" / "data" / "hazards.json"
#: (cloud, accelerator as the file names it, GPUs) -> (instance type, the catalog's accelerator name)
INSTANCE = {("aws", "v100", 1): ("p3.2xlarge", "V100")}
#: Spot-and-Scoot (arXiv 2604.16457): interruptions of one type in one AZ fall within 3 minutes of each
#: other in >92% of cases; used only while no multi-node trace measures it
PUBLISHED_RHO = (
    0.92,
    "Spot-and-Scoot, arXiv 2604.16457: >92% of one type's interruptions in an AZ within 3 min",
)
NAME = re.compile(r"^(?P<zone>[a-z]+-[a-z]+-\d+[a-z])_(?P<acc>[a-z0-9]+)_(?P<gpus>\d+)$")
ORIGIN = "Can't Be Late (NSDI '24) spot traces, github.com/skypilot-org/spot-traces"


def read_all(source: Path) -> tuple[list[Evidence], list[dict[str, str]]]:
    rows, files = [], []
    for path in sorted(source.rglob("*.json")):
        rel = path.relative_to(source)
        node_dir = next((p for p in rel.parts if p.endswith("-node")), None)
        cloud_dir = rel.parts[-2] if len(rel.parts) > 1 else ""
        match = NAME.match(path.stem)
        if node_dir is None or match is None:
            sys.exit(f"{rel}: not <N>-node/<cloud>-<date>/<zone>_<accelerator>_<gpus>.json")
        cloud = cloud_dir.split("-")[0]
        key = (cloud, match["acc"], int(match["gpus"]))
        if key not in INSTANCE:
            sys.exit(f"{rel}: no instance type for {key} in INSTANCE; add it with its source")
        itype, acc = INSTANCE[key]
        nodes = int(node_dir.split("-")[0])
        gap, counts = read_trace(path)
        stats = measure(counts, gap, nodes)
        zone = match["zone"]
        rows.append(
            Evidence(
                cloud=cloud, instance_type=itype, region=zone[:-1], zone=zone, nodes=nodes,
                hours=round(stats.hours, 4), interruptions=stats.interruptions,
                source=f"spot-traces {rel}", accelerator=acc, count=int(match["gpus"]),
                availability=round(stats.availability, 5), mean_down_s=round(stats.mean_down_s, 1),
            )
        )  # fmt: skip
        files.append({"path": str(rel), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "gap_seconds": gap, "ticks": stats.ticks})  # fmt: skip
    return rows, files


def regions(source: Path, rows: list[Evidence]) -> list[dict[str, object]]:
    """Capacity of each region as a whole (some zone of it obtainable), measured on the traces' common
    clock: zones of one region are short of spot together, so this is not their product."""
    from orchestrator.spot.hazards import no_capacity_after_loss, region_capacity

    groups: dict[tuple[str, str, str, int], list[Evidence]] = {}
    for e in rows:
        groups.setdefault((e.cloud, e.instance_type, e.region or "", e.nodes), []).append(e)
    out = []
    for (cloud, itype, region, nodes), members in sorted(groups.items()):
        traces = [read_trace(source / e.source.removeprefix("spot-traces ")) for e in members]
        stats = region_capacity([c for _, c in traces], traces[0][0], nodes)
        out.append({"cloud": cloud, "instance_type": itype, "region": region, "nodes": nodes,
                    "zones": sorted(e.zone or "" for e in members), "availability": round(stats.availability, 5),
                    "mean_down_s": round(stats.mean_down_s, 1),
                    "no_capacity_after_interruption": round(no_capacity_after_loss([c for _, c in traces], nodes), 5)})  # fmt: skip
    return out


def failovers(source: Path, rows: list[Evidence]) -> list[dict[str, object]]:
    """A job failing over between the zones of each ordered sequence of measured regions (every order
    the planner may try them in: it tries the cheapest first)."""
    from itertools import permutations

    from orchestrator.spot.hazards import failover

    out = []
    groups: dict[tuple[str, str, int], dict[str, list[Evidence]]] = {}
    for e in rows:
        groups.setdefault((e.cloud, e.instance_type, e.nodes), {}).setdefault(e.region or "", []).append(e)
    for (cloud, itype, nodes), by_region in sorted(groups.items()):
        names = sorted(by_region)
        for k in range(1, len(names) + 1):
            for order in permutations(names, k):
                members = [e for r in order for e in sorted(by_region[r], key=lambda e: e.zone or "")]
                traces = [read_trace(source / e.source.removeprefix("spot-traces "))[1] for e in members]
                stats = failover(
                    traces, read_trace(source / members[0].source.removeprefix("spot-traces "))[0], nodes
                )
                out.append({"cloud": cloud, "instance_type": itype, "nodes": nodes, "regions": list(order),
                            "hours": round(stats.hours, 4), "interruptions": stats.interruptions,
                            "availability": round(stats.availability, 5), "mean_down_s": round(stats.mean_down_s, 1),
                            "no_capacity_after_interruption": round(stats.no_capacity_after_loss, 5)})  # fmt: skip
    return out


def correlation(rows: list[Evidence]) -> dict[str, object]:
    """rho from N-node traces that share a zone with 1-node ones, else the published figure."""
    single = {(e.cloud, e.instance_type, e.zone): e for e in rows if e.nodes == 1}
    estimates = []
    for e in rows:
        one = single.get((e.cloud, e.instance_type, e.zone))
        if e.nodes > 1 and one is not None and one.interruptions and e.hours:
            factor = (e.interruptions / e.hours) / (one.interruptions / one.hours)
            estimates.append(min(1.0, max(0.0, 1.0 - (factor - 1.0) / (e.nodes - 1))))
    if estimates:
        rho = sum(estimates) / len(estimates)
        return {
            "rho": round(rho, 4),
            "source": f"measured: {len(estimates)} multi-node traces in the bundled set",
        }
    return {"rho": PUBLISHED_RHO[0], "source": f"published, not measured here: {PUBLISHED_RHO[1]}"}


#: the window over which a zone's rate is taken to drift: the longest a plan looks ahead (a job of days)
DRIFT_WINDOW_DAYS = 7.0
#: a week's availability is taken as at least this and at most 1 less this (logit of 0 or 1 is infinite)
AVAILABILITY_CLIP = 0.005


def _weeks(source: Path, rows: list[Evidence]) -> list[tuple[Evidence, list[TraceStats]]]:
    """Each one-node zone with interruptions whose trace spans two whole weeks or more, measured week by
    week (DRIFT_WINDOW_DAYS)."""
    out = []
    for e in rows:
        if e.nodes != 1 or not e.interruptions:
            continue
        gap, counts = read_trace(source / e.source.removeprefix("spot-traces "))
        per = int(DRIFT_WINDOW_DAYS * 86400 / gap)
        n = len(counts) // per
        if n >= 2:
            out.append((e, [measure(counts[i * per : (i + 1) * per], gap, e.nodes) for i in range(n)]))
    return out


def drift(source: Path, rows: list[Evidence]) -> dict[str, object]:
    """How much a zone's rate moves from one week to the next: each zone's trace cut into whole weeks,
    the variance of the weekly rates relative to the zone's mean less what Poisson noise alone gives
    (var(r_w) / m^2 - mean(1 / (m h_w))), averaged over the zones; cv is its square root."""
    import numpy as np

    excess, weeks = [], 0
    for e, stats in _weeks(source, rows):
        n = len(stats)
        rates = np.array([s.rate_per_hour for s in stats])
        hours = np.array([max(s.hours, 1e-9) for s in stats])
        mean = e.interruptions / e.hours
        excess.append(float(np.var(rates, ddof=1) / mean**2 - np.mean(1.0 / (mean * hours))))
        weeks += n
    if not excess:
        return {"cv": 0.0, "source": "not measured: no trace spans two weeks"}
    cv = float(np.sqrt(max(float(np.mean(excess)), 0.0)))
    return {
        "cv": round(cv, 4),
        "window_days": DRIFT_WINDOW_DAYS,
        "source": f"measured: the week-to-week spread of {len(excess)} zones' rates beyond Poisson noise "
        f"({weeks} zone-weeks)",
        **capacity_drift(source, rows),
    }


def _logit(a: float) -> float:
    a = min(max(a, AVAILABILITY_CLIP), 1.0 - AVAILABILITY_CLIP)
    return math.log(a / (1.0 - a))


def capacity_drift(source: Path, rows: list[Evidence]) -> dict[str, object]:
    """How much a zone's spot availability moves from one week to the next, and with its rate: each
    zone's trace cut into whole weeks; a week's deviation is logit(its availability) less logit(the
    zone's), pooled over the zones (one degree of freedom per zone); the rate's is log(its rate / the
    zone's), half an interruption where a week had none. The spread is the weeks' whole spread (the
    sampling noise of a week of spells is in it: wider, not narrower); the correlation is Pearson's
    of the two deviations over all zone-weeks."""
    import numpy as np

    logits: list[float] = []
    log_rates: list[float] = []
    zones = 0
    for e, stats in _weeks(source, rows):
        if e.availability is None:
            continue
        mean_logit, mean_rate = _logit(e.availability), e.interruptions / e.hours
        for s in stats:
            logits.append(_logit(s.availability) - mean_logit)
            log_rates.append(math.log(max(s.interruptions, 0.5) / max(s.hours, 1e-9) / mean_rate))
        zones += 1
    if zones == 0 or len(logits) <= zones + 1:
        return {"availability_logit_sd": 0.0}
    dev, rate = np.array(logits), np.array(log_rates)
    sd = float(np.sqrt(np.sum(dev**2) / (len(dev) - zones)))
    corr = float(np.corrcoef(dev, rate)[0, 1])
    return {
        "availability_logit_sd": round(sd, 4),
        "availability_rate_corr": round(corr, 4),
        "availability_source": f"measured: the week-to-week spread of {zones} zones' spot availability "
        f"(logit; sampling noise included) and its correlation with their rates ({len(dev)} zone-weeks)",
    }


def build(source: Path) -> dict[str, object]:
    rows, files = read_all(source)
    if not rows:
        sys.exit(f"{source}: no traces")
    return {
        "provenance": {
            "built_by": "scripts/build_hazards.py",
            "built_at": dt.date.today().isoformat(),
            "origin": ORIGIN,
            "method": "interruption = obtainable count falls below the job's nodes while held; "
            "rate = interruptions / hours held; gamma-Poisson posterior pooled zone<-region<-class<-cloud; "
            "intervals add the measured week-to-week drift",
            "covers": "AWS p3.2xlarge (1x V100) spot, 9 zones of us-east-1/us-east-2/us-west-2, "
            "45 days from 2023-02-15; every other cloud, instance and region borrows from it",
            "files": files,
        },
        "correlation": correlation(rows),
        "drift": drift(source, rows),
        "regions": regions(source, rows),
        "failover": failovers(source, rows),
        "measured": [e.to_json() for e in rows],
    }


def report(payload: dict[str, object]) -> str:
    """Markdown: each zone measured vs predicted from the other zones (leave-one-zone-out)."""
    rows = [Evidence.from_json(r) for r in payload["measured"]]  # type: ignore[union-attr]
    lines = [
        "| zone | hours held | interruptions | measured /h | predicted without it /h (90%) | in interval | "
        "availability | old constant /h |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in rows:
        others = HazardTable([r for r in rows if r.zone != e.zone], 0.0, "")
        g = others.region_prior(e.cloud, e.instance_type, e.accelerator, e.count, e.region or "")[0]
        measured = e.interruptions / e.hours
        lo, hi = g.quantile(0.05), g.quantile(0.95)
        lines.append(
            f"| {e.zone} | {e.hours:,.0f} | {e.interruptions} | {measured:.3f} | {g.mean:.3f} "
            f"({lo:.3f}-{hi:.3f}) | {'yes' if lo <= measured <= hi else 'no'} | {e.availability:.2f} | 0.050 |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", action="store_true", help="print the docs/benchmarks.md table")
    args = parser.parse_args()
    payload = build(args.source)
    args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(payload['measured'])} traces")  # type: ignore[arg-type]
    if args.report:
        print(report(payload))


if __name__ == "__main__":
    main()
