"""The bundled hazard prior against spot traces it was never built from.

The bundled table (orchestrator/data/hazards.json, scripts/build_hazards.py) is built from the 9 zones of
one availability trace set (AWS p3.2xlarge, 45 days from 2023-02-15). The same public repository,
github.com/skypilot-org/spot-traces ("Can't Be Late", NSDI '24), holds other recordings that ftorch never
reads: preemption traces of instances held (1 and 4 nodes, 2023), availability traces of another season
(2022, 1 and 8 GPUs, K80 too) and of 16 nodes. This script measures each of those with the same rule the
table uses (trainer-free: orchestrator.spot.hazards.measure) and sets it beside what the bundled prior
predicts for that cloud, instance, zone and node count: the posterior mean and the 90% interval of the
rate a job meets (the mean's uncertainty and the week-to-week drift the table measured on its own
traces), with no user evidence. Nothing here feeds back into the table. `--no-drift` shows the interval
of the mean alone (what the table said before it measured drift).

    git clone https://github.com/skypilot-org/spot-traces /tmp/spot-traces
    .venv/bin/python bench/hazards_unseen.py /tmp/spot-traces

Prints a markdown table and a summary (docs/benchmarks.md records the output).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.spot import hazards  # noqa: E402

#: the traces' file names: <zone>_<what>_<count>; what each stands for (the repository's README)
INSTANCES = {
    ("v100", 1): ("p3.2xlarge", "V100", 1),
    ("v100", 8): ("p3.16xlarge", "V100", 8),
    ("k80", 1): ("p2.xlarge", "K80", 1),
    ("k80", 8): ("p2.16xlarge", "K80", 8),
}
#: what the bundled table was built from: skipped here (it is not unseen)
SEEN = "availability/1-node/aws-02-15-2023"


def _poisson_interval(events: int, hours: float) -> tuple[float, float]:
    """A 90% interval for a rate measured as `events` in `hours` (the exact Poisson one, via gamma)."""
    low = hazards.Gamma(events, hours).quantile(0.05) if events else 0.0
    return low, hazards.Gamma(events + 1, hours).quantile(0.95)


def rows(root: Path, drift: bool = True) -> list[dict[str, object]]:
    table = hazards.HazardTable.from_json(hazards.bundled())
    if not drift:
        table.drift_cv = 0.0
    out: list[dict[str, object]] = []
    for path in sorted(root.glob("*/*-node/*/*.json")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SEEN):
            continue
        kind, node_dir, when = path.parts[-4], path.parts[-3], path.parts[-2]
        cloud = when.split("-")[0]
        zone, what, *rest = path.stem.split("_")
        count = int(rest[0]) if rest and rest[0].isdigit() else 1
        nodes = int(node_dir.split("-")[0])
        instance = INSTANCES.get((what, count))
        gap, counts = hazards.read_trace(path)
        measured = hazards.measure(counts, gap, nodes)
        row: dict[str, object] = {
            "trace": rel,
            "kind": kind,
            "nodes": nodes,
            "hours": measured.hours,
            "events": measured.interruptions,
            "measured": measured.rate_per_hour,
            "measured_interval": _poisson_interval(measured.interruptions, measured.hours),
        }
        if instance is None:  # CPU instances (r5.16xlarge, c3-highcpu-88): ftorch plans GPUs only
            row["scope"] = f"not a GPU instance ({what}): outside what ftorch plans"
            out.append(row)
            continue
        itype, accelerator, gpus = instance
        region = zone[:-1]
        zones = table.zones_of(cloud, itype, accelerator, gpus, region)
        known = next((z for z in zones if z.name == zone), None)
        entry = known or zones[0]
        factor = hazards.correlation_factor(nodes, table.rho)
        gamma = entry.gamma
        if known is None and len(zones) > 1:  # a zone never measured in a measured region: its pool
            gamma = table.region_prior(cloud, itype, accelerator, gpus, region)[0]
        row.update(
            instance=itype,
            level="zone" if known else entry.level,
            predicted=gamma.mean * factor,
            interval=tuple(bound * factor for bound in table.interval(gamma)),
        )
        out.append(row)
    return out


def render(found: list[dict[str, object]]) -> str:
    lines = [
        "| trace (never read by ftorch) | instance | nodes | hours held | interruptions | measured /h (90%) "
        "| predicted /h (90%) | level | measured / predicted | inside |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios, inside, overlap = [], 0, 0
    gpu = [r for r in found if "predicted" in r]
    for r in found:
        lo, hi = r["measured_interval"]  # type: ignore[misc]
        measured = f"{r['measured']:.3f} ({lo:.3f}-{hi:.3f})"
        if "predicted" not in r:
            lines.append(
                f"| {r['trace']} | - | {r['nodes']} | {r['hours']:.0f} | {r['events']} | {measured} "
                f"| {r['scope']} | | | |"
            )
            continue
        plo, phi = r["interval"]  # type: ignore[misc]
        ratio = r["measured"] / r["predicted"] if r["predicted"] else math.inf  # type: ignore[operator]
        ins = plo <= r["measured"] <= phi  # type: ignore[operator]
        inside += ins
        overlap += lo <= phi and plo <= hi
        if r["events"]:
            ratios.append(ratio)
        lines.append(
            f"| {r['trace']} | {r['instance']} | {r['nodes']} | {r['hours']:.0f} | {r['events']} | {measured} "
            f"| {r['predicted']:.3f} ({plo:.3f}-{phi:.3f}) | {r['level']} | {ratio:.2f} | "
            f"{'yes' if ins else 'NO'} |"
        )
    logs = [abs(math.log(x)) for x in ratios if x > 0]
    lines += [
        "",
        f"GPU traces: {len(gpu)}; the measured rate inside the predicted 90% interval: {inside} of {len(gpu)}; "
        f"the two intervals overlap: {overlap} of {len(gpu)}; measured / predicted median "
        f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
        f"median |log ratio| {statistics.median(logs):.2f}.",
    ]
    return "\n".join(lines)


#: job sizes the correlation check measures on each multi-instance availability trace
NODES = (2, 4, 8, 16)


def correlation(root: Path) -> str:
    """The bundled correlation between nodes (rho: a job on N nodes sees the one-node rate x (1 + (N-1)
    (1 - rho))) against what availability traces that count several instances show: on one trace, one
    clock and one zone, the rate of a job holding N against one holding 1 gives rho for that N."""
    table = hazards.HazardTable.from_json(hazards.bundled())
    lines = ["| trace (never read by ftorch) | " + " | ".join(f"{n} nodes: rate x, rho" for n in NODES) + " |",
             "|---|" + "---|" * len(NODES)]  # fmt: skip
    found: list[float] = []
    for path in sorted(root.glob("availability/*-node/*/*.json")):
        gap, counts = hazards.read_trace(path)
        one = hazards.measure(counts, gap, 1).rate_per_hour
        sizes = [n for n in NODES if max(counts) >= n]
        if not one or not sizes or path.relative_to(root).as_posix().startswith(SEEN):
            continue
        cells = []
        for n in NODES:
            if n not in sizes:
                cells.append("-")
                continue
            times = hazards.measure(counts, gap, n).rate_per_hour / one
            rho = 1.0 - (times - 1.0) / (n - 1)
            found.append(rho)
            cells.append(f"x{times:.2f}, {rho:.2f}")
        lines.append(f"| {path.relative_to(root).as_posix()} | " + " | ".join(cells) + " |")
    if not found:
        return ""
    bundled = " | ".join(f"x{hazards.correlation_factor(n, table.rho):.2f}, {table.rho:.2f}" for n in NODES)
    lines.append(f"| the bundled table ({table.correlation_source}) | {bundled} |")
    return "\n".join(lines) + (
        f"\n\nrho measured: median {statistics.median(found):.2f} (range {min(found):.2f}-{max(found):.2f}, "
        f"{len(found)} trace-sizes); bundled {table.rho:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="a checkout of github.com/skypilot-org/spot-traces")
    parser.add_argument("--no-drift", action="store_true", help="the mean's interval alone, no drift")
    args = parser.parse_args()
    found = rows(args.root, drift=not args.no_drift)
    if not found:
        print(f"no traces under {args.root} (expected <kind>/<N>-node/<date>/<zone>_<gpu>_<n>.json)")
        return 2
    print(render(found))
    nodes = correlation(args.root)
    if nodes:
        print("\ncorrelation between nodes, measured where a trace counts several instances\n\n" + nodes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
