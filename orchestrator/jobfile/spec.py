"""Reading a job file: YAML, `--set` overrides, validation, and one-line errors that name the field."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import SpecError, SpecErrors, quoted
from orchestrator.jobfile.aliases import ALIASES, alias_hint, near_miss
from trainer.config import JobSpec, unsupported_features

#: fields whose value is a secret (a chat webhook's token is in its URL): refusals never echo them
SECRET_FIELDS = ("notify.webhook",)


def _model_for_path(path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at `path`, to list its valid keys."""
    model: Any = JobSpec
    for part in path:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _sections() -> dict[str, list[str]]:
    """'' -> the top-level fields, and each section (e.g. 'train', 'local.chaos') -> its fields."""
    out: dict[str, list[str]] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        out[prefix] = list(model.model_fields)
        for name, field in model.model_fields.items():
            annotation = field.annotation
            for c in [annotation, *getattr(annotation, "__args__", ())]:
                if isinstance(c, type) and issubclass(c, BaseModel):
                    walk(c, f"{prefix}.{name}".lstrip("."))

    walk(JobSpec, "")
    return out


def _unknown(key: str, parents: list[str], brief: bool) -> SpecError:
    """An unknown key: another tool's name for a field, a near miss, or neither; with the valid keys."""
    here = ".".join(parents)
    sections = _sections()
    hint = alias_hint(key, here) or near_miss(key, here, sections)
    valid = ", ".join(sections.get(here, ()))
    parts = ["unknown field", hint] if hint else ["unknown field"]
    if not (brief and hint):
        parts.append(f"valid fields here: {valid}")
    return SpecError(".".join([*parents, key]), "; ".join(parts))


def _describe(error: dict[str, Any], brief: bool = False) -> SpecError:
    loc = tuple(
        p for p in error["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))
    )
    # pydantic puts union branch names (e.g. 'int', 'literal['auto']') in loc; keep only real fields
    clean: list[Any] = []
    model: Any = JobSpec
    for part in loc:
        if isinstance(part, int):
            clean.append(part)
            continue
        fields = getattr(model, "model_fields", None)
        if fields is not None and part in fields:
            clean.append(part)
            model = _model_for_path(tuple(p for p in clean if isinstance(p, str))) or object
        elif fields is None and not clean:
            clean.append(part)
    field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in clean).replace(".[", "[")
    kind = error["type"]
    if kind == "extra_forbidden":
        parents = [str(p) for p in clean if isinstance(p, str)]
        return _unknown(str(error["loc"][-1]), parents, brief)
    if kind == "missing":
        return SpecError(field, "is required")
    message = error["msg"]
    message = message.removeprefix("Value error, ")
    named = re.match(r"^([a-z_]+(?:\.[a-z_]+)+): (.+)$", message)
    if kind == "value_error" and named:  # a cross-field check names its own field
        return SpecError(named.group(1), named.group(2))
    value = error.get("input")
    if field in SECRET_FIELDS:  # a webhook URL carries its token: never echoed
        return SpecError(field, f"{message} (value hidden)")
    if kind not in ("model_type", "dict_type") and not isinstance(value, dict | list):
        message = f"{message} (got {quoted(value)})"  # a 120 KB value is not echoed whole
    return SpecError(field or "job", message)


def parse_override(item: str) -> tuple[list[str], Any]:
    """'train.max_steps=100' -> (['train', 'max_steps'], 100), the value typed as YAML."""
    if "=" not in item:
        raise SpecError("--set", f"{item!r} is not key.path=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise SpecError("--set", f"{item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise SpecError(key, f"--set value is not valid YAML ({exc.__class__.__name__})") from None
    except RecursionError:
        value = None
        depth = MAX_DEPTH + 1
    else:
        depth = _depth(value)
    if depth > MAX_DEPTH:
        raise SpecError(key, f"--set value is nested more than {MAX_DEPTH} levels deep")
    return parts, value


#: deeper values are refused: no field of a job needs more, and deep ones exhaust the recursion limit
MAX_DEPTH = 32


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH or not isinstance(value, (dict, list)):
        return level
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, level + 1) for v in items), default=level + 1)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                raise SpecError(".".join(parts[: i + 1]), "is not a mapping, cannot set a key inside it")
            node = child
        node[parts[-1]] = value
    return data


def _resolve_local_path(value: str, base: Path) -> str:
    """Relative local paths in the job file are relative to the job file's folder; `~` is the home."""
    value = os.path.expanduser(value)
    if "://" in value or os.path.isabs(value):
        return value
    candidate = (base / value).resolve()
    return str(candidate)


def _resolve_data_path(value: str, base: Path, field: str) -> str:
    """A local data path resolved against the job file's folder (it must exist), a URL, or a hub id (a
    name like 'owner/name' that is no path here: the trainer loads it from the Hugging Face Hub)."""
    from trainer.data.source import looks_like_hub_id

    if "://" in value:
        return value
    if not value.startswith(("/", "~")) and not (base / value).exists() and looks_like_hub_id(value):
        return value
    resolved = _resolve_local_path(os.path.expanduser(value), base)
    if not os.path.exists(resolved):
        raise SpecError(field, f"{resolved} does not exist")
    return resolved


def _chat_template(value: str, base: Path) -> str:
    """data.chat_template as the template's text (a file's content is stored with the job, so the trainer
    needs no copy of the file wherever it runs)."""
    from trainer.data.check import DataError, chat_template_text

    if "{{" not in value and "{%" not in value:
        value = _resolve_local_path(os.path.expanduser(value), base)
    try:
        return chat_template_text(value)
    except DataError as exc:
        raise SpecError(exc.field, str(exc)) from None


def load_job(path: str | Path, overrides: list[str] | None = None, check_support: bool = True) -> JobSpec:
    """Load, override, validate. Raises SpecError on any problem with the input."""
    path = Path(path)
    if not path.exists():
        raise SpecError("JOB", f"{path} does not exist")
    if path.is_dir():
        raise SpecError("JOB", f"{path} is a folder; give a job YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("JOB", f"cannot read {path}: {exc.__class__.__name__}") from None
    try:
        data = yaml.safe_load(text)
        if _depth(data) > MAX_DEPTH:
            raise SpecError("JOB", f"{path} is nested more than {MAX_DEPTH} levels deep")
    except RecursionError:
        raise SpecError("JOB", f"{path} is nested more than {MAX_DEPTH} levels deep") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise SpecError("JOB", f"{path} is not valid YAML{where}: {problem}") from None
    if data is None:
        raise SpecError("JOB", f"{path} is empty; a job needs at least model, data and checkpoint")
    if not isinstance(data, dict):
        raise SpecError("JOB", f"{path} must be a mapping of fields, not a {type(data).__name__}")
    data = apply_overrides(data, overrides or [])
    return validate_job(data, base=path.resolve().parent, check_support=check_support)


def validate_job(data: dict[str, Any], base: Path | None = None, check_support: bool = True) -> JobSpec:
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise _all_errors(exc.errors()) from None
    if base is not None:
        spec = _resolve_paths(spec, base)
    if check_support:
        problems = unsupported_features(spec)
        if problems:
            raise SpecErrors([SpecError(*p) for p in problems])
    return spec


def _all_errors(errors: list[Any]) -> SpecError:
    """Every problem pydantic found, one per field (a union's branches report the same field several
    times; the first says it best): one SpecError, or a SpecErrors that lists them all."""
    brief = len(errors) > 1
    found: dict[str, SpecError] = {}
    for error in errors:
        described = _describe(error, brief=brief)
        found.setdefault(described.field, described)
    # 'model: is required' says nothing new next to 'base_model: ... ftorch's field is model'
    named = {
        ALIASES[str(e["loc"][-1])][0]
        for e in errors
        if e["type"] == "extra_forbidden" and str(e["loc"][-1]) in ALIASES
    }
    kept = [e for f, e in found.items() if not (f in named and e.message == "is required")]
    return SpecErrors(kept or list(found.values()))


def _resolve_paths(spec: JobSpec, base: Path) -> JobSpec:
    spec.data.path = _resolve_data_path(spec.data.path, base, "data.path")
    if spec.data.eval_path is not None:
        spec.data.eval_path = _resolve_data_path(spec.data.eval_path, base, "data.eval_path")
    if spec.data.chat_template is not None:
        spec.data.chat_template = _chat_template(spec.data.chat_template, base)
    spec.checkpoint.uri = _resolve_local_path(spec.checkpoint.uri, base)
    if spec.output.uri:
        spec.output.uri = _resolve_local_path(spec.output.uri, base)
    if spec.local.chaos is not None and spec.local.chaos.trace:
        spec.local.chaos.trace = [_resolve_local_path(t, base) for t in spec.local.chaos.trace]
    model = spec.model
    if model.startswith((".", "/", "~")) or (base / model / "config.json").exists():
        spec.model = _resolve_local_path(os.path.expanduser(model), base)
    if spec.model.startswith("/") and not os.path.exists(os.path.join(spec.model, "config.json")):
        raise SpecError("model", f"{spec.model} has no config.json; give a model folder or a hub id")
    return spec
