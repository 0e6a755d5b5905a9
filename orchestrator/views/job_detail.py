"""`ftorch status JOB`: one job in detail, the answer first (state, progress, cost, ETA), then its cost
ledger, controller, attempts, checkpoints and loss chart, for any terminal width.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.registry import RESUMABLE
from orchestrator.views.cells import (
    NARROW,
    WIDE,
    checkpoint_text,
    console,
    loss_text,
    progress_text,
    state_text,
    where_text,
)
from orchestrator.views.format import duration, money


def ledger_view(ledger: dict[str, Any] | None, pad: str) -> list[RenderableType]:
    """The cost ledger of `ftorch status JOB`: spent, saved vs on demand, $/1M tokens, each preemption."""
    from trainer.recording.ledger import ledger_lines

    if not ledger:
        return []
    return [Text(f"{pad}{label}: {value}") for label, value in ledger_lines(ledger)]


def _clock(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    fmt = "%H:%M:%S" if now - at < 20 * 3600 else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(at))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _why(a: dict[str, Any]) -> str:
    return a.get("end_reason") or ("running" if a.get("ended_at") is None else "-")


def _attempts(d: dict[str, Any], width: int, now: float) -> RenderableType:
    rows = d.get("attempt_timeline") or []
    if width < NARROW:
        lines = []
        for a in rows:
            lost = f", lost {a['steps_lost']} steps" if a.get("steps_lost") else ""
            lost += f" + {duration(a['time_lost_s'])}" if a.get("time_lost_s") else ""
            lines.append(
                Text(
                    f"#{a['n']} {a['instance'] or '-'} {money(a['hourly_usd'])}/h "
                    f"{_clock(a['started_at'], now)}-{_clock(a['ended_at'], now)} "
                    f"+{a.get('steps_gained') or 0} steps{lost}: {_why(a)}"
                )
            )
        return Group(Text("attempts", style="bold"), *lines, *_measured_lines(rows))
    wide = width >= WIDE
    columns = ("#", "WHERE", "PRICE", "START", "END", "STEPS", "GAINED", "LOST", "WHY")
    if not wide:  # the clock times and the price give way to why it ended
        columns = ("#", "WHERE", "STEPS", "GAINED", "LOST", "WHY")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(
            column, no_wrap=column != "WHY", overflow="fold", min_width=8 if column == "WHY" else None
        )
    for a in rows:
        market = "" if a.get("spot") is None else (" spot" if a["spot"] else " on-demand")
        end = a["end_step"] if a["end_step"] is not None else "?"
        if a["end_step"] is None and a["ended_at"] is None and a.get("steps_gained") is not None:
            end = f"{(a['start_step'] or 0) + a['steps_gained']}…"
        parts = [f"{a['steps_lost']} st"] if a.get("steps_lost") else []
        if a.get("time_lost_s"):
            parts.append(duration(a["time_lost_s"]))
        lost = " + ".join(parts) or "-"
        cells = {
            "#": str(a["n"]),
            "WHERE": f"{a['instance'] or '-'}{market}",
            "PRICE": f"{money(a['hourly_usd'])}/h",
            "START": _clock(a["started_at"], now),
            "END": _clock(a["ended_at"], now),
            "STEPS": f"{a['start_step'] or 0}→{end}",
            "GAINED": f"+{a.get('steps_gained') or 0}",
            "LOST": lost,
            "WHY": _why(a),
        }
        table.add_row(*(cells[c] for c in columns))
    return Group(Text("attempts", style="bold"), table, *_measured_lines(rows))


def _measured_lines(rows: list[dict[str, Any]]) -> list[Text]:
    """A short 'measured' line per attempt that recorded one (trainer/recording/measure.py)."""
    from trainer.recording.measure import (
        describe as describe_measured,  # detail only: the jobs table loads less
    )

    return [
        Text(f"#{a['n']} measured: {describe_measured(a['measured'])}", style="dim")
        for a in rows
        if a.get("measured")
    ]


def _checkpoints(d: dict[str, Any], width: int, now: float) -> RenderableType:
    ckpts = d.get("checkpoints") or []
    if not ckpts:
        return Text("checkpoints: none yet", style="dim")
    where = ckpts[-1]["uri"].rsplit("/", 1)[0]
    if width < NARROW:
        lines = [f"step {c['step']} {_clock(c['created_at'], now)} {_size(c['size_bytes'])}" for c in ckpts]
        return Group(Text(f"checkpoints in {where}", style="bold"), *[Text(x) for x in lines])
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("STEP", "SAVED", "AGE", "SIZE", "WHERE"):
        table.add_column(column, no_wrap=column != "WHERE", overflow="fold")
    for c in ckpts[-8:]:
        table.add_row(
            str(c["step"]),
            _clock(c["created_at"], now),
            duration(now - c["created_at"]),
            _size(c["size_bytes"]),
            c["uri"].rsplit("/", 1)[-1],
        )
    return Group(Text("checkpoints", style="bold") + Text(f" in {where}"), table)


def render_detail(d: dict[str, Any], width: int) -> RenderableType:
    """One job: the answer first (state, progress, cost, ETA), then attempts, checkpoints, the chart."""
    now = time.time()
    head = Text(d["job_id"], style="bold") + Text(f" ({d['name']}, {d['backend']}) ") + state_text(d)
    parts: list[RenderableType] = [head]
    pad = "  " if width >= NARROW else ""
    if d.get("reason"):
        parts.append(Text(f"{pad}{d['reason']}", style="yellow" if d["state"] != "SUCCEEDED" else ""))
    parts.append(Text(pad) + progress_text(d, max(6, min(30, width - 30))))
    cost = f"cost {money(d.get('cost_usd'))}"
    if d.get("projected_cost_usd") is not None and d["state"] != "SUCCEEDED":
        cost += f", projected {money(d['projected_cost_usd'])}"
    if d.get("budget_usd") is not None:
        cost += f", budget {money(d['budget_usd'])}"
    parts.append(Text(f"{pad}loss {loss_text(d)}  eta {duration(d.get('eta_s'))}  {cost}"))
    parts.append(
        Text(
            f"{pad}preemptions {d.get('preemptions', 0)}  checkpoint {checkpoint_text(d, now)}  "
            f"where {where_text(d)}"
        )
    )
    parts += _controller(d.get("controller"), pad, now)
    parts += ledger_view(d.get("ledger"), pad)
    lost = d.get("lost_time_s") or []
    if lost:
        parts.append(Text(f"{pad}time lost per preemption: " + ", ".join(duration(s) for s in lost)))
    from trainer.checkpoints.fingerprint import describe_allowance  # detail only, as below
    from trainer.train_step.oom import describe as oom_describe

    for entry in d.get("allowed_changes") or []:
        parts.append(Text(f"{pad}resumed with an {describe_allowance(entry)}", style="yellow"))
    for entry in (
        d.get("adaptations") or []
    ):  # out of memory: a smaller micro-batch (trainer/train_step/oom.py)
        parts.append(Text(f"{pad}adapted: {oom_describe(entry)}", style="yellow"))
    if d.get("replan"):
        parts.append(Text(f"{pad}{d['replan']}", style="bold red"))
    for said in d.get("replanned") or []:  # moved to a GPU with more memory (orchestrator/sizing/replan.py)
        parts.append(Text(f"{pad}{said}", style="yellow"))
    before, after = d.get("eval_before"), d.get("eval_after")
    if before and after:
        parts.append(
            Text(
                f"{pad}held-out: loss {before['loss']:.4f} → {after['loss']:.4f}, exact match "
                f"{before['exact_match']:.0%} → {after['exact_match']:.0%}"
            )
        )
    if d["state"] == "SUCCEEDED":
        parts.append(Text(f"{pad}output: {d['output_uri']}", style="bold green"))
    else:
        parts.append(Text(f"{pad}run store: {d['run_uri']}"))
        if d["state"] in RESUMABLE:
            hint = f"{pad}`ftorch resume {d['job_id']}` continues from the newest checkpoint"
            if d.get("stop_reason") == "budget":
                hint += f" (raise it: --set resources.budget_usd={_next_budget(d)})"
            parts.append(Text(hint, style="dim"))
    parts += [Text(""), _attempts(d, width, now), Text(""), _checkpoints(d, width, now), Text("")]
    curve = d.get("loss_curve") or []
    parts.append(Text("loss", style="bold"))
    from orchestrator.views.charts import loss_chart

    chart = loss_chart(
        curve, width - 1, height=6 if width >= NARROW else 4, markers=d.get("preemption_steps") or []
    )
    parts += [Text(line, no_wrap=True, overflow="crop") for line in chart]
    return Group(*parts)


def _controller(c: dict[str, Any] | None, pad: str, now: float) -> list[RenderableType]:
    """A cloud job's controller: where it runs, alive or not, and every switch (attempt, mode, why)."""
    if not c:
        return []
    ended = str(c.get("note", "")).startswith("ended")
    alive = "alive" if c.get("alive") else ("ended" if ended else "NOT alive")
    lines: list[RenderableType] = [
        Text(f"{pad}controller on {c.get('where') or '?'}: {alive}, running on {c.get('mode') or '?'}")
    ]
    if c.get("note"):
        lines.append(Text(f"{pad}  {c['note']}", style="dim" if c.get("alive") or ended else "yellow"))
    for s in c.get("switches") or []:
        lines.append(
            Text(
                f"{pad}  attempt {s['attempt']}: {s['from']} -> {s['to']} at {_clock(s['at'], now)}"
                f" ({s['why']})"
            )
        )
    return lines


def _next_budget(d: dict[str, Any]) -> str:
    need = d.get("projected_cost_usd") or 0.0
    return f"{max(need * 1.2, (d.get('budget_usd') or 0) * 1.5):.2g}"


def print_job_detail(d: dict[str, Any], out: Console | None = None) -> None:
    out = out or console()
    out.print(render_detail(d, out.width))
