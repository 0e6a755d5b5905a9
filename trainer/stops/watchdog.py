"""Stalls (train.health.stall_timeout_s): a step that does not come within the stall timeout. No torch.

The rule, shared by the trainer's watchdog thread and the launchers that watch its heartbeat (the local
supervisor, the SkyPilot run script): `stall_timeout(step_times)` is max(300 s, 5x the p95 step after
warm-up) (SageMaker HyperPod: a step line within 300 s; NVIDIA's resiliency extension: observed time x 5),
or the job's `train.health.stall_timeout_s`. Eval and checkpoint phases get max(that, 5x their own last
duration); the first step (loading, compiling, a resume's reads) and a phase not timed yet get max(that,
3x the 300 s floor) unless the job gives its own. The trainer writes the figure into progress.json
(`stall_timeout_s`), so whoever watches the heartbeat (progress.json's `updated_at`, rewritten every step)
uses the trainer's own.

Inside (`Watchdog`): a thread that ends the process with exitcodes.STALLED when the loop has not beaten
in time; it records the stall in the epoch record first. Outside: a frozen process runs no thread, so
the launcher kills a trainer whose heartbeat is older than the timeout (`stale`, with a margin: `outside`).
The set-up before the first step (a hung model download, a dead mount) has its own bound, `setup_timeout`
(1 h unless the job sets `train.health.setup_timeout_s`): a watchdog in the phase "setup" inside, and the
local supervisor and the SkyPilot run script's watch (node 0) outside, which kill a trainer that has written
no heartbeat `outside(setup_timeout)` after its start.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

FLOOR_S = 300.0
FACTOR = 5.0
WARMUP_STEPS = 5  # NVIDIA's resiliency extension leaves the first 5 iterations out
KEY = "stall_timeout_s"
#: the set-up before the first step (NVIDIA's resiliency extension: an initial heartbeat within 60 min)
SETUP_S = 3600.0
#: the job's set-up timeout, for the SkyPilot run script's watch (trainer/stops/heartbeat_watch.py)
SETUP_ENV = "FTORCH_SETUP_TIMEOUT_S"


def stall_timeout(step_times: Sequence[float], given: float | None = None) -> float:
    """The stall timeout: `given` (the job's), else max(300 s, 5x the p95 of the steps after warm-up)."""
    if given is not None:
        return float(given)
    after = sorted(step_times[WARMUP_STEPS:])
    if not after:
        return FLOOR_S
    p95 = after[min(len(after) - 1, int(0.95 * len(after)))]
    return max(FLOOR_S, FACTOR * p95)


def setup_timeout(given: float | None = None) -> float:
    """How long the set-up may take (tokenising, model load, checkpoint read, the evaluation before
    training): the job's `train.health.setup_timeout_s`, else SETUP_S. It has no heartbeat of its own:
    the trainer's set-up watchdog counts from the claim of the run, a launcher from the start."""
    return float(given) if given is not None else SETUP_S


def outside(timeout: float) -> float:
    """The heartbeat age a launcher waits for: a little over the trainer's own timeout, so a trainer that
    is not frozen ends itself first (and records where)."""
    return 1.25 * timeout + 5.0


def stale(progress: dict[str, Any], now: float, grace: bool = True) -> float | None:
    """The heartbeat's age when it is older than `outside(the progress's own stall timeout)`, else None.
    `grace=False` (what `status` shows): older than the timeout itself, so a user sees STALLED before a
    launcher's kill, not only in the instant before it."""
    timeout = progress.get(KEY)
    if timeout is None or progress.get("state") not in ("running", "checkpointing", "evaluating"):
        return None
    age = now - float(progress.get("updated_at") or now)
    return age if age > (outside(float(timeout)) if grace else float(timeout)) else None


class Watchdog:
    """The trainer's own watchdog thread: `beat(phase)` after each step and around eval and checkpoints."""

    def __init__(
        self,
        given: float | None,
        on_stall: Callable[[str, float], None],
        clock: Callable[[], float] = time.monotonic,
        check_every_s: float = 1.0,
        phase: str = "first_step",
    ) -> None:
        self.given, self.on_stall, self.clock, self.check_every_s = given, on_stall, clock, check_every_s
        self.step_times: list[float] = []
        self.phase_s: dict[str, float] = {}
        self.phase = phase
        self.since = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ftorch-watchdog")

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def timeout(self, phase: str | None = None) -> float:
        base = stall_timeout(self.step_times, self.given)
        phase = phase or self.phase
        last = self.phase_s.get(phase)
        if phase in ("eval", "checkpoint", "first_step"):
            return (
                max(base, FACTOR * last)
                if last is not None
                else (base if self.given else max(base, 3 * FLOOR_S))
            )
        return base

    def beat(self, phase: str = "step") -> None:
        """The loop is alive; `phase` is what it does next (step, eval, checkpoint)."""
        now = self.clock()
        spent = now - self.since
        if self.phase == "step":
            self.step_times.append(spent)
        elif self.phase in ("eval", "checkpoint"):
            self.phase_s[self.phase] = spent
        self.phase, self.since = phase, now

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.check_every_s):
            waited = self.clock() - self.since
            limit = self.timeout()
            if waited > limit:
                self.on_stall(self.phase, waited)
                return


def exit_now(code: int) -> NoReturn:
    """Leave at once from the watchdog thread (the training thread is stuck: no cleanup can run)."""
    os._exit(code)
