"""One holder at a time for a duty on a run (the cloud controller): a lease in the run store.

Generations, like the fencing epochs (trainer/runstore/store.py claim_epoch): `control/lease/<n>.json`
is written with a conditional create, so of two machines that try generation n+1 at once exactly one
wins. The newest generation is the lease; it holds `holder` and `expires_at`. Its holder renews it
(rewrites its own generation with a later expiry) before it acts; anyone else may take it over only
once it has expired, by creating the next generation. A holder that finds a newer generation has lost
the lease for good (`LeaseLost`) and stops acting: a laptop that wakes after its lease ran out never
acts on what it saw before it slept.

Clocks: `expires_at` is compared with the caller's clock; keep `ttl_s` well above the clock skew
between the machines that may hold it (a few ticks of the controller, minutes). No torch here.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

LEASE_DIR = "control/lease"
#: the longest ttl a lease record may claim: holders write `expires_at = acquired_at + ttl_s` at every
#: acquire and renewal, with `ttl_s` a few controller ticks (3 min by default); a record claiming more
#: (tampered or broken) is treated as expired
MAX_LEASE_TTL_S = 3600.0


def _time(value: Any) -> float:
    """A JSON time as a float; 0.0 (long past) for anything else: text, bools, NaN, infinities."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0


class LeaseError(RuntimeError):
    """The lease cannot be held by this holder."""


class LeaseHeld(LeaseError):
    """Another holder's lease has not expired."""

    def __init__(self, record: LeaseRecord, now: float) -> None:
        self.record = record
        left = max(0.0, record.expires_at - now)
        super().__init__(
            f"the run's controller lease is held by {record.holder} (generation {record.generation},"
            f" expires in {left:.0f} s); one controller per run"
        )


class LeaseLost(LeaseError):
    """A newer generation was taken over while this holder was away (its lease had expired)."""


@dataclass(frozen=True)
class LeaseRecord:
    generation: int
    holder: str
    acquired_at: float
    expires_at: float
    released: bool = False

    def live(self, now: float) -> bool:
        """Not released, not expired, and bounded by its own ttl (`expires_at - acquired_at`, as `_write`
        wrote it): that ttl is at most MAX_LEASE_TTL_S, and `acquired_at` is at most one ttl ahead of
        `now` (clock skew): a record is held at most twice its own ttl (6 min for a controller's default
        3 min), never a day."""
        ttl = self.expires_at - self.acquired_at
        fresh = 0 < ttl <= MAX_LEASE_TTL_S and self.acquired_at <= now + ttl
        return not self.released and fresh and now < self.expires_at

    @classmethod
    def from_json(cls, data: Any, generation: int) -> LeaseRecord:
        data = data if isinstance(data, dict) else {}
        return cls(
            generation=generation,
            holder=str(data.get("holder") or "?"),
            acquired_at=_time(data.get("acquired_at")),
            expires_at=_time(data.get("expires_at")),
            released=bool(data.get("released")),
        )


def _rel(generation: int) -> str:
    return f"{LEASE_DIR}/{generation:08d}.json"


class Lease:
    """The lease of one run store for `holder` (e.g. "controller on host (pid N)")."""

    def __init__(self, store: Any, holder: str, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.store, self.holder, self.ttl_s, self.clock = store, holder, ttl_s, clock
        self.generation: int | None = None  # ours, once acquired

    def generations(self) -> list[int]:
        names = self.store.listdir(LEASE_DIR)
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def current(self) -> LeaseRecord | None:
        """The newest generation (who holds or last held the lease), or None."""
        found = self.generations()
        if not found:
            return None
        return LeaseRecord.from_json(self.store.read_json_or_none(_rel(found[-1])), found[-1])

    def _write(self, generation: int, create: bool) -> None:
        now = self.clock()
        record = LeaseRecord(generation, self.holder, now, now + self.ttl_s)
        payload = json.dumps(asdict(record)).encode()
        self.store.write_bytes(_rel(generation), payload, create=create)

    def acquire(self) -> int:
        """Take the lease (a new generation); LeaseHeld while another holder's has not expired."""
        now = self.clock()
        current = self.current()
        if current is not None and current.live(now) and current.holder != self.holder:
            raise LeaseHeld(current, now)
        generation = (current.generation if current else 0) + 1
        try:
            self._write(generation, create=True)
        except FileExistsError:  # someone else took it at the same moment
            raise LeaseHeld(self.current() or LeaseRecord(generation, "?", now, now), now) from None
        self.generation = generation
        return generation

    def renew(self) -> None:
        """Extend our lease; LeaseLost when a newer generation exists (taken over after it expired)."""
        if self.generation is None:
            raise LeaseLost("the lease was never acquired")
        newest = (self.generations() or [0])[-1]
        if newest != self.generation:
            raise LeaseLost(
                f"the controller lease was taken over (generation {newest} after ours, {self.generation})"
                " while this controller was away; this one stops"
            )
        self._write(self.generation, create=False)

    def release(self) -> None:
        """Give the lease up (a controller that ends with its job): the next one need not wait."""
        if self.generation is None or (self.generations() or [0])[-1] != self.generation:
            return
        now = self.clock()
        record = LeaseRecord(self.generation, self.holder, now, now, released=True)
        self.store.write_bytes(_rel(self.generation), json.dumps(asdict(record)).encode())
