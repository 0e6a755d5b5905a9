"""`train.attn_implementation: auto`: flash-attention 2 where it can run (the flash_attn package importable
and a CUDA device), SDPA everywhere else. Resolved once per attempt, on the device the trainer runs on
(trainer/loop.py), before the fingerprint is taken: the checkpoints record the path actually used, so an
attempt that would resolve differently (flash-attn missing on the next machine) is refused like any other
change of the math (trainer/checkpoints/fingerprint.py) instead of silently breaking bitwise resume.

The planner, which cannot know the remote image, counts `auto` as SDPA (`planned`): the slower, larger
path, so its estimates hold either way. FTORCH_FAULTS=flash-attn-installed@0 (or flash-attn-missing@0)
stands in for the import check in tests (a CPU machine has neither flash_attn nor CUDA).
"""

from __future__ import annotations

import importlib.util

from trainer import faults

FLASH = "flash_attention_2"


def flash_installed() -> bool:
    """Whether the flash_attn package can be imported here (without importing it)."""
    if faults.named("flash-attn-missing"):
        return False
    if faults.named("flash-attn-installed"):
        return True
    return importlib.util.find_spec("flash_attn") is not None


def resolve(requested: str, device_type: str) -> str:
    """The attention implementation to load the model with: `requested` unless it is `auto`."""
    if requested != "auto":
        return requested
    return FLASH if device_type == "cuda" and flash_installed() else "sdpa"


def planned(requested: str) -> str:
    """What the memory estimate and the time model assume: `auto` as SDPA (see the module's docstring)."""
    return "sdpa" if requested == "auto" else requested


def planned_packing(requested: bool | str, requested_attn: str) -> bool:
    """data.packing as the planner counts it: the trainer's rule (trainer/data/packing.py
    `resolve_packing`) on the attention it counts (`planned`: flash-attn is on the image only for
    flash_attention_2, which the planner sends only to CUDA offers that run it), the check taken as passed."""
    from trainer.data.packing import resolve_packing

    return resolve_packing(requested, planned(requested_attn))[0]
