"""docs/job-file.md and docs/job-file.schema.json, generated from the job schema (trainer/config.py), its
`#:` field comments and the README's commented example.

    python scripts/jobfile_ref.py > docs/job-file.md
    python scripts/jobfile_ref.py --schema > docs/job-file.schema.json

Every field of the schema gets a row: its YAML path, type, default and bounds from the schema, and the
comment the README's job-file example gives it. tests/orchestrator_tests/jobfile/test_jobfile_ref.py fails when the file is stale.
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
`tests/orchestrator_tests/jobfile/test_jobfile_ref.py` keeps it in sync. Notes come from the commented example in the README's job-file
section. Unknown keys are errors; `--set key.path=value` overrides any field (YAML-typed); relative paths
are relative to the job file. `ftorch validate JOB.yaml` checks a file, `ftorch init` writes a starter.
Other tools' names (axolotl, HF, TRL) are refused naming ftorch's field; `ftorch convert` translates an
axolotl file (docs/convert.md).

The same fields as a JSON Schema, for editor completion and checks: `docs/job-file.schema.json`
(`python scripts/jobfile_ref.py --schema`; the same test keeps it in sync). With the YAML language server
(VS Code's YAML extension, neovim), a job file's first line
`# yaml-language-server: $schema=<path or URL of job-file.schema.json>` turns it on.
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


# ---- the JSON Schema (editor completion and checks) ----------------------------------------------------
#: sections that take one string for their main field (trainer/config.py's `_shorthand`)
SHORTHANDS = {"checkpoint": "uri", "data": "path", "output": "uri"}


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """{field: its `#:` comment} from the model's source (what a reader of trainer/config.py sees)."""
    import inspect

    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"^    ([a-z_]+)\s*:", line)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


def schema(notes: dict[str, str] | None = None) -> dict[str, Any]:
    """JobSpec's JSON Schema, with each field's note (the README's, else its `#:` comment) as its
    description and the string shorthands the validators accept."""
    notes = readme_notes() if notes is None else notes
    out = JobSpec.model_json_schema()
    defs = out.get("$defs", {})

    def describe(model: type[BaseModel], node: dict[str, Any], prefix: str) -> None:
        comments = field_comments(model)
        for name, field in model.model_fields.items():
            prop = node["properties"][name]
            text = notes.get(f"{prefix}{name}") or comments.get(name)
            if text:
                prop["description"] = text
            for sub in _models(field.annotation):
                describe(sub, defs[sub.__name__], f"{prefix}{name}.")

    describe(JobSpec, out, "")
    for section, key in SHORTHANDS.items():
        prop = out["properties"][section]
        ref = {k: prop.pop(k) for k in ("$ref", "anyOf") if k in prop}
        branches = ref.get("anyOf") or [{"$ref": ref["$ref"]}]
        shorthand = {"type": "string", "minLength": 1, "description": f"shorthand for {section}.{key}"}
        prop["anyOf"] = [*branches, shorthand]
    out["title"] = "ftorch job file"
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **out}


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1:] == ["--schema"]:
        sys.stdout.write(json.dumps(schema(), indent=2) + "\n")
    else:
        sys.stdout.write(render())
