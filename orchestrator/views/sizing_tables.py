"""The tables of the sizing commands: `ftorch estimate` (the memory breakdown, and the traced step beside
it), `ftorch plan` (the candidates by expected cost), `ftorch gpus` and `ftorch history`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.views.format import money
from trainer.memory.facts import GIB


def estimate_view(spec: Any, shape: Any, est: Any, trace: dict[str, Any] | None, why: str | None) -> Group:
    """The estimate's breakdown, and the traced step beside it when there is one."""
    breakdown: RenderableType = _breakdown_table(est)
    if est.offload == "params":
        # NOTE: kept as it renders: with CPU offload the host RAM parts line replaces the breakdown table
        # (one name held both before this function was split); likely unintended, left for its own fix
        breakdown = _host_parts(est)
    return Group(
        *_estimate_head(spec, shape, est),
        breakdown,
        _peaks_table(est, trace),
        *_estimate_tail(est, trace, why),
    )


def _estimate_head(spec: Any, shape: Any, est: Any) -> list[Text]:
    """The model, the job's settings and the GPUs the estimate is for."""
    t = spec.train
    return [
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


def _breakdown_table(est: Any) -> Table:
    """The analytic estimate's parts at its peak (GiB)."""
    parts = Table(title="analytic estimate")
    parts.add_column("part")
    parts.add_column("GiB", justify="right")
    for part, gib in est.breakdown_gib.items():
        parts.add_row(part, f"{gib:.2f}")
    return parts


def _host_parts(est: Any) -> str:
    """The analytic host RAM by part (GiB): 'offloaded 12.3, loading 0.0, processes 3.0'."""
    return ", ".join(f"{k} {v:.1f}" for k, v in est.host_breakdown_gib.items())


def _peaks_table(est: Any, trace: dict[str, Any] | None) -> Table:
    """Peak per GPU (GiB), analytic and, when there is a trace, traced."""
    peaks = Table(title="peak per GPU (GiB)")
    peaks.add_column("")
    peaks.add_column("analytic", justify="right")
    if trace:
        peaks.add_column("traced", justify="right")
    for label, analytic, traced in _peak_rows(est, trace):
        cell = [] if not trace else ["-" if traced is None else f"{traced:.2f}"]
        peaks.add_row(label, f"{analytic:.2f}", *cell)
    peaks.add_row("peak phase", est.peak_phase, *([trace["peak_phase"]] if trace else []))
    return peaks


def _peak_rows(est: Any, trace: dict[str, Any] | None) -> list[tuple[str, float, Any]]:
    """(label, analytic GiB, traced GiB or None) for each row of the peaks table but the phase."""
    rows = [
        ("allocated", est.peak_allocated_gib, trace and trace["peak_allocated_gib"]),
        ("reserved", est.peak_reserved_gib, trace and trace["peak_reserved_gib"]),
        ("+ CUDA context", est.peak_gib_per_gpu, trace and trace["total_gib"]),
    ]
    load = (trace or {}).get("load")
    if trace:  # the load phase, + CUDA context: traced for QLoRA (trainer/memtrace/loadtrace.py)
        rows.append(("load (+ context)", est.load_gib_per_gpu, load["total_gib"] if load else None))
    if est.offload == "params" or (trace and trace.get("host_gib")):
        rows.append(("host RAM (machine)", est.host_gib, _traced_host_gib(est, trace) if trace else None))
    return rows


def _traced_host_gib(est: Any, trace: dict[str, Any]) -> float:
    """Host RAM per machine as traced: the larger of every rank's offloaded state and rank 0's loading
    copy, which it frees as it sends (trainer/memory/load_memory.py host_peak_bytes); the processes are
    not traced."""
    from trainer.memory.load_memory import host_peak_bytes

    load = trace.get("load")
    return sum(
        host_peak_bytes(
            (load or {}).get("rank0_copy_gib", 0.0), (trace.get("host_gib") or 0.0) * est.n_gpus
        ).values()
    )


def _estimate_tail(est: Any, trace: dict[str, Any] | None, why: str | None) -> list[Text]:
    """The lines under the tables: what sets the analytic peak, host RAM with offload, the traced load
    and step (or why there is no trace), paged optimizer states."""
    phases = ", ".join(f"{p} {g:.1f}" for p, g in est.phases_gib.items())
    tail = [Text(f"analytic peak set by: {est.peak_phase} (phases, GiB: {phases})")]
    if est.peak_phase == "load":
        how = (
            "the whole model on each GPU" if est.n_gpus == 1 else "sharded: a shard plus one tensor in flight"
        )
        tail.append(Text(f"load: {how} ({est.load_gib_per_gpu:.2f} GiB; trainer/memory/load_memory.py)"))
    if est.offload == "params":
        tail.append(
            Text(
                f"host RAM (analytic, GiB): {_host_parts(est)}; GPU memory above excludes the offloaded state"
            )
        )
    load = (trace or {}).get("load")
    if load:
        tail.append(_traced_load_line(load))
    if trace:
        at = ", ".join(f"{k} {v:.2f}" for k, v in trace["at_peak_gib"].items())
        tail.append(Text(f"traced one step in {trace['seconds']:.1f} s ({trace['cpu_seconds']:.1f} s CPU)"))
        tail.append(Text(f"at the traced peak (GiB): {at}"))
        tail += [Text(f"trace: {note}") for note in trace.get("notes", [])]
    elif why:
        tail.append(Text(f"not traced ({why}): the analytic estimate stands"))
    if est.paged_optimizer_gib:
        tail.append(Text(f"paged optimizer states: {est.paged_optimizer_gib:.2f} GiB in unified memory"))
    return tail


def _traced_load_line(load: dict[str, Any]) -> Text:
    """The traced load: its path, time, GPU memory and what it held in host RAM."""
    return Text(
        f"traced load ({load['path']}, {load['seconds']:.1f} s): {load['peak_allocated_gib']:.2f} GiB "
        f"allocated per GPU"
        + (
            f"; rank 0's CPU copy of the 4-bit model {load['rank0_copy_gib']:.2f} GiB"
            if load["rank0_copy_gib"]
            else ""
        )
        + (f"; offloaded shards {load['host_gib']:.2f} GiB in host RAM" if load["host_gib"] else "")
    )


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
        data_usd = money(data, cents=True, missing="-") + ("" if cand.egress_usd is not None else "+?")
        extra = [data_usd] if show_data else []
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
            money(cand.expected_cost_usd, cents=True, missing="-"),
            money(cand.expected_cost_spot_usd, cents=True, missing="-"),
            money(cand.expected_cost_ondemand_usd, cents=True, missing="-"),
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
            money(o.ondemand_usd, cents=True, missing="-"),
            money(o.spot_usd, cents=True, missing="-"),
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
