"""What a SkyPilot job costs: SkyPilot reports no price, so ftorch keeps one.

At launch the plan's offers give a price per (cloud, GPU, count, spot). Each time SkyPilot places the job
(after each recovery) a segment starts, priced by the offer it landed on; the cost is each segment's
share of SkyPilot's running time at its price.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.sizing.sky_names import sky_name


def offer_prices(plan: Any) -> list[dict[str, Any]]:
    """(cloud, accelerator, count, spot) -> the cheapest hourly price of one node among the plan's offers
    (the planner's prices are for all the job's nodes)."""
    best: dict[tuple[Any, ...], float] = {}
    for c in plan.candidates:
        nodes = max(1, int(getattr(c, "nodes", 1) or 1))
        for spot, price in ((True, c.spot_hourly_usd), (False, c.ondemand_hourly_usd)):
            if price is not None:
                key = (c.cloud, c.accelerator, c.count, spot)
                best[key] = min(price / nodes, best.get(key, math.inf))
    return [
        {"cloud": k[0], "accelerator": k[1], "count": k[2], "spot": k[3], "hourly_usd": v, "per": "node"}
        for k, v in sorted(best.items(), key=lambda kv: kv[1])
    ]


#: SkyPilot's `cluster_resources`: f"{launched_nodes}x" + ("[spot]" if use_spot) + "(...)"
#: (sky/utils/resources_utils.py get_readable_resources_repr / format_resource, 0.14.1)
_CLUSTER = re.compile(r"^\s*(\d+)x(\[spot\])?\(")


def is_spot(record: Mapping[str, Any]) -> bool | None:
    """Spot or on-demand, from the cluster SkyPilot launched (`cluster_resources`). The requested
    `resources` string reads `[On-demand|Spot]` for a task that mixes them, so it decides only when
    it names one kind; None when unknown (not placed yet)."""
    placed_on = _CLUSTER.match(str(record.get("cluster_resources") or ""))
    if placed_on:
        return placed_on.group(2) is not None
    asked = str(record.get("resources") or "").lower()
    if "spot" in asked and "on-demand" not in asked:
        return True
    return False if asked.strip() and "spot" not in asked else None


def nodes(record: Mapping[str, Any]) -> int | None:
    """How many nodes SkyPilot launched (from `cluster_resources`); None when not placed yet."""
    placed_on = _CLUSTER.match(str(record.get("cluster_resources") or ""))
    return int(placed_on.group(1)) if placed_on else None


def price_for(offers: list[dict[str, Any]], record: Mapping[str, Any]) -> float | None:
    """The hourly price of the cluster a record runs on: the offer matched by cloud, GPUs (SkyPilot's
    catalog names) and spot, times the node count."""
    cloud = str(record.get("cloud") or "").lower()
    accelerators = record.get("accelerators") or {}
    spot = is_spot(record)
    for offer in offers:
        name = sky_name(offer["accelerator"])
        if (
            offer["cloud"] != cloud
            or accelerators.get(name, accelerators.get(offer["accelerator"])) != offer["count"]
        ):
            continue
        if spot is None or offer["spot"] == spot:
            per_node = offer.get("per") == "node"
            return float(offer["hourly_usd"]) * ((nodes(record) or 1) if per_node else 1)
    return None


def where(record: Mapping[str, Any]) -> str | None:
    if not record.get("cloud"):
        return None
    place = "/".join(str(p) for p in (record.get("cloud"), record.get("region")) if p)
    gpus = ", ".join(f"{n}x {a}" for a, n in (record.get("accelerators") or {}).items())
    if (nodes(record) or 1) > 1:
        gpus = f"{nodes(record)} nodes x {gpus}"
    kind = {True: "spot", False: "on-demand", None: ""}[is_spot(record)]
    return " ".join(p for p in (place.lower(), gpus, kind) if p)


def placed(record: Mapping[str, Any]) -> bool:
    """Running on a cluster whose cloud is known (while recovering, the old placement still shows)."""
    return bool(record.get("cloud")) and str(record.get("status")) in ("RUNNING", "CANCELLING")


def update_segments(state: dict[str, Any], record: Mapping[str, Any], now: float) -> None:
    """One segment per recovery: its price and where it starts in SkyPilot's running time."""
    segments = state.setdefault("segments", [])
    n = int(record.get("recovery_count") or 0)
    if not placed(record) or (segments and segments[-1]["n"] == n):
        return
    total = float(record.get("job_duration") or 0.0)
    current = 0.0
    if record.get("last_recovered_at"):
        current = max(0.0, (record.get("end_at") or now) - float(record["last_recovered_at"]))
    segments.append(
        {
            "n": n,
            "offset_s": max(0.0, total - current),
            "hourly_usd": price_for(state.get("offers") or [], record),
            "where": where(record),
            "nodes": nodes(record) or 1,
        }
    )


def cost_usd(state: Mapping[str, Any]) -> float | None:
    """Price x running time, summed over the segments seen (SkyPilot itself reports no cost)."""
    record = state.get("record") or {}
    segments = state.get("segments") or []
    past = float(state.get("past_cost_usd") or 0.0)  # earlier managed jobs of the run (resume, switches)
    if not segments:
        return past if record or past else None
    total = float(record.get("job_duration") or 0.0)
    cost = past
    for i, seg in enumerate(segments):
        end = segments[i + 1]["offset_s"] if i + 1 < len(segments) else total
        price = seg.get("hourly_usd")
        if price is None:  # an offer outside the plan: the dearest known price, to stay on the safe side
            dearest = max((o["hourly_usd"] for o in state.get("offers") or []), default=0.0)
            price = dearest * int(seg.get("nodes") or 1)
        cost += max(0.0, end - seg["offset_s"]) / 3600.0 * price
    return round(cost, 6)


def ondemand_price(state: Mapping[str, Any]) -> float | None:
    """The on-demand hourly price of the offer the newest placement ran on (its cloud, GPUs and count,
    from the launch's offers in `skypilot.json`), times its nodes: what the ledger prices the same work
    at (trainer/recording/ledger.py). None when the placement is unknown or that offer has no on-demand price."""
    offers = state.get("offers") or []
    segments = [s for s in state.get("segments") or [] if s.get("hourly_usd") is not None]
    if not segments:
        return None
    seg = segments[-1]
    nodes_n = int(seg.get("nodes") or 1)
    where_ = str(seg.get("where") or "").lower()
    for offer in offers:
        scale = nodes_n if offer.get("per") == "node" else 1
        if (
            not where_.startswith(str(offer["cloud"]))
            or abs(offer["hourly_usd"] * scale - seg["hourly_usd"]) > 1e-9
        ):
            continue
        if not offer["spot"]:
            return float(seg["hourly_usd"])
        for other in offers:
            same = (other["cloud"], other["accelerator"], other["count"]) == (
                offer["cloud"],
                offer["accelerator"],
                offer["count"],
            )
            if same and not other["spot"]:
                return float(other["hourly_usd"]) * scale
    return None
