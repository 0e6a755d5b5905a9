"""Preemption notices: a flag the training loop checks after every optimizer step.

SIGTERM is the notice a spot VM's shutdown, Kubernetes, torchrun or the local supervisor sends;
SIGINT (Ctrl-C) is treated the same way. Cloud metadata watchers set the same flag.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any


class PreemptionFlag:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self.noticed_at: float | None = None

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self.noticed_at = time.time()
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def install_signal_handlers(flag: PreemptionFlag) -> None:
    def handler(signum: int, _frame: Any) -> None:
        flag.set(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
