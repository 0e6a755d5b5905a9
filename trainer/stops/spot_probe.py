"""The trainer's probes back to spot when nobody watches the job (the rule: trainer/stops/spot_return.py).

On for a `deadline` job whose task sets FTORCH_SPOT_RETURN (JSON, `{"restart_overhead_s": 300}`, and
optionally `"probe_base_s"`, the first back-off, default one hour: the SkyPilot render sets it from the chosen offer; the local supervisor watches spot capacity itself, so a local
job never has it). Each attempt records where it landed (trainer/stops/lifecycle.py) in the run store's
`spot_landings.json`, filling in the landing of the probe that started it. On demand, every `check_s` it
asks the shared rule (ahead of the uniform-progress line, room for two restarts) and the back-off (one
probe an hour after landing on demand, doubling after each probe that lands on demand again); when both
say go it records the probe, and the loop checkpoints and exits 75: SkyPilot's recovery walks `ordered`
from the spot end and lands on spot if there is capacity, else on demand again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from trainer.config import JobSpec, deadline_seconds
from trainer.stops import spot_return as rule
from trainer.stops.lifecycle import on_spot
from trainer.stops.spot_return import Landing

ENV = "FTORCH_SPOT_RETURN"
LANDINGS = "spot_landings.json"


def read_landings(store: Any) -> list[Landing]:
    """The run store's landings, oldest first (an unreadable file reads as none)."""
    data = store.read_json_or_none(LANDINGS)
    rows = data if isinstance(data, list) else []
    return [x for x in (Landing.from_json(r) for r in rows) if x is not None]


def _write(store: Any, landings: list[Landing]) -> None:
    store.write_json(LANDINGS, [x.as_json() for x in landings])


@dataclass
class SpotProbe:
    """One attempt on demand that may probe back to spot."""

    store: Any
    attempt: int
    start_s: float
    deadline_s: float
    restart_overhead_s: float
    landings: list[Landing]
    probe_base_s: float = rule.PROBE_BASE_S
    check_s: float = 60.0
    checked_at: float = field(default=-float("inf"))
    reason: str = ""

    @classmethod
    def open(
        cls,
        store: Any,
        spec: JobSpec,
        resolved: Mapping[str, Any],
        attempt: int,
        log: Callable[[str], None],
        env: Mapping[str, str] | None = None,
        now: float | None = None,
    ) -> SpotProbe | None:
        """Record where this attempt landed; a SpotProbe if it is on demand and may probe, else None."""
        env = os.environ if env is None else env
        if not env.get(ENV) or not rule.probes_apply(spec.resources):
            return None
        now = time.time() if now is None else now
        spot = on_spot(env)
        if spot is None:
            log("spot return: cannot tell spot from on demand here; no probes back to spot")
            return None
        landed = rule.SPOT if spot else rule.ON_DEMAND
        landings = read_landings(store)
        if landings and landings[-1].probe and landings[-1].landed is None:
            probe = landings.pop()
            landings.append(Landing(probe.at_s, probe.attempt, landed, True))
            log(f"spot return: the probe of attempt {probe.attempt} landed on {landed}")
        else:
            landings.append(Landing(now, attempt, landed, False))
        _write(store, landings)
        if spot:
            return None
        try:
            settings = json.loads(env[ENV])
            overhead = float(settings.get("restart_overhead_s", 300.0))
            base = float(settings.get("probe_base_s", rule.PROBE_BASE_S))
            created = float(resolved["created_at"])
            assert spec.resources.deadline is not None
            launched = datetime.fromtimestamp(created, timezone.utc)
            deadline = created + deadline_seconds(spec.resources.deadline, now=launched)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log(f"spot return: off ({exc.__class__.__name__}: {exc})")
            return None
        return cls(store, attempt, created, deadline, overhead, landings, base)

    def due(self, step: int, steps: int, steps_per_s: float, now: float | None = None) -> bool:
        """Whether to probe now (checked every `check_s`); if so the probe is recorded first."""
        now = time.time() if now is None else now
        if now - self.checked_at < self.check_s or steps_per_s <= 0.0:
            return False
        self.checked_at = now
        if now < rule.next_probe_at(self.landings, self.probe_base_s):
            return False
        p = rule.Progress(
            now, self.start_s, self.deadline_s, step / steps_per_s, steps / steps_per_s,
            self.restart_overhead_s, self.check_s,
        )  # fmt: skip
        if not rule.return_to_spot(p, rule.margin_s(p), restarts=2.0):
            return False
        self.landings.append(Landing(now, self.attempt, None, True))
        _write(self.store, self.landings)
        lead_h = (p.work_done_s - rule.uniform_line(p, now)) / 3600.0
        self.reason = f"probing for spot: {lead_h:.1f} h ahead of the deadline's uniform progress"
        return True
