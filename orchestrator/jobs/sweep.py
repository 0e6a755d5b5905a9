"""`ftorch sweep JOB.yaml --grid key=v1,v2 ...`: one job per point of the grid, launched as a group that
shares one budget, and the group's view in `ftorch status` (ranked by held-out loss).

The shared budget (`--budget`, else the job file's `resources.budget_usd`) is kept by the trainer's one
budget rule (trainer/stops/budget.py): on the local backend the jobs take turns on the device
(backends/local_queue.py) and each, when its turn comes, gets what the others left
(local_supervisor.share_group_budget); on a cloud backend the jobs run at once, so each gets an equal
share up front. No torch, no sky.
"""

from __future__ import annotations

import itertools
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.registry import Job, Registry

#: more points than this is almost surely a typo in a grid (and as many jobs)
MAX_POINTS = 64
#: keys a point may not set: the sweep owns them
SWEEP_OWNS = {
    "name": "each point's job is named after the job file's name",
    "resources.budget_usd": "--budget",
}


def split_values(raw: str) -> list[str]:
    """'1e-3,3e-3' -> ['1e-3', '3e-3']; commas inside [...] or {...} stay (`[q_proj,v_proj],all-linear`)."""
    values, depth, current = [], 0, ""
    for char in raw:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """Each `--grid key.path=v1,v2` as (key, raw values), in the order given."""
    if not items:
        raise SpecError("--grid", "give at least one, e.g. --grid train.lr=1e-4,3e-4")
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError("--grid", f"{item!r} is not key.path=v1,v2")
        if key in SWEEP_OWNS:
            raise SpecError("--grid", f"{key} cannot vary in a sweep ({SWEEP_OWNS[key]})")
        values = split_values(raw)
        if any(not v for v in values):
            raise SpecError("--grid", f"{item!r} has an empty value")
        if any(key == k for k, _ in axes):
            raise SpecError("--grid", f"{key} is given twice; put all its values in one --grid")
        axes.append((key, values))
    return axes


def grid_points(axes: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """Every combination, the first axis slowest (as `itertools.product`)."""
    keys = [k for k, _ in axes]
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]
    if len(points) > MAX_POINTS:
        raise SpecError("--grid", f"{len(points)} points; a sweep launches at most {MAX_POINTS} jobs")
    return points


def launch_sweep(
    job_file: str, grids: list[str], overrides: list[str], budget_usd: float | None = None
) -> dict[str, Any]:
    """Validate every point, then launch one job per point as a group. Nothing is launched when any
    point is wrong."""
    from orchestrator.backends.base import backend_for
    from orchestrator.jobfile.data_check import check_data
    from orchestrator.jobfile.spec import load_job
    from orchestrator.jobs import lifecycle as jobs

    points = grid_points(parse_grid(grids))
    base = load_job(job_file, overrides)
    if budget_usd is not None and budget_usd <= 0:
        raise SpecError("--budget", f"must be more than 0 (got {budget_usd})")
    budget = budget_usd if budget_usd is not None else base.resources.budget_usd
    remote = backend_for(base.resources.backend).remote
    each = budget if budget is None or not remote else round(budget / len(points), 6)
    width = len(str(len(points)))
    plans = []
    for i, point in enumerate(points, start=1):
        suffix = f"-{i:0{width}d}"
        sets = [
            *overrides,
            *(f"{k}={v}" for k, v in point.items()),
            f"name={base.name[: 63 - len(suffix)]}{suffix}",
        ]
        if each is not None:
            sets.append(f"resources.budget_usd={each}")
        spec = load_job(job_file, sets)  # every point is checked before any is launched
        check_data(spec)
        plans.append((point, sets))
    import secrets  # here: `ftorch status` imports this module for its group names

    group_id = f"sweep-{base.name[:40].lower()}-{secrets.token_hex(3)}"
    launched = []
    for point, sets in plans:

        def join(registry: Registry, job: Job, point: dict[str, str] = point) -> None:
            registry.join_group(job.job_id, group_id, budget, point)
            registry.event(job.job_id, "group", f"{group_id}: {_point_text(point)}")

        result = jobs.launch(job_file, sets, before_start=join)
        launched.append({"job_id": result["job_id"], "point": point})
    return {"group_id": group_id, "budget_usd": budget, "backend": base.resources.backend, "jobs": launched}


def _point_text(point: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


# ---- the group's view in `ftorch status` ------------------------------------------------------------
def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A group's rows, best held-out loss first; those without one (yet) after, in launch order."""
    return sorted(
        rows, key=lambda r: (r.get("eval_loss") is None, r.get("eval_loss") or 0.0, r["created_at"])
    )


def by_group(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(rows of no group, group id -> its rows ranked), groups in launch order."""
    alone = [r for r in rows if not r.get("group")]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("group"):
            groups.setdefault(r["group"], []).append(r)
    return alone, {g: ranked(members) for g, members in groups.items()}


def print_status(rows: list[dict[str, Any]], show_all: bool = False) -> None:
    """`ftorch status`: the jobs table for jobs of no group, then each group ranked by held-out loss."""
    from rich.table import Table
    from rich.text import Text

    from orchestrator.views.cells import console, cost_text, loss_text, state_text
    from orchestrator.views.format import money
    from orchestrator.views.jobs_table import print_jobs_table

    out = console()
    alone, groups = by_group(rows)
    if alone or not groups:
        print_jobs_table(alone, show_all=show_all, out=out)
    for group_id, members in groups.items():
        budget = next((m.get("group_budget_usd") for m in members), None)
        spent = sum(m.get("cost_usd") or 0.0 for m in members)
        head = f"{group_id}: {len(members)} jobs, spent {money(spent)}"
        head += f" of a shared {money(budget)} budget" if budget is not None else ""
        out.print(Text(head, style="bold"))
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("RANK", "JOB", "POINT", "STATE", "HELD-OUT", "LOSS", "COST"):
            table.add_column(column, no_wrap=column != "POINT", overflow="fold")
        for rank, m in enumerate(members, start=1):
            held = m.get("eval_loss")
            table.add_row(
                str(rank) if held is not None else "-",
                m["job_id"],
                _point_text(m.get("point") or {}),
                state_text(m),
                "-" if held is None else f"{held:.4f}",
                loss_text(m, 4),
                cost_text(m),
            )
        out.print(table)
