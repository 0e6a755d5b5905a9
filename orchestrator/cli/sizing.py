"""`ftorch estimate`, `ftorch plan`, `ftorch gpus`: sizing a job and choosing where it runs."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

import typer

from orchestrator.cli.common import JobFile, JsonOut, Sets
from orchestrator.cli.common import print_json as _print_json
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

    # the plan table has 13 columns (layout and traced/estimated fit included): under 140 columns rich
    # would cut every cell to a few letters, so a narrow terminal wraps whole lines instead
    return Console(highlight=False, soft_wrap=False, width=max(170, _width()))


def _width() -> int:
    import shutil

    return shutil.get_terminal_size((140, 40)).columns


def _load(job_file: str, sets: list[str] | None) -> Any:
    from orchestrator.jobfile.spec import load_job

    return load_job(job_file, list(sets or []), check_support=False)


def estimate_cmd(
    job_file: JobFile,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="GPUs to shard over (FSDP)")] = None,
    trace: Annotated[
        bool,
        typer.Option("--trace", help="also run one training step on fake tensors on the CPU and report it"),
    ] = False,
    set_: Sets = None,
    as_json: JsonOut = False,
    online: Online = False,
) -> None:
    """Peak GPU memory per GPU for a job, with its breakdown (analytic; traced with --trace)."""
    from orchestrator.sizing.memory import estimate_memory
    from orchestrator.sizing.shapes import resolve_shape

    spec = _load(job_file, set_)
    shape = resolve_shape(spec.model, online=online)
    est = estimate_memory(spec, gpus, shape=shape)
    est, offloaded = _offload_as_plan_does(spec, shape, est)
    traced, why = _trace_step(spec, shape, est.n_gpus) if trace else (None, None)
    measured = measured_for(spec, est.n_gpus)
    if as_json:
        payload = _estimate_json(spec, shape, est, offloaded, measured)
        if trace:
            payload["trace"] = traced
            if why:
                payload["trace_error"] = f"{why}; the analytic estimate stands"
        _print_json(payload)
        return
    from orchestrator.views.sizing_tables import estimate_view

    con = _console()
    con.print(estimate_view(spec, shape, est, traced, why))
    _print_sources(con, est, offloaded, measured)
    peak, load_gib = _peak_and_load(est, traced)
    fits = _sizes_that_fit(peak)
    con.print(_fit_line(spec, shape, est, fits, loading=peak <= load_gib))
    if spec.train.offload == "auto" and not offloaded:
        _print_offload_hint(con, spec, shape, est, fits)


def _trace_step(spec: Any, shape: Any, n_gpus: int) -> tuple[dict[str, Any] | None, str | None]:
    """(the traced step on `n_gpus` GPUs or None, why it was not traced or None)."""
    from orchestrator.sizing.tracing import trace_job
    from orchestrator.views.progress import spinner

    with spinner(f"tracing the training step of {spec.model} on fake tensors (cached after the first)"):
        result = trace_job(spec, shape, [n_gpus], load=True)
    return result.results.get(n_gpus), result.error


def _estimate_json(
    spec: Any, shape: Any, est: Any, offloaded: bool, measured: dict[str, Any] | None
) -> dict[str, Any]:
    """`ftorch estimate --json` without the traced step (the caller adds it under --trace)."""
    payload = est.to_json()
    payload["shape"] = shape.summary()
    payload["measured"] = measured
    payload["offload_by_planner"] = offloaded
    payload["next_gpus_that_fit"] = _next_gpus_that_fit(spec, shape, est.n_gpus)
    return payload


def _print_sources(con: Any, est: Any, offloaded: bool, measured: dict[str, Any] | None) -> None:
    """Say when the estimate is the offloaded one the planner would run, and when a run measured it."""
    if offloaded:
        con.print(
            f"offload: train.offload is auto and the job fits no common GPU on {est.n_gpus} GPU(s) without it, "
            "so this is the estimate with CPU offload (train.offload: params), as `ftorch plan` would run it",
            markup=False,
        )
    if measured:
        con.print(
            f"measured: {measured['peak_gib_per_gpu']:.1f} GiB per GPU by job {measured['job_id']} "
            f"(attempt {measured['attempt']}, {measured['ranks']}x {measured['gpu']}); the plan uses it "
            "over the estimate (fit measured)",
            markup=False,
        )


def _peak_and_load(est: Any, traced: dict[str, Any] | None) -> tuple[float, float]:
    """(peak GiB per GPU, GiB per GPU to load the model): the traced step's when there is one."""
    # the trace measures the step, and QLoRA's loading; other loading is estimated
    load_gib = traced["load"]["total_gib"] if traced and traced.get("load") else est.load_gib_per_gpu
    peak = max(traced["total_gib"], load_gib) if traced else est.peak_gib_per_gpu
    return peak, load_gib


def _sizes_that_fit(peak_gib: float) -> list[float]:
    """The common GPU sizes (GiB) that hold `peak_gib` with the planner's headroom, smallest first."""
    from orchestrator.sizing.planner import HEADROOM

    return [g for g in COMMON_GPU_SIZES_GIB if peak_gib <= g * (1 - HEADROOM)]


def _fit_line(spec: Any, shape: Any, est: Any, fits: list[float], loading: bool) -> str:
    """Which common GPUs the job fits, or what to try when none; `loading`: the model's load sets the peak."""
    from orchestrator.sizing.planner import HEADROOM

    more = _next_gpus_that_fit(spec, shape, est.n_gpus)
    hint = f"; try --gpus {more}" if more else f"; not even on {MAX_GPUS_TRIED} GPUs"
    return (
        f"fits GPUs of {fits[0]:g} GiB or more (with {HEADROOM:.0%} headroom)"
        + (", set by loading the model" if loading else "")
        if fits
        else f"fits none of the common GPU sizes on {est.n_gpus} GPU(s)"
        + ("; set by loading the model" if loading else hint)
    )


def _print_offload_hint(con: Any, spec: Any, shape: Any, est: Any, fits: list[float]) -> None:
    """With train.offload auto, say so when CPU offload would fit a smaller common GPU than `fits`."""
    from orchestrator.sizing.memory import estimate, settings_from_spec

    off = estimate(shape, settings_from_spec(spec, est.n_gpus, "params"))
    smaller = _sizes_that_fit(off.peak_gib_per_gpu)
    if smaller and (not fits or smaller[0] < fits[0]):
        con.print(
            f"with CPU offload (train.offload auto: `ftorch plan` turns it on for GPUs too small without "
            f"it): {off.peak_gib_per_gpu:.1f} GiB per GPU, fits GPUs of {smaller[0]:g} GiB or more, "
            f"{off.host_gib:.0f} GiB host RAM per machine",
            markup=False,
        )


MAX_GPUS_TRIED = 64


def _fits_common(est: Any) -> bool:
    from orchestrator.sizing.planner import HEADROOM

    return est.peak_gib_per_gpu <= max(COMMON_GPU_SIZES_GIB) * (1 - HEADROOM)


def _offload_as_plan_does(spec: Any, shape: Any, est: Any) -> tuple[Any, bool]:
    """The estimate with CPU offload when train.offload is auto and the job fits no common GPU without
    it but does with it (the planner's rule: orchestrator/sizing/planner.py `_check_fit`); (estimate, offloaded)."""
    from orchestrator.sizing.memory import estimate, settings_from_spec

    if spec.train.offload != "auto" or _fits_common(est):
        return est, False
    offloaded = estimate(shape, settings_from_spec(spec, est.n_gpus, "params"))
    return (offloaded, True) if _fits_common(offloaded) else (est, False)


def _next_gpus_that_fit(spec: Any, shape: Any, n_gpus: int) -> int | None:
    """The smallest GPU count above `n_gpus` (powers of two up to MAX_GPUS_TRIED) on which the job fits
    the largest common GPU (with offload when train.offload is auto, as the planner does)."""
    from orchestrator.sizing.memory import estimate, settings_from_spec

    n = 1
    while n <= MAX_GPUS_TRIED:
        if n > n_gpus:
            est, _ = _offload_as_plan_does(spec, shape, estimate(shape, settings_from_spec(spec, n)))
            if _fits_common(est):
                return n
        n *= 2
    return None


def plan_cmd(
    job_file: JobFile,
    set_: Sets = None,
    as_json: JsonOut = False,
    online: Online = False,
    offline: Offline = False,
    top: Annotated[int, typer.Option("--top", min=1, help="candidates to show")] = 15,
    no_trace: Annotated[
        bool, typer.Option("--no-trace", help="judge every fit by the analytic estimate (no traced step)")
    ] = False,
) -> None:
    """Rank the offers by expected cost: fits or why not, hours, cost on spot and on demand, the choice."""
    from orchestrator.sizing.planner import make_plan
    from orchestrator.views.progress import spinner

    spec = _load(job_file, set_)
    with spinner("planning: reading the catalog and tracing the close calls (cached after the first)"):
        plan = make_plan(spec, offline=offline, online_shapes=online, trace=not no_trace)
    if as_json:
        _print_json(plan.to_json())
        if plan.chosen is None:
            raise UserError(plan.why_none())
        return
    from orchestrator.views.format import money
    from orchestrator.views.sizing_tables import plan_table

    con = _console()
    single = plan.estimates.get(1)
    con.print(
        f"[bold]{plan.model}[/] {plan.method}: {single.peak_gib_per_gpu:.1f} GiB on one GPU"
        if single
        else f"[bold]{plan.model}[/] {plan.method}"
    )
    con.print(f"catalog: {plan.catalog_source}")
    from trainer.model.attention import planned_packing

    packed = planned_packing(spec.data.packing, spec.train.attn_implementation)  # auto: the trainer's rule
    unit = "packs" if packed else "examples"  # data.packing: a micro-batch holds packs
    con.print(
        f"effective batch: {spec.train.micro_batch_size * spec.train.grad_accum} {unit} per optimizer "
        f"step (train.micro_batch_size {spec.train.micro_batch_size} per GPU x grad_accum "
        f"{spec.train.grad_accum}), kept on every GPU count; layout = {unit} per GPU x accumulation"
    )
    steps, sequences = plan.workload.get("steps"), plan.workload.get("sequences_per_epoch")
    if steps and sequences and not spec.train.max_steps:
        what = f"packs of up to {spec.data.max_seq_len} tokens" if packed else "examples"
        con.print(f"steps: {steps:,} (~{sequences:,} {what} per epoch x {spec.train.epochs:g} epochs)")
    shown = plan.candidates[:top]
    if plan.chosen and plan.chosen not in shown:
        shown.append(plan.chosen)
    con.print(plan_table(plan, shown))
    for note in plan.notes:
        if note.startswith(("memory: ", "tier: ", "interruptions: ", "cost: ", "capacity: ", "egress: ",
                            "checkpoint", "market: ", "nodes: ")):  # fmt: skip
            con.print(note, markup=False)
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
        f"expected {money(c.expected_cost_usd, cents=True, missing='-')} over {c.expected_hours:.1f} h"
        + (f" with {c.expected_interruptions:.1f} interruptions" if c.spot else "")
    )
    if c.layout:
        offload = f", CPU offload ({c.host_gib:.0f} GiB host RAM)" if c.offload == "params" else ""
        con.print(f"layout: {c.layout.describe()}{offload}", markup=False)


def accelerator_rows(offers: list[Any]) -> list[dict[str, Any]]:
    """One row per accelerator (`sky show-gpus` style): memory, tier, clouds, GPU counts per instance, the
    cheapest spot and on-demand price per GPU-hour, how many offers; in the offers' order."""
    rows: dict[str, dict[str, Any]] = {}
    for o in offers:
        row = rows.setdefault(
            o.accelerator,
            {"accelerator": o.accelerator, "tier": o.tier, "gpu_memory_gib": o.gpu_memory_gib, "clouds": set(),
             "counts": set(), "spot_usd_per_gpu": None, "ondemand_usd_per_gpu": None, "offers": 0},
        )  # fmt: skip
        row["clouds"].add(o.cloud)
        row["counts"].add(o.count)
        row["offers"] += 1
        for key, price in (("spot_usd_per_gpu", o.spot_usd), ("ondemand_usd_per_gpu", o.ondemand_usd)):
            if price is not None and (row[key] is None or price / o.count < row[key]):
                row[key] = round(price / o.count, 4)
    return [{**r, "clouds": sorted(r["clouds"]), "counts": sorted(r["counts"])} for r in rows.values()]


def _accelerators_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    from orchestrator.views.format import money

    table = Table()
    for col in ("tier", "accelerator", "GiB/GPU", "GPUs per instance", "clouds", "spot $/GPU-h", "on demand $/GPU-h",
                "offers"):  # fmt: skip
        table.add_column(col, justify="right" if "$" in col or col in ("GiB/GPU", "offers") else "left")
    for r in rows:
        table.add_row(
            r["tier"], r["accelerator"], f"{r['gpu_memory_gib']:g}", ",".join(map(str, r["counts"])),
            ", ".join(r["clouds"]), money(r["spot_usd_per_gpu"], cents=True, missing="-"),
            money(r["ondemand_usd_per_gpu"], cents=True, missing="-"), str(r["offers"]),
        )  # fmt: skip
    return table


def gpus_cmd(
    name: Annotated[
        str | None, typer.Argument(help="an accelerator (e.g. H100): every instance that has it, with prices")
    ] = None,
    min_memory: Annotated[
        float | None, typer.Option("--min-memory", help="only GPUs with at least this much memory (GiB)")
    ] = None,
    cloud: Annotated[list[str] | None, typer.Option("--cloud", help="only these clouds; repeatable")] = None,
    accelerator: Annotated[
        list[str] | None, typer.Option("--accelerator", help="only these accelerators; repeatable")
    ] = None,
    tier: Annotated[
        str | None,
        typer.Option(
            "--tier", help="only this tier: consumer (GDDR GeForce/workstation cards) or datacenter"
        ),
    ] = None,
    as_json: JsonOut = False,
    offline: Offline = False,
) -> None:
    """The GPU catalog in use and where it came from: one row per accelerator (consumer cards, then
    datacenter); `gpus NAME` lists that accelerator's instances."""
    from orchestrator.sizing.catalog import TIERS, load_catalog

    if tier is not None and tier not in TIERS:
        raise UserError(f"--tier: '{tier}' is not a tier; valid: {', '.join(TIERS)}")
    catalog = load_catalog(offline=offline)
    offers = catalog.filter(min_memory_gib=min_memory, clouds=cloud, accelerators=accelerator, tier=tier)
    offers.sort(
        key=lambda o: (TIERS.index(o.tier), o.gpu_memory_gib, o.count, o.spot_usd or o.ondemand_usd or 1e9)
    )
    if name is not None:
        offers = [o for o in offers if o.accelerator.lower() == name.lower()]
        if not offers:
            import difflib

            known = sorted({o.accelerator for o in catalog.offers})
            near = difflib.get_close_matches(name, known, n=3, cutoff=0.4) or known[:8]
            raise UserError(
                f"NAME: no {name} offer in the catalog (with these filters); did you mean {', '.join(near)}?"
            )
    rows = accelerator_rows(offers)
    if as_json:
        _print_json(
            {"source": catalog.source, "live": catalog.live, "accelerators": rows,
             "offers": [o.to_json() for o in offers]}
        )  # fmt: skip
        return
    from orchestrator.views.sizing_tables import gpus_table

    con = _console()
    con.print(f"source: {catalog.source}", markup=False)
    if name is None:
        con.print(_accelerators_table(rows))
        con.print(f"{len(rows)} accelerators in {len(offers)} offers; `ftorch gpus NAME` lists one's offers")
        return
    con.print(gpus_table(offers))
    con.print(f"{len(offers)} offers")


def measured_for(spec: Any, n_gpus: int) -> dict[str, Any] | None:
    """The newest plausible measurement of this job's key on `n_gpus` ranks (orchestrator/sizing/history.py)."""
    from orchestrator.sizing.history import key_of, load_history, peak_gib
    from orchestrator.sizing.memory import settings_from_spec

    settings = settings_from_spec(spec, n_gpus)
    key = key_of(spec.model_dump(mode="json"), settings.micro_batch, settings.grad_ckpt, n_gpus, None)
    row = load_history().peak_for(key)
    return None if row is None else {**row, "peak_gib_per_gpu": round(peak_gib(row), 3)}


def history_cmd(as_json: JsonOut = False) -> None:
    """What runs measured (peak memory, tokens/s) and whether the planner uses it."""
    from orchestrator.sizing.history import load_history, peak_gib

    rows = load_history().rows
    if as_json:
        _print_json({"measurements": [{**r, "peak_gib_per_gpu": round(peak_gib(r), 3)} for r in rows]})
        return
    from orchestrator.views.sizing_tables import history_table

    con = _console()
    if not rows:
        con.print("nothing measured yet: each attempt's measured facts are kept when its job ends")
        return
    con.print(history_table(rows))


def register(app: typer.Typer) -> None:
    """Add the sizing commands to the CLI."""
    app.command("history")(history_cmd)
    app.command("estimate")(estimate_cmd)
    app.command("plan")(plan_cmd)
    app.command("gpus")(gpus_cmd)
