"""Spot availability traces: `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`, one file per zone.

`data[i]` is the number of spot instances obtainable at tick i (G seconds apart). A zone is up at a tick
when it can give the job all the nodes it needs. The shared traces were recorded for AWS p3.2xlarge
(1x V100); the simulator uses them as an availability signal for whatever instance the job runs on.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator.errors import UserError


@dataclass
class Zones:
    """Availability of several zones on one clock: `up[z, i]` is True when zone z is up at tick i."""

    names: list[str]
    gap_s: float
    up: np.ndarray
    _lists: tuple[list[list[bool]], list[int]] | None = field(default=None, repr=False)

    @property
    def n_ticks(self) -> int:
        return int(self.up.shape[1])

    @property
    def any_up(self) -> np.ndarray:
        return self.up.any(axis=0)

    def first_up(self) -> np.ndarray:
        """For each tick, the first zone that is up, or -1."""
        first = np.argmax(self.up, axis=0).astype(np.int64)
        first[~self.any_up] = -1
        return first

    def as_lists(self) -> tuple[list[list[bool]], list[int]]:
        """Plain Python lists (fast to index in the simulator's loop), cached."""
        if self._lists is None:
            self._lists = ([row.tolist() for row in self.up], self.first_up().tolist())
        return self._lists


def from_arrays(rows: list[list[int]] | np.ndarray, gap_s: float, names: list[str] | None = None) -> Zones:
    """Zones from in-memory counts (tests, hand-made traces); a count > 0 means up."""
    up = np.asarray(rows) > 0
    if up.ndim == 1:
        up = up[None, :]
    names = names or [f"zone{i}" for i in range(up.shape[0])]
    return Zones(names=names, gap_s=float(gap_s), up=up)


def _read(path: Path, nodes: int) -> tuple[float, np.ndarray]:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--trace: cannot read {path}: {exc.__class__.__name__}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"--trace: {path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        gap = float(payload["metadata"]["gap_seconds"])
        data = np.asarray(payload["data"], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        raise UserError(
            f"--trace: {path} is not a trace: expected"
            " {'metadata': {'gap_seconds': G}, 'data': [n0, n1, ...]}"
        ) from None
    if gap <= 0 or data.ndim != 1 or data.size == 0:
        raise UserError(f"--trace: {path} needs gap_seconds > 0 and a non-empty list of counts")
    return gap, data >= nodes


def expand(paths: list[str]) -> list[Path]:
    """Files, folders (every *.json inside) and glob patterns, in a stable order."""
    out: list[Path] = []
    for raw in paths:
        path = Path(os.path.expanduser(raw))
        if path.is_dir():
            found = sorted(path.rglob("*.json"))
            if not found:
                raise UserError(f"--trace: no *.json trace files in {path}")
            out.extend(found)
        elif path.exists():
            out.append(path)
        elif any(ch in raw for ch in "*?["):
            found = [Path(p) for p in sorted(glob.glob(os.path.expanduser(raw)))]
            if not found:
                raise UserError(f"--trace: {raw} matches no files")
            out.extend(found)
        else:
            raise UserError(f"--trace: {raw} does not exist")
    return out


def load_zones(paths: list[str], nodes: int = 1) -> Zones:
    """Load trace files as zones. All must share gap_seconds; longer ones are cut to the shortest."""
    files = expand(paths)
    if not files:
        raise UserError("--trace: give at least one trace file")
    gaps, rows = [], []
    for path in files:
        gap, up = _read(path, nodes)
        gaps.append(gap)
        rows.append(up)
    if len(set(gaps)) > 1:
        detail = ", ".join(f"{p.name}={g:g}s" for p, g in zip(files, gaps, strict=True))
        raise UserError(f"--trace: all traces must share gap_seconds; got {detail}")
    length = min(len(r) for r in rows)
    names = [p.stem for p in files]
    return Zones(names=names, gap_s=gaps[0], up=np.stack([r[:length] for r in rows]))
