"""How much more often regions are without spot together than their one-by-one figures multiplied say,
fitted on the region sets the hazard table measured together, for the sets it never measured.

Spot is lost across regions together (a shortage of one GPU type is seldom one region's alone). Where
the table measured a set of regions on one clock it uses that set's own figures; elsewhere it composes
the regions' own figures, and taking them as independent there is optimistic: on the shared traces no
region of three has spot 3.6x as often as the product says, and a job that has just lost spot finds no
other region up 5-45x as often. Two exponents carry the measured dependence to the other sets:
- `alpha`, at a random moment: P(none of S up) = prod(P(r down))^alpha (1 is independence; the set's
  least available region's figure is the ceiling, full dependence);
- `beta`, right after a loss in region r: P(no other region up) = prod(P(o down), o != r)^beta.
Each is the median over the measured sets (alpha per unordered set, beta per ordered one). No torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: (cloud, instance type, region or regions, nodes) keyed figures, as HazardTable holds them:
#: (availability, mean spell without spot in s, no capacity right after an interruption)
Figures = tuple[float, float, float]


@dataclass(frozen=True)
class Dependence:
    alpha: float
    beta: float
    sets: int  # unordered region sets measured together that the fit used
    source: str

    def none_up(self, downs: Sequence[float]) -> float:
        """P(no region of the set has spot) from each region's own P(down)."""
        if not downs:
            return 1.0
        return min(math.prod(downs) ** self.alpha, min(downs))

    def others_down(self, downs: Sequence[float]) -> float:
        """P(every other region is without spot right after a loss), from their own P(down)."""
        return math.prod(downs) ** self.beta if downs else 1.0


def _exponent(measured: float, product: float) -> float | None:
    if not 0.0 < product < 1.0 or not 0.0 < measured <= 1.0:
        return None
    return math.log(measured) / math.log(product)


def fit(
    capacity: Mapping[tuple[str, str, str, int], Figures],
    joint: Mapping[tuple[str, str, tuple[str, ...], int], Figures],
    leave_out: frozenset[str] | None = None,
) -> Dependence | None:
    """The exponents from every multi-region set in `joint` whose regions each have their own figures in
    `capacity` (same cloud, instance type and nodes); `leave_out` skips one set (any order), for checking
    the fit on a set it did not see. None when nothing was measured together."""
    alphas: dict[tuple[str, str, frozenset[str], int], float] = {}
    betas: list[float] = []
    for (cloud, itype, regions, nodes), (avail, _down, after) in joint.items():
        own = [capacity.get((cloud, itype, r, nodes)) for r in regions]
        if len(regions) < 2 or any(o is None for o in own) or frozenset(regions) == leave_out:
            continue
        downs = [1.0 - o[0] for o in own if o is not None]
        a = _exponent(1.0 - avail, math.prod(downs))
        first = own[0]
        assert first is not None
        b = _exponent(after / first[2], math.prod(downs[1:])) if first[2] > 0 else None
        if a is not None:
            alphas[(cloud, itype, frozenset(regions), nodes)] = a
        if b is not None:
            betas.append(max(b, 0.0))  # a loss never makes the other regions more available than at random
    if not alphas or not betas:
        return None
    where = sorted({f"{k[1]} on {k[0]}" for k in alphas})
    alpha, beta = statistics.median(alphas.values()), statistics.median(betas)
    source = (
        f"regions taken as dependent as {len(alphas)} region set(s) measured together were "
        f"({', '.join(where)}: alpha {alpha:.2f}, beta {beta:.2f}; 1 is independence)"
    )
    return Dependence(alpha=alpha, beta=beta, sets=len(alphas), source=source)
