"""Reading and checking a JSONL data file: encoding, JSON, and the keys each format needs, with `file:line`.

No torch here: `ftorch launch` runs the same checks before anything is recorded or started, and the
trainer runs them again when it reads the file (a remote file may change, or be unreadable at launch).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import fsspec

ROLES = ("system", "user", "assistant", "tool")
#: what each format's records hold (for messages naming what is missing)
FORMATS = {
    "text": '{"text": ...}',
    "instruction": '{"instruction": ..., "input": ... (optional), "output": ...}',
    "chat": '{"messages": [{"role": ..., "content": ...}, ...]} or ShareGPT\'s {"conversations": [{"from": ..., "value": ...}, ...]}',
}


class DataError(ValueError):
    """The data is wrong; the message names the file and line (or the job-file field, `field`)."""

    def __init__(self, message: str, field: str = "data.path") -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> Any:  # survives the trip back from a `datasets.map` worker process
        return (DataError, (str(self), self.field))


def read_jsonl(
    path: str, storage_options: dict[str, Any] | None = None, fmt: str | None = None
) -> list[dict[str, Any]]:
    """Every record of a JSONL file (blank lines skipped), each checked for `fmt` when given.

    Each record gets `_line` (its line number) for later messages."""
    rows = list(iter_jsonl(path, storage_options, fmt))
    if not rows:
        raise DataError(f"{path}: no examples")
    return rows


def iter_jsonl(
    path: str, storage_options: dict[str, Any] | None = None, fmt: str | None = None
) -> Iterator[dict[str, Any]]:
    """`read_jsonl`, one record at a time (for readers that stop early)."""
    with fsspec.open(path, "rb", **(storage_options or {})) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1});"
                    " save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: each line must be a JSON object")
            row["_line"] = number
            if fmt == "chat":
                row = from_sharegpt(row, f"{path}:{number}")
            if fmt is not None:
                check_row(row, fmt, path)
            yield row


#: ShareGPT's speakers (`from`) as chat roles; `function_call` is the assistant calling a tool
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bing": "assistant", "bard": "assistant", "system": "system", "function_call": "assistant",
    "observation": "tool", "tool": "tool",
}  # fmt: skip


def from_sharegpt(row: dict[str, Any], where: str) -> dict[str, Any]:
    """A ShareGPT record (`{"conversations": [{"from": "human", "value": ...}, ...]}`) as a chat record
    (`messages`, with roles); any other record as it is."""
    turns = row.get("conversations")
    if "messages" in row or not isinstance(turns, list):
        return row
    messages = []
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise DataError(f"{where}: each ShareGPT turn needs 'from' and a string 'value'")
        role = SHAREGPT_ROLES.get(str(turn.get("from")).lower())
        if role is None:
            known = ", ".join(sorted(SHAREGPT_ROLES))
            raise DataError(f"{where}: ShareGPT speaker {turn.get('from')!r} is not one of {known}")
        messages.append({"role": role, "content": turn["value"]})
    return {**{k: v for k, v in row.items() if k != "conversations"}, "messages": messages}


def text_field(row: dict[str, Any], key: str, path: str, fmt: str, required: bool = True) -> str:
    value = row.get(key)
    if value is None and not required:
        return ""
    if key not in row:
        raise DataError(f"{path}:{row['_line']}: '{key}' is required ({fmt} records: {FORMATS[fmt]})")
    if not isinstance(value, str):
        raise DataError(f"{path}:{row['_line']}: '{key}' must be a string")
    return value


def check_row(row: dict[str, Any], fmt: str, path: str) -> None:
    """Raise DataError (with `file:line`) if `row` lacks what format `fmt` needs."""
    if fmt == "text":
        text_field(row, "text", path, fmt)
    elif fmt == "instruction":
        text_field(row, "instruction", path, fmt)
        text_field(row, "input", path, fmt, required=False)
        text_field(row, "output", path, fmt)
    elif fmt == "chat":
        where = f"{path}:{row['_line']}"
        messages = row.get("messages")
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: 'messages' must be a non-empty list ({FORMATS['chat']})")
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                raise DataError(f"{where}: each message needs 'role' and a string 'content'")
            if message.get("role") not in ROLES:
                raise DataError(f"{where}: role must be system, user, assistant or tool")
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: no assistant message to learn from")
    else:
        raise DataError(f"unknown data format {fmt!r}")


def chat_template_text(value: str) -> str:
    """data.chat_template as a template: inline (it holds '{{' or '{%') or read from the file it names.
    Raises DataError (field data.chat_template) for a missing file or a template Jinja cannot parse."""
    text = value
    if "{{" not in value and "{%" not in value:
        try:
            with open(os.path.expanduser(value), encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(
                f"{value}: not a Jinja template (no '{{{{' or '{{%') nor a readable file ({exc.__class__.__name__})",
                "data.chat_template",
            ) from None
        if "{{" not in text and "{%" not in text:  # e.g. a README: plain text is a valid (useless) template
            raise DataError(
                f"{value}: not a chat template (no '{{{{' or '{{%' in the file); give a Jinja chat template",
                "data.chat_template",
            )
    try:
        import jinja2
    except ImportError:  # transformers checks it when it renders
        return text
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise DataError(
            f"not a valid Jinja template (line {exc.lineno}: {exc.message})", "data.chat_template"
        ) from None
    return text


def check_chat_template(template: str, row: dict[str, Any], path: str) -> None:
    """Render one record with `template` as the trainer will (with and without the generation prompt):
    DataError naming data.chat_template if it raises (e.g. `raise_exception` for a role it refuses).
    Through transformers' own renderer where it is installed (no torch), else a plain Jinja sandbox."""
    messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    where = f"{path}:{row.get('_line', 1)}"
    try:
        for upto, generation_prompt in ((first, True), (len(messages), False)):
            if upto:
                _render(template, messages[:upto], generation_prompt)
    except Exception as exc:  # noqa: BLE001 - whatever the template raises, on one line
        text = " ".join(str(exc).split()) or exc.__class__.__name__
        raise DataError(f"rendering {where} fails: {text}", "data.chat_template") from None


def _render(template: str, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(template).render(messages=messages, add_generation_prompt=generation_prompt)
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=generation_prompt
    )
    return rendered[0]
