"""A run's training_summary.json read back from its output folder is input from anyone who can write the
store (issue 30): before an export copies it and renders its model card from it, every field the card
reads is checked for its recorded type. A summary that fails is not used (one warning line names the
fields); the export then rebuilds it from the run's metrics, as for an export of an earlier step. No torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.runstore.recordcheck import is_number, warn


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _maybe(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _eval(v: Any) -> bool:
    return isinstance(v, dict) and all(is_number(v.get(k)) for k in ("loss", "exact_match", "examples"))


def _curve(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and all(is_number(x) for x in p) for p in v
    )


def _scalars(v: Any) -> bool:
    return isinstance(v, dict) and all(x is None or isinstance(x, str | int | float) for x in v.values())


def _lora(v: Any) -> bool:
    return _scalars({k: x for k, x in v.items() if k != "target_modules"}) and all(
        k in v for k in ("r", "alpha", "dropout", "target_modules")
    )


def _quantization(v: Any) -> bool:
    return _scalars(v) and all(k in v for k in ("bits", "quant_type", "compute_dtype"))


#: every top-level field the model card reads, with its check (trainer/outputs/model_card.py)
FIELDS: dict[str, Callable[[Any], bool]] = {
    "method": lambda v: v in ("lora", "qlora", "full"),
    "base_model": _text,
    "prompt_format": _text,
    "steps": _count,
    "attempts": _count,
    "interruptions": _count,
    "tokens_seen": _maybe(_count),
    "preemptions": _maybe(_count),
    "first_loss": _maybe(is_number),
    "final_loss": _maybe(is_number),
    "cost_usd": _maybe(is_number),
    "eval_before": _maybe(_eval),
    "eval_after": _maybe(_eval),
    "eval_curve": _maybe(_curve),
    "hyperparameters": _scalars,
    "lora": _maybe(lambda v: isinstance(v, dict) and _lora(v)),
    "quantization": _maybe(lambda v: isinstance(v, dict) and _quantization(v)),
    "ledger": _maybe(lambda v: isinstance(v, dict)),
    "job_id": _maybe(_text),
}
DATA_FIELDS: dict[str, Callable[[Any], bool]] = {
    "path": _text,
    "format": _text,
    "max_seq_len": _count,
    "training_examples": _maybe(_count),
    "training_tokens": _maybe(_count),
    "held_out_examples": _maybe(_count),
}


def problems(summary: Any) -> list[str]:
    """The fields of `summary` that are missing or not of their recorded type ([] when it is usable)."""
    if not isinstance(summary, dict):
        return [f"the whole file (a JSON {type(summary).__name__}, not an object)"]
    bad = [key for key, ok in FIELDS.items() if not ok(summary.get(key))]
    data = summary.get("data")
    if not isinstance(data, dict):
        return [*bad, "data"]
    return bad + [f"data.{key}" for key, ok in DATA_FIELDS.items() if not ok(data.get(key))]


def usable(summary: Any, where: str) -> dict[str, Any] | None:
    """`summary` when every field the card reads has its recorded type; else None, with one warning."""
    if summary is None:
        return None
    bad = problems(summary)
    if not bad:
        return summary
    shown = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
    warn(where, f"not used ({shown}: missing or not of the recorded type); rebuilt from the run's metrics")
    return None
