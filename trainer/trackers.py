"""Experiment trackers (`train.report_to`): TensorBoard event files in the run store, one run per job.

Every attempt appends its own event file to `<run store>/tensorboard/`, so TensorBoard shows one run
across all attempts. An attempt that resumes from step S opens its writer with `purge_step=S + 1`:
TensorBoard's reader then drops what an earlier attempt logged after that checkpoint (steps it is about
to train again), so no step appears twice. Events are written to a local folder and copied into the
run store at each flush (the store may be a bucket). Logged: loss, lr, grad norm, tokens/s, the held-out
loss before and after, and the attempt number (so interruptions are visible as steps in it).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from trainer.store import RunStore

FOLDER = "tensorboard"
FLUSH_EVERY_S = float(os.environ.get("FTORCH_TRACKER_FLUSH_S", "30"))


class Trackers:
    def __init__(self, store: RunStore, report_to: list[str], attempt: int, start_step: int) -> None:
        self.store = store
        self.writer: Any = None
        self.local = ""
        self.last_flush = time.monotonic()
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                from trainer.data_check import DataError

                raise DataError(
                    "train.report_to: tensorboard is not installed here; pip install 'ftorch[tensorboard]'"
                ) from None

            self.local = tempfile.mkdtemp(prefix="ftorch-tb-")
            self.writer = SummaryWriter(self.local, purge_step=start_step + 1 if start_step else None)
            self.writer.add_scalar("run/attempt", attempt, start_step + 1)

    def step(self, step: int, metrics: dict[str, float | None]) -> None:
        if self.writer is None:
            return
        for name, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(f"train/{name}", value, step)
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush()

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        """Copy this attempt's event files into the run store (a failure waits for the next flush)."""
        if self.writer is None:
            return
        self.writer.flush()
        self.last_flush = time.monotonic()
        try:
            for name in sorted(os.listdir(self.local)):
                with open(os.path.join(self.local, name), "rb") as handle:
                    self.store.write_bytes(f"{FOLDER}/{name}", handle.read())
        except Exception:  # noqa: BLE001 - tracking is advisory, like progress
            pass

    def close(self) -> None:
        if self.writer is not None:
            self.flush()
            self.writer.close()
            self.writer = None
