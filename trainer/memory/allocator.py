"""The CUDA caching allocator's configuration: expandable segments unless the user chose otherwise.

Blocks of a fixed-size segment that are freed at different times leave holes no later request fits
(reserved grows over allocated by 1-22% in traces, most at long context). `expandable_segments:True`
maps memory into one growing segment instead, which removes most of that slack. The setting is read when
CUDA's allocator starts, so `configure` runs at the trainer's entry, before torch touches CUDA.
This module imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: the variable torch reads (PYTORCH_ALLOC_CONF is the device-neutral name newer torch reads too)
VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
DEFAULT = "expandable_segments:True"


def configure(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set expandable segments unless the user set an allocator configuration; say what holds, and who
    set it, for the run's record: {"setting": ..., "source": "ftorch" | "user" | <variable>}."""
    env = os.environ if environ is None else environ
    for name in NAMES:
        if env.get(name):
            return {"setting": env[name], "source": f"user ({name})"}
    env[VARIABLE] = DEFAULT
    env["FTORCH_ALLOC_CONF_SET"] = "1"  # so a later read (or a torchrun worker) knows ftorch set it
    return {"setting": DEFAULT, "source": "ftorch"}


def record(device_type: str, environ: MutableMapping[str, str] | None = None) -> dict[str, str] | None:
    """What the run records about the allocator (None off CUDA, where the setting does nothing)."""
    if device_type != "cuda":
        return None
    env = os.environ if environ is None else environ
    for name in NAMES:
        if env.get(name):
            source = "ftorch" if env.get("FTORCH_ALLOC_CONF_SET") == "1" else f"user ({name})"
            return {"setting": env[name], "source": source}
    return {"setting": "torch default", "source": "unset"}
