"""A SkyPilot client double that replays a spot trace: launch, preemption, queue states, cancel.

It is the cloud and the trainer together, on a clock the test moves: a managed job launched with spot
entries waits (PENDING) while the trace has no spot capacity, boots for `restart_s` (STARTING), trains
(RUNNING) and is preempted when capacity goes (RECOVERING, recovery_count + 1, the work since the last
checkpoint lost), as SkyPilot's own recovery does. On-demand launches always get capacity. The "trainer"
writes progress.json to a real run store, checkpoints every `ckpt_steps`, and honours the controller's
stop request in the run store (checkpoint, then exit 75, which SkyPilot answers with a recovery).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.stops.stop_request import STOP_REQUEST


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Job:
    job_id: int
    spot: bool
    status: str = "PENDING"
    recovery_count: int = 0
    boot_left: float = 0.0
    submitted_at: float = 0.0
    running_s: float = 0.0


@dataclass
class ReplaySky:
    up: list[bool]  # spot capacity per trace tick
    gap_s: float
    clock: Clock
    store: Any  # trainer.runstore.store.RunStore
    total_steps: int
    step_s: float
    ckpt_steps: int
    restart_s: float
    jobs: dict[int, _Job] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    step: int = 0
    saved: int = 0
    state: str = "running"
    spot_s: float = 0.0
    ondemand_s: float = 0.0
    finished_at: float | None = None
    _carry: float = 0.0

    # ---- the SkyClient protocol ----------------------------------------------------------------
    def launch(self, task: dict[str, Any], name: str) -> int:
        entries = task["resources"]["ordered"]
        spot = all(e.get("use_spot") for e in entries)
        assert spot or not any(e.get("use_spot") for e in entries), "one kind per launch"
        job_id = len(self.jobs) + 1
        self.jobs[job_id] = _Job(job_id, spot, submitted_at=self.clock())
        self.calls.append(("launch", ("spot" if spot else "on-demand", name)))
        return job_id

    def queue(self, job_ids: list[int]) -> list[dict[str, Any]]:
        self.calls.append(("queue", tuple(job_ids)))
        return [
            {
                "job_id": j.job_id,
                "status": j.status,
                "recovery_count": j.recovery_count,
                "resources": "[Spot]" if j.spot else "[On-demand]",
                "cloud": "aws",
                "region": "us-east-1",
                "accelerators": {"V100": 1},
                "job_duration": j.running_s,
            }
            for j in self.jobs.values()
            if j.job_id in job_ids
        ]

    def cancel(self, job_id: int) -> None:
        self.calls.append(("cancel", job_id))
        job = self.jobs[job_id]
        if job.status == "RUNNING":  # killed mid-step: back to the last checkpoint
            self.step = self.saved
        job.status = "CANCELLED"

    # ---- the world -----------------------------------------------------------------------------
    def spot_up(self, at: float) -> bool:
        tick = int(at // self.gap_s)
        return self.up[tick] if tick < len(self.up) else False

    def advance(self, dt: float) -> None:
        """Move the world `dt` seconds (the clock is advanced here)."""
        end = self.clock.now + dt
        while self.clock.now < end - 1e-9:
            step = min(self.gap_s - (self.clock.now % self.gap_s), end - self.clock.now)
            self._advance(step)
            self.clock.now += step

    def _active(self) -> _Job | None:
        live = [j for j in self.jobs.values() if j.status not in ("CANCELLED", "SUCCEEDED")]
        assert len(live) <= 1, "two managed jobs of one run alive at once"
        return live[0] if live else None

    def _advance(self, dt: float) -> None:
        job = self._active()
        if job is None:
            return
        up = self.spot_up(self.clock.now) if job.spot else True
        if job.status == "RUNNING" and not up:  # preempted
            job.status = "RECOVERING"
            job.recovery_count += 1
            self.step = self.saved
            return
        if job.status in ("PENDING", "RECOVERING") and up:
            job.status, job.boot_left = "STARTING", self.restart_s
        if job.status == "STARTING":
            self._bill(job, dt)
            if job.boot_left > dt:
                job.boot_left -= dt
                return
            dt -= job.boot_left
            job.status = "RUNNING"
            self.state = "running"
            self._carry = 0.0
        if job.status != "RUNNING":
            return
        if self.store.read_json_or_none(STOP_REQUEST):  # the controller asks for a checkpoint
            self.saved = self.step
            self.state = "preempted"
            self._write()
            job.status = "RECOVERING"  # exit 75: SkyPilot recovers it (the controller cancels)
            job.recovery_count += 1
            return
        self._bill(job, dt)
        job.running_s += dt
        self._carry += dt
        while self._carry >= self.step_s and self.step < self.total_steps:
            self._carry -= self.step_s
            self.step += 1
            if self.step % self.ckpt_steps == 0:
                self.saved = self.step
        if self.step >= self.total_steps:
            self.saved = self.step
            self.state = "finished"
            job.status = "SUCCEEDED"
            self.finished_at = self.clock.now + dt - self._carry
        self._write()

    def _bill(self, job: _Job, dt: float) -> None:
        if job.spot:
            self.spot_s += dt
        else:
            self.ondemand_s += dt

    def _write(self) -> None:
        self.store.write_progress(
            {
                "state": self.state,
                "step": self.step,
                "total_steps": self.total_steps,
                "steps_per_s": 1.0 / self.step_s,
                "last_checkpoint_step": self.saved,
            }
        )
