"""The cloud controller's state (typed, with its own JSON), its typed refusals, and what the run store
says about how a run ended (the controller's truth when SkyPilot's queue is empty or unreachable).

The state lives in the run store (`control/controller.json`), so that a controller started on another
machine, or again after a kill, continues what the last one began (a switch half done); the job folder
keeps a copy for `ftorch status` (`read_state` / `write_state`; `load_state` prefers the run store's).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STATE_RECORD = "control/controller.json"
#: the job folder's copy of the state (what `ftorch status` reads)
STATE_FILE = "controller.json"


class LaunchRefused(Exception):
    """SkyPilot refused a launch (the client maps SkyPilot's own exceptions to these). `line` is
    SkyPilot's error on one line."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class RefusedForGood(LaunchRefused):
    """A refusal that waiting does not cure (SkyPilot 0.14.1: NoCloudAccessError, `sky check`)."""


@dataclass
class Placement:
    sky_job_id: int | None
    cloud: str
    region: str | None = None


@dataclass
class Pending:
    """A switch (or the budget stop) under way: asked the trainer to checkpoint at `at`."""

    to: str
    why: str
    at: float
    step: int
    asked_checkpoint: bool = False


@dataclass
class Relaunch:
    """A relaunch intent, written to the run store BEFORE the managed job it replaces is cancelled: a
    controller killed between the cancel and the launch finishes it when it starts again."""

    mode: str
    why: str
    at: float
    replaces: int | None = None
    tries: int = 0
    error: str | None = None


_NESTED = {"placed": Placement, "pending": Pending, "relaunch": Relaunch}


@dataclass
class ControllerState:
    mode: str = "spot"
    sky_job_id: int | None = None
    launched_at: float | None = None
    down_since: float | None = None
    placed: Placement | None = None
    pending: Pending | None = None
    relaunch: Relaunch | None = None
    #: why the controller is done: a SkyPilot status, "finished", "budget", "relaunch refused", ...
    ended: str | None = None
    failed: str | None = None
    stopped: dict[str, Any] | None = None
    switches: list[dict[str, Any]] = field(default_factory=list)
    launches: list[dict[str, Any]] = field(default_factory=list)
    relocations: list[dict[str, Any]] = field(default_factory=list)
    preemptions_before: int = 0
    spot_missing_at: float | None = None
    spot_misses: int = 0
    probing: bool = False
    last_decision: dict[str, Any] | None = None
    #: relaunch orders kept (mode -> resources entries)
    ordered: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    relocated_step: int | None = None
    #: since when SkyPilot's queue has had no record of the managed job
    missing_since: float | None = None
    where: str | None = None
    pid: int | None = None
    heartbeat_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ControllerState:
        """From a saved state; unknown keys are dropped, a missing or unreadable one is a fresh state."""
        if not isinstance(data, dict):
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                continue
            nested = _NESTED.get(key)
            if nested is not None and isinstance(value, dict):
                known = {f.name for f in dataclasses.fields(nested)}
                value = nested(**{k: v for k, v in value.items() if k in known})
            kwargs[key] = value
        if isinstance(kwargs.get("sky_job_id"), str) and kwargs["sky_job_id"].isdigit():
            kwargs["sky_job_id"] = int(kwargs["sky_job_id"])
        return cls(**kwargs)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)


# ---- the state's files: the run store's record and the job folder's copy --------------------------------
def read_state(job_dir: Any) -> dict[str, Any]:
    """The job folder's copy of the controller state, as JSON (for `ftorch status`); {} when none."""
    try:
        return json.loads((job_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_state(job_dir: Any, state: ControllerState | Mapping[str, Any]) -> None:
    """Write the job folder's copy (owner-only, replaced atomically)."""
    payload = state.to_json() if isinstance(state, ControllerState) else dict(state)
    path = job_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


def load_state(store: Any, job_dir: Any) -> ControllerState:
    """The run store's state (any machine's controller), else the job folder's copy."""
    try:
        saved = store.read_json_or_none(STATE_RECORD)
    except Exception:  # noqa: BLE001 - advisory: the job folder's copy
        saved = None
    return ControllerState.from_json(saved if isinstance(saved, dict) else read_state(job_dir))


# ---- what the run store says about the run's end -------------------------------------------------
#: `run_end` values: the run is over and nothing may be launched for it
OVER = ("finished", "budget", "cancelled")


def run_end(store: Any) -> str | None:
    """How the run ended by its store, or None when the store does not say it ended (running, between
    attempts, preempted, or crashed): "finished" (its output written), "budget" (stopped at its budget),
    "cancelled" (stopped by the user). Read before any launch: never launch for a run that is over."""
    progress = store.read_progress() or {}
    if progress.get("state") == "finished":
        return "finished"
    try:
        records = store.epoch_records()
    except Exception:  # advisory: progress alone
        records = {}
    if not records:
        return None
    last = records[max(records)]
    if last.get("ended") == "finished":
        return "finished"
    if last.get("ended") == "stopped":
        reason = str(last.get("stop_reason") or "")
        if reason.startswith("budget"):
            return "budget"
        if reason.startswith("cancel"):
            return "cancelled"
    return None
