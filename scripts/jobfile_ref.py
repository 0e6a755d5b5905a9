"""docs/job-file.md, generated from the job schema (trainer/config.py) and the README's commented example.

    python scripts/jobfile_ref.py > docs/job-file.md

Every field of the schema gets a row: its YAML path, type, default and bounds from the schema, and the
comment the README's job-file example gives it. tests/orchestrator_tests/test_jobfile_ref.py fails when the file is stale.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from trainer.config import JobSpec

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = """# Job file reference

Generated from the schema (`trainer/config.py`) by `python scripts/jobfile_ref.py > docs/job-file.md`;
`tests/orchestrator_tests/test_jobfile_ref.py` keeps it in sync. Notes come from the commented example in the README's job-file
section. Unknown keys are errors; `--set key.path=value` overrides any field (YAML-typed); relative paths
are relative to the job file. `ftorch validate JOB.yaml` checks a file, `ftorch init` writes a starter.
"""


def _models(annotation: Any) -> list[type[BaseModel]]:
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" \\| null" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: Any) -> str:
    found = []
    for item in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >=")):
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            found.append(f"matches `{pattern}`")
    return ", ".join(found)


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
        return f"`{value!r}`" if value not in ({}, []) else f"`{value}`"
    if field.default is PydanticUndefined:
        return "**required**"
    if field.default is None:
        return "`null`"
    return f"`{str(field.default).lower() if isinstance(field.default, bool) else field.default}`"


def readme_notes(text: str | None = None) -> dict[str, str]:
    """{'train.micro_batch_size': 'comment', ...} from the README's ```yaml job example."""
    text = README.read_text(encoding="utf-8") if text is None else text
    block = re.search(r"## The job file.*?```yaml\n(.*?)```", text, re.S)
    notes: dict[str, str] = {}
    if block is None:
        return notes
    stack: list[tuple[int, str]] = []
    for line in block.group(1).splitlines():
        match = re.match(r"^(\s*)([A-Za-z_]+):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _i, k in stack] + [key])
        if "#" in rest:
            notes[path] = rest.split("#", 1)[1].strip()
        if rest.split("#", 1)[0].strip() == "":
            stack.append((indent, key))
        elif rest.strip().startswith("{"):  # an inline mapping: its keys belong to this path
            for inner in re.findall(r"([A-Za-z_]+):", rest.split("#", 1)[0]):
                notes.setdefault(f"{path}.{inner}", "")
    return notes


def rows(model: type[BaseModel] = JobSpec, prefix: str = "") -> list[tuple[str, str, str, str, bool]]:
    """(path, type, default, bounds, is_section) for every field, depth first."""
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _models(field.annotation)
        out.append((path, type_name(field.annotation), _default(field), _bounds(field), bool(nested)))
        for sub in nested:
            out += rows(sub, f"{path}.")
    return out


def render(notes: dict[str, str] | None = None) -> str:
    notes = readme_notes() if notes is None else notes
    everything = rows()
    table = ["| field | type | default | bounds | note |", "|---|---|---|---|---|"]

    def row(path: str, kind: str, default: str, bounds: str) -> str:
        note = notes.get(path, "").replace("|", "\\|")
        return f"| `{path}` | {kind} | {default} | {bounds} | {note} |"

    lines = [HEADER, "## Top level", "", *table]
    lines += [row(p, k, d, b) for p, k, d, b, section in everything if "." not in p and not section]
    for path, kind, _default, _bounds, section in everything:
        if "." in path or not section:
            continue
        note = notes.get(path, "")
        optional = " (optional: null leaves it off)" if kind.endswith("null") else ""
        lines += ["", f"## `{path}`{optional}", ""]
        lines += ([note, ""] if note else []) + table
        lines += [row(p, k, d, b) for p, k, d, b, _s in everything if p.startswith(f"{path}.")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
