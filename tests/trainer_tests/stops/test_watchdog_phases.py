"""The trainer's stall watchdog (trainer/stops/watchdog.py) with an injected clock: each phase's timeout
(the first step, steady steps, eval, checkpoint) as the module documents it, and the thread that ends a
phase overdue. The rules (trainer/health/rules.py) and the watchdog import no torch (launchers read them)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO

from trainer.stops.watchdog import FACTOR, FLOOR_S, WARMUP_STEPS, Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def _unused(phase: str, waited: float) -> None:
    raise AssertionError(f"no stall expected ({phase}, {waited})")


def _steps(dog: Watchdog, clock: Clock, seconds: list[float]) -> None:
    for s in seconds:
        clock.tick(s)
        dog.beat("step")


def test_each_phase_gets_its_own_timeout_by_the_documented_rule() -> None:
    clock = Clock()
    dog = Watchdog(None, _unused, clock=clock)
    # nothing measured: 300 s for a step; the first step (loading, compiling, a resume's reads) and a
    # phase never timed yet get 3x that
    assert dog.phase == "first_step"
    assert dog.timeout() == 3 * FLOOR_S == 900.0
    assert dog.timeout("step") == FLOOR_S
    assert dog.timeout("eval") == dog.timeout("checkpoint") == 3 * FLOOR_S
    clock.tick(600.0)  # a slow first step is not a steady step: not in the p95
    dog.beat("step")
    assert dog.step_times == [] and dog.timeout("step") == FLOOR_S
    # warm-up steps (the first WARMUP_STEPS) are left out; then 5x the p95 of the steady steps
    _steps(dog, clock, [250.0] * WARMUP_STEPS + [70.0] * 19 + [90.0])
    assert dog.timeout("step") == FACTOR * 90.0 == 450.0  # p95 of 20 steps: the largest here
    _steps(dog, clock, [40.0] * 20)
    assert dog.timeout("step") == FACTOR * 70.0 == 350.0  # over the 300 s floor
    # a checkpoint: max(the step timeout, 5x the last checkpoint's duration)
    dog.beat("checkpoint")
    clock.tick(100.0)
    dog.beat("step")
    assert dog.phase_s["checkpoint"] == 100.0 and dog.timeout("checkpoint") == 500.0
    # an eval shorter than a fifth of the step timeout: the step timeout
    dog.beat("eval")
    clock.tick(10.0)
    dog.beat("step")
    assert dog.timeout("eval") == 350.0
    assert dog.timeout("first_step") == 3 * FLOOR_S  # never timed: the first step's bound stays
    assert 100.0 not in dog.step_times and 10.0 not in dog.step_times  # an eval or checkpoint is no step


def test_the_jobs_stall_timeout_replaces_the_measured_one_but_not_a_longer_eval_or_checkpoint() -> None:
    clock = Clock()
    dog = Watchdog(10.0, _unused, clock=clock)
    assert dog.timeout() == 10.0  # the first step too: the job's figure is what the user asked for
    assert dog.timeout("step") == dog.timeout("eval") == dog.timeout("checkpoint") == 10.0
    clock.tick(1.0)
    dog.beat("step")
    _steps(dog, clock, [100.0] * 30)  # measured steps do not move the given timeout
    assert dog.timeout("step") == 10.0
    dog.beat("eval")
    clock.tick(4.0)
    dog.beat("checkpoint")
    clock.tick(1.0)
    dog.beat("step")
    assert dog.timeout("eval") == 20.0 and dog.timeout("checkpoint") == 10.0


@pytest.mark.parametrize(
    ("phase", "before_s"),
    [("first_step", 0.0), ("step", 0.0), ("eval", 30.0), ("checkpoint", 30.0)],
)
def test_the_thread_ends_a_phase_only_once_it_is_overdue(phase: str, before_s: float) -> None:
    clock = Clock()
    stalls: list[tuple[str, float]] = []
    stalled = threading.Event()

    def on_stall(phase: str, waited: float) -> None:
        stalls.append((phase, waited))
        stalled.set()

    dog = Watchdog(None, on_stall, clock=clock, check_every_s=0.01)
    if phase != "first_step":
        clock.tick(1.0)
        dog.beat("step")
        _steps(dog, clock, [2.0] * 10)  # steady steps of 2 s: the 300 s floor
    if before_s:  # the phase timed once before: 5x that (150 s) is under the floor, 900 s when never timed
        dog.beat(phase)
        clock.tick(before_s)
        dog.beat("step")
    if phase != "first_step":
        dog.beat(phase)
    limit = dog.timeout(phase)
    assert limit == (900.0 if phase == "first_step" else FLOOR_S)
    dog.start()
    try:
        clock.tick(limit - 1.0)
        time.sleep(0.3)  # ~30 checks: none may fire inside the limit
        assert not stalls
        dog.beat(phase)  # alive: the wait starts again, the phase's time just measured counted in
        limit = dog.timeout(phase)
        # a step or a phase of 299 s: 5x that now (the first step is never measured: 900 s still)
        assert limit == (900.0 if phase == "first_step" else FACTOR * (FLOOR_S - 1.0))
        clock.tick(limit - 1.0)
        time.sleep(0.1)
        assert not stalls
        clock.tick(2.0)  # one second over
        assert stalled.wait(60.0), "the watchdog never fired"
        assert stalls == [(phase, limit + 1.0)]
    finally:
        dog.close()


def test_a_closed_watchdog_never_fires() -> None:
    clock = Clock()
    dog = Watchdog(1.0, _unused, clock=clock, check_every_s=0.01).start()
    dog.close()
    dog._thread.join(10.0)
    assert not dog._thread.is_alive()
    clock.tick(10_000.0)  # the thread is gone: _unused is never called


def test_the_rules_and_the_watchdog_import_no_torch() -> None:
    code = (
        "import sys; import trainer.health.rules, trainer.stops.watchdog; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
