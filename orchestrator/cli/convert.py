"""`ftorch convert AXOLOTL.yml [OUT]`: a ftorch job from an axolotl config, listing what it cannot map."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.errors import SpecError, UserError


def render_job(job: dict[str, Any], unmapped: list[str], source: str) -> str:
    """The job's YAML, headed by a comment that lists what the conversion left out."""
    import yaml

    head = [f"# ftorch job converted from {source} by `ftorch convert`; check it with `ftorch validate`"]
    if unmapped:
        head.append("# not mapped:")
        head += [f"#   {line}" for line in unmapped]
    return "\n".join(head) + "\n" + yaml.safe_dump(job, sort_keys=False, default_flow_style=False)


def convert_file(source: str) -> tuple[str, list[str]]:
    """(the job's text, the unmapped keys) for an axolotl file; SpecError if it is not one or the
    result would not validate."""
    import yaml

    from orchestrator.jobfile.convert import convert_axolotl
    from orchestrator.jobfile.spec import validate_job

    path = Path(source)
    if not path.is_file():
        raise SpecError("AXOLOTL", f"{source} does not exist or is not a file")
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError("AXOLOTL", f"cannot read {source} as YAML ({exc.__class__.__name__})") from None
    if not isinstance(cfg, dict):
        raise SpecError("AXOLOTL", f"{source} is not a mapping of axolotl settings")
    result = convert_axolotl(cfg)
    validate_job(result.job, check_support=False)  # the schema; paths are checked by `ftorch validate`
    return render_job(result.job, result.unmapped, path.name), result.unmapped


def convert_cmd(
    source: Annotated[str, typer.Argument(help="the axolotl config (YAML)")],
    out: Annotated[str | None, typer.Argument(help="the ftorch job to write (default: print it)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite OUT")] = False,
) -> None:
    """Write a ftorch job from an axolotl config; list what could not be mapped."""
    text, unmapped = convert_file(source)
    if out is None:
        sys.stdout.write(text)
    else:
        path = Path(out)
        if path.exists() and not force:
            raise UserError(f"OUT: {out} exists; --force overwrites it")
        if not path.parent.is_dir():
            raise UserError(f"OUT: the folder {path.parent} does not exist")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        typer.echo(f"wrote {out}; next: `ftorch validate {out}`", err=True)
    if unmapped:
        typer.echo(f"not mapped ({len(unmapped)}):", err=True)
        for line in unmapped:
            typer.echo(f"  {line}", err=True)


def register(app: typer.Typer) -> None:
    app.command("convert")(convert_cmd)
