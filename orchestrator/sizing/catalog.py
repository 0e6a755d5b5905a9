"""GPU offers: SkyPilot's catalog when it can be read, else the bundled snapshot.

The bundled table (orchestrator/data/gpu_offers.csv and gpu_offer_regions.csv) is produced from
../shared/data/catalog/ by scripts/build_catalog.py. SkyPilot is optional; reading its catalog is
attempted only when `offline` is false and `sky` is importable, in a child process that gets
SKY_PROBE_TIMEOUT_S to answer, so the CLI never waits long on the network nor prints SkyPilot's noise.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources, util
from typing import Any

SKY_PROBE_TIMEOUT_S = 3.0
#: the consumer cards the bundled catalog takes from SkyPilot's RunPod/Vast catalogs (names as they spell
#: them; scripts/build_catalog.py reads this list)
CONSUMER_CARDS = (
    "RTX3090",
    "RTX4090",
    "RTX5090",
    "RTXA4000",
    "RTXA4500",
    "RTXA5000",
    "RTXA6000",
    "RTX2000-Ada",
    "RTX4000-Ada",
    "RTX6000-Ada",
)
#: the consumer tier: GeForce and RTX workstation GDDR cards (PCIe only, no NVLink in any offer; RunPod
#: and Vast marketplaces, plus Lambda's A6000 and Quadro RTX6000). Everything else is "datacenter".
CONSUMER_TIER = frozenset(name.lower() for name in (*CONSUMER_CARDS, "A6000", "RTX6000"))
TIERS = ("consumer", "datacenter")
BUNDLED_SOURCE = (
    "bundled snapshot of SkyPilot's catalog (scripts/build_catalog.py from ../shared/data/catalog)"
)


@dataclass(frozen=True)
class Offer:
    cloud: str
    instance_type: str
    accelerator: str
    count: int
    gpu_memory_gib: float
    ondemand_usd: float | None
    spot_usd: float | None
    interconnect: str  # NVLink | PCIe | n/a (one GPU) | unknown
    regions: tuple[str, ...] = ()
    vcpus: float | None = None
    memory_gib: float | None = None
    notes: str = ""
    #: region -> (on-demand, spot) hourly prices, for plans restricted to some regions
    region_prices: dict[str, tuple[float | None, float | None]] = field(default_factory=dict, compare=False)

    @property
    def nvlink(self) -> bool:
        return self.interconnect.lower() == "nvlink"

    @property
    def tier(self) -> str:
        """'consumer' (GDDR GeForce/workstation cards) or 'datacenter'."""
        return "consumer" if self.accelerator.lower() in CONSUMER_TIER else "datacenter"

    def prices_in(self, regions: list[str] | None) -> tuple[float | None, float | None, tuple[str, ...]]:
        """(on-demand, spot, regions) over the allowed regions: the median of the regions' prices."""
        if not regions:
            return self.ondemand_usd, self.spot_usd, self.regions
        allowed = [r for r in self.regions if r in set(regions)]
        if not allowed:
            return None, None, ()
        ods = [p[0] for r in allowed if (p := self.region_prices.get(r)) and p[0]]
        spots = [p[1] for r in allowed if (p := self.region_prices.get(r)) and p[1]]
        od = statistics.median(ods) if ods else (self.ondemand_usd if not self.region_prices else None)
        spot = statistics.median(spots) if spots else (self.spot_usd if not self.region_prices else None)
        return od, spot, tuple(allowed)

    def to_json(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "accelerator": self.accelerator,
            "tier": self.tier,
            "count": self.count,
            "gpu_memory_gib": self.gpu_memory_gib,
            "interconnect": self.interconnect,
            "ondemand_hourly_usd": self.ondemand_usd,
            "spot_hourly_usd": self.spot_usd,
            "regions": list(self.regions),
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class Catalog:
    offers: tuple[Offer, ...]
    #: where the offers came from, said in words (shown by `ftorch gpus`)
    source: str
    live: bool = False

    def filter(
        self,
        *,
        min_memory_gib: float | None = None,
        clouds: list[str] | None = None,
        accelerators: list[str] | None = None,
        tier: str | None = None,
    ) -> list[Offer]:
        wanted = {a.lower() for a in accelerators or []}
        return [
            o
            for o in self.offers
            if (min_memory_gib is None or o.gpu_memory_gib >= min_memory_gib)
            and (not clouds or o.cloud in clouds)
            and (not wanted or o.accelerator.lower() in wanted)
            and (tier is None or o.tier == tier)
        ]


def _num(text: str | None) -> float | None:
    if text is None or str(text).strip() == "":
        return None
    return float(text)


def parse_offers(offers_csv: str, regions_csv: str | None = None) -> list[Offer]:
    """Offers from the bundled CSV format (tests build fixed catalogs with it too)."""
    region_prices: dict[tuple[str, str], dict[str, tuple[float | None, float | None]]] = {}
    if regions_csv:
        for row in csv.DictReader(io.StringIO(regions_csv)):
            key = (row["cloud"], row["instance_type"])
            region_prices.setdefault(key, {})[row["region"]] = (
                _num(row["ondemand_usd"]),
                _num(row["spot_usd"]),
            )
    offers = []
    for row in csv.DictReader(io.StringIO(offers_csv)):
        key = (row["cloud"], row["instance_type"])
        offers.append(
            Offer(
                cloud=row["cloud"],
                instance_type=row["instance_type"],
                accelerator=row["accelerator"],
                count=int(row["count"]),
                gpu_memory_gib=float(row["gpu_memory_gib"]),
                ondemand_usd=_num(row.get("ondemand_usd")),
                spot_usd=_num(row.get("spot_usd")),
                interconnect=row.get("interconnect") or "unknown",
                regions=tuple(r for r in (row.get("regions") or "").split(";") if r),
                vcpus=_num(row.get("vcpus")),
                memory_gib=_num(row.get("memory_gib")),
                notes=row.get("notes") or "",
                region_prices=region_prices.get(key, {}),
            )
        )
    return offers


@lru_cache(maxsize=1)
def bundled_catalog() -> Catalog:
    data = resources.files("orchestrator").joinpath("data")
    offers = parse_offers(
        data.joinpath("gpu_offers.csv").read_text("utf-8"),
        data.joinpath("gpu_offer_regions.csv").read_text("utf-8"),
    )
    return Catalog(tuple(offers), BUNDLED_SOURCE, live=False)


#: run in a child process, so SkyPilot's imports, network retries and prints never reach the CLI
_SKY_PROBE = """
import json
from sky import catalog
rows = []
for acc, infos in catalog.list_accelerators(gpus_only=True, name_filter=None, case_sensitive=False).items():
    for i in infos:
        rows.append({"cloud": str(i.cloud).lower(), "instance_type": i.instance_type, "accelerator": acc,
                     "count": i.accelerator_count, "memory": i.memory, "device_memory": i.device_memory,
                     "cpus": i.cpu_count, "price": i.price, "spot_price": i.spot_price,
                     "region": getattr(i, "region", None)})
print("FTORCH-SKY-JSON" + json.dumps(rows))
"""


def _sky_offers(timeout_s: float | None = None) -> list[Offer]:
    """Offers from SkyPilot's catalog (`sky.catalog.list_accelerators`), one per instance type."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _SKY_PROBE],
        capture_output=True,
        text=True,
        timeout=timeout_s or SKY_PROBE_TIMEOUT_S,
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("FTORCH-SKY-JSON")]
    if proc.returncode != 0 or not marker:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(last[:200])
    offers: dict[tuple[str, str], Offer] = {}
    for row in json.loads(marker[-1].removeprefix("FTORCH-SKY-JSON")):
        count = row["count"]
        if not count or count != int(count) or not row.get("device_memory"):
            continue
        key = (row["cloud"], row["instance_type"] or f"{row['accelerator']}x{int(count)}")
        if key in offers:
            continue
        offers[key] = Offer(
            cloud=key[0],
            instance_type=key[1],
            accelerator=row["accelerator"],
            count=int(count),
            gpu_memory_gib=float(row["device_memory"]),
            ondemand_usd=row["price"] if row.get("price") and row["price"] > 0 else None,
            spot_usd=row["spot_price"] if row.get("spot_price") and row["spot_price"] > 0 else None,
            interconnect="unknown" if count > 1 else "n/a",
            regions=(row["region"],) if row.get("region") else (),
            vcpus=row.get("cpus"),
            memory_gib=row.get("memory"),
        )
    return list(offers.values())


def sky_available() -> bool:
    return util.find_spec("sky") is not None


def load_catalog(offline: bool = True) -> Catalog:
    """SkyPilot's catalog when online and readable within a short probe, else the bundled snapshot."""
    bundled = bundled_catalog()
    if offline:
        return bundled
    if not sky_available():
        return Catalog(bundled.offers, f"{bundled.source}; SkyPilot is not installed", live=False)
    try:
        offers = _sky_offers(SKY_PROBE_TIMEOUT_S)
    except Exception as exc:  # the live source is optional: any failure falls back to the snapshot
        why = f"no answer within {SKY_PROBE_TIMEOUT_S:.0f}s" if "Timeout" in type(exc).__name__ else str(exc)
        return Catalog(bundled.offers, f"{bundled.source}; sky.catalog unavailable ({why})", live=False)
    if not offers:
        return Catalog(bundled.offers, f"{bundled.source}; sky.catalog listed no GPU offers", live=False)
    # SkyPilot does not say which multi-GPU machines have NVLink: take it from the snapshot where known
    known = {(o.cloud, o.instance_type): o.interconnect for o in bundled.offers}
    merged = tuple(
        Offer(**{**o.__dict__, "interconnect": known.get((o.cloud, o.instance_type), o.interconnect)})
        for o in offers
    )
    return Catalog(merged, "SkyPilot catalog (sky.catalog), live", live=True)
