"""Tables and detail views for `ftorch status` (rich)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator.registry import TERMINAL

STATE_STYLE = {
    "PENDING": "dim",
    "PROVISIONING": "cyan",
    "RUNNING": "green",
    "PREEMPTED": "yellow",
    "RECOVERING": "yellow",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "magenta",
    "STOPPED": "blue",
}


def console() -> Console:
    return Console()


def clear() -> None:
    console().clear()


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, '')}]{state}[/]"


def print_jobs_table(rows: list[dict[str, Any]], show_all: bool = False, out: Console | None = None) -> None:
    out = out or console()
    visible = [
        r for r in rows if show_all or r["state"] not in TERMINAL or time.time() - (r["ended_at"] or 0) < 3600
    ]
    if not rows:
        out.print("no jobs yet: `ftorch launch JOB.yaml` starts one")
        return
    table = Table(box=None, header_style="bold")
    for column in ("JOB", "STATE", "STEP", "LOSS", "ETA", "COST", "PREEMPT", "CKPT", "WHERE"):
        table.add_column(column, no_wrap=column in ("JOB", "STATE"))
    for r in visible:
        step = f"{r['step']}/{r['total_steps']}" if r.get("total_steps") else str(r.get("step") or 0)
        loss = f"{r['loss']:.4f}" if r.get("loss") is not None else "-"
        ckpt = f"{r['last_checkpoint_step']}" if r.get("last_checkpoint_step") is not None else "-"
        table.add_row(
            r["job_id"],
            _state(r["state"]),
            step,
            loss,
            _duration(r.get("eta_s")),
            f"${r['cost_usd']:.2f}",
            str(r["preemptions"]),
            ckpt,
            r.get("where") or "-",
        )
    out.print(table)
    hidden = len(rows) - len(visible)
    if hidden:
        out.print(f"[dim]{hidden} finished job(s) hidden; --all shows them[/]")


def print_job_detail(d: dict[str, Any], out: Console | None = None) -> None:
    out = out or console()
    out.print(
        f"[bold]{d['job_id']}[/] ({d['name']}, {d['backend']}): {_state(d['state'])}"
        + (f" - {d['reason']}" if d.get("reason") else "")
    )
    step = f"{d['step']}/{d['total_steps']}" if d.get("total_steps") else str(d.get("step"))
    loss = f"{d['loss']:.4f}" if d.get("loss") is not None else "-"
    out.print(
        f"step {step}  loss {loss}  eta {_duration(d.get('eta_s'))}  cost ${d['cost_usd']:.2f}  "
        f"preemptions {d['preemptions']}  last checkpoint {d.get('last_checkpoint_step')}"
    )
    out.print(f"run store: {d['run_uri']}")
    out.print(f"output:    {d['output_uri']}")
    table = Table(title="attempts", box=None, header_style="bold")
    for column in ("#", "WHERE", "START", "STEPS", "ENDED", "WHY"):
        table.add_column(column)
    for a in d["attempt_timeline"]:
        started = time.strftime("%H:%M:%S", time.localtime(a["started_at"]))
        ended = time.strftime("%H:%M:%S", time.localtime(a["ended_at"])) if a["ended_at"] else "-"
        steps = f"{a['start_step']}->{a['end_step'] if a['end_step'] is not None else '?'}"
        table.add_row(str(a["n"]), a["instance"] or "-", started, steps, ended, a["end_reason"] or "running")
    out.print(table)
    if d["checkpoints"]:
        out.print(
            "checkpoints: "
            + ", ".join(f"step {c['step']} ({c['size_bytes'] / 1024:.0f} KiB)" for c in d["checkpoints"])
        )
    if d.get("eval_before") and d.get("eval_after"):
        b, a = d["eval_before"], d["eval_after"]
        out.print(
            f"held-out: loss {b['loss']:.4f} -> {a['loss']:.4f}, exact match "
            f"{b['exact_match']:.0%} -> {a['exact_match']:.0%}"
        )
