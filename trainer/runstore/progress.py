"""Progress for whoever watches: a snapshot and a metric history in the run store, and log lines.

Writes are throttled (every FTORCH_PROGRESS_EVERY_S seconds, default 2) so a slow store never slows
training by more than one small write every few seconds. A failed progress write is logged and skipped:
progress is advisory, checkpoints are what matter.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from trainer.runstore import finite_json
from trainer.runstore.store import RunStore

PROGRESS_EVERY_S = float(os.environ.get("FTORCH_PROGRESS_EVERY_S", "2"))
ROWS_PER_PART = 1000


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S", time.localtime())
    sys.stdout.write(f"{stamp} [trainer] {message}\n")
    sys.stdout.flush()


def debug(message: str) -> None:
    """Details (checkpoint timings, why an interval was chosen) only with FTORCH_LOG_LEVEL=debug."""
    if os.environ.get("FTORCH_LOG_LEVEL", "info").lower() == "debug":
        log(f"debug: {message}")


class PhaseProgress:
    """A long phase before training (reading, tokenising) as log lines: its start, a line at most every
    `every_s` seconds with the share done and the rate, and its end with the time it took."""

    def __init__(self, what: str, total: int, unit: str, every_s: float = 10.0) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.started = self.last = time.monotonic()
        log(f"{what}: {total:,} {unit}")

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s and self.total:
            self.last = now
            rate = done / max(now - self.started, 1e-9)
            log(f"{self.what}: {done / self.total:.0%} ({done:,}/{self.total:,} {self.unit}, {rate:,.0f}/s)")

    def done(self, detail: str = "") -> None:
        took = time.monotonic() - self.started
        log(f"{self.what}: done in {took:.1f} s" + (f"; {detail}" if detail else ""))


class ProgressReporter:
    def __init__(self, store: RunStore, run_id: str, attempt: int, total_steps: int, output_uri: str) -> None:
        #: a local copy of the snapshot, rewritten every step, for a supervisor on this machine
        #: (FTORCH_PROGRESS_MIRROR; rank 0 only): it acts on exact steps without waiting for the store
        self.mirror = os.environ.get("FTORCH_PROGRESS_MIRROR") if os.environ.get("RANK", "0") == "0" else None
        self.store = store
        self.run_id = run_id
        self.attempt = attempt
        self.total_steps = total_steps
        self.output_uri = output_uri
        self.state = "running"
        self.started_at = time.time()
        self.first_step_at: float | None = None
        self.start_step = 0
        self.start_tokens: int | None = None
        self.step_no = 0
        self.loss: float | None = None
        self.lr: float | None = None
        self.tokens = 0
        self.last_ckpt_step: int | None = None
        self.last_ckpt_at: float | None = None
        self.rows: list[dict[str, Any]] = []
        self.part = 0
        self.last_flush = 0.0
        self.extra: dict[str, Any] = {}

    def start(self, step: int) -> None:
        self.step_no = self.start_step = step
        self.flush()

    def tokens_per_s(self) -> float:
        if self.first_step_at is None or self.start_tokens is None:
            return 0.0
        elapsed = time.time() - self.first_step_at
        return (self.tokens - self.start_tokens) / elapsed if elapsed > 0 else 0.0

    def steps_per_s(self) -> float:
        if self.first_step_at is None:
            return 0.0
        elapsed = time.time() - self.first_step_at
        done = self.step_no - self.start_step - 1
        return done / elapsed if elapsed > 0 and done > 0 else 0.0

    def step(self, step: int, loss: float, lr: float, tokens: int, grad_norm: float | None = None) -> None:
        now = time.time()
        if self.first_step_at is None:
            # throughput counts from the end of the first step (which pays for warm-up)
            self.first_step_at = now
            self.start_tokens = tokens
            self.extra["first_step_at"] = now
        self.step_no, self.loss, self.lr, self.tokens = step, loss, lr, tokens
        self.rows.append(
            {
                "step": step,
                "loss": loss,
                "lr": lr,
                "time": now,
                "attempt": self.attempt,
                "tokens": tokens,
                "grad_norm": grad_norm,
            }
        )
        if now - self.last_flush >= PROGRESS_EVERY_S:
            self.flush()
        else:
            self.write_mirror()

    def eval_loss(self, step: int, loss: float) -> None:
        """The held-out loss at `step`, in that step's metrics row (written with the next flush)."""
        self.extra["eval_loss"] = loss
        row = next((r for r in reversed(self.rows) if r["step"] == step), None)
        if row is None and self.loss is None:  # an earlier attempt logged the step (this one resumed there)
            row = next((dict(r) for r in self.store.read_metrics() if r.get("step") == step), None)
            if row is not None:
                self.rows.append(row)
        if row is None:  # the step's row went out with a full part: write it again with the loss
            row = {"step": step, "loss": self.loss, "lr": self.lr, "time": time.time(), "attempt": self.attempt,
                   "tokens": self.tokens}  # fmt: skip
            self.rows.append(row)
        row["eval_loss"] = loss

    def last_checkpoint(self, step: int | None) -> None:
        """The newest durable checkpoint (unchanged: its time stays when it was first seen)."""
        if step is not None and step != self.last_ckpt_step:
            self.last_ckpt_step = step
            self.last_ckpt_at = time.time()

    def set_state(self, state: str, flush: bool = False) -> None:
        self.state = state
        if flush:
            self.flush()
        else:
            self.write_mirror()

    def write_mirror(self, snapshot: dict[str, Any] | None = None) -> None:
        if not self.mirror:
            return
        tmp = f"{self.mirror}.tmp"
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
                handle.write(finite_json.dumps(snapshot or self.snapshot()))  # NaN/inf: null + flag
            os.replace(tmp, self.mirror)
        except OSError as exc:  # advisory, like the store's copy
            log(f"progress mirror write failed ({exc.__class__.__name__}: {exc})")
            self.mirror = None

    def snapshot(self) -> dict[str, Any]:
        rate = self.steps_per_s()
        remaining = self.total_steps - self.step_no
        return {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "state": self.state,
            "step": self.step_no,
            "total_steps": self.total_steps,
            "loss": self.loss,
            "lr": self.lr,
            "tokens_seen": self.tokens,
            "tokens_per_s": self.tokens_per_s(),
            "steps_per_s": rate,
            "eta_s": remaining / rate if rate > 0 else None,
            "start_step": self.start_step,
            "attempt_started_at": self.started_at,
            "updated_at": time.time(),
            "last_checkpoint_step": self.last_ckpt_step,
            "last_checkpoint_at": self.last_ckpt_at,
            "output_uri": self.output_uri,
            **self.extra,
        }

    def flush(self) -> None:
        self.last_flush = time.time()
        self.write_mirror()
        try:
            if self.rows:
                self.store.write_metrics_part(self.attempt, self.part, self.rows)
                if len(self.rows) >= ROWS_PER_PART:
                    self.part += 1
                    self.rows = []
            self.store.write_progress(self.snapshot())
        except Exception as exc:  # progress is advisory; never let it stop training
            log(f"progress write failed ({exc.__class__.__name__}: {exc}); will retry")

    def finish(self, **results: Any) -> None:
        self.state = "finished"
        self.extra.update({k: v for k, v in results.items() if v is not None})
        self.extra["finished_at"] = time.time()
        self.flush()
