"""A job row's cells as the jobs table, a job's detail and a sweep's table draw them (rich), and the
terminal widths they draw for: 120 columns and up get every column, 80 and up a table without the
placement and the projection, narrower terminals (a phone) one small card per job.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.registry import TERMINAL
from orchestrator.views.format import duration, money

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
    "UNHEALTHY": "bold red",
}
WIDE = 120
NARROW = 80
WIDEST = 140  # and up: the savings column too


def console() -> Console:
    return Console()


def state_text(row: dict[str, Any]) -> Text:
    """The state, coloured; a stop for a reason says which (STOPPED·budget)."""
    label = row["state"]
    if row.get("stop_reason") == "budget":
        label += "·budget"
    if row.get("stalled_s") is not None:  # a heartbeat older than the trainer's stall timeout
        return Text(f"STALLED (heartbeat {duration(row['stalled_s'])} old)", style="bold yellow")
    return Text(label, style=STATE_STYLE.get(row["state"], ""))


def bar(fraction: float | None, width: int) -> Text:
    if fraction is None:
        return Text("░" * width, style="dim")
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return Text("█" * filled, style="green") + Text("░" * (width - filled), style="dim")


def progress_text(row: dict[str, Any], bar_width: int, percent: bool = True) -> Text:
    total = row.get("total_steps")
    fraction = row.get("fraction_done")
    steps = f"{row.get('step') or 0}/{total}" if total else str(row.get("step") or 0)
    pct = f" {fraction:4.0%}" if fraction is not None and percent else ""
    return bar(fraction, bar_width) + Text(f" {steps}{pct}")


def loss_text(row: dict[str, Any], digits: int = 4) -> str:
    return f"{row['loss']:.{digits}f}" if row.get("loss") is not None else "-"


def cost_text(row: dict[str, Any], projected: bool = True) -> str:
    text = money(row.get("cost_usd"))
    proj = row.get("projected_cost_usd")
    if projected and proj is not None and row["state"] != "SUCCEEDED":
        text += f"→{money(proj)}"
    return text


def checkpoint_text(row: dict[str, Any], now: float) -> str:
    step = row.get("last_checkpoint_step")
    if step is None:
        return "none yet" if row["state"] not in TERMINAL else "-"
    at = row.get("last_checkpoint_at")
    return f"{step}, {duration(now - at)} ago" if at else str(step)


def where_text(row: dict[str, Any]) -> str:
    where = row.get("where") or "-"
    return f"{where} ({row['market']})" if row.get("market") else where


def savings_text(r: dict[str, Any]) -> str:
    """'$1.20 (35%)' saved against on demand, '-' when there is no on-demand price (trainer/recording/ledger.py)."""
    if r.get("savings_usd") is None:
        return "-"
    pct = r.get("savings_pct")
    return money(r["savings_usd"]) + ("" if pct is None else f" ({pct:.0f}%)")
