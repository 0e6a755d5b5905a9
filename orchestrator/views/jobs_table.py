"""`ftorch status`'s jobs table: active jobs and recently finished ones at a glance, every column that
fits the terminal (orchestrator/views/cells.py), one small card per job under 80 columns; older finished
jobs collapse into one line.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.registry import TERMINAL
from orchestrator.views.cells import (
    NARROW,
    WIDE,
    WIDEST,
    checkpoint_text,
    console,
    cost_text,
    loss_text,
    progress_text,
    savings_text,
    state_text,
    where_text,
)
from orchestrator.views.format import duration

#: finished jobs that ended longer ago than this collapse into one line (`--all` shows them)
RECENT_S = 24 * 3600.0
#: and so do finished jobs beyond the newest RECENT_MAX: a table to take in at a glance, not a log
RECENT_MAX = 25


def recent_finished(ended: list[tuple[str, float | None]], now: float) -> list[str]:
    """Of finished jobs' (id, ended_at), the ids the table shows, newest first: ended within RECENT_S,
    at most RECENT_MAX. The rest collapse into one line (and `ftorch status` summarizes them no further)."""
    recent = [(job_id, at or 0.0) for job_id, at in ended if now - (at or 0.0) < RECENT_S]
    recent.sort(key=lambda item: item[1], reverse=True)
    return [job_id for job_id, _at in recent[:RECENT_MAX]]


def _visible(rows: list[dict[str, Any]], show_all: bool, now: float) -> tuple[list[dict], list[dict]]:
    active = [r for r in rows if r["state"] not in TERMINAL]
    finished = [r for r in rows if r["state"] in TERMINAL]
    if show_all:
        return active + sorted(finished, key=lambda r: r.get("ended_at") or 0, reverse=True), []
    by_id = {r["job_id"]: r for r in finished}
    shown = recent_finished([(r["job_id"], r.get("ended_at")) for r in finished], now)
    kept = set(shown)
    return active + [by_id[i] for i in shown], [r for r in finished if r["job_id"] not in kept]


def _table(rows: list[dict[str, Any]], width: int, now: float) -> Table:
    """The jobs table; what does not fit `width` goes (placement, projection, percent), never the id."""
    wide = width >= WIDE
    roomy = width >= 96
    table = Table(box=None, header_style="bold", pad_edge=False, collapse_padding=True)
    table.add_column("JOB", no_wrap=True, overflow="ellipsis", max_width=28 if roomy else 20)
    table.add_column("STATE", no_wrap=True)
    table.add_column("PROGRESS", no_wrap=True)
    table.add_column("LOSS", justify="right", no_wrap=True)
    table.add_column("ETA", justify="right", no_wrap=True)
    table.add_column("COST" + ("→PROJ" if wide else ""), justify="right", no_wrap=True)
    table.add_column("PRE", justify="right", no_wrap=True)
    table.add_column("CKPT", no_wrap=True)
    if wide:
        table.add_column("WHERE", no_wrap=True, overflow="ellipsis")
    if width >= WIDEST:
        table.add_column("SAVED", justify="right", no_wrap=True)
    for r in rows:
        ckpt_age = duration(now - r["last_checkpoint_at"]) if r.get("last_checkpoint_at") else "-"
        cells: list[RenderableType] = [
            r["job_id"],
            state_text(r),
            progress_text(r, 12 if wide else 10 if roomy else 6, percent=roomy),
            loss_text(r, 4 if roomy else 3),
            duration(r.get("eta_s")) if r.get("eta_s") is not None else "-",
            cost_text(r, projected=wide),
            str(r.get("preemptions", 0)),
            checkpoint_text(r, now) if roomy else ckpt_age,
        ]
        if wide:
            cells.append(where_text(r))
        if width >= WIDEST:
            cells.append(savings_text(r))
        table.add_row(*cells)
    return table


def _card(r: dict[str, Any], width: int, now: float) -> Group:
    """A job in four short lines, for narrow terminals."""
    head = Text(r["job_id"], style="bold", overflow="ellipsis", no_wrap=True)
    head.append(" ")
    head.append_text(state_text(r))
    lines: list[RenderableType] = [
        head,
        progress_text(r, max(4, min(20, width - 22))),
        Text(f"loss {loss_text(r)}  eta {duration(r.get('eta_s'))}  {cost_text(r)}"),
        Text(f"preempted {r.get('preemptions', 0)}  ckpt {checkpoint_text(r, now)}"),
        Text(f"on {where_text(r)}", overflow="ellipsis", no_wrap=True),
    ]
    return Group(*lines)


def render_jobs(rows: list[dict[str, Any]], width: int, show_all: bool = False) -> RenderableType:
    """All jobs at a glance: active ones and recently finished ones; older ones collapse to a line."""
    now = time.time()
    if not rows:
        return Text("no jobs yet: `ftorch launch JOB.yaml` starts one")
    visible, hidden = _visible(rows, show_all, now)
    parts: list[RenderableType] = []
    if visible:
        if width < NARROW:
            for i, r in enumerate(visible):
                if i:
                    parts.append(Text(""))
                parts.append(_card(r, width, now))
        else:
            parts.append(_table(visible, width, now))
    if hidden:
        counts: dict[str, int] = {}
        for r in hidden:
            counts[r["state"].lower()] = counts.get(r["state"].lower(), 0) + 1
        kinds = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        noun = "job" if len(hidden) == 1 else "jobs"
        parts.append(Text(f"{len(hidden)} older {noun} hidden ({kinds}): --all", style="dim"))
    return Group(*parts)


def print_jobs_table(rows: list[dict[str, Any]], show_all: bool = False, out: Console | None = None) -> None:
    out = out or console()
    out.print(render_jobs(rows, out.width, show_all))
