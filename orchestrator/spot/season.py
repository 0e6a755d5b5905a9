"""The seasons a spot job may meet: its hazard with the rate and the capacity moved together as far as
the traces' weeks moved them, for the spread of its expected cost (the plan's 90%).

A plan's expected cost is for the measured rate and capacity. The job meets one week's: the traces
show a zone's rate moving ~70% week to week (`drift` cv in hazards.json) and its spot availability
~1.1 in logit, the two strongly against each other (a stormy week is also a week without spot; corr
-0.86). Each season here is one draw of both from those measured spreads (a Gaussian copula: the
rate log-normal with the hazard's own 90% interval, availability shifted in logit), on a fixed
equal-probability grid, so a plan's band does not flicker. What it does not cover: a season unlike any
week of the traces (docs/benchmarks.md, "The plan's cost on another season").
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from orchestrator.spot.hazards import Hazard, HazardTable

#: points per axis of the grid of seasons (GRID x GRID): the band's ends move by up to ~7% between grids
#: of 40, 60 and 80 a side (the upper tail is steep where a stormy season sends the job on demand)
GRID = 40
Z90 = 1.6448536269514722  # the standard normal's 95% quantile: a 90% interval is mean +- Z90 sd
CLIP = 1e-4  # availability kept inside (CLIP, 1 - CLIP) before its logit


@lru_cache(maxsize=4)
def _normals(grid: int) -> tuple[tuple[float, float], ...]:
    """Pairs of standard normal scores on an equal-probability grid (the midpoints of `grid` bins a
    side): every season weighs the same, and the band is the same every time, with no seed to move it."""
    from statistics import NormalDist

    z = [NormalDist().inv_cdf((i + 0.5) / grid) for i in range(grid)]
    return tuple((a, b) for a in z for b in z)


def _shift(no_capacity: float, by: float) -> float:
    """The chance of no spot when availability (1 - `no_capacity`) moves `by` in logit."""
    a = min(max(1.0 - no_capacity, CLIP), 1.0 - CLIP)
    moved = 1.0 / (1.0 + math.exp(-(math.log(a / (1.0 - a)) + by)))
    return 1.0 - moved


def seasons(hazard: Hazard, table: HazardTable) -> list[Hazard]:
    """`hazard` as GRID x GRID seasons might have it (see the module's docstring); [] when the table measured
    no spread of either (nothing to draw)."""
    spread = table.availability_logit_sd if hazard.availability is not None else 0.0
    if hazard.rate_per_hour > 0 and hazard.low_per_hour > 0 and hazard.high_per_hour > hazard.low_per_hour:
        log_sd = math.log(hazard.high_per_hour / hazard.low_per_hour) / (2.0 * Z90)
    else:
        log_sd = 0.0
    if spread <= 0 and log_sd <= 0:
        return []
    rho = max(-1.0, min(1.0, table.availability_rate_corr))
    out = []
    for z_rate, z_other in _normals(GRID):
        moved = spread * (rho * z_rate + math.sqrt(1.0 - rho * rho) * z_other)
        no_capacity = _shift(hazard.no_capacity, moved) if spread > 0 else hazard.no_capacity
        out.append(
            replace(
                hazard,
                rate_per_hour=hazard.rate_per_hour * math.exp(log_sd * z_rate - log_sd * log_sd / 2.0),
                no_capacity=no_capacity,
                relaunch_no_capacity=_shift(hazard.relaunch_no_capacity, moved)
                if spread > 0
                else hazard.relaunch_no_capacity,
                wait_s=hazard.wait_s * (no_capacity / hazard.no_capacity) if hazard.no_capacity > 0 else 0.0,
            )
        )
    return out


def band(costs: list[float]) -> tuple[float, float]:
    """The 5% and 95% of `costs` (nearest rank)."""
    ordered = sorted(costs)
    last = len(ordered) - 1
    return ordered[round(0.05 * last)], ordered[round(0.95 * last)]
