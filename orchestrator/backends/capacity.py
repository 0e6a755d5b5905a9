"""Simulated spot capacity for the local backend, and the policy that reacts to it.

`local.chaos.trace` replays spot availability traces (the format `ftorch simulate` reads) at
`local.chaos.speedup` trace-seconds per wall-second. The supervisor asks the same policy objects the
simulator uses, every tick, whether to run on spot, on demand, or wait; when spot capacity disappears under
a job on spot, that is a preemption.

Work is measured in trace seconds: a step takes (measured wall seconds per step) x speedup.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from orchestrator.spot.policy import (
    Decision,
    Mode,
    Observation,
    Policy,
    make_policy,
    policy_name_for,
)
from trainer.config import JobSpec, deadline_seconds


@dataclass
class TraceCapacity:
    """Spot capacity from traces, on a clock that runs `speedup` times faster than the wall."""

    zones_up: list[list[bool]]  # zones_up[tick] = [zone0 up, zone1 up, ...]
    gap_s: float
    speedup: float
    start_tick: int = 0
    t0: float = field(default_factory=time.time)

    @classmethod
    def from_spec(cls, spec: JobSpec, t0: float | None = None) -> TraceCapacity | None:
        chaos = spec.local.chaos
        if chaos is None or not chaos.trace:
            return None
        from orchestrator.spot.traces import load_zones

        zones = load_zones(list(chaos.trace), nodes=spec.resources.nodes)
        rows = zones.up.T.tolist()
        return cls(rows, zones.gap_s, chaos.speedup, chaos.start_tick, t0 if t0 is not None else time.time())

    def sim_seconds(self, wall: float) -> float:
        return (wall - self.t0) * self.speedup

    def tick(self, wall: float) -> int:
        return self.start_tick + int(self.sim_seconds(wall) // self.gap_s)

    def spot_available(self, wall: float) -> bool:
        index = self.tick(wall)
        if index >= len(self.zones_up):  # past the end of the trace: the last tick holds
            index = len(self.zones_up) - 1
        return any(self.zones_up[index])

    @property
    def wall_tick_s(self) -> float:
        return self.gap_s / self.speedup


@dataclass
class PolicyDriver:
    """Asks a policy what to run on, from the job's progress and the simulated capacity."""

    policy: Policy
    capacity: TraceCapacity
    deadline_s: float | None  # trace seconds from launch
    restart_overhead_s: float  # trace seconds

    @classmethod
    def from_spec(cls, spec: JobSpec, capacity: TraceCapacity) -> PolicyDriver:
        chaos = spec.local.chaos
        assert chaos is not None
        name = policy_name_for(spec.resources)
        deadline = deadline_seconds(spec.resources.deadline) if spec.resources.deadline else None
        return cls(make_policy(name), capacity, deadline, chaos.restart_overhead_s)

    def decide(
        self,
        wall: float,
        mode: Mode,
        step: int,
        total_steps: int,
        last_checkpoint_step: int,
        wall_s_per_step: float,
        preemptions: int,
    ) -> Decision:
        per_step = max(wall_s_per_step, 1e-6) * self.capacity.speedup
        return self.policy.decide(
            Observation(
                now_s=self.capacity.sim_seconds(wall),
                start_s=0.0,
                deadline_s=self.deadline_s,
                work_done_s=step * per_step,
                work_total_s=max(total_steps, step) * per_step,
                restart_overhead_s=self.restart_overhead_s,
                spot_available=self.capacity.spot_available(wall),
                mode=mode,
                unsaved_work_s=max(0, step - last_checkpoint_step) * per_step,
                tick_s=self.capacity.gap_s,
                preemptions=preemptions,
            )
        )
