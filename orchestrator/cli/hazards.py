"""`ftorch hazards`: the spot hazard table the planner ranks by; `ftorch hazards import`: add your traces."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.common import JsonOut
from orchestrator.cli.common import print_json as _print_json
from orchestrator.errors import SpecError

hazards_app = typer.Typer(
    invoke_without_command=True,
    no_args_is_help=False,
    help="Spot interruption rates, capacity and their evidence (orchestrator/spot/hazards.py).",
)
ZONE = re.compile(r"^[a-z]+(-[a-z]+)*-?\d+-?[a-z]$")


@hazards_app.callback()
def hazards_cmd(ctx: typer.Context, as_json: JsonOut = False) -> None:
    """The hazard table: rate per hour (90% interval), availability, expected wait, evidence, source."""
    if ctx.invoked_subcommand is not None:
        return
    from orchestrator.spot.hazards import load_table

    table = load_table()
    rows = table.rows()
    if as_json:
        _print_json({"provenance": table.provenance, "correlation": {"rho": table.rho,
                     "source": table.correlation_source},
                     "drift": {"cv": table.drift_cv, "source": table.drift_source,
                               "availability_logit_sd": table.availability_logit_sd,
                               "availability_rate_corr": table.availability_rate_corr,
                               "availability_source": table.availability_source}, "rows": rows})  # fmt: skip
        return
    from rich.console import Console
    from rich.table import Table

    view = Table(title="spot hazards (per instance; N nodes see more: see the correlation below)")
    for col in ("cloud", "instance", "region", "zone", "rate/h (90%)", "availability", "expected wait",
                "evidence", "source"):  # fmt: skip
        view.add_column(col)
    for r in rows:
        wait = r["expected_wait_s"]
        view.add_row(
            r["cloud"], r["instance_type"] or f"{r['count']}x {r['accelerator']}", r["region"], r["zone"] or "-",
            f"{r['rate_per_hour']:.3f} ({r['low_per_hour']:.3f}-{r['high_per_hour']:.3f})",
            f"{r['availability']:.0%}" if r["availability"] is not None else "not measured",
            f"{wait / 60:.0f} min" if wait else "-",
            f"{r['hours']:,.0f} h, {r['interruptions']:.0f} interruptions", r["source"],
        )  # fmt: skip
    con = Console(highlight=False, soft_wrap=False, width=200)
    con.print(view)
    con.print(
        f"nodes: a job on N nodes sees rate x (1 + (N-1) x (1 - {table.rho:.2f})) ({table.correlation_source})",
        markup=False,
    )
    if table.drift_cv > 0:
        con.print(
            f"90%: the rate a job meets in a week, the mean's uncertainty and a week-to-week drift of "
            f"{table.drift_cv:.0%} ({table.drift_source})",
            markup=False,
        )
    if table.availability_logit_sd > 0:
        con.print(
            f"seasons: availability moves {table.availability_logit_sd:.2f} in logit week to week, with the "
            f"rate at correlation {table.availability_rate_corr:.2f} ({table.availability_source}); a plan's "
            "cost band (90%) draws both",
            markup=False,
        )
    con.print(
        f"covers: {table.provenance.get('covers', '?')}; anything else falls back to a pool with wide "
        "uncertainty and says so in `ftorch plan --json` (interruption_source)",
        markup=False,
    )


@hazards_app.command("import")
def import_cmd(
    files: Annotated[
        list[Path], typer.Argument(help="trace files: {metadata: {gap_seconds}, data: [alive count]}")
    ],
    cloud: Annotated[str, typer.Option("--cloud", help="the cloud the trace was recorded on, e.g. aws")],
    instance_type: Annotated[str, typer.Option("--instance-type", help="e.g. p3.2xlarge")],
    zone: Annotated[str, typer.Option("--zone", help="e.g. us-east-1a")],
    nodes: Annotated[int, typer.Option("--nodes", help="instances the trace counts for one job")] = 1,
    region: Annotated[str | None, typer.Option("--region", help="default: the zone less its letter")] = None,
    as_json: JsonOut = False,
) -> None:
    """Add measured traces (e.g. a team's own logs) to the evidence the planner's rates rest on."""
    from orchestrator.sizing.catalog import load_catalog
    from orchestrator.spot.hazards import Evidence, add_evidence, measure, read_trace

    cloud = cloud.lower()
    offers = [o for o in load_catalog(offline=True).offers if o.cloud == cloud]
    if not offers:
        clouds = sorted({o.cloud for o in load_catalog(offline=True).offers})
        raise SpecError("--cloud", f"'{cloud}' is not in the catalog; valid: {', '.join(clouds)}")
    offer = next((o for o in offers if o.instance_type == instance_type), None)
    if offer is None:
        raise SpecError("--instance-type", f"'{instance_type}' is not a {cloud} instance in the catalog "
                        f"(e.g. {offers[0].instance_type}; `ftorch gpus --cloud {cloud}` lists them)")  # fmt: skip
    if not ZONE.match(zone):
        raise SpecError("--zone", f"'{zone}' is not a zone name (e.g. us-east-1a, us-central1-a)")
    if nodes < 1:
        raise SpecError("--nodes", f"must be >= 1 (got {nodes})")
    region = region or zone[:-1].rstrip("-")
    found: list[Evidence] = []
    for path in files:
        gap, counts = read_trace(path)  # every file is read before anything is kept
        stats = measure(counts, gap, nodes)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        found.append(Evidence(
            cloud=cloud, instance_type=instance_type, region=region, zone=zone, nodes=nodes,
            hours=stats.hours, interruptions=stats.interruptions, source=f"import {path.name} sha256:{digest}",
            accelerator=offer.accelerator, count=offer.count, availability=stats.availability,
            mean_down_s=stats.mean_down_s,
        ))  # fmt: skip
    added = add_evidence(found)
    rows: list[dict[str, Any]] = [e.to_json() for e in found]
    if as_json:
        _print_json({"imported": rows, "added": added})
        return
    for e in found:
        print(f"{e.source}: {e.hours:,.1f} h held, {e.interruptions} interruptions "
              f"({e.interruptions / e.hours if e.hours else 0:.3f}/h), available {e.availability:.0%}")  # fmt: skip
    print(f"added {added} of {len(found)} (the rest were imported before)")


def register(app: typer.Typer) -> None:
    app.add_typer(hazards_app, name="hazards")
