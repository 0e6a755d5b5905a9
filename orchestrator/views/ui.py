"""What the CLI draws (rich): `ftorch status`'s jobs table, one job in detail, and their narrow-terminal
forms; the tables of `ftorch estimate`, `plan` and `gpus`. (Over 400 lines: every table of the CLI is
here, so that command modules hold no drawing.)

Everything renders for a given width: 120 columns and up get every column, 80 and up a table without
the placement and the projection, and narrower terminals (under 80) (a phone) one small card per job.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.registry import RESUMABLE, TERMINAL
from trainer.memory.facts import GIB

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
#: finished jobs that ended longer ago than this collapse into one line (`--all` shows them)
RECENT_S = 24 * 3600.0
WIDE = 120
NARROW = 80
WIDEST = 140  # and up: the savings column too


def console() -> Console:
    return Console()


def clear() -> None:
    console().clear()


# ---- small formatters ---------------------------------------------------------------------------
def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 5400:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 172800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"


def money(usd: float | None) -> str:
    if usd is None:
        return "?"
    return f"${usd:.2f}" if usd >= 0.995 or usd == 0 else f"${usd:.3f}" if usd >= 0.01 else f"${usd:.4f}"


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


# ---- the jobs table -----------------------------------------------------------------------------
def _visible(rows: list[dict[str, Any]], show_all: bool, now: float) -> tuple[list[dict], list[dict]]:
    active = [r for r in rows if r["state"] not in TERMINAL]
    finished = [r for r in rows if r["state"] in TERMINAL]
    recent = [r for r in finished if show_all or now - (r.get("ended_at") or 0) < RECENT_S]
    hidden = [r for r in finished if r not in recent] if not show_all else []
    recent.sort(key=lambda r: r.get("ended_at") or 0, reverse=True)
    return active + recent, hidden


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


def savings_text(r: dict[str, Any]) -> str:
    """'$1.20 (35%)' saved against on demand, '-' when there is no on-demand price (trainer/recording/ledger.py)."""
    if r.get("savings_usd") is None:
        return "-"
    pct = r.get("savings_pct")
    return money(r["savings_usd"]) + ("" if pct is None else f" ({pct:.0f}%)")


def ledger_view(ledger: dict[str, Any] | None, pad: str) -> list[RenderableType]:
    """The cost ledger of `ftorch status JOB`: spent, saved vs on demand, $/1M tokens, each preemption."""
    from trainer.recording.ledger import ledger_lines

    if not ledger:
        return []
    return [Text(f"{pad}{label}: {value}") for label, value in ledger_lines(ledger)]


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


# ---- one job in detail --------------------------------------------------------------------------
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


# ---- `ftorch simulate` (plain text: it is read in terminals and pasted into docs) ------------------------
def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600.0:.2f}"


def simulate_lines(payload: dict[str, Any]) -> list[str]:
    """The job, the traces, and one row per policy (one start) or per policy summary (many starts)."""
    job, tr = payload["job"], payload["traces"]
    deadline = "none" if job["deadline_s"] is None else f"{job['deadline_s'] / 3600.0:.2f} h"
    lines = [
        f"job: {job['work_s'] / 3600.0:.2f} h of compute, deadline {deadline},"
        f" spot ${job['spot_hourly_usd']:.3f}/h, on demand ${job['ondemand_hourly_usd']:.3f}/h,"
        f" checkpoint every {job['checkpoint_interval_s']:.0f} s, restart {job['restart_overhead_s']:.0f} s",
        f"traces: {len(tr['zones'])} zone(s), {tr['ticks']} ticks of {tr['gap_s']:g} s"
        f" ({tr['ticks'] * tr['gap_s'] / 86400.0:.1f} days), spot available {tr['available_share']:.1%}"
        f" of the time; start at +{tr['start_h']:.2f} h",
    ]
    if "summaries" in payload:
        lines.append(f"{payload['windows']} start offsets spread over the traces:")
        head = f"{'policy':<18}{'met':>7}{'cost/OD':>9}{'median':>8}{'worst':>8}{'finish h':>10}"
        lines.append(head + f"{'preempt':>9}{'wait h':>8}{'lost h':>8}")
        for s in payload["summaries"]:
            met = "-" if s["met_share"] is None else f"{s['met_share']:.1%}"
            finish = "-" if s["mean_finish_h"] is None else f"{s['mean_finish_h']:.2f}"
            lines.append(
                f"{s['policy']:<18}{met:>7}{s['mean_cost_vs_ondemand']:>9.3f}"
                f"{s['median_cost_vs_ondemand']:>8.3f}{s['max_cost_vs_ondemand']:>8.3f}{finish:>10}"
                f"{s['mean_preemptions']:>9.2f}{s['mean_wait_h']:>8.2f}{s['mean_work_lost_h']:>8.2f}"
            )
        return lines
    head = f"{'policy':<18}{'cost $':>9}{'cost/OD':>9}{'finish h':>10}{'deadline':>10}{'preempt':>9}"
    lines.append(head + f"{'wait h':>8}{'lost h':>8}{'spot h':>8}{'OD h':>8}")
    for r in payload["results"]:
        met = "-" if r["deadline_met"] is None else ("met" if r["deadline_met"] else "MISSED")
        finish = _hours(r["finish_s"]) if r["finished"] else "unfinished"
        lines.append(
            f"{r['policy']:<18}{r['cost_usd']:>9.2f}{r['cost_vs_ondemand']:>9.3f}{finish:>10}{met:>10}"
            f"{r['preemptions']:>9}{_hours(r['wait_s']):>8}{_hours(r['work_lost_s']):>8}"
            f"{_hours(r['spot_s']):>8}{_hours(r['ondemand_s']):>8}"
        )
    return lines


# ---- sizing: `ftorch estimate`, `ftorch plan`, `ftorch gpus` -----------------------------------------
def usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def estimate_view(spec: Any, shape: Any, est: Any, trace: dict[str, Any] | None, why: str | None) -> Group:
    """The estimate's breakdown, and the traced step beside it when there is one."""
    t = spec.train
    head = [
        Text.from_markup(
            f"[bold]{shape.name}[/] ({shape.family}, {shape.params / 1e9:.2f}B params, from {shape.source})"
        ),
        Text(
            f"{spec.method}, {t.precision}, {t.optimizer}, micro-batch {t.micro_batch_size} x "
            f"{spec.data.max_seq_len} tokens, gradient checkpointing "
            f"{'on' if t.gradient_checkpointing else 'off'}, attention {t.attn_implementation}"
        ),
        Text(f"trainable parameters: {est.trainable_params:,} of {est.params:,}"),
        Text(f"peak memory per GPU on {est.n_gpus} GPU(s), sharding: {est.sharding}"),
    ]
    parts = Table(title="analytic estimate")
    parts.add_column("part")
    parts.add_column("GiB", justify="right")
    for part, gib in est.breakdown_gib.items():
        parts.add_row(part, f"{gib:.2f}")
    phases = ", ".join(f"{p} {g:.1f}" for p, g in est.phases_gib.items())
    peaks = Table(title="peak per GPU (GiB)")
    peaks.add_column("")
    peaks.add_column("analytic", justify="right")
    if trace:
        peaks.add_column("traced", justify="right")
    rows = [
        ("allocated", est.peak_allocated_gib, trace and trace["peak_allocated_gib"]),
        ("reserved", est.peak_reserved_gib, trace and trace["peak_reserved_gib"]),
        ("+ CUDA context", est.peak_gib_per_gpu, trace and trace["total_gib"]),
    ]
    load = (trace or {}).get("load")
    if trace:  # the load phase, + CUDA context: traced for QLoRA (trainer/memtrace/loadtrace.py)
        rows.append(("load (+ context)", est.load_gib_per_gpu, load["total_gib"] if load else None))
    if est.offload == "params" or (trace and trace.get("host_gib")):
        # traced: the larger of every rank's offloaded state and rank 0's loading copy, which it frees as
        # it sends (trainer/memory/load_memory.py host_peak_bytes); the processes are not traced
        from trainer.memory.load_memory import host_peak_bytes

        host_traced = (
            sum(
                host_peak_bytes(
                    (load or {}).get("rank0_copy_gib", 0.0), (trace.get("host_gib") or 0.0) * est.n_gpus
                ).values()
            )
            if trace
            else None
        )
        rows.append(("host RAM (machine)", est.host_gib, host_traced))
    for label, analytic, traced in rows:
        cell = [] if not trace else ["-" if traced is None else f"{traced:.2f}"]
        peaks.add_row(label, f"{analytic:.2f}", *cell)
    peaks.add_row("peak phase", est.peak_phase, *([trace["peak_phase"]] if trace else []))
    tail = [Text(f"analytic peak set by: {est.peak_phase} (phases, GiB: {phases})")]
    if est.peak_phase == "load":
        how = (
            "the whole model on each GPU" if est.n_gpus == 1 else "sharded: a shard plus one tensor in flight"
        )
        tail.append(Text(f"load: {how} ({est.load_gib_per_gpu:.2f} GiB; trainer/memory/load_memory.py)"))
    if est.offload == "params":
        parts = ", ".join(f"{k} {v:.1f}" for k, v in est.host_breakdown_gib.items())
        tail.append(Text(f"host RAM (analytic, GiB): {parts}; GPU memory above excludes the offloaded state"))
    if load:
        tail.append(
            Text(
                f"traced load ({load['path']}, {load['seconds']:.1f} s): {load['peak_allocated_gib']:.2f} GiB "
                f"allocated per GPU"
                + (
                    f"; rank 0's CPU copy of the 4-bit model {load['rank0_copy_gib']:.2f} GiB"
                    if load["rank0_copy_gib"]
                    else ""
                )
                + (f"; offloaded shards {load['host_gib']:.2f} GiB in host RAM" if load["host_gib"] else "")
            )
        )
    if trace:
        at = ", ".join(f"{k} {v:.2f}" for k, v in trace["at_peak_gib"].items())
        tail.append(Text(f"traced one step in {trace['seconds']:.1f} s ({trace['cpu_seconds']:.1f} s CPU)"))
        tail.append(Text(f"at the traced peak (GiB): {at}"))
        tail += [Text(f"trace: {note}") for note in trace.get("notes", [])]
    elif why:
        tail.append(Text(f"not traced ({why}): the analytic estimate stands"))
    if est.paged_optimizer_gib:
        tail.append(Text(f"paged optimizer states: {est.paged_optimizer_gib:.2f} GiB in unified memory"))
    return Group(*head, parts, peaks, *tail)


DATA_SHOWN = 0.01  # the plan table's `data $` column shows when moving data is this share of a cost


def plan_table(plan: Any, shown: list[Any]) -> Table:
    """Candidates by expected cost; `fit` says whether the fit was traced or estimated; `hours` is compute,
    `wall h` what is billed and waited (interruptions, restarts, capacity); `data $` (egress and storage
    of checkpoints) shows when it is at least DATA_SHOWN of some shown candidate's cost."""
    table = Table(title="candidates, by expected cost")
    moved = [(c.egress_usd or 0.0) + (c.storage_usd or 0.0) for c in shown]
    show_data = any(m >= DATA_SHOWN * c.expected_cost_usd for m, c in zip(moved, shown, strict=True))
    columns = [
        ("", "left"),
        ("cloud", "left"),
        ("instance", "left"),
        ("GPUs", "left"),
        ("link", "left"),
        ("layout", "left"),
        ("GiB/GPU", "right"),
        ("fit", "left"),
        ("$/h", "right"),
        ("hours", "right"),
        ("wall h", "right"),
        ("interr.", "right"),
        ("expected", "right"),
        ("on spot", "right"),
        ("on demand", "right"),
    ] + ([("data $", "right")] if show_data else [])
    for col, justify in columns:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for cand, data in zip(shown, moved, strict=True):
        chosen = cand is plan.chosen
        extra = [usd(data) if cand.egress_usd is not None else f"{usd(data)}+?"] if show_data else []
        table.add_row(
            "►" if chosen else "",
            cand.cloud,
            cand.instance_type,
            (f"{cand.nodes} nodes x " if cand.nodes > 1 else "")
            + f"{cand.count}x {cand.accelerator} {cand.gpu_memory_gib:g}G",
            cand.interconnect,
            cand.layout_text,
            f"{cand.peak_gib_per_gpu:.1f}",
            cand.fit,
            f"{cand.hourly_usd:.2f} {'spot' if cand.spot else 'od'}",
            f"{cand.est_hours:.1f}",
            f"{cand.expected_hours:.1f}",
            f"{cand.expected_interruptions:.1f}" if cand.spot else "-",
            usd(cand.expected_cost_usd),
            usd(cand.expected_cost_spot_usd),
            usd(cand.expected_cost_ondemand_usd),
            *extra,
            style="bold green" if chosen else None,
        )
    return table


def gpus_table(offers: list[Any]) -> Table:
    table = Table()
    for col, justify in [
        ("tier", "left"),
        ("cloud", "left"),
        ("instance", "left"),
        ("accelerator", "left"),
        ("GPUs", "right"),
        ("GiB/GPU", "right"),
        ("link", "left"),
        ("on demand $/h", "right"),
        ("spot $/h", "right"),
        ("regions", "right"),
    ]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for o in offers:
        table.add_row(
            o.tier,
            o.cloud,
            o.instance_type,
            o.accelerator,
            str(o.count),
            f"{o.gpu_memory_gib:g}",
            o.interconnect,
            usd(o.ondemand_usd),
            usd(o.spot_usd),
            str(len(o.regions)),
        )
    return table


def history_table(rows: list[dict[str, Any]]) -> Table:
    """`ftorch history`: each measurement, its key, what it measured and whether plans use it."""
    from orchestrator.sizing.history import peak_gib

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("JOB", "ATT", "GPU", "RANKS", "MODEL", "METHOD", "SEQ", "MB", "CKPT", "PEAK GiB", "TOK/S",
                   "VS MODEL", "USED"):  # fmt: skip
        table.add_column(column, no_wrap=column != "USED", overflow="fold")
    for r in rows:
        predicted, measured = r.get("predicted_tokens_per_s"), r.get("tokens_per_s")
        ratio = f"x{measured / predicted:.2f}" if predicted and measured else "-"
        peak = (
            f"{peak_gib(r):.1f}"
            if r.get("plausible")
            else f"(rss {(r.get('peak_rss_bytes') or 0) / GIB:.1f})"
        )
        table.add_row(
            str(r["job_id"]), str(r["attempt"]), str(r.get("gpu")), str(r.get("ranks")), str(r.get("model")),
            str(r.get("method")), str(r.get("seq_len")), str(r.get("micro_batch")),
            "on" if r.get("grad_ckpt") else "off", peak, "-" if measured is None else f"{measured:,.0f}", ratio,
            "yes" if r.get("plausible") else f"no: {r.get('why')}",
        )  # fmt: skip
    return table
