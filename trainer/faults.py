"""Fault injection for tests: die or crash at a named point, which no outside signal can hit reliably.

FTORCH_FAULTS="checkpoint-partial@15,before-manifest@20,crash@8:1" kills the process with SIGKILL at those
points of the checkpoint for those steps, or raises at the end of step 8 in attempt 1 only;
`kill@N` is a
SIGKILL once step N is reported (its metrics row and tracker values handed over, nothing flushed);
`store-full@N` makes the run store answer ENOSPC after the first file of checkpoint N; `oom-above@K`
raises torch.cuda.OutOfMemoryError in every step whose micro-batch per rank exceeds K examples (the only
way to cause one on a CPU; `:A` limits it to attempt A as usual). Unset (always,
outside tests), this costs one set lookup.
"""

from __future__ import annotations

import os
import signal


class InjectedFault(RuntimeError):
    """A crash asked for by FTORCH_FAULTS."""


def _parse(text: str) -> set[tuple[str, int, int | None]]:
    points = set()
    for item in text.split(","):
        if "@" not in item:
            continue
        name, where = item.strip().split("@", 1)
        step, _, attempt = where.partition(":")
        points.add((name, int(step), int(attempt) if attempt else None))
    return points


_POINTS = _parse(os.environ.get("FTORCH_FAULTS", ""))
_ATTEMPT = int(os.environ.get("FTORCH_ATTEMPT", "0") or 0)


def _armed(point: str, step: int) -> bool:
    return (point, step, None) in _POINTS or (point, step, _ATTEMPT) in _POINTS


def named(point: str) -> bool:
    """Whether `point@N` is set for any N (this attempt's, or every attempt's): a switch, not a step."""
    return bool(_POINTS) and any(n == point and a in (None, _ATTEMPT) for n, _s, a in _POINTS)


def maybe_die(point: str, step: int) -> None:
    if _POINTS and _armed(point, step):
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_disk_full(point: str, step: int) -> None:
    """Raise ENOSPC at `point` (a full disk, which tests cannot make for real)."""
    if _POINTS and _armed(point, step):
        import errno

        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def maybe_crash(point: str, step: int) -> None:
    if _POINTS and _armed(point, step):
        raise InjectedFault(f"injected fault {point}@{step}")


def oom_limit() -> int | None:
    """K of `oom-above@K` (for this attempt), or None."""
    limits = [k for name, k, attempt in _POINTS if name == "oom-above" and attempt in (None, _ATTEMPT)]
    return min(limits) if limits else None


def maybe_oom(micro_batch: int) -> None:
    """Raise CUDA's out-of-memory error when a rank's micro-batch exceeds `oom-above@K`."""
    limit = oom_limit() if _POINTS else None
    if limit is not None and micro_batch > limit:
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"injected fault oom-above@{limit}: micro-batch of {micro_batch} examples per rank"
        )
