"""What moving a job's bytes and keeping its checkpoints cost: the planner prices them per candidate.

Rates per cloud come from orchestrator/data/egress.json (list prices with their sources and date). Who
pays: the sender's cloud. A save from a GPU in region A to a run store in region B of the same cloud pays
that cloud's inter-region rate, one to a store in another cloud the GPU cloud's internet rate; a restore
or a data pull the other way pays the store's cloud. Same region: free. Storage: the checkpoints kept
(`checkpoint.keep`) for the whole run, at the store's cloud's rate.

The run store's region is `checkpoint.region` when the job file gives it, else what the bucket answers
(orchestrator/spot/store_region.py, cached); a local path has none (nothing crosses a cloud); otherwise
it is unknown and data movement is not priced (the plan says so; `require_region` refuses where needed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any
from urllib.parse import urlparse

HOURS_PER_MONTH = 730.0
#: fsspec schemes of object stores -> the cloud that bills them
STORE_CLOUDS = {
    "s3": "aws",
    "s3a": "aws",
    "gs": "gcp",
    "gcs": "gcp",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
}


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(
        resources.files("orchestrator.data").joinpath("egress.json").read_text(encoding="utf-8")
    )


#: URL schemes (fsspec protocols) of a path on the machine itself
LOCAL_SCHEMES = frozenset({"", "file", "local"})


@dataclass(frozen=True)
class Store:
    """Where the run store is: its cloud and region, and how that is known."""

    cloud: str | None
    region: str | None
    how: str  # checkpoint.region | bucket | disk (a path on this machine) | unknown

    @property
    def known(self) -> bool:
        return self.how != "unknown"

    @property
    def on_disk(self) -> bool:
        """A path on the machine that runs the job: no cloud transfer."""
        return self.how == "disk"


def store_of(spec: Any, detect: bool = True) -> Store:
    """The run store's place from the job file: a local path is on disk (no cloud transfer); an object
    store's region is checkpoint.region, else the bucket's own answer (orchestrator/spot/store_region.py,
    with `detect`), else unknown."""
    uri = spec.checkpoint.uri
    scheme = urlparse(uri).scheme.lower() if "://" in uri else ""
    region = getattr(spec.checkpoint, "region", None)
    if scheme in LOCAL_SCHEMES:
        return Store(None, None, "disk")
    cloud = STORE_CLOUDS.get(scheme)
    if region:
        return Store(cloud, region, "checkpoint.region")
    if detect:
        from orchestrator.spot.store_region import detect as ask_bucket

        found = ask_bucket(uri, getattr(spec.checkpoint, "storage_options", None) or {})
        if found:
            return Store(cloud, found, "bucket")
    return Store(cloud, None, "unknown")


def per_gb(sender: str, sender_region: str, receiver: str, receiver_region: str) -> float | None:
    """USD per GB the sender's cloud bills for a transfer; None when the table has no rate for it."""
    rates = table()["clouds"].get(sender)
    if rates is None:
        return None
    if sender != receiver:
        return float(rates["internet_usd_per_gb"])
    if sender_region == receiver_region:
        return float(rates["same_region_usd_per_gb"])
    return float(rates["inter_region_usd_per_gb"])


def storage_per_gb_month(cloud: str | None) -> float | None:
    rates = table()["clouds"].get(cloud or "")
    value = rates.get("storage_usd_per_gb_month") if rates else None
    return float(value) if value is not None else None


@dataclass(frozen=True)
class Movement:
    """A candidate's data-movement and storage bill (None: not priced) and what one save costs."""

    egress_usd: float | None
    storage_usd: float | None
    per_save_usd: float
    per_restore_usd: float
    note: str | None = None


def price(
    store: Store,
    cloud: str,
    shares: dict[str, float],
    *,
    save_gb: float,
    saves: float,
    pull_gb: float,
    launches: float,
    restores: float,
    keep: int,
    hours: float,
) -> Movement:
    """The bill of a job that runs on `cloud`, spending `shares` of its time in each region: `saves`
    checkpoints of `save_gb` up to the store, `restores` of one back, `launches` pulls of `pull_gb` (the
    data set) from it, `keep` checkpoints stored for `hours`."""
    month = storage_per_gb_month(store.cloud)
    storage = month * save_gb * keep * hours / HOURS_PER_MONTH if month is not None else None
    if store.on_disk:
        return Movement(0.0, 0.0, 0.0, 0.0)
    if not store.known or store.cloud is None:
        return Movement(
            None, storage, 0.0, 0.0, "egress: the run store's region is unknown; set checkpoint.region"
        )
    up = down = 0.0
    for region, share in shares.items():
        rate_up = per_gb(cloud, region, store.cloud, store.region or "")
        rate_down = per_gb(store.cloud, store.region or "", cloud, region)
        if rate_up is None or rate_down is None:
            who = cloud if rate_up is None else store.cloud
            return Movement(
                None,
                storage,
                0.0,
                0.0,
                f"egress: no transfer rates for {who} in orchestrator/data/egress.json",
            )
        up += share * rate_up
        down += share * rate_down
    total = up * save_gb * saves + down * (save_gb * restores + pull_gb * launches)
    return Movement(total, storage, up * save_gb, down * save_gb)


def attempt_movement(
    store: Store, attempts: dict[int, dict[str, Any]], records: dict[int, dict[str, Any]], save_bytes: float
) -> dict[str, Any] | None:
    """What each attempt paid to move checkpoints (the ledger's `data_movement`): its uploads
    (`measured.checkpoint_uploads`) of `save_bytes` from where it ran (SkyPilot's cluster info,
    attempts/<n>.json) to the run store, and the checkpoint it resumed from (start_step > 0) back.
    None when the store's place is unknown or nothing says where an attempt ran."""
    from trainer.recording.ledger import by_attempt

    if not store.known or store.cloud is None or store.on_disk:
        return None
    rows, gb = [], save_bytes / 1e9
    for n, record in sorted(by_attempt(records).items()):
        info = (attempts.get(n) or {}).get("cluster_info") or {}
        cloud, region = str(info.get("cloud") or "").lower(), str(info.get("region") or "")
        uploads = int((record.get("measured") or {}).get("checkpoint_uploads") or 0)
        restores = 1 if int(record.get("start_step") or 0) > 0 else 0
        if not cloud or not region:
            continue
        up, down = (
            per_gb(cloud, region, store.cloud, store.region or ""),
            per_gb(store.cloud, store.region or "", cloud, region),
        )
        usd = (up or 0.0) * gb * uploads + (down or 0.0) * gb * restores
        rows.append({"attempt": n, "cloud": cloud, "region": region, "uploads": uploads, "restores": restores,
                     "gb": round(gb * (uploads + restores), 3), "usd": round(usd, 4),
                     "priced": up is not None and down is not None})  # fmt: skip
    if not rows:
        return None
    return {"store": f"{store.cloud} {store.region}", "attempts": rows,
            "gb": round(sum(r["gb"] for r in rows), 3), "total_usd": round(sum(r["usd"] for r in rows), 4)}  # fmt: skip


def require_region(spec: Any, candidates: list[Any]) -> None:
    """Refuse (SpecError on checkpoint.region, exit 2) a plan whose data movement cannot be priced but
    matters: an object-store run store whose region neither the job file nor the bucket gives, while the
    candidates run in more than one place (cloud and region), so that the choice depends on where the
    store is. One place, or a local store: nothing to refuse."""
    store = store_of(spec)
    if store.known:
        return
    places = {(c.cloud, r) for c in candidates for r in (getattr(c, "regions", None) or [""])}
    if len(places) <= 1:
        return
    same = sorted({r for cloud, r in places if cloud == store.cloud and r})
    valid = ", ".join(same) if same else "the bucket's region"
    from orchestrator.errors import SpecError

    raise SpecError(
        "checkpoint.region",
        f"the region of {spec.checkpoint.uri} is unknown (the bucket could not be asked) and the offers span "
        f"{len(places)} regions; set it to the bucket's region, one of: {valid}",
    )
