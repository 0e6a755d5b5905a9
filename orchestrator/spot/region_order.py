"""A SkyPilot `resources.ordered` list with a lost region moved last (the relaunch after a preemption).

SkyPilot 0.14.1 walks `ordered` from the top on every recovery, and its EAGER_NEXT_REGION does not block
the region it lost (notes/skypilot.md §6), so a relaunch tries the lost region first. The controller
relaunches with this list instead: every entry in another region keeps its place; the lost region's
entries go to the end, in their order. A cloud-wide entry (`infra: aws`) on the lost cloud is spread
over its offer's regions (the plan's, cheapest first: skypilot_render.regions_of) so that the lost one
can go last; with no regions known it stays as it is (SkyPilot then picks among all regions).

The order itself (`region_costs`, `launch_order`) is one rule for the plan and the launch: the planner
prices the hazard's landing shares and the data movement over it (orchestrator/sizing/planner.py) and
skypilot_render.regions_of gives it to the controller, from the same inputs (the candidate's market,
per-region data movement and interruption rates, restart and interval).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

#: (on-demand, spot) USD per hour of one instance, per region (the catalog's `region_prices`)
RegionPrices = Mapping[str, tuple[float | None, float | None]]


def lost_hours(restart_s: float, interval_s: float) -> float:
    """Hours of progress an interruption loses: the restart and half a checkpoint interval of work."""
    return (float(restart_s) + float(interval_s) / 2.0) / 3600.0


def region_costs(
    regions: Iterable[str],
    prices: RegionPrices,
    spot: bool,
    *,
    nodes: int = 1,
    data_usd_per_hour: Mapping[str, float] | None = None,
    rates_per_hour: Mapping[str, float] | None = None,
    lost_h: float = 0.0,
) -> dict[str, float]:
    """What an hour of progress costs in each of `regions`, the key launches and re-bids are ordered by:
    the instance's price there on the market the job runs on (spot: the spot price, the on-demand one
    where no spot is quoted; on demand: the on-demand price) plus the job's data movement per hour there
    (`data_usd_per_hour`, for all its `nodes`: per instance here), times the re-bid loss on spot, 1 + the
    hazard model's rate there (`rates_per_hour`) x the hours an interruption loses (`lost_hours`). On
    demand, or where no rate is given, the loss is 1; inf where the region has no price."""
    data, rates = data_usd_per_hour or {}, rates_per_hour or {}
    costs: dict[str, float] = {}
    for region in regions:
        od, spot_usd = prices.get(region) or (None, None)
        on_spot = spot and spot_usd is not None
        price = spot_usd if on_spot else od
        if price is None:
            costs[region] = math.inf
            continue
        loss = 1.0 + (rates.get(region, 0.0) if on_spot else 0.0) * lost_h
        costs[region] = (price + data.get(region, 0.0) / max(1, nodes)) * loss
    return costs


def launch_order(regions: Iterable[str], costs: Mapping[str, float]) -> list[str]:
    """`regions` cheapest first by `costs` (`region_costs`); equal ones keep their order, unpriced last."""
    return sorted(regions, key=lambda r: costs.get(r, math.inf))


def entry_key(entry: Mapping[str, Any]) -> str:
    """The "cloud|GPU|count" key of an entry (the key of the plan's region lists)."""
    accelerator, count = next(iter(entry["accelerators"].items()))
    return f"{cloud_of(entry)}|{accelerator}|{count}"


def cloud_of(entry: Mapping[str, Any]) -> str:
    return str(entry["infra"]).split("/")[0].lower()


def region_of(entry: Mapping[str, Any]) -> str | None:
    parts = str(entry["infra"]).split("/")
    return parts[1] if len(parts) > 1 and parts[1] not in ("", "*") else None


def lost_region_last(
    entries: list[dict[str, Any]], cloud: str, region: str, regions: Mapping[str, list[str]]
) -> list[dict[str, Any]]:
    """`entries` with `cloud`/`region` tried last (a new list; the input is left alone)."""
    kept: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    cloud = cloud.lower()
    for entry in entries:
        if cloud_of(entry) != cloud:
            kept.append(dict(entry))
            continue
        where = region_of(entry)
        if where is not None:
            (last if where == region else kept).append(dict(entry))
            continue
        spread = list(regions.get(entry_key(entry)) or [])
        if not spread:
            kept.append(dict(entry))
            continue
        infra = str(entry["infra"]).split("/")[0]
        kept.extend({**entry, "infra": f"{infra}/{r}"} for r in spread if r != region)
        if region in spread:
            last.append({**entry, "infra": f"{infra}/{region}"})
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in kept + last:
        key = repr(sorted((k, repr(v)) for k, v in entry.items()))
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out
