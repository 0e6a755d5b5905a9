"""`ftorch simulate`'s report: the job, the traces, and one row per policy (plain text: it is read in
terminals and pasted into docs).
"""

from __future__ import annotations

from typing import Any


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
