"""One spot hazard model: how often spot is taken away, how often it can be had, and how sure we are.

Used by the planner (expected cost, ETA, the spot/on-demand choice), the checkpoint interval (the rate the
task passes to the trainer, trainer/stops/interval.py), the simulator's benchmark and `ftorch hazards`.
No torch, no sky here.

The model, per key (cloud, instance type, region, zone; the accelerator and GPU count stand in for the
instance type where it is not known): interruptions of one instance form a Poisson process of rate lambda
per hour held; lambda has a gamma posterior (alpha, beta) = (alpha0 + n, beta0 + T), n interruptions in T
hours held (successes, user stops and crashes are right-censored: hours without an event). Its prior
comes from the bundled table (orchestrator/data/hazards.json, built by scripts/build_hazards.py from
measured traces, with provenance), pooled so a key without a measurement borrows strength and says so:

    zone (measured) <- region (its zones' pooled rate, the between-zone spread) <- (cloud, GPU class)
    <- cloud <- every measured cloud (shape x CROSS_CLOUD_SHAPE: wider)

The pools' spread is fitted to the measured zones (gamma by moments), so a key that was never measured
gets the spread the measured ones show, not a guess. Evidence on top of the prior: the user's own spot
attempts (alive hours and how each ended, `record_attempts`) and traces the user brings (`ftorch
hazards import`), both kept in $FTORCH_HOME/hazards.json (owner-only).

Several nodes: interruptions of one type in one zone come together (Spot-and-Scoot, arXiv 2604.16457:
>92% within 3 minutes of each other), so N nodes see lambda x (1 + (N - 1) x (1 - rho)), rho the share
that coincide (the table's `correlation`), not N x lambda. Evidence from an N-node job counts as that
many node-equivalent hours.

Capacity, per zone: the share of time spot was obtainable (`availability`) and the mean length of a
spell without it (`mean_down_s`). A job that may go to several zones takes the first that is up, in
order (SkyPilot's failover); zones are taken as independent, except regions measured together (the
table's `failover` rows: spot is lost across regions together, more often than independence says).
`Hazard.wait_s` is the expected wait for capacity at each launch, `no_capacity` the chance that no zone
has spot when the job (re)launches.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.errors import UserError
from orchestrator.home import ftorch_home, private_dir, write_private
from orchestrator.sizing.catalog import CONSUMER_TIER
from orchestrator.spot import region_dependence

DATA_FILE = "hazards.json"
USER_FILE = "hazards.json"  # under $FTORCH_HOME
#: a pool borrowed from other clouds keeps its mean but half its shape (twice its squared coefficient
#: of variation): nothing was measured on this cloud, and the model should say it knows less
CROSS_CLOUD_SHAPE = 0.5
#: the bundled correlation counts as this many hours of multi-node evidence against the user's own
RHO_PRIOR_HOURS = 500.0


@dataclass(frozen=True)
class TraceStats:
    """What one availability trace shows for a job of `nodes` instances."""

    hours: float  # hours the job could hold its nodes (exposure)
    interruptions: int  # times it lost one of them while holding
    availability: float  # share of ticks with at least `nodes` obtainable
    mean_down_s: float  # mean length of a spell with fewer than `nodes` obtainable (0: never)
    gap_s: float
    ticks: int
    #: (failover) the share of the job's interruptions at whose tick no zone had spot: a relaunch found none
    no_capacity_after_loss: float = 0.0

    @property
    def rate_per_hour(self) -> float:
        return self.interruptions / self.hours if self.hours else 0.0


def measure(counts: Sequence[float] | np.ndarray, gap_s: float, nodes: int = 1) -> TraceStats:
    """Exposure, interruptions and capacity of a trace (`counts[i]` instances obtainable at tick i): a job
    holds while at least `nodes` are obtainable and is interrupted when the count falls below that."""
    data = np.asarray(counts, dtype=np.float64)
    up = data >= nodes
    drops = int(np.sum(up[:-1] & ~up[1:]))
    down_runs = _runs(~up)
    return TraceStats(
        hours=float(up.sum()) * gap_s / 3600.0,
        interruptions=drops,
        availability=float(up.mean()) if up.size else 0.0,
        mean_down_s=float(np.mean(down_runs)) * gap_s if down_runs else 0.0,
        gap_s=float(gap_s),
        ticks=int(up.size),
    )


def region_capacity(traces: Sequence[Sequence[float]], gap_s: float, nodes: int = 1) -> TraceStats:
    """Capacity of several zones together (some zone has `nodes` obtainable), on their common clock
    (cut to the shortest)."""
    length = min(len(t) for t in traces)
    best = np.max(np.stack([np.asarray(t[:length], dtype=np.float64) for t in traces]), axis=0)
    return measure(best, gap_s, nodes)


def no_capacity_after_loss(traces: Sequence[Sequence[float]], nodes: int = 1) -> float:
    """The share of interruptions in any of these zones at whose tick no zone has `nodes` obtainable:
    spot is lost together, so a relaunch finds none far more often than a random moment does."""
    length = min(len(t) for t in traces)
    ups = np.stack([np.asarray(t[:length], dtype=np.float64) >= nodes for t in traces])
    any_up = ups.any(axis=0)
    lost = [np.flatnonzero(up[:-1] & ~up[1:]) + 1 for up in ups]
    ticks = np.concatenate(lost) if lost else np.array([], dtype=int)
    return float(np.mean(~any_up[ticks])) if ticks.size else float(np.mean(~any_up))


def failover(traces: Sequence[Sequence[float]], gap_s: float, nodes: int = 1) -> TraceStats:
    """A job that takes the first zone with capacity, in the order given, and stays there until it is
    interrupted (SkyPilot's failover): its hours held and interruptions over these zones. Zones lose
    spot together, so this is measured, not composed from the zones one by one."""
    length = min(len(t) for t in traces)
    ups = np.stack([np.asarray(t[:length], dtype=np.float64) >= nodes for t in traces])
    first = np.where(ups.any(axis=0), np.argmax(ups, axis=0), -1).tolist()
    rows = ups.tolist()
    any_up = ups.any(axis=0)
    cur, held, lost, stranded = -1, 0, 0, 0
    for tick in range(length):
        if cur >= 0 and not rows[cur][tick]:
            lost, cur, stranded = lost + 1, -1, stranded + (not any_up[tick])
        if cur < 0:
            cur = first[tick]
        held += cur >= 0
    downs = _runs(~any_up)
    return TraceStats(held * gap_s / 3600.0, lost, float(any_up.mean()),
                      float(np.mean(downs)) * gap_s if downs else 0.0, float(gap_s), length,
                      stranded / lost if lost else float(np.mean(~any_up)))  # fmt: skip


def _runs(mask: np.ndarray) -> list[int]:
    """Lengths of the runs of True in `mask`."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return (edges[1::2] - edges[::2]).tolist()


def read_trace(path: Path) -> tuple[float, list[float]]:
    """(gap_seconds, counts) of a trace file in the spot-traces format; UserError naming what is wrong."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        gap = float(payload["metadata"]["gap_seconds"])
        data = [float(x) for x in payload["data"]]
    except OSError as exc:
        raise UserError(f"FILE: cannot read {path}: {exc.__class__.__name__}") from None
    except (ValueError, KeyError, TypeError):
        raise UserError(
            f"FILE: {path} is not a trace: expected "
            '{"metadata": {"gap_seconds": N}, "data": [alive count per tick, ...]}'
        ) from None
    if gap <= 0 or not data or any(x < 0 for x in data):
        raise UserError(f"FILE: {path} needs gap_seconds > 0 and a non-empty list of counts >= 0")
    return gap, data


# ---- the posterior -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gamma:
    """A gamma distribution over a rate per hour: shape `alpha`, rate `beta` (hours)."""

    alpha: float
    beta: float

    @property
    def mean(self) -> float:
        return self.alpha / self.beta

    def update(self, hours: float, events: float) -> Gamma:
        return Gamma(self.alpha + events, self.beta + hours)

    def with_mean(self, mean: float) -> Gamma:
        """The same shape (spread relative to the mean), centred on `mean`."""
        return Gamma(self.alpha, self.alpha / mean)

    def quantile(self, q: float) -> float:
        """The `q` quantile: the unit-rate gamma's (cached per shape) scaled by 1 / beta."""
        return _unit_quantile(self.alpha, q) / self.beta


@lru_cache(maxsize=4096)
def _unit_quantile(alpha: float, q: float) -> float:
    """The `q` quantile of Gamma(alpha, 1) (bisection on the regularized incomplete gamma function)."""
    lo, hi = 0.0, alpha * 10.0 + 10.0
    while _gamma_cdf(alpha, hi) < q:
        hi *= 2.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _gamma_cdf(alpha, mid) < q else (lo, mid)
    return (lo + hi) / 2.0


def _gamma_cdf(a: float, x: float) -> float:
    """P(a, x), the regularized lower incomplete gamma function (series below a + 1, else continued
    fraction: Numerical Recipes' gser/gcf)."""
    if x <= 0:
        return 0.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        for _ in range(500):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-12:
                break
        return min(1.0, total * math.exp(log_front))
    tiny = 1e-300
    b, c, d = x + 1.0 - a, 1.0 / tiny, 1.0 / (x + 1.0 - a)
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def fit_pool(rates: Sequence[float], hours: Sequence[float]) -> Gamma:
    """A gamma over zone rates fitted by moments (between-zone variance less the Poisson noise), so the
    spread of a pool is the spread its measured zones show. One zone: shape 1 (an exponential).
    `hours` give each zone's Poisson noise, taken out of the spread."""
    r, t = np.asarray(rates, dtype=float), np.asarray(hours, dtype=float)
    if len(r) < 2:
        mean = float(r[0])
        return Gamma(1.0, 1.0 / mean)
    mean = float(np.mean(r))  # a zone not measured is any zone: each zone counts once
    noise = float(np.mean(r / np.maximum(t, 1e-9)))
    var = max(float(np.var(r, ddof=1)) - noise, (0.1 * mean) ** 2)
    alpha = mean * mean / var
    return Gamma(alpha, alpha / mean)


def correlation_factor(nodes: int, rho: float) -> float:
    """How many times one node's rate a job on `nodes` sees when a share `rho` of interruptions hit all
    of them at once."""
    return 1.0 + (max(1, nodes) - 1) * (1.0 - rho)


# ---- evidence ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """Hours held and interruptions of one key: a measured trace, an import, or the user's attempts."""

    cloud: str
    instance_type: str
    region: str | None
    zone: str | None
    nodes: int
    hours: float
    interruptions: int
    source: str
    accelerator: str = ""
    count: int = 0
    availability: float | None = None
    mean_down_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Evidence:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


@dataclass(frozen=True)
class Hazard:
    """The rate a job sees on an offer, its uncertainty, where it comes from, and the capacity."""

    rate_per_hour: float  # for the job's nodes, posterior mean
    low_per_hour: float  # 5% quantile
    high_per_hour: float  # 95% quantile
    nodes: int
    level: str  # zone | region | class | cloud | borrowed
    source: str
    hours: float  # evidence behind the key (hours held, node-equivalent)
    interruptions: float
    availability: float | None  # share of time some allowed zone has spot (None: not measured)
    no_capacity: float  # chance that no allowed zone has spot at a (re)launch
    wait_s: float  # expected wait for capacity at a (re)launch
    #: chance that no allowed zone has spot right after an interruption (losses come together)
    relaunch_no_capacity: float = 0.0
    zones: tuple[str, ...] = ()
    #: share of the job's spot time in each region (where it lands, how long it stays)
    region_share: tuple[tuple[str, float], ...] = ()
    #: where the capacity figures come from: measured for these regions, or borrowed (said in the plan)
    capacity_source: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["region_share"] = {r: round(v, 4) for r, v in self.region_share}
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 5)
        out["zones"] = list(self.zones)
        return out


def gpu_class(accelerator: str) -> str:
    return "consumer" if accelerator.lower() in CONSUMER_TIER else "datacenter"


@dataclass
class _Zone:
    name: str
    region: str
    gamma: Gamma  # one node
    level: str
    source: str
    hours: float
    interruptions: float
    availability: float | None
    mean_down_s: float | None


@dataclass
class HazardTable:
    """The bundled prior and the user's evidence; `for_offer` answers the planner."""

    measured: list[Evidence]
    rho: float
    correlation_source: str
    provenance: dict[str, Any] = field(default_factory=dict)
    user: list[Evidence] = field(default_factory=list)
    #: (cloud, instance type, region, nodes) -> (availability, mean_down_s, no capacity right after an
    #: interruption) of the region as a whole
    capacity: dict[tuple[str, str, str, int], tuple[float, float, float]] = field(default_factory=dict)
    #: (cloud, instance type, regions in the order tried, nodes) -> (hours held, interruptions) of a job
    #: failing over between their zones (`failover`)
    failovers: dict[tuple[str, str, tuple[str, ...], int], tuple[float, int]] = field(default_factory=dict)
    #: the same keys -> (availability, mean_down_s, no capacity right after an interruption) of those
    #: regions together, measured on one clock: spot is lost across regions together, more often than
    #: their one-by-one figures multiplied say (`_capacity` uses these where measured)
    joint_capacity: dict[tuple[str, str, tuple[str, ...], int], tuple[float, float, float]] = field(
        default_factory=dict
    )
    #: how much a zone's rate moves from one week to the next beyond Poisson noise (coefficient of
    #: variation, measured by scripts/build_hazards.py `drift`): the spread of the rate a job will meet,
    #: on top of the uncertainty of the zone's mean; 0 where the table does not say
    drift_cv: float = 0.0
    drift_source: str = ""
    #: how much a zone's spot availability moves week to week (sd of its logit) and how that moves with
    #: the rate (correlation of the two weeks' deviations): orchestrator/spot/season.py draws seasons
    #: from them for the spread of a plan's cost; 0 where the table does not say
    availability_logit_sd: float = 0.0
    availability_rate_corr: float = 0.0
    availability_source: str = ""
    _dependence: dict[str, region_dependence.Dependence | None] = field(
        default_factory=dict, repr=False, compare=False
    )
    #: zones_of answers, per key (the table is not changed after it is built; a plan asks per region)
    _zones: dict[tuple[str, str, str, int, str], list[_Zone]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def from_json(cls, payload: dict[str, Any], user: Iterable[Evidence] = ()) -> HazardTable:
        table = cls._from_json(payload, list(user))
        table.rho, table.correlation_source = correlation_with(
            table.measured + table.user, table.user, table.rho, table.correlation_source
        )
        return table

    @classmethod
    def _from_json(cls, payload: dict[str, Any], user: list[Evidence]) -> HazardTable:
        corr = payload.get("correlation") or {}
        drift = payload.get("drift") or {}
        return cls(
            drift_cv=float(drift.get("cv", 0.0)),
            drift_source=str(drift.get("source", "")),
            availability_logit_sd=float(drift.get("availability_logit_sd", 0.0)),
            availability_rate_corr=float(drift.get("availability_rate_corr", 0.0)),
            availability_source=str(drift.get("availability_source", "")),
            measured=[Evidence.from_json(r) for r in payload.get("measured", [])],
            rho=float(corr.get("rho", 0.0)),
            correlation_source=str(corr.get("source", "none: nodes taken as independent")),
            provenance=payload.get("provenance") or {},
            user=list(user),
            capacity={
                (r["cloud"], r["instance_type"], r["region"], int(r["nodes"])): (
                    float(r["availability"]),
                    float(r["mean_down_s"]),
                    float(r.get("no_capacity_after_interruption", 1.0 - float(r["availability"]))),
                )
                for r in payload.get("regions", [])
            },  # fmt: skip
            failovers={
                (r["cloud"], r["instance_type"], tuple(r["regions"]), int(r["nodes"])): (
                    float(r["hours"]),
                    int(r["interruptions"]),
                )
                for r in payload.get("failover", [])
            },  # fmt: skip
            joint_capacity={
                (r["cloud"], r["instance_type"], tuple(r["regions"]), int(r["nodes"])): (
                    float(r["availability"]),
                    float(r["mean_down_s"]),
                    float(r["no_capacity_after_interruption"]),
                )
                for r in payload.get("failover", [])
                if "no_capacity_after_interruption" in r
            },  # fmt: skip
        )

    def interval(self, g: Gamma) -> tuple[float, float]:
        """The 90% interval of the rate a job will meet: the posterior of the mean (`g`) widened by the
        week-to-week drift (variances of the relative rate add: 1/alpha + cv^2), same mean. A zone's
        mean is known to a few percent after weeks of traces, but the rate next month is not (the
        traces of another season: docs/benchmarks.md, "the bundled prior against traces it never saw")."""
        if self.drift_cv <= 0:
            return g.quantile(0.05), g.quantile(0.95)
        alpha = 1.0 / (1.0 / g.alpha + self.drift_cv**2)
        wide = Gamma(alpha, alpha / g.mean)
        return wide.quantile(0.05), wide.quantile(0.95)

    # ---- pools ---------------------------------------------------------------------------------------
    def _node_hours(self, e: Evidence) -> float:
        return e.hours * correlation_factor(e.nodes, self.rho)

    def _pool(self, rows: list[Evidence]) -> Gamma | None:
        by_zone: dict[tuple[str, ...], list[float]] = {}
        for e in rows:
            key = (e.cloud, e.instance_type, e.region or "", e.zone or "")
            acc = by_zone.setdefault(key, [0.0, 0.0])
            acc[0] += self._node_hours(e)
            acc[1] += e.interruptions
        usable = [(n / h, h) for h, n in by_zone.values() if h > 0 and n > 0]
        if not usable:
            return None
        return fit_pool([r for r, _ in usable], [h for _, h in usable])

    def _fallback(self, cloud: str, accelerator: str) -> tuple[Gamma, str, str]:
        """(prior, level, source) for an instance with no measurement of its own."""
        klass = gpu_class(accelerator)
        same_class = [e for e in self.measured if e.cloud == cloud and gpu_class(e.accelerator) == klass]
        if (g := self._pool(same_class)) is not None:
            return (
                g,
                "class",
                f"no measurement of this instance: {cloud} {klass} GPUs' pool ({_what(same_class)})",
            )
        same_cloud = [e for e in self.measured if e.cloud == cloud]
        if (g := self._pool(same_cloud)) is not None:
            return g, "cloud", f"no measurement of this instance: {cloud}'s pool ({_what(same_cloud)})"
        g = self._pool(self.measured)
        if g is None:
            raise UserError(
                "hazards: the bundled table holds no measurement; rebuild it (scripts/build_hazards.py)"
            )
        wide = Gamma(g.alpha * CROSS_CLOUD_SHAPE, g.beta * CROSS_CLOUD_SHAPE)
        return (
            wide,
            "borrowed",
            f"nothing measured on {cloud}: other clouds' pool, wider ({_what(self.measured)})",
        )

    def _matches(self, e: Evidence, cloud: str, instance_type: str, accelerator: str, count: int) -> bool:
        if e.cloud != cloud:
            return False
        if e.instance_type and instance_type:
            return e.instance_type == instance_type
        return e.accelerator.lower() == accelerator.lower() and e.count == count

    def region_prior(
        self, cloud: str, instance_type: str, accelerator: str, count: int, region: str
    ) -> tuple[Gamma, str, str, list[Evidence]]:
        """(prior of a zone of `region` before its own evidence, its level, its source, the evidence of
        the region): the region's pooled rate with the between-zone spread, else a fallback pool."""
        mine = [e for e in self.measured if self._matches(e, cloud, instance_type, accelerator, count)]
        user = [e for e in self.user if self._matches(e, cloud, instance_type, accelerator, count)]
        in_region = [e for e in mine + user if e.region == region]
        if not mine:
            base, level, source = self._fallback(cloud, accelerator)
        else:
            pool = self._pool(mine)
            assert pool is not None
            base, level, source = pool, "region", f"{region} pool of this instance ({_what(mine)})"
            measured_here = [e for e in mine if e.region == region]
            if measured_here:
                hours = sum(self._node_hours(e) for e in measured_here)
                base = base.with_mean(base.update(hours, sum(e.interruptions for e in measured_here)).mean)
            else:
                level, source = "cloud", f"no measurement in {region}: this instance's other regions"
        # evidence without a zone (attempts that did not say) moves the region's prior
        loose = [e for e in in_region if not e.zone]
        base = base.update(sum(self._node_hours(e) for e in loose), sum(e.interruptions for e in loose))
        return base, level, source, in_region

    def zones_of(
        self, cloud: str, instance_type: str, accelerator: str, count: int, region: str
    ) -> list[_Zone]:
        """The zones of `region` the model knows for this instance (one region-level entry when none)."""
        key = (cloud, instance_type, accelerator, count, region)
        if key not in self._zones:
            self._zones[key] = self._zones_of(cloud, instance_type, accelerator, count, region)
        return list(self._zones[key])

    def _zones_of(
        self, cloud: str, instance_type: str, accelerator: str, count: int, region: str
    ) -> list[_Zone]:
        prior, level, source, in_region = self.region_prior(cloud, instance_type, accelerator, count, region)
        names = sorted({e.zone for e in in_region if e.zone})
        if not names:
            loose = [e for e in in_region if not e.zone]
            hours = sum(self._node_hours(e) for e in loose)
            return [
                _Zone(
                    region,
                    region,
                    prior,
                    level,
                    source,
                    hours,
                    sum(e.interruptions for e in loose),
                    None,
                    None,
                )
            ]
        out = []
        for name in names:
            rows = [e for e in in_region if e.zone == name]
            hours = sum(self._node_hours(e) for e in rows)
            events = sum(e.interruptions for e in rows)
            caps = [e for e in rows if e.availability is not None]
            avail = (
                _weighted([e.availability for e in caps], [e.hours or 1.0 for e in caps]) if caps else None
            )
            downs = [e for e in caps if e.mean_down_s is not None]
            down = (
                _weighted([e.mean_down_s for e in downs], [e.hours or 1.0 for e in downs]) if downs else None
            )
            sources = "; ".join(sorted({e.source for e in rows}))
            out.append(
                _Zone(name, region, prior.update(hours, events), "zone", sources, hours, events, avail, down)
            )
        return out

    def for_offer(
        self,
        cloud: str,
        instance_type: str,
        accelerator: str,
        count: int,
        regions: Sequence[str],
        nodes: int = 1,
    ) -> Hazard:
        """The hazard a job on `nodes` instances sees on this offer when it may run in `regions` (tried in
        that order; zones by name): the renewal-weighted rate over where it lands, and the capacity."""
        zones: list[_Zone] = []
        for region in regions or ("",):
            zones += self.zones_of(cloud, instance_type, accelerator, count, region)
        factor = correlation_factor(nodes, self.rho)
        land, missing = [], 1.0
        for z in zones:
            a = 1.0 if z.availability is None else z.availability
            land.append(missing * a)
            missing *= 1.0 - a
        reach = sum(land)
        if reach <= 0:  # never obtainable in the measurements: the rate of the least bad zone
            land, reach = [1.0 if z is zones[0] else 0.0 for z in zones], 1.0

        def blend(rates: list[float]) -> float:
            stay = sum(p / max(r, 1e-9) for p, r in zip(land, rates, strict=True))
            return reach / stay if stay else 0.0

        mean = blend([z.gamma.mean for z in zones]) * factor
        bounds = [self.interval(z.gamma) for z in zones]
        low = blend([lo for lo, _ in bounds]) * factor
        high = blend([hi for _, hi in bounds]) * factor
        measured_failover = self._failover(cloud, instance_type, accelerator, count, regions)
        if measured_failover is not None:
            g, failover_source = measured_failover
            lo, hi = self.interval(g)
            mean, low, high = g.mean * factor, lo * factor, hi * factor
        stays = [p / max(z.gamma.mean, 1e-9) for p, z in zip(land, zones, strict=True)]
        shares: dict[str, float] = {}
        for z, stay in zip(zones, stays, strict=True):
            shares[z.region] = shares.get(z.region, 0.0) + stay / sum(stays)
        known, none_up, after, wait, said = self._capacity(cloud, instance_type, regions, zones, shares)
        top = max(zones, key=lambda z: (land[zones.index(z)], z.hours))
        level, source = top.level, top.source
        if measured_failover is not None:
            level, source = "failover", failover_source
        if nodes > 1:
            source += f"; {nodes} nodes x{factor:.2f} ({self.correlation_source})"
        return Hazard(
            rate_per_hour=mean,
            low_per_hour=low,
            high_per_hour=high,
            nodes=nodes,
            level=level,
            source=source,
            hours=sum(z.hours for z in zones),
            interruptions=sum(z.interruptions for z in zones),
            availability=(1.0 - none_up) if known else None,
            no_capacity=none_up if known else 0.0,
            relaunch_no_capacity=after if known else 0.0,
            wait_s=wait,
            zones=tuple(z.name for z in zones),
            region_share=tuple(shares.items()),
            capacity_source=said,
        )

    def _capacity(
        self,
        cloud: str,
        instance_type: str,
        regions: Sequence[str],
        zones: list[_Zone],
        shares: dict[str, float],
    ) -> tuple[bool, float, float, float, str]:
        """(known, chance no allowed region has spot, the same right after an interruption, expected wait
        at a launch, where the figures come from): each region as a whole (measured jointly where the
        table has it, else its zones, else borrowed from measured regions); regions never measured together are taken as dependent as
        the sets that were (region_dependence), or independent when none was."""
        known, exits, caps, said = False, 0.0, {}, []
        for region in regions or ("",):
            cap = self._region_capacity(
                cloud, instance_type, region, [z for z in zones if z.region == region]
            )
            if cap is None:
                cap, why = self._borrowed_capacity(cloud, instance_type, region)
                said.append(why)
            if cap is not None:
                known, caps[region] = True, cap
                exits += 1.0 / cap[1] if cap[1] else 0.0
        joint = (
            self.joint_capacity.get((cloud, instance_type, tuple(regions), 1)) if len(regions) > 1 else None
        )
        dependence = self.region_dependence() if len(caps) > 1 and joint is None else None
        if dependence is not None:  # never measured together: as dependent as the sets that were
            said = [*said[:1], dependence.source]
            none_up = dependence.none_up([1.0 - c[0] for c in caps.values()])
            others_down = dependence.others_down
        else:  # one region, or nothing measured together anywhere: independent
            none_up, others_down = math.prod(1.0 - c[0] for c in caps.values()), math.prod
        # after an interruption in region r: r's own chance of none right then, the others' with it
        after = sum(
            share * caps[r][2] * others_down([1.0 - c[0] for o, c in caps.items() if o != r])
            for r, share in shares.items()
            if r in caps
        )
        wait = none_up / exits if known and exits and none_up > 0 else 0.0
        if joint is not None:  # these regions measured together: their losses are not independent
            avail, down, after = joint
            return (
                True,
                1.0 - avail,
                after,
                (1.0 - avail) * down,
                f"measured together over {', '.join(regions)}",
            )
        return known, none_up, after, wait, "; ".join(said[:2]) if said else ("measured" if known else "")

    def region_dependence(self) -> region_dependence.Dependence | None:
        """The dependence between regions fitted on the sets measured together (cached)."""
        if "fit" not in self._dependence:
            self._dependence["fit"] = region_dependence.fit(self.capacity, self.joint_capacity)
        return self._dependence["fit"]

    def _failover(
        self, cloud: str, instance_type: str, accelerator: str, count: int, regions: Sequence[str]
    ) -> tuple[Gamma, str] | None:
        """The posterior of a job failing over between the zones of `regions` (in that order) when the
        table measured exactly that (every allowed region measured, in this order); the user's
        evidence in those regions on top. None when not measured."""
        measured = tuple(r for r in regions if (cloud, instance_type, (r,), 1) in self.failovers)
        if not measured or len(measured) != len(regions):  # a region never measured: composed instead
            return None
        found = self.failovers.get((cloud, instance_type, measured, 1))
        if found is None:
            return None
        mine = [e for e in self.measured if self._matches(e, cloud, instance_type, accelerator, count)]
        pool = self._pool(mine)
        assert pool is not None
        user = [e for e in self.user if self._matches(e, cloud, instance_type, accelerator, count)
                and e.region in measured]  # fmt: skip
        hours = found[0] + sum(self._node_hours(e) for e in user)
        events = found[1] + sum(e.interruptions for e in user)
        what = f"measured failover over the zones of {', '.join(measured)}: {found[0]:,.0f} h, {found[1]} interruptions"
        if user:
            what += f", and {len(user)} record(s) of yours"
        return pool.update(hours, events), what

    def _region_capacity(
        self, cloud: str, instance_type: str, region: str, zones: list[_Zone]
    ) -> tuple[float, float, float] | None:
        """(availability, mean spell without spot in s, no capacity right after an interruption) of a
        region: measured jointly, else from its zones taken as independent, else None (not measured)."""
        for key in ((cloud, instance_type, region, 1),):
            if key in self.capacity:
                return self.capacity[key]
        known = [z for z in zones if z.availability is not None]
        if not known:
            return None
        none_up = math.prod(1.0 - (z.availability or 0.0) for z in known)
        exits = sum(1.0 / z.mean_down_s for z in known if z.mean_down_s)
        return 1.0 - none_up, (1.0 / exits if exits else 0.0), none_up

    def _borrowed_capacity(
        self, cloud: str, instance_type: str, region: str
    ) -> tuple[tuple[float, float, float] | None, str]:
        """A region whose capacity was never measured for this instance: the mean of the regions measured
        on the same cloud (else on any), and the words that say so; (None, ...) when nothing was measured.
        Spot capacity is assumed neither always there nor never: as where it was measured."""
        pool = [(k, v) for k, v in self.capacity.items() if k[0] == cloud and k[3] == 1]
        where = cloud
        if not pool:
            pool, where = [(k, v) for k, v in self.capacity.items() if k[3] == 1], "other clouds"
        if not pool:
            return None, f"capacity not measured for {instance_type} in {region}: taken as always obtainable"
        avail = sum(v[0] for _, v in pool) / len(pool)
        down = sum(v[1] for _, v in pool) / len(pool)
        after = sum(v[2] for _, v in pool) / len(pool)
        types = ", ".join(sorted({k[1] for k, _ in pool}))
        why = (
            f"capacity not measured for {instance_type} in {region}: the mean of {len(pool)} measured "
            f"region(s) on {where} ({types}): obtainable {avail:.0%} of the time"
        )
        return (avail, down, after), why

    def rows(self) -> list[dict[str, Any]]:
        """Every key the table knows, for `ftorch hazards`: one row per (cloud, instance, region, zone),
        and one per measured region as a whole (a job failing over between its zones: what plans use)."""
        seen: dict[tuple[str, str, str, str, int], None] = {}
        for e in self.measured + self.user:
            seen[(e.cloud, e.instance_type, e.accelerator, e.region or "", e.count)] = None
        out = []
        for cloud, itype, acc, region, count in seen:
            for z in self.zones_of(cloud, itype, acc, count, region):
                low, high = self.interval(z.gamma)
                out.append({
                    "cloud": cloud, "instance_type": itype, "accelerator": acc, "count": count,
                    "region": region, "zone": z.name if z.level == "zone" else None,
                    "rate_per_hour": z.gamma.mean, "low_per_hour": low,
                    "high_per_hour": high, "hours": z.hours, "interruptions": z.interruptions,
                    "availability": z.availability, "mean_down_s": z.mean_down_s, "level": z.level,
                    # arriving at a random time: no spot with 1 - availability, then the rest of a spell
                    "expected_wait_s": (1 - z.availability) * z.mean_down_s
                    if z.availability is not None and z.mean_down_s is not None else None,
                    "source": z.source,
                })  # fmt: skip
        for (cloud, itype, region, _nodes), (avail, down, _after) in sorted(self.capacity.items()):
            measured = [
                e for e in self.measured if (e.cloud, e.instance_type, e.region) == (cloud, itype, region)
            ]
            acc, count = (measured[0].accelerator, measured[0].count) if measured else ("", 0)
            found = self._failover(cloud, itype, acc, count, [region])
            if found is None:
                continue
            g, source = found
            hours, events = self.failovers[(cloud, itype, (region,), 1)]
            low, high = self.interval(g)
            out.append({
                "cloud": cloud, "instance_type": itype, "accelerator": acc, "count": count, "region": region,
                "zone": "any (failover)", "rate_per_hour": g.mean, "low_per_hour": low,
                "high_per_hour": high, "hours": hours, "interruptions": events, "availability": avail,
                "mean_down_s": down, "level": "failover", "expected_wait_s": (1 - avail) * down, "source": source,
            })  # fmt: skip
        return out


def correlation_with(
    rows: list[Evidence], user: list[Evidence], rho: float, source: str
) -> tuple[float, str]:
    """rho moved by the user's multi-node evidence (imported traces `--nodes N`, recorded N-node attempts)
    that shares a zone with one-node evidence of the same instance: each pair says rate_N / rate_1 =
    1 + (N - 1)(1 - rho); the estimates, weighted by their hours, are pooled with the bundled rho counted
    as RHO_PRIOR_HOURS hours. Without such a pair, the bundled rho and its source as they are."""
    single: dict[tuple[str, str, str], list[float]] = {}
    for e in rows:
        if e.nodes == 1 and e.zone and e.hours > 0:
            acc = single.setdefault((e.cloud, e.instance_type, e.zone), [0.0, 0.0])
            acc[0] += e.hours
            acc[1] += e.interruptions
    pairs = []
    for e in user:
        one = single.get((e.cloud, e.instance_type, e.zone or ""))
        if e.nodes > 1 and e.hours > 0 and one is not None and one[1] > 0:
            factor = (e.interruptions / e.hours) / (one[1] / one[0])
            pairs.append((min(1.0, max(0.0, 1.0 - (factor - 1.0) / (e.nodes - 1))), e.hours))
    if not pairs:
        return rho, source
    hours = sum(h for _, h in pairs)
    moved = (rho * RHO_PRIOR_HOURS + sum(r * h for r, h in pairs)) / (RHO_PRIOR_HOURS + hours)
    said = (
        f"{len(pairs)} multi-node record(s) of yours ({hours:,.0f} h) beside one-node evidence of the same "
        f"zone, pooled with {rho:.2f} counted as {RHO_PRIOR_HOURS:.0f} h ({source})"
    )
    return moved, said


def _what(rows: list[Evidence]) -> str:
    zones = {(e.region, e.zone) for e in rows}
    hours = sum(e.hours for e in rows)
    return f"{len(zones)} zones, {hours:,.0f} h, {sum(e.interruptions for e in rows)} interruptions"


def _weighted(values: list[float], weights: list[float]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


# ---- loading and the user's evidence -----------------------------------------------------------------
@lru_cache(maxsize=1)
def bundled() -> dict[str, Any]:
    text = resources.files("orchestrator.data").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def user_path(home: Path | None = None) -> Path:
    return (home or ftorch_home()) / USER_FILE


def load_user(home: Path | None = None) -> list[Evidence]:
    path = user_path(home)
    if not path.exists():
        return []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return [Evidence.from_json(r) for r in raw.get("evidence", [])]
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"hazards: {path} is unreadable ({exc.__class__.__name__}); move it away") from None


def save_user(evidence: list[Evidence], home: Path | None = None) -> Path:
    """Keep the user's evidence under $FTORCH_HOME, owner-only, written whole or not at all."""
    if home is None:
        folder = private_dir()
    else:
        folder = home
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / USER_FILE
    payload = {"updated_at": time.time(), "evidence": [e.to_json() for e in evidence]}
    write_private(path, json.dumps(payload, indent=1, sort_keys=True).encode())
    return path


def load_table(home: Path | None = None, prior: dict[str, Any] | None = None) -> HazardTable:
    """The bundled prior with the user's evidence."""
    return HazardTable.from_json(prior or bundled(), load_user(home))


def add_evidence(new: list[Evidence], home: Path | None = None) -> int:
    """Add evidence not kept yet (same source and key); the number added."""
    kept = load_user(home)
    have = {(e.source, e.cloud, e.instance_type, e.region, e.zone, e.nodes) for e in kept}
    fresh = [e for e in new if (e.source, e.cloud, e.instance_type, e.region, e.zone, e.nodes) not in have]
    if fresh:
        save_user(kept + fresh, home)
    return len(fresh)


# ---- the user's own attempts -------------------------------------------------------------------------
def evidence_from_run(
    job_id: str, spec: dict[str, Any], attempts: dict[int, dict[str, Any]], epochs: dict[int, dict[str, Any]]
) -> list[Evidence]:
    """One Evidence per spot attempt of a run that says where it ran: its alive hours, and whether it
    ended interrupted (a notice, or gone without an end while a later attempt followed) or censored
    (finished, stopped, or the newest attempt without an end: nobody knows yet). Where: the attempt's
    SkyPilot cluster info (attempts/<n>.json); what: the GPU the attempt measured, else the job's
    resources; the market from its price record."""
    from orchestrator.sizing.history import catalog_gpu
    from trainer.recording.ledger import by_attempt
    from trainer.stops.budget import alive_s
    from trainer.stops.interruptions import NOT_INTERRUPTIONS

    res = spec.get("resources") or {}
    out = []
    records = by_attempt(epochs)
    newest = max(records) if records else 0
    for n, record in sorted(records.items()):
        info = (attempts.get(n) or {}).get("cluster_info") or {}
        cloud, region = str(info.get("cloud") or "").lower(), info.get("region")
        if record.get("market") != "spot" or not cloud or not region:
            continue
        nodes = int(info.get("num_nodes") or res.get("nodes") or 1)
        measured = record.get("measured") or {}
        acc = catalog_gpu(measured.get("gpu_name")) or next(iter(res.get("accelerators") or []), None)
        world = measured.get("world_size")
        count = int(world) // nodes if world else int(res.get("gpus") or 0)
        hours = alive_s(record) / 3600.0
        if not acc or not count or hours <= 0:
            continue
        ended = record.get("ended")
        interrupted = ended not in NOT_INTERRUPTIONS and (ended is not None or n < newest)
        out.append(Evidence(
            cloud=cloud, instance_type="", region=str(region), zone=info.get("zone"), nodes=nodes,
            hours=hours, interruptions=int(interrupted), source=f"attempt {job_id}/{n}", accelerator=acc,
            count=count,
        ))  # fmt: skip
    return out


def learn_from_store(job_id: str, spec: dict[str, Any], store: Any, home: Path | None = None) -> int:
    """Keep the spot attempts of a run as evidence (orchestrator/sizing/history.py calls it as a job ends)."""
    from trainer.runstore.attempts import ATTEMPTS

    attempts: dict[int, dict[str, Any]] = {}
    for name in store.listdir(ATTEMPTS):
        stem = name.removesuffix(".json")
        if stem.isdigit():
            attempts[int(stem)] = store.read_json_or_none(f"{ATTEMPTS}/{name}") or {}
    return add_evidence(evidence_from_run(job_id, spec, attempts, store.epoch_records()), home)


def learn_from_job(registry: Any, job: Any) -> int:
    """The job's spot attempts as evidence (called where orchestrator/sizing/history.py learns from a job);
    best effort: an unreadable store is learnt from next time."""
    try:
        return learn_from_store(job.job_id, job.spec, job.run_store(retry_seconds=2.0), registry.home)
    except Exception:  # noqa: BLE001 - the evidence is best effort
        return 0
