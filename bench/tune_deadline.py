"""How the `deadline` policy's defaults were chosen: a grid over its parameters on the FIRST half of the
shared spot traces, each compared with Uniform Progress on the same launches.

    .venv/bin/python bench/tune_deadline.py [--starts 40]

For every (hysteresis, margin growth per preemption, lag) it runs the issue's jobs (8 h with 10/12/16 h
deadlines, 24 h with 30/36/48 h) in each zone alone and with all zones open, and prints the worst and
the mean of deadline's mean cost / UP's mean cost over those 12 cases, and the smallest share of
deadlines met. The second half of the traces is left alone for the held-out table of
bench/simulate_policies.py.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from simulate_policies import DEFAULT_TRACES, H, halves  # noqa: E402

from orchestrator.spot.policy import DeadlinePolicy, Policy, UniformProgressPolicy  # noqa: E402
from orchestrator.spot.simulator import JobNumbers, simulate, start_ticks  # noqa: E402
from orchestrator.spot.traces import Zones, load_zones  # noqa: E402

CASES = ((8, 10), (8, 12), (8, 16), (24, 30), (24, 36), (24, 48))


def evaluate(policy: Policy, zones: Zones, starts: int) -> list[tuple[float, float]]:
    """(mean cost ratio, share met) per case and zone setting (each zone alone pooled, then all zones)."""
    singles = [Zones([n], zones.gap_s, zones.up[i : i + 1]) for i, n in enumerate(zones.names)]
    out = []
    for hours, deadline_h in CASES:
        job = JobNumbers(hours * H, 0.66, 3.06, 600, 300, deadline_s=deadline_h * H)
        tail = job.deadline_s + job.ondemand_only_s()
        for group in (singles, [zones]):
            runs = [simulate(policy, job, z, s) for z in group for s in start_ticks(z, starts, tail)]
            out.append(
                (
                    sum(r.cost_vs_ondemand for r in runs) / len(runs),
                    sum(bool(r.deadline_met) for r in runs) / len(runs),
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--starts", type=int, default=40)
    args = parser.parse_args()
    first, _held_out = halves(load_zones([str(f) for f in sorted(args.traces.glob("*.json"))]))
    base = evaluate(UniformProgressPolicy(), first, args.starts)
    print("hysteresis_restarts backoff lag   worst/UP  mean/UP  min met")
    for restarts, backoff, lag in itertools.product((0, 0.25, 0.5, 1, 2), (0, 1), (0, -0.02, 0.1)):
        policy = DeadlinePolicy(hysteresis_restarts=restarts, hysteresis_ticks=0, backoff=backoff, lag=lag)
        cells = evaluate(policy, first, args.starts)
        ratios = [c[0] / b[0] for c, b in zip(cells, base, strict=True)]
        print(
            f"{restarts:>19} {backoff:>7} {lag:>5} {max(ratios):>9.4f} {sum(ratios) / len(ratios):>8.4f}"
            f" {min(c[1] for c in cells):>8.1%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
