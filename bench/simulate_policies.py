"""The spot-policy table in docs/benchmarks.md: every policy on the shared spot traces, many start offsets.

    .venv/bin/python bench/simulate_policies.py                 # print the section (markdown)
    .venv/bin/python bench/simulate_policies.py --write docs/benchmarks.md   # and replace it there

Each job runs from `--starts` start offsets spread evenly over the 45-day traces, once in each single
zone (9 runs per offset, averaged) and once with all 9 zones open to the job. Two tables: the second
half of the traces (held out: `deadline` was tuned on the first half), then the first half. Prices are AWS p3.2xlarge
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

from orchestrator.spot.policy import NoObserverPolicy, make_policy  # noqa: E402
from orchestrator.spot.simulator import JobNumbers, Summary, simulate, start_ticks, sweep  # noqa: E402
from orchestrator.spot.traces import Zones, load_zones  # noqa: E402

HEADING = "## Spot policies on real traces"
DEFAULT_TRACES = ROOT.parent / "shared/data/spot-traces/availability/1-node/aws-02-15-2023"
H = 3600.0
#: columns, in the order of the issue's table; on demand last (the baseline every ratio divides by)
COLUMNS = ("deadline", "no-observer", "uniform-progress", "spot-fallback", "spot-only", "on-demand")
#: (compute hours, deadline hours)
JOBS = ((8, 10), (8, 12), (8, 16), (24, 30), (24, 36), (24, 48))


def _merge(parts: list[Summary]) -> tuple[float, float, float]:
    """Mean cost ratio, share met and mean preemptions over several equally sized sweeps."""
    n = len(parts)
    return (
        sum(p.mean_cost_vs_ondemand for p in parts) / n,
        sum(p.met_share or 0.0 for p in parts) / n,
        sum(p.mean_preemptions for p in parts) / n,
    )


def halves(zones: Zones) -> tuple[Zones, Zones]:
    """The first and the second half of the traces in time (the policy was tuned on the first)."""
    mid = zones.n_ticks // 2
    return (
        Zones(zones.names, zones.gap_s, zones.up[:, :mid]),
        Zones(zones.names, zones.gap_s, zones.up[:, mid:]),
    )


def speed(every: Zones) -> dict[str, float]:
    """Seconds to simulate one job that needs the whole 45-day trace (9 zones), per policy."""
    days = every.n_ticks * every.gap_s / 86400.0
    job = JobNumbers(0.9 * days * 86400.0, 0.66, 3.06, 600, 300, deadline_s=days * 86400.0)
    out = {}
    for name in COLUMNS:
        began = time.perf_counter()
        simulate(make_policy(name, baselines=True), job, every, max_ticks=every.n_ticks)
        out[name] = time.perf_counter() - began
    return out


Row = tuple[int, float, str, list[tuple[float, float, float]]]


def table(every: Zones, starts: int, spot: float, ondemand: float, ckpt: float, restart: float) -> list[Row]:
    """Every policy, every job of JOBS, in each zone alone (averaged) and with all zones open."""
    singles = [Zones([name], every.gap_s, every.up[i : i + 1]) for i, name in enumerate(every.names)]
    policies = [make_policy(n, baselines=True) for n in COLUMNS]
    rows: list[Row] = []
    for hours, deadline_h in JOBS:
        job = JobNumbers(hours * H, spot, ondemand, ckpt, restart, deadline_s=deadline_h * H)
        tail = job.deadline_s + job.ondemand_only_s()
        per_zone = [sweep(policies, job, z, start_ticks(z, starts, tail)) for z in singles]
        merged = [_merge([zone[i] for zone in per_zone]) for i in range(len(policies))]
        together = sweep(policies, job, every, start_ticks(every, starts, tail))
        rows.append((hours, deadline_h, "1 zone", merged))
        rows.append((hours, deadline_h, f"{len(every.names)} zones", [_merge([s]) for s in together]))
    return rows


def _markdown(rows: list[Row]) -> list[str]:
    lines = [
        "| compute | deadline | zones | "
        + " | ".join(COLUMNS)
        + " | deadline vs UP | no-observer vs deadline |",
        "|---|---|---|" + "---|" * (len(COLUMNS) + 2),
    ]
    d, up, od = COLUMNS.index("deadline"), COLUMNS.index("uniform-progress"), COLUMNS.index("on-demand")
    alone = COLUMNS.index("no-observer")
    for hours, deadline_h, label, cells in rows:
        text = " | ".join(f"{c:.3f} / {m:.0%} / {p:.1f}" for c, m, p in cells)
        ok = cells[d][0] <= cells[up][0] + 1e-12 and cells[d][1] >= cells[od][1] - 1e-12
        verdict = f"{cells[d][0] / cells[up][0]:.3f}" + ("" if ok else " (WORSE)")
        worth = f"{cells[alone][0] / cells[d][0]:.3f}"
        lines.append(f"| {hours} h | {deadline_h:g} h | {label} | {text} | {verdict} | {worth} |")
    return lines


def run(traces: Path, starts: int, spot: float, ondemand: float, ckpt: float, restart: float) -> str:
    began = time.perf_counter()
    files = sorted(traces.glob("*.json"))
    every = load_zones([str(f) for f in files])
    first, second = halves(every)
    tuned = table(first, starts, spot, ondemand, ckpt, restart)
    held = table(second, starts, spot, ondemand, ckpt, restart)
    elapsed = time.perf_counter() - began
    timing = speed(every)
    avail = ", ".join(f"{n.split('_')[0]} {every.up[i].mean():.0%}" for i, n in enumerate(every.names))
    days = every.n_ticks * every.gap_s / 86400
    lines = [
        HEADING,
        "",
        "Produced by `bench/simulate_policies.py`; regenerate with",
        "",
        "```",
        f".venv/bin/python bench/simulate_policies.py --starts {starts} --write docs/benchmarks.md",
        "```",
        "",
        f"Traces: `{'shared/' + str(traces).split('/shared/', 1)[1] if '/shared/' in str(traces) else traces}`"
        f" ({len(files)} AWS zones, p3.2xlarge, {every.n_ticks} ticks of {every.gap_s:g} s ="
        f" {days:.1f} days). Spot available: {avail};"
        f" any of the {len(files)}: {every.any_up.mean():.1%}.",
        f"Prices: spot ${spot:.2f}/h, on demand ${ondemand:.2f}/h (p3.2xlarge, bundled catalog snapshot);"
        f" checkpoint every {ckpt / 60:g} min of progress, {restart / 60:g} min restart overhead per start.",
        f"Each row: {starts} launch times spread evenly over the traces; '1 zone' averages the 9 zones run"
        f" separately ({starts} x 9 runs), '{len(files)} zones' lets the job take spot in any zone.",
        "Cells: mean cost relative to on demand alone (restart + work at the on-demand price)"
        " / share of deadlines met / mean preemptions. `uniform-progress` (UP) is the policy of"
        " \"Can't Be Late\" (NSDI '24), a baseline; the last column is deadline's mean cost / UP's"
        " (WORSE if it costs more than UP or misses a deadline on-demand meets).",
        "",
        "`no-observer` is what a `deadline` job does with no outside controller (the laptop closed):"
        " SkyPilot falls back to the on-demand offers after the spot ones in `ordered` when spot is gone"
        f" (after {NoObserverPolicy().failover_s:g} s of failed spot launches, unbilled); on demand, the"
        " trainer probes back to spot (checkpoint, exit 75, one restart) when the rule `deadline` uses"
        " says it is ahead, with room for two restarts, at most once an hour after landing on demand and"
        " doubling after each probe that lands on demand again; it never waits for spot and has no"
        " safety net. The last column is its mean cost / deadline's: what the outside controller saves.",
        "",
        "What these tables cover: one trace set (AWS, us-east-1/us-east-2/us-west-2, p3.2xlarge = 1 V100,"
        " February-March 2023, availability probed every 195 s), one price pair, a 5 min restart."
        " They do not cover other GPUs, clouds or years (A100/H100 spot is scarcer), multi-node jobs,"
        " spot prices that move, preemptions inside a tick, or SkyPilot's real failover time (assumed"
        " above). The availability signal is whether a launch would have succeeded, so a probe here sees"
        " exactly what the trace says.",
        "",
        f"### Held out: the second half of the traces (days {days / 2:.1f}-{days:.1f})",
        "",
        "The `deadline` policy's parameters were chosen on the first half only"
        " (`bench/tune_deadline.py`); these launches never overlap the data it was tuned on.",
        "",
        *_markdown(held),
        "",
        f"### Tuning data: the first half (days 0-{days / 2:.1f})",
        "",
        *_markdown(tuned),
        "",
        "Speed: one job that needs the whole 45-day trace (all 9 zones), simulated per policy: "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timing.items())
        + f"; the two tables took {elapsed:.1f} s.",
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
