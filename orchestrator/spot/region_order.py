"""A SkyPilot `resources.ordered` list with a lost region moved last (the relaunch after a preemption).

SkyPilot 0.14.1 walks `ordered` from the top on every recovery, and its EAGER_NEXT_REGION does not block
the region it lost (notes/skypilot.md §6), so a relaunch tries the lost region first. The controller
relaunches with this list instead: every entry in another region keeps its place; the lost region's
entries go to the end, in their order. A cloud-wide entry (`infra: aws`) on the lost cloud is spread
over its offer's regions (the plan's, cheapest first: skypilot_render.regions_of) so that the lost one
can go last; with no regions known it stays as it is (SkyPilot then picks among all regions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
