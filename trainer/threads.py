"""The trainer's CPU threads (`local.threads`): a count, torch's default (0), or `auto`.

`auto` counts the cores free right now (idle time in /proc/stat over a short window; the 1-minute load
average where that cannot be read), at least 1. Why: torch's intra-op threads spin and wait for each other
at every op, so one more thread than there are free cores makes every step wait for a descheduled thread:
the quickstart's 2 threads on a 2-core machine with one busy core went from 0.15 s to 4 s a step, while 1
thread is 4-28% slower than 2 on a quiet machine (bench/busy_quickstart.py).
"""

from __future__ import annotations

import math
import os
import time

WINDOW_S = 0.2


def _idle_jiffies() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


def free_cores(window_s: float = WINDOW_S) -> float:
    """Cores idle over the last `window_s` seconds (fractional)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        idle0, total0 = _idle_jiffies()
        time.sleep(window_s)
        idle1, total1 = _idle_jiffies()
        busy = 1.0 - (idle1 - idle0) / max(1, total1 - total0)
        machine = os.cpu_count() or cores
        return max(0.0, min(cores, machine * (1.0 - busy)))
    except (OSError, ValueError, IndexError):
        return max(0.0, cores - os.getloadavg()[0])


def thread_count(setting: int | str, free: float | None = None) -> int:
    """Threads for `local.threads`: the number itself, 0 for torch's default, `auto`: the free cores,
    a core counted when at least 75% idle (a half-busy core makes a thread wait), at least 1."""
    if setting != "auto":
        return int(setting)
    free = free_cores() if free is None else free
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # torchrun: the ranks share the cores
    return max(1, int(math.floor(free / ranks + 0.25)))


def set_threads(setting: int | str) -> int:
    """Apply `local.threads` to torch (0 leaves torch's default); returns the count set (0: none)."""
    count = thread_count(setting)
    if count:
        import torch

        torch.set_num_threads(count)
    return count
