"""Build the bundled GPU offer table (orchestrator/data/gpu_offers.csv, gpu_offer_regions.csv).

Source: ../shared/data/catalog/ (a snapshot of SkyPilot's public catalog; see its README for quirks).
What this script decides, so the planner does not have to:

- prices per region are the cheapest zone of the region; an offer's price is the median over regions,
  because the single cheapest zone often has no capacity;
- AWS shows zones without a spot quote as spot == on-demand, and RunPod SECURE pods are not
  interruptible (spot == price): those are "no spot quote", not spot prices;
- GCP n1 rows (T4, V100, P100, P4) are GPU-only prices: an n1-standard host of 8 vCPUs per GPU is added
  (N1_HOST_* below, us-central1 list prices, an approximation);
- fractional GPUs (AWS g6f, 1/4 of an L4) are dropped;
- multi-GPU instances whose interconnect the snapshot marks 'unknown' are NVLink where the machine family
  is SXM by construction (GCP a2/a3, Lambda *_sxm*); the rest stay 'unknown' and count as PCIe.
- the consumer tier (consumer_offers*.csv: RunPod and Vast GDDR cards, PCIe only) is added for the
  cards in CONSUMER_CARDS, the ones the time model has datasheet figures for (orchestrator/
  throughput.py). Left out: RTX PRO 4000/4500/5000/6000 (Blackwell workstation; SkyPilot's
  `RTXPRO6000` already names AWS g7e's server card, and the smaller ones' datasheet figures are not
  pinned here), and Vast's RTX 3060/3070/3080/4060/4070/A2000 (8-16 GB, and Vast's names merge
  variants: its RTX4070 is a 4070 Ti SUPER, its RTX3060 both the 12 GB 3060 and the 8 GB 3060 Ti).
  Neither marketplace quotes spot prices (RunPod SECURE pods: spot == price; Vast: 0.00), so these
  offers are on-demand only; Vast's vCPUs and host memory are the same 32/64 in every row (read from
  the instance name, not the machine), so they are left empty rather than shipped as facts.

Usage: python scripts/build_catalog.py [SOURCE_DIR] [--out orchestrator/data]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from orchestrator.sizing import catalog as catalog_module

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "data" / "catalog"
DEFAULT_OUT = REPO / "orchestrator" / "data"
N1_HOST_ONDEMAND_PER_GPU = 0.38  # n1-standard-8, USD/h
N1_HOST_SPOT_PER_GPU = 0.08
#: consumer/workstation cards taken from consumer_offers*.csv: the catalog's own list
CONSUMER_CARDS = set(catalog_module.CONSUMER_CARDS)
#: clouds whose host figures (vCPUs, memory) in the consumer catalog are placeholders, not the machine
PLACEHOLDER_HOST = {"vast"}

OFFER_FIELDS = [
    "cloud",
    "instance_type",
    "accelerator",
    "count",
    "gpu_memory_gib",
    "vcpus",
    "memory_gib",
    "ondemand_usd",
    "spot_usd",
    "n_regions",
    "regions",
    "interconnect",
    "notes",
]
REGION_FIELDS = ["cloud", "instance_type", "region", "ondemand_usd", "spot_usd"]


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def _interconnect(row: dict[str, str]) -> str:
    value = row["interconnect"]
    if value != "unknown":
        return "n/a" if value.startswith("n/a") else value
    name = row["instance_type"].lower()
    if (row["cloud"] == "gcp" and name.startswith(("a2-", "a3-"))) or "sxm" in name:
        return "NVLink"
    return "unknown"


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open(encoding="utf-8"))) if path.exists() else []


def _consumer(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r["accelerator"] in CONSUMER_CARDS]


def build(source: Path, out: Path) -> tuple[int, int]:
    offers = list(csv.DictReader((source / "gpu_offers.csv").open(encoding="utf-8")))
    zones = list(csv.DictReader((source / "gpu_offers_by_region.csv").open(encoding="utf-8")))
    offers += _consumer(_rows(source / "consumer_offers.csv"))
    zones += _consumer(_rows(source / "consumer_offers_by_region.csv"))
    per_region: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(
        lambda: {"od": [], "spot": []}
    )
    for z in zones:
        key = (z["cloud"], z["instance_type"], z["region"])
        price, spot = _float(z["price"]), _float(z["spot_price"])
        gpu_only = z["price_basis"].startswith("gpu-only")
        count = float(z["count"] or 1)
        if gpu_only:
            price = price + N1_HOST_ONDEMAND_PER_GPU * count if price else None
            spot = spot + N1_HOST_SPOT_PER_GPU * count if spot else None
        no_quote = spot is not None and price is not None and abs(spot - price) < 1e-9
        if z["cloud"] in ("aws", "runpod") and no_quote:
            spot = None  # (vast's 0.00 spot is already no quote: _float drops it)
        if price:
            per_region[key]["od"].append(price)
        if spot:
            per_region[key]["spot"].append(spot)

    region_rows = []
    by_offer: dict[tuple[str, str], list[dict[str, float | None]]] = defaultdict(list)
    for (cloud, itype, region), prices in sorted(per_region.items()):
        od = min(prices["od"]) if prices["od"] else None
        spot = min(prices["spot"]) if prices["spot"] else None
        if od is None and spot is None:
            continue
        region_rows.append(
            {
                "cloud": cloud,
                "instance_type": itype,
                "region": region,
                "ondemand_usd": f"{od:.4f}" if od else "",
                "spot_usd": f"{spot:.4f}" if spot else "",
            }
        )
        by_offer[(cloud, itype)].append({"region": region, "od": od, "spot": spot})

    offer_rows = []
    for row in offers:
        count = float(row["accelerator_count"])
        if count < 1 or count != int(count):
            continue  # fractional GPUs cannot hold a training job's model
        regions = by_offer.get((row["cloud"], row["instance_type"]), [])
        if not regions:
            continue
        ods = [r["od"] for r in regions if r["od"]]
        spots = [r["spot"] for r in regions if r["spot"]]
        notes = []
        if row["notes"].startswith("partial"):
            notes.append("partial region coverage")
        if "GPU-only" in row["notes"]:
            notes.append("n1 host price added (approx.)")
        if not spots:
            notes.append("no spot")
        if row["accelerator"] in CONSUMER_CARDS:
            notes.append("consumer tier: PCIe, marketplace")
        placeholder = row["cloud"] in PLACEHOLDER_HOST
        offer_rows.append(
            {
                "cloud": row["cloud"],
                "instance_type": row["instance_type"],
                "accelerator": row["accelerator"],
                "count": int(count),
                "gpu_memory_gib": row["gpu_memory_gib"],
                "vcpus": "" if placeholder else row["vcpus"],
                "memory_gib": "" if placeholder else row["memory_gib"],
                "ondemand_usd": f"{statistics.median(ods):.4f}" if ods else "",
                "spot_usd": f"{statistics.median(spots):.4f}" if spots else "",
                "n_regions": len(regions),
                "regions": ";".join(sorted(r["region"] for r in regions)),
                "interconnect": _interconnect(row),
                "notes": "; ".join(notes),
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    with (out / "gpu_offers.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, OFFER_FIELDS)
        writer.writeheader()
        writer.writerows(offer_rows)
    with (out / "gpu_offer_regions.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, REGION_FIELDS)
        writer.writeheader()
        writer.writerows(region_rows)
    return len(offer_rows), len(region_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source",
        nargs="?",
        type=Path,
        default=DEFAULT_SOURCE,
        help=f"folder with gpu_offers.csv, gpu_offers_by_region.csv and consumer_offers*.csv "
        f"(default {DEFAULT_SOURCE})",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    n_offers, n_regions = build(args.source, args.out)
    print(f"wrote {n_offers} offers and {n_regions} region prices to {args.out}")


if __name__ == "__main__":
    main()
