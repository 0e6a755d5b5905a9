"""`ftorch simulate`: replay spot availability traces through the policies, before paying for anything."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import JobFile, JsonOut, Sets, print_json
from orchestrator.errors import SpecError, UserError

if TYPE_CHECKING:
    from orchestrator.spot.traces import Zones


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


def simulate_command(
    ctx: typer.Context,
    job_file: JobFile,
    trace: Annotated[
        list[str] | None,
        typer.Option(
            "--trace",
            help="spot trace file(s), one per zone; a folder means every *.json in it; repeatable,"
            " and files right after it count too (shell globs work)",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="spot-only | spot-fallback | deadline | on-demand | uniform-progress (a baseline) |"
            " no-observer (a deadline job with no outside controller: SkyPilot falls back, the trainer"
            " probes back to spot) | all"
        ),
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
    set_: Sets = None,
    as_json: JsonOut = False,
) -> None:
    """Replay spot availability traces: cost, finish time and deadline of each policy."""
    from orchestrator.jobfile.spec import load_job
    from orchestrator.spot import simulator, traces
    from orchestrator.spot.policy import make_policy

    extra = _extra_trace_files(ctx)
    if not trace:
        raise SpecError("--trace", "give at least one spot trace file (one per zone)")
    spec = load_job(job_file, list(set_ or []), check_support=False)
    names = _policy_names(policy)
    _check_numbers(hours, spot_price, ondemand_price, windows)
    given = {
        "hours": hours,
        "spot_price": spot_price,
        "ondemand_price": ondemand_price,
        "checkpoint_interval_s": _seconds("--checkpoint-interval", checkpoint_interval),
        "restart_overhead_s": _seconds("--restart-overhead", restart_overhead),
    }
    zones = traces.load_zones([*trace, *extra], nodes=spec.resources.nodes)
    job, sources = simulator.job_numbers(spec, given, deadline)
    start_tick = _start_tick(start, zones)
    policies = [make_policy(n, baselines=True) for n in names]
    payload = simulator.run(policies, job, zones, start_tick, windows)
    payload["job"]["sources"] = sources
    _show(payload, as_json)


def _extra_trace_files(ctx: typer.Context) -> list[str]:
    """The arguments left over: the trace files after --trace's first (a shell glob expands to several);
    an option among them is one this command does not have."""
    extra = list(ctx.args)
    bad = [a for a in extra if a.startswith("-")]
    if bad:
        raise UserError(f"unknown option {bad[0]}")
    return extra


def _policy_names(policy: str) -> list[str]:
    """The policies to replay for --policy, always with on-demand: the baseline the others are
    compared with."""
    from orchestrator.spot.policy import BASELINE_NAMES, POLICY_NAMES

    known = (*(n for n in POLICY_NAMES if n != "on-demand"), *BASELINE_NAMES, "on-demand")
    names = list(known) if policy == "all" else [policy]
    if policy != "all" and policy not in known:
        raise SpecError("--policy", f"unknown policy {policy!r}; valid: {', '.join(known)}, all")
    if "on-demand" not in names:
        names.append("on-demand")  # the baseline the others are compared with
    return names


def _check_numbers(
    hours: float | None, spot_price: float | None, ondemand_price: float | None, windows: int
) -> None:
    """Refuse hours, prices and window counts that are out of range."""
    _positive("--hours", hours)
    _positive("--spot-price", spot_price, allow_zero=True)
    _positive("--ondemand-price", ondemand_price)
    if windows < 1:
        raise SpecError("--windows", f"must be >= 1 (got {windows})")


def _start_tick(start: str, zones: Zones) -> int:
    """The trace tick that --start names; refused when it lies past the end of the traces."""
    start_s = _seconds("--start", start) or 0.0
    start_tick = int(start_s // zones.gap_s)
    if start_tick >= zones.n_ticks:
        raise SpecError(
            "--start", f"is past the end of the traces ({zones.n_ticks * zones.gap_s / 3600:.1f} h)"
        )
    return start_tick


def _show(payload: dict[str, Any], as_json: bool) -> None:
    """Print the simulation: its JSON, or the table of policies."""
    if as_json:
        print_json(payload)
    else:
        from orchestrator.views.simulate_lines import simulate_lines

        typer.echo("\n".join(simulate_lines(payload)))


def register(app: typer.Typer) -> None:
    """Add the simulation command to the CLI."""
    app.command(
        "simulate",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(simulate_command)
