"""`ftorch simulate`: replay spot availability traces through the policies, before paying for anything."""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Annotated, Any

import typer

from orchestrator.errors import SpecError, UserError

#: JobNumbers inputs: (attribute of the planner's chosen Candidate, the option that overrides it)
_PLAN_FIELDS = {
    "hours": ("est_hours", "--hours"),
    "spot_price": ("spot_hourly_usd", "--spot-price"),
    "ondemand_price": ("ondemand_hourly_usd", "--ondemand-price"),
    "checkpoint_interval_s": ("checkpoint_interval_s", "--checkpoint-interval"),
    "restart_overhead_s": ("restart_overhead_s", "--restart-overhead"),
}
_NUMBER_OPTIONS = tuple(option for _, option in _PLAN_FIELDS.values())


def _seconds(option: str, value: str | None) -> float | None:
    """'600', '10m', '1.5h' -> seconds (a bare number is seconds)."""
    if value is None:
        return None
    from trainer.config import parse_duration

    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise SpecError(option, str(exc)) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise SpecError(option, f"must be a duration >= 0 (got {value!r})")
    return seconds


def _positive(option: str, value: float | None, allow_zero: bool = False) -> None:
    if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)):
        raise SpecError(option, f"must be {'>= 0' if allow_zero else '> 0'} (got {value})")


def _from_planner(spec: Any) -> tuple[dict[str, float | None], str]:
    """The chosen offer's numbers, and a one-line description of it."""
    try:
        from orchestrator.planner import make_plan
    except ImportError:
        raise UserError(
            "the planner is not available in this build; give " + ", ".join(_NUMBER_OPTIONS)
        ) from None
    plan = make_plan(spec, offline=True)
    chosen = getattr(plan, "chosen", None)
    if chosen is None:
        raise UserError("the planner found no offer for this job; give " + ", ".join(_NUMBER_OPTIONS))
    where = " ".join(
        str(getattr(chosen, k)) for k in ("cloud", "instance_type", "accelerator") if getattr(chosen, k, None)
    )
    count = getattr(chosen, "count", None)
    offer = f"{where}{f' x{count}' if count else ''}"
    numbers: dict[str, float | None] = {}
    for key, (attr, _option) in _PLAN_FIELDS.items():
        value = getattr(chosen, attr, None)
        numbers[key] = None if value is None else float(value)
    return numbers, offer


def _job_numbers(
    spec: Any,
    given: dict[str, float | None],
    deadline: str | None,
) -> tuple[Any, dict[str, str]]:
    """JobNumbers from the options, the planner filling what is not given; and where each came from."""
    from orchestrator.policy import deadline_seconds
    from orchestrator.simulator import JobNumbers

    sources = {k: "given" for k, v in given.items() if v is not None}
    values = dict(given)
    if any(v is None for v in values.values()):
        planned, offer = _from_planner(spec)
        for key, value in values.items():
            if value is None:
                if planned.get(key) is None:
                    option = _PLAN_FIELDS[key][1]
                    raise UserError(f"the planner's offer ({offer}) has no value for {option}; give {option}")
                values[key] = planned[key]
                sources[key] = f"planner ({offer})"
    field = "--deadline" if deadline is not None else "resources.deadline"
    text = deadline if deadline is not None else spec.resources.deadline
    deadline_s = None
    if text is not None:
        try:
            deadline_s = deadline_seconds(str(text))
        except ValueError as exc:
            raise SpecError(field, str(exc)) from None
    job = JobNumbers(
        work_s=float(values["hours"] or 0.0) * 3600.0,
        spot_hourly_usd=float(values["spot_price"] or 0.0),
        ondemand_hourly_usd=float(values["ondemand_price"] or 0.0),
        checkpoint_interval_s=float(values["checkpoint_interval_s"] or 0.0),
        restart_overhead_s=float(values["restart_overhead_s"] or 0.0),
        deadline_s=deadline_s,
    )
    if job.work_s <= 0:
        raise SpecError("--hours", "the job's compute time must be > 0")
    return job, sources


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600.0:.2f}"


def _print_results(payload: dict[str, Any]) -> None:
    job, tr = payload["job"], payload["traces"]
    deadline = "none" if job["deadline_s"] is None else f"{job['deadline_s'] / 3600.0:.2f} h"
    typer.echo(
        f"job: {job['work_s'] / 3600.0:.2f} h of compute, deadline {deadline},"
        f" spot ${job['spot_hourly_usd']:.3f}/h, on demand ${job['ondemand_hourly_usd']:.3f}/h,"
        f" checkpoint every {job['checkpoint_interval_s']:.0f} s, restart {job['restart_overhead_s']:.0f} s"
    )
    typer.echo(
        f"traces: {len(tr['zones'])} zone(s), {tr['ticks']} ticks of {tr['gap_s']:g} s"
        f" ({tr['ticks'] * tr['gap_s'] / 86400.0:.1f} days), spot available {tr['available_share']:.1%}"
        f" of the time; start at +{tr['start_h']:.2f} h"
    )
    if "summaries" in payload:
        typer.echo(f"{payload['windows']} start offsets spread over the traces:")
        head = f"{'policy':<14}{'met':>7}{'cost/OD':>9}{'median':>8}{'worst':>8}{'finish h':>10}"
        typer.echo(head + f"{'preempt':>9}{'wait h':>8}{'lost h':>8}")
        for s in payload["summaries"]:
            met = "-" if s["met_share"] is None else f"{s['met_share']:.1%}"
            finish = "-" if s["mean_finish_h"] is None else f"{s['mean_finish_h']:.2f}"
            typer.echo(
                f"{s['policy']:<14}{met:>7}{s['mean_cost_vs_ondemand']:>9.3f}{s['median_cost_vs_ondemand']:>8.3f}"
                f"{s['max_cost_vs_ondemand']:>8.3f}{finish:>10}{s['mean_preemptions']:>9.2f}"
                f"{s['mean_wait_h']:>8.2f}{s['mean_work_lost_h']:>8.2f}"
            )
        return
    head = f"{'policy':<14}{'cost $':>9}{'cost/OD':>9}{'finish h':>10}{'deadline':>10}{'preempt':>9}"
    typer.echo(head + f"{'wait h':>8}{'lost h':>8}{'spot h':>8}{'OD h':>8}")
    for r in payload["results"]:
        met = "-" if r["deadline_met"] is None else ("met" if r["deadline_met"] else "MISSED")
        finish = _hours(r["finish_s"]) if r["finished"] else "unfinished"
        typer.echo(
            f"{r['policy']:<14}{r['cost_usd']:>9.2f}{r['cost_vs_ondemand']:>9.3f}{finish:>10}{met:>10}"
            f"{r['preemptions']:>9}{_hours(r['wait_s']):>8}{_hours(r['work_lost_s']):>8}"
            f"{_hours(r['spot_s']):>8}{_hours(r['ondemand_s']):>8}"
        )


def simulate_command(
    ctx: typer.Context,
    job_file: Annotated[str, typer.Argument(help="the job YAML file")],
    trace: Annotated[
        list[str] | None,
        typer.Option(
            "--trace",
            help="spot trace file(s), one per zone; a folder means every *.json in it; repeatable,"
            " and files right after it count too (shell globs work)",
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option(help="spot-only | spot-fallback | deadline | on-demand | all")
    ] = "all",
    deadline: Annotated[
        str | None, typer.Option(help="override resources.deadline: '12h' or an ISO time with a zone")
    ] = None,
    hours: Annotated[
        float | None, typer.Option(help="compute hours (default: the planner's estimate)")
    ] = None,
    spot_price: Annotated[float | None, typer.Option(help="spot USD/hour (default: the planner's)")] = None,
    ondemand_price: Annotated[
        float | None, typer.Option(help="on-demand USD/hour (default: the planner's)")
    ] = None,
    checkpoint_interval: Annotated[
        str | None, typer.Option(help="seconds or a duration like 10m (default: the planner's)")
    ] = None,
    restart_overhead: Annotated[
        str | None, typer.Option(help="seconds or a duration like 5m (default: the planner's)")
    ] = None,
    start: Annotated[str, typer.Option(help="where in the traces to launch: a duration like 3d")] = "0s",
    windows: Annotated[
        int, typer.Option(help="simulate from N start offsets spread over the traces and summarize")
    ] = 1,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a field: key.path=value; repeatable")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Replay spot availability traces: cost, finish time and deadline of each policy."""
    from orchestrator import simulator, traces
    from orchestrator.policy import POLICY_NAMES, make_policy
    from orchestrator.spec import load_job

    extra = list(ctx.args)
    bad = [a for a in extra if a.startswith("-")]
    if bad:
        raise UserError(f"unknown option {bad[0]}")
    if not trace:
        raise SpecError("--trace", "give at least one spot trace file (one per zone)")
    spec = load_job(job_file, list(set_ or []), check_support=False)
    names = list(POLICY_NAMES) if policy == "all" else [policy]
    if policy != "all" and policy not in POLICY_NAMES:
        raise SpecError("--policy", f"unknown policy {policy!r}; valid: {', '.join(POLICY_NAMES)}, all")
    if "on-demand" not in names:
        names.append("on-demand")  # the baseline the others are compared with
    _positive("--hours", hours)
    _positive("--spot-price", spot_price, allow_zero=True)
    _positive("--ondemand-price", ondemand_price)
    if windows < 1:
        raise SpecError("--windows", f"must be >= 1 (got {windows})")
    given = {
        "hours": hours,
        "spot_price": spot_price,
        "ondemand_price": ondemand_price,
        "checkpoint_interval_s": _seconds("--checkpoint-interval", checkpoint_interval),
        "restart_overhead_s": _seconds("--restart-overhead", restart_overhead),
    }
    zones = traces.load_zones([*trace, *extra], nodes=spec.resources.nodes)
    job, sources = _job_numbers(spec, given, deadline)
    start_s = _seconds("--start", start) or 0.0
    start_tick = int(start_s // zones.gap_s)
    if start_tick >= zones.n_ticks:
        raise SpecError(
            "--start", f"is past the end of the traces ({zones.n_ticks * zones.gap_s / 3600:.1f} h)"
        )
    policies = [make_policy(n) for n in names]
    began = time.perf_counter()
    payload: dict[str, Any] = {
        "job": {**job.__dict__, "sources": sources},
        "traces": {
            "zones": zones.names,
            "gap_s": zones.gap_s,
            "ticks": zones.n_ticks,
            "available_share": float(zones.any_up.mean()),
            "start_h": start_tick * zones.gap_s / 3600.0,
            "note": "traces are used as the spot availability signal for the job's instance type",
        },
    }
    if windows > 1:
        tail = (job.deadline_s or 0.0) + job.ondemand_only_s()
        starts = simulator.start_ticks(zones, windows, tail)
        payload["windows"] = len(starts)
        payload["summaries"] = [s.as_dict() for s in simulator.sweep(policies, job, zones, starts)]
    else:
        payload["results"] = [simulator.simulate(p, job, zones, start_tick).as_dict() for p in policies]
    payload["elapsed_s"] = time.perf_counter() - began
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        _print_results(payload)


def register(app: typer.Typer) -> None:
    """Add the simulation command to the CLI."""
    app.command(
        "simulate",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(simulate_command)
