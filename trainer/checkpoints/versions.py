"""The library versions at a resume: a resume under other COMPARED versions (trainer/envlock.py) than the
newest checkpoint's is refused like a spec fingerprint change (exit 2, one line naming the package and both
versions), unless `ftorch resume --allow-change` recorded the change in spec.json. No torch here."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from trainer.checkpoints.fingerprint import Change, SpecChanged, allowed, show
from trainer.envlock import COMPARED, FIELD_PREFIX, META_KEY, installed


def compared_changes(before: Mapping[str, Any], after: Mapping[str, Any], step: int) -> list[Change]:
    """The COMPARED libraries whose version differs between a checkpoint's record and now (both known)."""
    return [
        Change(FIELD_PREFIX + name, before[name], after[name], step)
        for name in COMPARED
        if before.get(name) is not None and after.get(name) is not None and before[name] != after[name]
    ]


def newest_versions(store: Any, listing: Any = None) -> tuple[int, dict[str, Any]] | None:
    """(step, versions) of the newest complete checkpoint; None without one; {} for one that recorded none."""
    info = (listing if listing is not None else store.list_checkpoints()).newest
    if info is None:
        return None
    recorded = info.meta.get(META_KEY)
    return info.step, recorded if isinstance(recorded, dict) else {}


def check_start(
    store: Any, resolved: dict[str, Any], log: Callable[[str], None], listing: Any = None
) -> dict[str, str | None]:
    """At the trainer's start: this attempt's versions (put in its epoch record by rank 0); a resume under
    other COMPARED versions than the newest checkpoint's raises SpecChanged unless spec.json allows it."""
    now = installed()
    if int(os.environ.get("RANK", "0")) == 0:
        store.update_epoch_record(**{META_KEY: now})
    newest = newest_versions(store, listing)
    if newest is None:
        return now
    step, before = newest
    found = compared_changes(before, now, step)
    if not found:
        return now
    if allowed(resolved, step) is None:
        raise SpecChanged(found[0].line(), found[0].field)
    described = "; ".join(f"{c.field} {show(c.before)} -> {show(c.after)}" for c in found)
    log(f"resuming from checkpoint step {step} under other library versions, allowed: {described}")
    if int(os.environ.get("RANK", "0")) == 0:
        store.update_epoch_record(allowed_version_changes=[c.to_json() for c in found])
    return now
