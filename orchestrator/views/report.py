"""`ftorch report JOB --html FILE`: one self-contained HTML page to share a run with a team.

It holds the loss curve with the held-out loss and the preemptions marked, the attempts on a time line
(each one's outcome and cost), the cost ledger, and the plan the launch chose. Everything is inline (CSS,
SVG drawn here; no script, no font, no image, nothing fetched), so it opens offline, in a mail attachment
or a bucket's web view. A copy is kept in the run store as `report.html`. No torch, no sky.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.views.format import money

REPORT_FILE = "report.html"
#: the plan `ftorch launch` recorded in the run store (jobs.launch), for backends that plan
PLAN_FILE = "plan.json"
OUTCOME_COLOURS = {
    "succeeded": "#2e7d32",
    "preempted": "#ef6c00",
    "crashed": "#c62828",
    "failed": "#c62828",
    "lost": "#c62828",
    "cancelled": "#757575",
    "budget": "#6a1b9a",
    "switch": "#1565c0",
    "adapted": "#00838f",
}
RUNNING_COLOUR = "#1976d2"

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 960px;
       color: #212121; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { padding: 3px 10px 3px 0; text-align: left;
vertical-align: top; } th { border-bottom: 1px solid #bdbdbd; } .muted { color: #757575; }
.state { font-weight: 600; } svg { display: block; margin: 0.5em 0; } svg text { font-size: 11px; fill: #424242; }
"""


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def _usd(value: Any) -> str:
    """To the cent, four places under a cent (orchestrator/views/format.py: the CLI's dollars too)."""
    return money(value, cents=True, tiny=True, missing="-")


def _clock(at: Any) -> str:
    return "-" if not isinstance(at, (int, float)) else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _seconds(s: Any) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], css_id: str = "") -> str:
    ident = f' id="{css_id}"' if css_id else ""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---- the charts (SVG) ------------------------------------------------------------------------------
def loss_svg(
    loss: Sequence[Sequence[float]], held_out: Sequence[Sequence[float]], preemptions: Sequence[int]
) -> str:
    """Training loss (line), held-out loss (dots and line), preemptions (dashed verticals), by step."""
    if not loss and not held_out:
        return '<p class="muted">no loss was logged</p>'
    w, h, left, right, top, bottom = 880, 300, 56, 16, 14, 40
    points = [*loss, *held_out]
    steps = [p[0] for p in points] + list(preemptions)
    values = [p[1] for p in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad

    def x(step: float) -> float:
        return left + (step - x0) / (x1 - x0) * (w - left - right)

    def y(value: float) -> float:
        return top + (y1 - value) / (y1 - y0) * (h - top - bottom)

    parts = [
        f'<svg id="loss-chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="loss by step">',
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="#fafafa" '
        'stroke="#e0e0e0"/>',
    ]
    for i in range(5):  # the value axis: five ticks
        value = y0 + (y1 - y0) * i / 4
        parts.append(
            f'<line x1="{left}" x2="{w - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eeeeee"/>'
            f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>'
        )
    for i in range(6):  # the step axis
        step = x0 + (x1 - x0) * i / 5
        parts.append(f'<text x="{x(step):.1f}" y="{h - bottom + 16}" text-anchor="middle">{step:.0f}</text>')
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 6}" text-anchor="middle">step</text>')
    for step in preemptions:
        parts.append(
            f'<line class="preemption" x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{top}" y2="{h - bottom}" '
            f'stroke="#ef6c00" stroke-dasharray="4 3"><title>preempted at step {step}</title></line>'
        )
    if loss:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(s):.1f},{y(v):.1f}" for i, (s, v) in enumerate(loss))
        parts.append(f'<path id="train-loss" d="{path}" fill="none" stroke="#1976d2" stroke-width="1.6"/>')
    if held_out:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(s):.1f},{y(v):.1f}" for i, (s, v) in enumerate(held_out))
        parts.append(f'<path id="held-out-loss" d="{path}" fill="none" stroke="#2e7d32" stroke-width="1.4"/>')
        for s, v in held_out:
            parts.append(
                f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="#2e7d32">'
                f"<title>held-out loss {v:.4f} at step {s:.0f}</title></circle>"
            )
    legend = [("#1976d2", "training loss")] if loss else []
    legend += [("#2e7d32", "held-out loss")] if held_out else []
    legend += [("#ef6c00", "preemption")] if preemptions else []
    for i, (colour, label) in enumerate(legend):
        lx = left + 10 + i * 130
        parts.append(
            f'<rect x="{lx}" y="{top + 6}" width="12" height="3" fill="{colour}"/>'
            f'<text x="{lx + 16}" y="{top + 11}">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(attempts: Sequence[dict[str, Any]], now: float) -> str:
    """Each attempt as a bar over wall-clock time, coloured by how it ended."""
    if not attempts:
        return '<p class="muted">no attempt has started</p>'
    w, row_h, left, right = 880, 26, 90, 16
    start = min(a["started_at"] for a in attempts)
    end = max((a["ended_at"] or now) for a in attempts)
    span = max(end - start, 1e-6)
    h = len(attempts) * row_h + 30

    def x(at: float) -> float:
        return left + (at - start) / span * (w - left - right)

    parts = [
        f'<svg id="attempts-chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" role="img" aria-label="attempts over time">'
    ]
    for i, a in enumerate(attempts):
        top = 6 + i * row_h
        a_end = a["ended_at"] or now
        outcome = str(a.get("outcome") or "") or None
        colour = OUTCOME_COLOURS.get(outcome or "", RUNNING_COLOUR)
        label = outcome or ("running" if a["ended_at"] is None else "-")
        width = max(2.0, x(a_end) - x(a["started_at"]))
        parts.append(
            f'<text x="{left - 8}" y="{top + 15}" text-anchor="end">attempt {a["n"]}</text>'
            f'<rect class="attempt" x="{x(a["started_at"]):.1f}" y="{top}" width="{width:.1f}" height="{row_h - 8}" '
            f'fill="{colour}"><title>attempt {a["n"]}: {_e(a.get("end_reason") or label)}, '
            f"steps {_e(a.get('start_step'))}-{_e(a.get('end_step'))}, {_usd(a.get('cost_usd'))}</title></rect>"
        )
        text_x = x(a["started_at"]) + width + 6
        anchor = "start"
        if text_x > w - 150:
            text_x, anchor = x(a["started_at"]) - 6, "end"
        parts.append(
            f'<text x="{text_x:.1f}" y="{top + 15}" text-anchor="{anchor}">{_e(label)}, '
            f"{_usd(a.get('cost_usd'))}</text>"
        )
    parts.append(
        f'<text x="{left}" y="{h - 6}">{_e(_clock(start))}</text>'
        f'<text x="{w - right}" y="{h - 6}" text-anchor="end">{_e(_clock(end))} ({_seconds(span)})</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


# ---- the sections ----------------------------------------------------------------------------------
def _overview(d: dict[str, Any], spec: dict[str, Any]) -> str:
    train = spec.get("train") or {}
    rows = [
        ("state", f"{d['state']}" + (f" ({d['reason']})" if d.get("reason") else "")),
        ("model", spec.get("model")),
        ("method", spec.get("method")),
        ("backend", d.get("backend")),
        ("steps", f"{d.get('step')} of {d.get('total_steps') or '?'}"),
        ("learning rate", train.get("lr")),
        ("attempts", f"{d.get('attempts')} ({d.get('preemptions')} preempted)"),
        (
            "cost",
            _usd(d.get("cost_usd"))
            + (f" of a {_usd(d['budget_usd'])} budget" if d.get("budget_usd") else ""),
        ),
        ("started", _clock(d.get("created_at"))),
        ("ended", _clock(d.get("ended_at"))),
        ("run store", d.get("run_uri")),
        ("output", d.get("output_uri")),
    ]
    before, after = d.get("eval_before") or {}, d.get("eval_after") or {}
    if before.get("loss") is not None or after.get("loss") is not None:
        rows.append(
            ("held-out loss", f"{_fmt(before.get('loss'))} before -> {_fmt(after.get('loss'))} after")
        )
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table id="overview">{body}</table>'


def _fmt(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.4f}"


def _attempts_table(attempts: Sequence[dict[str, Any]]) -> str:
    rows = []
    for a in attempts:
        market = "-" if a.get("spot") is None else ("spot" if a["spot"] else "on demand")
        rows.append(
            [
                a["n"],
                a.get("instance") or "-",
                market,
                _usd(a.get("hourly_usd")) + "/h",
                _clock(a.get("started_at")),
                _clock(a.get("ended_at")),
                f"{a.get('start_step')} -> {a.get('end_step')}",
                a.get("steps_lost") or 0,
                _usd(a.get("cost_usd")),
                a.get("end_reason") or ("running" if a.get("ended_at") is None else "-"),
            ]
        )
    header = ("#", "where", "market", "price", "start", "end", "steps", "lost", "cost", "how it ended")
    return _table(header, rows, "attempts")


def _ledger(ledger: dict[str, Any] | None) -> str:
    from trainer.recording.ledger import ledger_lines

    if not ledger:
        return '<p class="muted">no ledger</p>'
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in ledger_lines(ledger))
    return f'<table id="ledger"><tbody>{body}</tbody></table>'


def _plan(plan: dict[str, Any] | None, spec: dict[str, Any], backend: str) -> str:
    if not plan or not plan.get("chosen"):
        local = spec.get("local") or {}
        price = local.get("hourly_usd") or 0.0
        return (
            f'<p id="plan">{_e(backend)} backend: this machine (device {_e(local.get("device", "auto"))}, '
            f"{_e(local.get('nproc', 1))} trainer process(es), {_usd(price)}/h as the simulated price); "
            "no offers were compared</p>"
        )
    c = plan["chosen"]
    chosen = (
        f"{c.get('count')}x {c.get('accelerator')} on {c.get('cloud')} {c.get('instance_type')}"
        f" ({'spot' if c.get('spot') else 'on demand'}, {_usd(c.get('hourly_usd'))}/h, ~{c.get('est_hours')} h,"
        f" expected {_usd(c.get('expected_cost_usd'))})"
    )
    rows = [
        [o.get("cloud"), o.get("instance_type"), o.get("gpus"), "spot" if o.get("spot") else "on demand",
         _usd(o.get("hourly_usd")) + "/h", o.get("est_hours"), _usd(o.get("expected_cost_usd"))]
        for o in plan.get("top_offers") or []
    ]  # fmt: skip
    offers = _table(("cloud", "instance", "GPUs", "market", "price", "hours", "expected"), rows, "offers")
    counts = f"{plan.get('candidates', '?')} adequate offers, {plan.get('rejected', '?')} rejected"
    return f'<p id="plan">chosen: {_e(chosen)}; {_e(counts)}; catalog {_e(plan.get("catalog"))}</p>{offers}'


def render(detail: dict[str, Any], metrics: list[dict[str, Any]], spec: dict[str, Any], plan: Any) -> str:
    """The report page."""
    held = [[m["step"], m["eval_loss"]] for m in metrics if isinstance(m.get("eval_loss"), (int, float))]
    before = detail.get("eval_before") or {}
    if isinstance(before.get("loss"), (int, float)):  # measured before the first step
        held.insert(0, [0, before["loss"]])
    after = detail.get("eval_after") or {}
    if isinstance(after.get("loss"), (int, float)) and not any(s == detail.get("step") for s, _ in held):
        held.append([detail.get("step") or 0, after["loss"]])
    now = time.time()
    attempts = detail.get("attempt_timeline") or []
    title = f"{detail['job_id']}: {detail['state']}"
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
            f'<h1>{_e(detail["job_id"])} <span class="state">{_e(detail["state"])}</span></h1>',
            f'<p class="muted">ftorch report, written {_e(_clock(now))}</p>',
            _overview(detail, spec),
            "<h2>Loss</h2>",
            loss_svg(detail.get("loss_curve") or [], held, detail.get("preemption_steps") or []),
            "<h2>Attempts</h2>",
            timeline_svg(attempts, now),
            _attempts_table(attempts),
            "<h2>Cost ledger</h2>",
            _ledger(detail.get("ledger")),
            "<h2>Plan</h2>",
            _plan(plan if isinstance(plan, dict) else None, spec, str(detail.get("backend"))),
            "</body></html>\n",
        ]
    )


def write_report(job_ref: str, target: str) -> tuple[str, str | None]:
    """Write JOB's report to `target` and keep a copy in its run store; (target, the store copy's URI or
    None with a warning when the store cannot be written)."""
    import sys

    from orchestrator.jobs.lifecycle import get_job
    from orchestrator.views import status

    path = Path(target)
    if path.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--html: {target} must end in .html")
    if path.is_dir():
        raise UserError(f"--html: {target} is a folder; give a file name ending in .html")
    if not path.parent.is_dir():
        raise UserError(f"--html: the folder {path.parent} does not exist")
    job = get_job(job_ref)
    detail = status.status_one(job.job_id)
    store = job.run_store()
    try:
        metrics, plan = store.read_metrics(), store.read_json_or_none(PLAN_FILE)
    except Exception as exc:  # noqa: BLE001 - the report is drawn from what the registry has
        sys.stderr.write(f"warning: cannot read the run store {job.run_uri}: {exc.__class__.__name__}\n")
        metrics, plan = [], None
    page = render(detail, metrics, job.spec, plan)
    path.write_text(page, encoding="utf-8")
    try:
        store.write_bytes(REPORT_FILE, page.encode("utf-8"))
        kept: str | None = store.uri(REPORT_FILE)
    except Exception as exc:  # noqa: BLE001 - the file asked for is written; the copy is a convenience
        sys.stderr.write(f"warning: the report's copy in {job.run_uri} was not written: {exc}\n")
        kept = None
    return str(path), kept
