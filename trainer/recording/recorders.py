"""The loop's recorders as observers (trainer/observers.py): progress, trackers, measurements, notices.

Each wraps one existing part and says at which named point it records what; none changes the training
state. `standard(a)` is the list every attempt starts with, in the order the loop always called them.
"""

from __future__ import annotations

from typing import Any

from trainer.faults import maybe_die
from trainer.observers import Observer, StepRecord
from trainer.runstore.progress import log


class MeasurerObserver(Observer):
    """trainer/recording/measure.py: step throughput, checkpoint costs; its record survives a kill."""

    def __init__(self, measurer: Any, store: Any, checkpoints: Any) -> None:
        self.measurer, self.store, self.checkpoints = measurer, store, checkpoints

    def on_step(self, record: StepRecord) -> None:
        self.measurer.step(record.tokens)

    def on_checkpoint(self, step: int, blocking_s: float) -> None:
        self.measurer.checkpoint(blocking_s, self.checkpoints.writer)
        self.measurer.record(self.store)  # what this attempt measured so far survives a kill


class ReporterObserver(Observer):
    """progress.json and the metrics rows (trainer/runstore/progress.py)."""

    def __init__(self, reporter: Any, checkpoints: Any) -> None:
        self.reporter, self.checkpoints = reporter, checkpoints

    def on_step(self, record: StepRecord) -> None:
        self.reporter.last_checkpoint(self.checkpoints.durable_step)  # a background upload may have committed
        self.reporter.step(record.step, record.loss, record.lr, record.tokens_seen, record.grad_norm)

    def on_eval(self, step: int, result: dict[str, float]) -> None:
        self.reporter.eval_loss(step, result["loss"])

    def on_checkpoint_start(self, step: int) -> None:
        self.reporter.set_state("checkpointing")

    def on_checkpoint(self, step: int, blocking_s: float) -> None:
        self.reporter.last_checkpoint(self.checkpoints.durable_step)
        self.reporter.set_state("running")


class TrackersObserver(Observer):
    """W&B / TensorBoard (trainer/recording/trackers.py); closed after the final checkpoint of a stop."""

    def __init__(self, trackers: Any, reporter: Any) -> None:
        self.trackers, self.reporter = trackers, reporter

    def on_step(self, record: StepRecord) -> None:
        tokens_per_s = self.reporter.tokens_per_s()
        values = {"loss": record.loss, "lr": record.lr, "grad_norm": record.grad_norm}
        self.trackers.step(record.step, {**values, "tokens_per_s": tokens_per_s or None})

    def on_eval(self, step: int, result: dict[str, float]) -> None:
        self.trackers.scalar("eval/loss", result["loss"], step)

    def on_stop(self, step: int, reason: str | None) -> None:
        self.trackers.close()  # after the checkpoint: W&B's finish may take a while


class KillPoint(Observer):
    """Tests: SIGKILL once the step is reported (FTORCH_FAULTS=kill@N), its rows handed over, none flushed."""

    def on_step(self, record: StepRecord) -> None:
        maybe_die("kill", record.step)


class StepLog(Observer):
    """The `step N/M loss ...` line every `log_every` steps and at the last."""

    def __init__(self, reporter: Any, steps: int, log_every: int) -> None:
        self.reporter, self.steps, self.log_every = reporter, steps, log_every

    def on_step(self, record: StepRecord) -> None:
        if record.step % self.log_every == 0 or record.step == self.steps:
            log(
                f"step {record.step}/{self.steps} loss {record.loss:.4f} lr {record.lr:.2e} "
                f"tok/s {self.reporter.tokens_per_s():,.0f}"
            )

    def on_eval(self, step: int, result: dict[str, float]) -> None:
        log(f"step {step}/{self.steps} held-out {fmt_eval(result)}")


class NotifierObserver(Observer):
    """The webhook posts (trainer/recording/notify.py): a stop before the end (budget or preemption notice)."""

    def __init__(self, notifier: Any, flag: Any) -> None:
        self.notifier, self.flag = notifier, flag

    def on_stop(self, step: int, reason: str | None) -> None:
        if self.flag.is_set():  # a stop with its own exit code (unhealthy) sends its own event
            self.notifier.stopped(step, self.flag.reason)


class WatchdogObserver(Observer):
    """The stall watchdog's heartbeat (trainer/stops/watchdog.py); its timeout goes into progress.json
    so the launcher watching the heartbeat from outside uses the same figure."""

    def __init__(self, watchdog: Any, reporter: Any) -> None:
        self.watchdog, self.reporter = watchdog, reporter

    def enter(self, phase: str, publish: bool = True) -> None:
        """The loop starts `phase` (step, eval, checkpoint): its own timeout, published for the launcher
        before the phase (a long eval must not look like a frozen step from outside)."""
        self.watchdog.beat(phase)
        self.reporter.extra["stall_timeout_s"] = round(self.watchdog.timeout(phase), 1)
        if publish:
            self.reporter.write_mirror()

    def on_step(self, record: StepRecord) -> None:
        if record.step % 20 == 1 or "stall_timeout_s" not in self.reporter.extra:
            self.enter("step", publish=False)  # the reporter writes the step's progress next
        else:
            self.watchdog.beat("step")

    def on_eval(self, step: int, result: dict[str, float]) -> None:
        self.enter("step")

    def on_checkpoint_start(self, step: int) -> None:
        self.enter("checkpoint", publish=False)  # the reporter's "checkpointing" state writes it

    def on_checkpoint(self, step: int, blocking_s: float) -> None:
        self.enter("step", publish=False)  # its "running" state writes it

    def on_stop(self, step: int, reason: str | None) -> None:
        self.watchdog.close()


def standard(a: Any, log_every: int) -> list[Observer]:
    """Every attempt's recorders, in the order the loop called them before observers existed."""
    return [
        NotifierObserver(a.rec.notifier, a.flag),
        MeasurerObserver(a.rec.measurer, a.store, a.checkpoints),
        ReporterObserver(a.rec.reporter, a.checkpoints),
        TrackersObserver(a.rec.trackers, a.rec.reporter),
        KillPoint(),
        StepLog(a.rec.reporter, a.steps, log_every),
    ]


def fmt_eval(result: dict[str, float]) -> str:
    return (
        f"loss {result['loss']:.4f}, exact match {result['exact_match']:.0%} "
        f"on {int(result['examples'])} examples"
    )
