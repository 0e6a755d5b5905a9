"""What the local backend checks before a launch is recorded: the model can be had on this machine,
every LoRA target module exists in it, and the machine has the device the job needs.

The same questions the trainer would answer by crashing, asked once here: a job that fails them is
refused with a one-line error (exit 2) and nothing recorded. A target list is judged from the model's
shape (no torch) when every name is known there, and else by building the model on the meta device from
its config.json (trainer/model/check.py), which is exact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.jobfile.models import cached_config, check_local_model, download_config
from trainer.config import JobSpec


def _config(model: str, source: str) -> dict[str, Any] | None:
    if source == "folder":
        path: Path | None = Path(os.path.expanduser(model)) / "config.json"
    elif source == "cache":
        path = cached_config(model)
    else:  # on the Hub: config.json into the cache (the trainer downloads it anyway)
        path = download_config(model)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None  # the trainer's own loading says what is wrong with it
    return cfg if isinstance(cfg, dict) else None


def _check_targets(spec: JobSpec, cfg: dict[str, Any]) -> None:
    from orchestrator.sizing.shapes import OUTSIDE_LAYERS, shape_from_config

    targets = spec.lora.target_modules
    if isinstance(targets, str) or spec.method not in ("lora", "qlora"):
        return
    try:
        shape = shape_from_config(cfg, spec.model, "preflight")
    except SpecError:
        shape = None
    if shape is not None and not shape.approximate:
        known = {lin.name.rsplit(".", 1)[-1] for lin in shape.linears} | OUTSIDE_LAYERS
        if all(t.rsplit(".", 1)[-1] in known for t in targets):
            return
    from trainer.model.check import unknown_targets

    try:
        missing, linear = unknown_targets(cfg, targets)
    except (KeyError, ValueError, TypeError, OSError):
        return  # not buildable from its config here: the trainer checks the loaded model itself
    if missing:
        raise SpecError(
            "lora.target_modules",
            f"{', '.join(missing)} is not a module of {spec.model}; its linear layers: "
            f"{', '.join(linear)} (or all-linear)",
        )


def preflight(spec: JobSpec) -> dict[str, Any]:
    """SpecError on the first thing this machine cannot do for the job; what was found otherwise."""
    source = check_local_model(spec.model)
    if spec.method == "qlora" or spec.local.device == "cuda":
        from trainer.model.quant import device_problem

        problem = device_problem(spec.method, spec.local.device)
        if problem:
            raise SpecError(*problem)
    cfg = _config(spec.model, source)
    if cfg is not None:
        _check_targets(spec, cfg)
    return {"model_source": source}
