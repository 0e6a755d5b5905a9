"""`ftorch init` (a commented starter job) and `ftorch validate` (check a job without launching it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.backends.base import BACKENDS as BACKEND_CLASSES
from orchestrator.backends.base import backend_for
from orchestrator.cli.common import BACKEND_NAMES, JobFile, JsonOut, Sets, choices, print_json
from orchestrator.errors import SpecError, UserError

METHODS = ("lora", "qlora", "full")
BACKENDS = tuple(BACKEND_CLASSES)
FORMATS = ("text", "instruction", "chat")
FORMAT_NOTE = {
    "text": '{"text": "..."} per line',
    "instruction": '{"instruction": "...", "input": "..." (optional), "output": "..."} per line',
    "chat": '{"messages": [{"role": "user", "content": "..."}, ...]} per line',
}


# ---- validate -------------------------------------------------------------------------------------
def check_job(job_file: str, overrides: list[str]) -> dict[str, Any]:
    """What a launch checks before it records anything (the schema, supported settings, the data file's
    lines, local model folders, the plan and task on the skypilot backend), without a store probe or a launch.
    Raises SpecError/UserError (exit 2) on the first problem.
    """
    from orchestrator.jobfile.data_check import check_data
    from orchestrator.jobfile.spec import load_job
    from orchestrator.jobs import lifecycle as jobs

    spec = load_job(job_file, overrides)
    notes = check_data(spec)  # every line, as launch and the trainer read it
    data = spec.data.path
    store = spec.checkpoint.uri.split("://", 1)[0] if "://" in spec.checkpoint.uri else "file"
    if store in jobs.NON_DURABLE_SCHEMES:
        raise SpecError("checkpoint.uri", f"{store}:// is gone when the process ends; give a shared store")
    result: dict[str, Any] = {
        "job_file": job_file,
        "name": spec.name,
        "model": spec.model,
        "method": spec.method,
        "backend": spec.resources.backend,
        "data": data,
        "checkpoint_uri": spec.checkpoint.uri,
        "notes": notes,
    }
    backend = backend_for(spec.resources.backend)
    result.update(backend.check(spec, f"{spec.name}-000000", f"{spec.checkpoint.uri}/{spec.name}"))
    return result


def validate_cmd(
    job_file: JobFile,
    set_: Sets = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="local | skypilot (default: the job file's)", autocompletion=choices(*BACKEND_NAMES)
        ),
    ] = None,
    as_json: JsonOut = False,
) -> None:
    """Check a job file (schema, local files, and the plan on the skypilot backend); launch nothing."""
    overrides = list(set_ or [])
    if backend is not None:
        overrides.append(f"resources.backend={backend}")
    result = check_job(job_file, overrides)
    if as_json:
        print_json(result)
        return
    typer.echo(f"ok: {job_file}")
    typer.echo(
        f"  {result['name']}: {result['method']} of {result['model']} on the {result['backend']} backend"
    )
    typer.echo(f"  data {result['data']}; run store {result['checkpoint_uri']}")
    for note in result["notes"]:
        typer.echo(f"  note: {note}")
    if "plan" in result:
        plan = result["plan"]
        typer.echo(f"  plan: {plan['adequate_offers']} adequate offers; cheapest {plan['cheapest']}")


# ---- init -----------------------------------------------------------------------------------------
def starter_job(model: str, method: str, backend: str, data: str, fmt: str, name: str) -> str:
    """A commented job file; every value is one that validates (see tests/orchestrator_tests/cli/test_cli_jobfile.py)."""
    cloud = backend_for(backend).remote
    rows: list[tuple[str, str]] = [
        (f"name: {name}", "the job id is NAME-xxxxxx"),
        (f"model: {model}", "hub id, local folder with config.json, or a bundled shape name"),
        (f"method: {method}", "full | lora | qlora"),
    ]
    if method in ("lora", "qlora"):
        rows += [
            ("lora:", "adapters on every linear layer"),
            ("  r: 16", ""),
            ("  alpha: 32", ""),
            ("  dropout: 0.05", ""),
            ("  target_modules: all-linear", "or a list such as [q_proj, v_proj]"),
        ]
    if method == "qlora":
        rows += [
            (
                "quantization: {bits: 4, quant_type: nf4, double_quant: true}",
                "computes in train.precision's dtype",
            )
        ]
    rows += [
        ("data:", ""),
        (f"  path: {data}", "JSONL: a local path or a bucket URL"),
        (f"  format: {fmt}", FORMAT_NOTE[fmt]),
        ("  max_seq_len: 2048", "longer examples are truncated"),
        ("  eval_examples: 0", "held back from the end of the file for a before/after check"),
    ]
    if cloud:
        rows += [
            ("  tokens: 10000000", "tokens in the data set: the planner's hours and cost (a guess is fine)")
        ]
    rows += [
        ("train:", ""),
        ("  micro_batch_size: 2", ""),
        ("  grad_accum: 8", "samples per optimizer step = micro_batch_size x grad_accum"),
        ("  epochs: 1", "or max_steps: N (optimizer steps)"),
        (f"  lr: {'2.0e-5' if method == 'full' else '2.0e-4'}", ""),
        ("  schedule: cosine", "cosine | linear | constant"),
        ("  warmup_ratio: 0.03", ""),
        ("  precision: bf16-mixed", "fp32 | bf16 | bf16-mixed | fp16-mixed (GPUs without bf16: T4, V100)"),
        ("  gradient_checkpointing: true", "less activation memory, some recompute"),
        ("checkpoint:", ""),
        (f"  uri: {'s3://YOUR-BUCKET/ftorch' if cloud else 'runs'}", "each run's store is <uri>/<job id>"),
        ("  every: auto", "Young/Daly from the measured checkpoint cost; or N steps, or 10m"),
        ("  keep: 3", "newest complete checkpoints kept"),
        ("resources:", ""),
        (f"  backend: {backend}", "local (this machine) | skypilot (clouds, spot)"),
    ]
    if cloud:
        rows += [
            ("  spot: true", ""),
            ("  fallback: on-demand", "none | on-demand, when spot capacity is gone"),
            ("  max_hourly_usd: 10.0", "no offer above this price"),
            ("  # clouds: [aws, gcp]", "default: every cloud SkyPilot can use"),
        ]
    else:
        rows += [("local:", ""), ("  device: auto", "auto | cpu | cuda")]
    head = [
        f"# ftorch job: {method} fine-tune of {model}. Check it with `ftorch validate <this file>`,",
        "# run it with `ftorch launch <this file> -f`. Every field is in the README's job-file section.",
    ]
    body = [f"{code:<34} # {note}" if note else code for code, note in rows]
    return "\n".join(head + body) + "\n"


def init_cmd(
    out: Annotated[str, typer.Argument(help="the job file to write")] = "job.yaml",
    model: Annotated[str, typer.Option(help="hub id, local folder or bundled shape")] = "Qwen/Qwen2.5-0.5B",
    method: Annotated[
        str, typer.Option(help="lora | qlora | full", autocompletion=choices(*METHODS))
    ] = "lora",
    backend: Annotated[
        str, typer.Option(help="local | skypilot", autocompletion=choices(*BACKEND_NAMES))
    ] = "local",
    data: Annotated[str | None, typer.Option(help="the training data (JSONL)")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="text | instruction | chat", autocompletion=choices(*FORMATS))
    ] = "instruction",
    force: Annotated[bool, typer.Option("--force", help="overwrite OUT")] = False,
) -> None:
    """Write a commented starter job for a model and method."""
    for field, value, valid in (("--method", method, METHODS), ("--backend", backend, BACKENDS)):
        if value not in valid:
            raise UserError(f"{field}: {value!r} is not one of {', '.join(valid)}")
    if fmt not in FORMATS:
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    path = Path(out)
    if path.exists() and not force:
        raise UserError(f"OUT: {out} exists; --force overwrites it")
    if not path.parent.is_dir():
        raise UserError(f"OUT: the folder {path.parent} does not exist")
    if data is None:
        data = "s3://YOUR-BUCKET/data/train.jsonl" if backend_for(backend).remote else "data/train.jsonl"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", model.split("/")[-1].lower()).strip("-.") or "job"
    text = starter_job(model, method, backend, data, fmt, f"{name}-{method}"[:60])
    import yaml

    from orchestrator.jobfile.spec import validate_job

    validate_job(yaml.safe_load(text))  # the starter is a valid job, before anything is written
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    typer.echo(f"wrote {out}: {method} of {model}, {backend} backend")
    if "://" not in data and not (path.parent / data).exists():
        typer.echo(f"next: put your data at {data} ({FORMAT_NOTE[fmt]}), then `ftorch validate {out}`")
    else:
        typer.echo(f"next: `ftorch validate {out}`, then `ftorch launch {out} -f`")


def register(app: typer.Typer) -> None:
    app.command("init")(init_cmd)
    app.command("validate")(validate_cmd)
