"""`ftorch estimate`, `ftorch plan`, `ftorch gpus`: sizing a job and choosing where it runs."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

import typer

from orchestrator.cli_common import JobFile, JsonOut, Sets
from orchestrator.cli_common import print_json as _print_json
from orchestrator.errors import UserError

Online = Annotated[
    bool, typer.Option("--online", help="allow fetching the model's config.json from the Hugging Face Hub")
]
Offline = Annotated[
    bool, typer.Option("--offline", help="use the bundled GPU catalog without probing SkyPilot's")
]
COMMON_GPU_SIZES_GIB = (16, 22.35, 40, 44.7, 48, 80, 96, 141, 180)


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=max(100, _width()))


def _width() -> int:
    import shutil

    return shutil.get_terminal_size((140, 40)).columns


def _load(job_file: str, sets: list[str] | None) -> Any:
    from orchestrator.spec import load_job

    return load_job(job_file, list(sets or []), check_support=False)


def estimate_cmd(
    job_file: JobFile,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="GPUs to shard over (FSDP)")] = None,
    set_: Sets = None,
    as_json: JsonOut = False,
    online: Online = False,
) -> None:
    """Peak GPU memory per GPU for a job, with its breakdown."""
    from orchestrator.memory import estimate_memory
    from orchestrator.planner import HEADROOM
    from orchestrator.shapes import resolve_shape

    spec = _load(job_file, set_)
    shape = resolve_shape(spec.model, online=online)
    est = estimate_memory(spec, gpus, shape=shape)
    if as_json:
        payload = est.to_json()
        payload["shape"] = shape.summary()
        _print_json(payload)
        return
    from rich.table import Table

    con = _console()
    con.print(
        f"[bold]{shape.name}[/] ({shape.family}, {shape.params / 1e9:.2f}B params, from {shape.source})"
    )
    con.print(
        f"{spec.method}, {spec.train.precision}, {spec.train.optimizer}, micro-batch "
        f"{spec.train.micro_batch_size} x {spec.data.max_seq_len} tokens, gradient checkpointing "
        f"{'on' if spec.train.gradient_checkpointing else 'off'}, attention {spec.train.attn_implementation}"
    )
    con.print(f"trainable parameters: {est.trainable_params:,} of {est.params:,}")
    con.print(f"peak memory per GPU on {est.n_gpus} GPU(s), sharding: {est.sharding}")
    table = Table()
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for part, gib in est.breakdown_gib.items():
        table.add_row(part, f"{gib:.2f}")
    table.add_row("[bold]peak[/]", f"[bold]{est.peak_gib_per_gpu:.2f}[/]")
    con.print(table)
    phases = ", ".join(f"{p} {g:.1f}" for p, g in est.phases_gib.items())
    con.print(f"peak set by: {est.peak_phase} (phases, GiB: {phases})")
    if est.paged_optimizer_gib:
        con.print(f"paged optimizer states: {est.paged_optimizer_gib:.2f} GiB in unified memory (evictable)")
    fits = [g for g in COMMON_GPU_SIZES_GIB if est.fits(g, HEADROOM)]
    con.print(
        f"fits GPUs of {fits[0]:g} GiB or more (with {HEADROOM:.0%} headroom)"
        if fits
        else f"fits none of the common GPU sizes on {est.n_gpus} GPU(s); try --gpus 8"
    )


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def plan_cmd(
    job_file: JobFile,
    set_: Sets = None,
    as_json: JsonOut = False,
    online: Online = False,
    offline: Offline = False,
    top: Annotated[int, typer.Option("--top", min=1, help="candidates to show")] = 15,
) -> None:
    """Rank the offers by expected cost: fits or why not, hours, cost on spot and on demand, the choice."""
    from orchestrator.planner import make_plan

    spec = _load(job_file, set_)
    plan = make_plan(spec, offline=offline, online_shapes=online)
    if as_json:
        _print_json(plan.to_json())
        if plan.chosen is None:
            raise UserError(plan.why_none())
        return
    from rich.table import Table

    con = _console()
    single = plan.estimates.get(1)
    con.print(
        f"[bold]{plan.model}[/] {plan.method}: {single.peak_gib_per_gpu:.1f} GiB on one GPU"
        if single
        else f"[bold]{plan.model}[/] {plan.method}"
    )
    con.print(f"catalog: {plan.catalog_source}")
    con.print(
        f"effective batch: {spec.train.micro_batch_size * spec.train.grad_accum} examples per optimizer "
        f"step (train.micro_batch_size {spec.train.micro_batch_size} per GPU x grad_accum "
        f"{spec.train.grad_accum}), kept on every GPU count; layout = examples per GPU x accumulation"
    )
    table = Table(title="candidates, by expected cost")
    for col, justify in [
        ("", "left"),
        ("cloud", "left"),
        ("instance", "left"),
        ("GPUs", "left"),
        ("link", "left"),
        ("layout", "left"),
        ("GiB/GPU", "right"),
        ("$/h", "right"),
        ("hours", "right"),
        ("expected", "right"),
        ("on spot", "right"),
        ("on demand", "right"),
    ]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    shown = plan.candidates[:top]
    if plan.chosen and plan.chosen not in shown:
        shown.append(plan.chosen)
    for cand in shown:
        chosen = cand is plan.chosen
        table.add_row(
            "►" if chosen else "",
            cand.cloud,
            cand.instance_type,
            (f"{cand.nodes} nodes x " if cand.nodes > 1 else "")
            + f"{cand.count}x {cand.accelerator} {cand.gpu_memory_gib:g}G",
            cand.interconnect,
            cand.layout.short() if cand.layout else "",
            f"{cand.peak_gib_per_gpu:.1f}",
            f"{cand.hourly_usd:.2f} {'spot' if cand.spot else 'od'}",
            f"{cand.est_hours:.1f}",
            _money(cand.expected_cost_usd),
            _money(cand.expected_cost_spot_usd),
            _money(cand.expected_cost_ondemand_usd),
            style="bold green" if chosen else None,
        )
    con.print(table)
    if len(plan.candidates) > len(shown):
        con.print(f"... {len(plan.candidates) - len(shown)} more adequate offers (--top to show them)")
    if plan.rejected:
        con.print(f"[bold]rejected[/] ({len(plan.rejected)}):")
        groups: dict[str, list[str]] = defaultdict(list)
        for r in plan.rejected:
            groups[r.reason].append(f"{r.cloud}/{r.instance_type}")
        for reason, names in sorted(groups.items(), key=lambda kv: (kv[0].split(":")[0], -len(kv[1]))):
            listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            con.print(f"  {listed}: {reason}", markup=False)
    if plan.chosen is None:
        raise UserError(plan.why_none())
    c = plan.chosen
    con.print(
        f"[bold green]chosen:[/] {c.cloud} "
        + (f"{c.nodes} x " if c.nodes > 1 else "")
        + f"{c.instance_type} ({c.count}x {c.accelerator}), "
        f"{'spot' if c.spot else 'on-demand'} ${c.hourly_usd:.2f}/h, {c.est_hours:.1f} h of training, "
        f"expected {_money(c.expected_cost_usd)} over {c.expected_hours:.1f} h"
        + (f" with {c.expected_interruptions:.1f} interruptions" if c.spot else "")
    )
    if c.layout:
        con.print(f"layout: {c.layout.describe()}", markup=False)


def gpus_cmd(
    min_memory: Annotated[
        float | None, typer.Option("--min-memory", help="only GPUs with at least this much memory (GiB)")
    ] = None,
    cloud: Annotated[list[str] | None, typer.Option("--cloud", help="only these clouds; repeatable")] = None,
    accelerator: Annotated[
        list[str] | None, typer.Option("--accelerator", help="only these accelerators; repeatable")
    ] = None,
    as_json: JsonOut = False,
    offline: Offline = False,
) -> None:
    """The GPU catalog in use and where it came from."""
    from orchestrator.catalog import load_catalog

    catalog = load_catalog(offline=offline)
    offers = catalog.filter(min_memory_gib=min_memory, clouds=cloud, accelerators=accelerator)
    offers.sort(key=lambda o: (o.gpu_memory_gib, o.count, o.spot_usd or o.ondemand_usd or 1e9))
    if as_json:
        _print_json({"source": catalog.source, "live": catalog.live, "offers": [o.to_json() for o in offers]})
        return
    from rich.table import Table

    con = _console()
    con.print(f"source: {catalog.source}", markup=False)
    table = Table()
    for col, justify in [
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
            o.cloud,
            o.instance_type,
            o.accelerator,
            str(o.count),
            f"{o.gpu_memory_gib:g}",
            o.interconnect,
            _money(o.ondemand_usd),
            _money(o.spot_usd),
            str(len(o.regions)),
        )
    con.print(table)
    con.print(f"{len(offers)} offers")


def register(app: typer.Typer) -> None:
    """Add the sizing commands to the CLI."""
    app.command("estimate")(estimate_cmd)
    app.command("plan")(plan_cmd)
    app.command("gpus")(gpus_cmd)
