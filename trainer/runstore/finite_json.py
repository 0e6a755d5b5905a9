"""Every number a run writes stays readable JSON: NaN and inf become `null`, and the object that held
them says which keys in `nonfinite` (e.g. `{"loss": null, "nonfinite": {"loss": "NaN"}}`), never a bare
`NaN` that strict parsers (and `ftorch status`'s integer formatting) choke on. No torch."""

from __future__ import annotations

import json
import math
from typing import Any

FLAG = "nonfinite"


def _word(value: float) -> str:
    return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def clean(value: Any) -> Any:
    """`value` with non-finite floats as None; each dict holding one gets `nonfinite: {key: word}`."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        flags: dict[str, str] = {}
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                flags[str(key)] = _word(item)
            out[key] = clean(item)
        if flags:
            out[FLAG] = {**(value.get(FLAG) or {}), **flags} if isinstance(value.get(FLAG), dict) else flags
        return out
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


def dumps(payload: Any, **kwargs: Any) -> str:
    """json.dumps of the cleaned payload; strict (allow_nan=False), so nothing non-finite slips out."""
    return json.dumps(clean(payload), allow_nan=False, **kwargs)
