"""The spot-policy table in docs/benchmarks.md: every policy on the shared spot traces, many start offsets.

    .venv/bin/python bench/simulate_policies.py                 # print the section (markdown)
    .venv/bin/python bench/simulate_policies.py --write docs/benchmarks.md   # and replace it there

Each job runs from `--starts` start offsets spread evenly over the 45-day traces, once in each single
zone (9 runs per offset, averaged) and once with all 9 zones open to the job. Prices are AWS p3.2xlarge
(the traces' instance) from the bundled catalog snapshot: on demand $3.06/h, spot $0.66/h (median).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.policy import POLICY_NAMES, make_policy  # noqa: E402
from orchestrator.simulator import JobNumbers, Summary, simulate, start_ticks, sweep  # noqa: E402
from orchestrator.traces import load_zones  # noqa: E402

HEADING = "## Spot policies on real traces"
DEFAULT_TRACES = ROOT.parent / "shared/data/spot-traces/availability/1-node/aws-02-15-2023"
H = 3600.0


def _merge(parts: list[Summary]) -> tuple[float, float, float]:
    """Mean cost ratio, share met and mean preemptions over several equally sized sweeps."""
    n = len(parts)
    return (
        sum(p.mean_cost_vs_ondemand for p in parts) / n,
        sum(p.met_share or 0.0 for p in parts) / n,
        sum(p.mean_preemptions for p in parts) / n,
    )


def speed(traces: Path) -> dict[str, float]:
    """Seconds to simulate one job that needs the whole 45-day trace (9 zones), per policy."""
    zones = load_zones([str(traces)])
    days = zones.n_ticks * zones.gap_s / 86400.0
    job = JobNumbers(0.9 * days * 86400.0, 0.66, 3.06, 600, 300, deadline_s=days * 86400.0)
    out = {}
    for name in POLICY_NAMES:
        began = time.perf_counter()
        simulate(make_policy(name), job, zones, max_ticks=zones.n_ticks)
        out[name] = time.perf_counter() - began
    return out


def run(traces: Path, starts: int, spot: float, ondemand: float, ckpt: float, restart: float) -> str:
    began = time.perf_counter()
    files = sorted(traces.glob("*.json"))
    singles = [load_zones([str(f)]) for f in files]
    every = load_zones([str(f) for f in files])
    policies = [make_policy(n) for n in POLICY_NAMES]
    rows = []
    for hours in (4, 8, 24):
        for factor in (1.25, 1.5, 2.0):
            job = JobNumbers(hours * H, spot, ondemand, ckpt, restart, deadline_s=hours * factor * H)
            tail = job.deadline_s + job.ondemand_only_s()
            per_zone = [sweep(policies, job, z, start_ticks(z, starts, tail)) for z in singles]
            merged = [_merge([zone[i] for zone in per_zone]) for i in range(len(policies))]
            together = sweep(policies, job, every, start_ticks(every, starts, tail))
            for label, cells in (
                ("1 zone", merged),
                (f"{len(files)} zones", [_merge([s]) for s in together]),
            ):
                rows.append((hours, hours * factor, label, cells))
    elapsed = time.perf_counter() - began
    timing = speed(traces)
    avail = ", ".join(f"{z.names[0].split('_')[0]} {z.any_up.mean():.0%}" for z in singles)
    lines = [
        HEADING,
        "",
        "Produced by `bench/simulate_policies.py`; regenerate with",
        "",
        "```",
        f".venv/bin/python bench/simulate_policies.py --starts {starts} --write docs/benchmarks.md",
        "```",
        "",
        f"Traces: `{traces.relative_to(ROOT.parent) if traces.is_relative_to(ROOT.parent) else traces}`"
        f" ({len(files)} AWS zones, p3.2xlarge, {every.n_ticks} ticks of {every.gap_s:g} s ="
        f" {every.n_ticks * every.gap_s / 86400:.1f} days). Spot available: {avail};"
        f" any of the {len(files)}: {every.any_up.mean():.1%}.",
        f"Prices: spot ${spot:.2f}/h, on demand ${ondemand:.2f}/h (p3.2xlarge, bundled catalog snapshot);"
        f" checkpoint every {ckpt / 60:g} min of progress, {restart / 60:g} min restart overhead per start.",
        f"Each row: {starts} launch times spread evenly over the traces; '1 zone' averages the 9 zones run"
        f" separately ({starts} x 9 runs), '{len(files)} zones' lets the job take spot in any zone.",
        "Cells: mean cost relative to on demand alone (restart + work at the on-demand price)"
        " / share of deadlines met / mean preemptions.",
        "",
        "| compute | deadline | zones | " + " | ".join(POLICY_NAMES) + " |",
        "|---|---|---|" + "---|" * len(POLICY_NAMES),
    ]
    for hours, deadline_h, label, cells in rows:
        text = " | ".join(f"{c:.2f} / {m:.0%} / {p:.1f}" for c, m, p in cells)
        lines.append(f"| {hours} h | {deadline_h:g} h | {label} | {text} |")
    lines += [
        "",
        "Speed: one job that needs the whole 45-day trace (all 9 zones), simulated per policy: "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timing.items())
        + f"; the whole table took {elapsed:.1f} s.",
        "",
    ]
    return "\n".join(lines)


def replace_section(path: Path, section: str) -> None:
    """Put `section` under HEADING in `path`, leaving every other section as it is."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--spot-price", type=float, default=0.66)
    parser.add_argument("--ondemand-price", type=float, default=3.06)
    parser.add_argument("--checkpoint-interval", type=float, default=600.0)
    parser.add_argument("--restart-overhead", type=float, default=300.0)
    parser.add_argument("--write", type=Path, help="replace the section in this markdown file")
    args = parser.parse_args()
    section = run(
        args.traces.resolve(),
        args.starts,
        args.spot_price,
        args.ondemand_price,
        args.checkpoint_interval,
        args.restart_overhead,
    )
    sys.stdout.write(section)
    if args.write:
        replace_section(args.write, section)


if __name__ == "__main__":
    main()
