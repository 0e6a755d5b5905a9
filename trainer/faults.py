"""Fault injection for tests: die or crash at a named point, which no outside signal can hit reliably.

FTORCH_FAULTS="checkpoint-partial@15,before-manifest@20,crash@8:1" kills the process with SIGKILL at those
points of the checkpoint for those steps, or raises at the end of step 8 in attempt 1 only;
`kill@N` is a
SIGKILL once step N is reported (its metrics row and tracker values handed over, nothing flushed);
`store-full@N` makes the run store answer ENOSPC after the first file of checkpoint N; `oom-above@K`
raises torch.cuda.OutOfMemoryError in every step whose micro-batch per rank exceeds K examples (the only
way to cause one on a CPU; `:A` limits it to attempt A as usual). The health faults (trainer/health/rules.py):
`nan@K` turns a trainable weight to NaN before step K (so every loss is NaN from step K until a rollback
restores the weights: a fault that happens once and stays), `spike@K` multiplies step K's loss by 1000
(a bad batch), `nan-grad-rank1@K` makes one gradient non-finite on rank 1 only at step K, `hang@K`
blocks step K (a hung collective or a dead mount), `hang-rank1@K` freezes rank 1 only at step K, holding
the GIL (a process stuck in a C call: not even its own watchdog thread runs; the other ranks wait in their
next collective until the process group's timeout or their own watchdog ends them); `hang-rank1@setup` and
`hang-rank1@finish` freeze it outside the step loop (once the process group is up; before the output is
gathered), where no watchdog runs and only the group's timeout ends the others.
A step of `*` arms a point at every
step: `checkpoint-partial@*:1` kills attempt 1 inside its first checkpoint, whatever its step (the budget
stop's, when no periodic checkpoint came before it). `slow-step@MS` makes every optimizer step take MS
milliseconds longer and `slow-save@MS` every checkpoint save (a slow machine or store on demand: the
budget stop must hold under both). The phases where a notice or the budget must be honoured between steps
get the same kind of delay, so that a test can send its SIGTERM into them: `slow-eval@MS` after every
batch of each mid-run evaluation, `slow-eval-before@MS` / `slow-eval-after@MS` of the evaluation before the
first step / after the last, `slow-tokenize@MS` after every tokenisation chunk, `slow-load@MS` between
loading the base model and adding its adapters. Unset (always, outside tests), this costs one set lookup.
"""

from __future__ import annotations

import os
import signal
from typing import Any


class InjectedFault(RuntimeError):
    """A crash asked for by FTORCH_FAULTS."""


#: the step of a point armed at every step (`name@*`)
ANY_STEP = -1


def _parse(text: str) -> set[tuple[str, int | str, int | None]]:
    points: set[tuple[str, int | str, int | None]] = set()
    for item in text.split(","):
        if "@" not in item:
            continue
        name, where = item.strip().split("@", 1)
        step, _, attempt = where.partition(":")
        at: int | str = ANY_STEP if step == "*" else int(step) if step.lstrip("-").isdigit() else step
        points.add((name, at, int(attempt) if attempt else None))
    return points


_POINTS = _parse(os.environ.get("FTORCH_FAULTS", ""))
_ATTEMPT = int(os.environ.get("FTORCH_ATTEMPT", "0") or 0)


def use_attempt(attempt: int) -> None:
    """The attempt a point's `:A` is matched against: the trainer's own `--attempt` (FTORCH_ATTEMPT is
    set only by the supervisors; a trainer started by hand or by a test has just the argument)."""
    global _ATTEMPT
    _ATTEMPT = attempt


def _armed(point: str, step: int | str) -> bool:
    return any((point, at, a) in _POINTS for at in (step, ANY_STEP) for a in (None, _ATTEMPT))


def delay_s(point: str) -> float:
    """Seconds of `slow-step@MS` / `slow-save@MS` (or another `slow-*` point) armed for this attempt
    (0.0 when none)."""
    if not _POINTS:
        return 0.0
    armed = [ms for name, ms, attempt in _POINTS if name == point and attempt in (None, _ATTEMPT)]
    return sum(ms for ms in armed if isinstance(ms, int)) / 1000.0


def maybe_slow(point: str) -> None:
    """Sleep what `point@MS` asks (a slow step or save that a fast test machine cannot make for real)."""
    seconds = delay_s(point)
    if seconds > 0:
        import time

        time.sleep(seconds)


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


def _first_trainable(model: Any) -> Any:
    return next(p for p in model.parameters() if p.requires_grad)


def _local(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard (FSDP)


def maybe_poison(model: Any, step: int) -> None:
    """`nan@K`: a trainable weight becomes NaN before step K (a fault that stays until a rollback)."""
    if _POINTS and _armed("nan", step):
        import torch

        with torch.no_grad():
            _local(_first_trainable(model)).fill_(float("nan"))


def spike(step: int) -> float:
    """`spike@K`: the factor step K's loss is multiplied by (1000), else 1."""
    return 1000.0 if _POINTS and _armed("spike", step) else 1.0


def maybe_nan_grad(model: Any, step: int) -> None:
    """`nan-grad-rank<R>@K`: one gradient of rank R becomes non-finite at step K (after backward)."""
    if _POINTS and _armed(f"nan-grad-rank{os.environ.get('RANK', '0')}", step):
        grad = _first_trainable(model).grad
        if grad is not None:
            _local(grad).view(-1)[0] = float("inf")


def maybe_hang(step: int) -> None:
    """`hang@K`: step K blocks (a hung collective, a dead mount) until the process is killed;
    `hang-rank<R>@K`: rank R only, frozen (`_freeze`)."""
    if _POINTS and _armed("hang", step):
        import time

        while True:
            time.sleep(3600)
    rank = os.environ.get("RANK", "0")
    if _POINTS and _armed(f"hang-rank{rank}", step):
        _freeze(f"hang-rank{rank}@{step}")


def maybe_hang_in(phase: str) -> None:
    """`hang-rank<R>@setup` / `@finish`: rank R freezes in that phase, outside the step loop."""
    rank = os.environ.get("RANK", "0")
    if _POINTS and (f"hang-rank{rank}", phase, None) in _POINTS:
        _freeze(f"hang-rank{rank}@{phase}")


def _freeze(point: str) -> None:
    """Sleep in C with the GIL held (ctypes.PyDLL does not release it), for good; says when on stderr."""
    import ctypes
    import sys
    import time

    print(f"injected fault {point}: frozen at {time.time():.3f}", file=sys.stderr, flush=True)
    libc = ctypes.PyDLL(None)
    while True:  # a signal ends one sleep (its Python handler runs in between), not the freeze
        libc.sleep(3600)
