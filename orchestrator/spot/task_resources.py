"""The shaping of a SkyPilot task's resources list into the lists the cloud controller launches.

A rendered task has one `resources.ordered` list, spot and on-demand entries mixed. The controller
(orchestrator/spot/controller.py) switches between kinds of capacity by relaunching the same task with
another list: these functions cut the task into one copy per kind (`Mode.SPOT`, `Mode.ON_DEMAND`), each
a deep copy with its own `ordered` list, so the controller can later reorder one (a lost region last)
without touching the other or the original.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orchestrator.spot.policy import Mode


def spot_first(task: Mapping[str, Any]) -> dict[Mode, dict[str, Any]]:
    """The lists a switching job's controller launches: SPOT is the whole task, spot entries first and
    on-demand after (SkyPilot falls back by itself, and a relaunch SkyPilot makes while no controller
    watches keeps that fallback); ON_DEMAND has the on-demand entries only (the safety net)."""
    entries = task["resources"]["ordered"]
    full = json.loads(json.dumps(task))
    full["resources"]["ordered"] = [e for e in entries if e.get("use_spot")] + [
        e for e in entries if not e.get("use_spot")
    ]
    out = split_resources(task)
    if Mode.SPOT in out:
        out[Mode.SPOT] = full
    return out


def split_resources(task: Mapping[str, Any]) -> dict[Mode, dict[str, Any]]:
    """The task with spot entries only, and with on-demand entries only (a kind with none is left out)."""
    entries = task["resources"]["ordered"]
    out: dict[Mode, dict[str, Any]] = {}
    for mode, spot in ((Mode.SPOT, True), (Mode.ON_DEMAND, False)):
        kept = [e for e in entries if bool(e.get("use_spot")) is spot]
        if kept:
            copy = json.loads(json.dumps(task))
            copy["resources"]["ordered"] = kept
            out[mode] = copy
    return out
