"""Attempt numbers for runs whose launcher does not count them (SkyPilot relaunches a task as is).

`python -m trainer.runstore.attempts RUN_URI` prints the attempt number for this machine and records it in the
run store as `attempts/<n>.json` (when it started, where: SkyPilot's cluster info, with which library
versions). The key is this
machine's identity (SkyPilot's node IPs and cluster info, else the host name and boot time), so every
node of one multi-node attempt gets the same number, and a relaunch gets the next one (on new machines by
its key; on the same machines because a trainer of the attempt already started: `claim_attempt`).
No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from trainer.envlock import installed
from trainer.runstore.store import RunStore

ATTEMPTS = "attempts"


def machine_key(env: dict[str, str] | None = None) -> str:
    """Identifies one placement of the run: the same on all its nodes, new after every relaunch."""
    env = dict(os.environ if env is None else env)
    parts = [env.get("SKYPILOT_NODE_IPS", ""), env.get("SKYPILOT_CLUSTER_INFO", "")]
    if not any(parts):
        parts = [socket.gethostname(), _boot_id()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return str(os.getpid())


def _known(store: RunStore) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for name in store.listdir(ATTEMPTS):
        stem = name.removesuffix(".json")
        if stem.isdigit():
            found[int(stem)] = store.read_json_or_none(f"{ATTEMPTS}/{name}") or {}
    return found


def _highest_seen(store: RunStore) -> int:
    """The highest attempt number the run has used anywhere (progress, metrics, checkpoints)."""
    seen = [0]
    progress = store.read_progress() or {}
    if isinstance(progress.get("attempt"), int):
        seen.append(progress["attempt"])
    for name in store.listdir("metrics"):
        head = name.split("-", 1)[0]
        if head.isdigit():
            seen.append(int(head))
    for info in store.complete_checkpoints():
        if isinstance(info.meta.get("attempt"), int):
            seen.append(info.meta["attempt"])
    return max(seen)


def _started(store: RunStore, attempt: int) -> bool:
    """Has a trainer of `attempt` started (claimed a fencing epoch of the run)?"""
    return any(record.get("attempt") == attempt for record in store.epoch_records().values())


def claim_attempt(store: RunStore, env: dict[str, str] | None = None) -> int:
    """This machine's attempt number: the newest one recorded for its key while no trainer of it has
    started, else the next one.

    No trainer of an attempt starts before every node has claimed its number (torchrun starts the
    trainers once all nodes have joined), so a key whose attempt has started is a relaunch on the same
    machines: SkyPilot's FAILOVER or a restart after an error on a cluster still up keeps the node IPs
    and the cluster info, and still gets a new number."""
    env = dict(os.environ if env is None else env)
    key = machine_key(env)
    known = _known(store)
    mine = [n for n, record in known.items() if record.get("key") == key]
    if mine and not _started(store, max(mine)):
        return max(mine)
    n = max([_highest_seen(store), *known]) + 1
    record = {
        "n": n,
        "key": key,
        "started_at": time.time(),
        "task_id": env.get("SKYPILOT_TASK_ID"),
        "cluster_info": _json_or_none(env.get("SKYPILOT_CLUSTER_INFO")),
        "versions": installed(),  # the libraries this placement installed (trainer/envlock.py)
    }
    store.write_json(f"{ATTEMPTS}/{n:04d}.json", record)
    return n


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def was_preempted(
    store: RunStore,
    attempt: int,
    wait_s: float = 0.0,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Did `attempt` stop on a preemption notice with its checkpoint written (progress says so)?

    Only rank 0 writes progress, so only its recorded preemption counts. A worker node whose torchrun
    ended first (killed when rank 0 left) waits up to `wait_s` for rank 0's record of how the attempt
    ended, instead of judging a progress that still says "running" (the multi-node race)."""
    return ending(store, attempt, wait_s, poll_s, sleep, clock) == "preempted"


#: endings recorded in an attempt's epoch record that no relaunch may repeat: the run script exits 0 for
#: them, so SkyPilot's max_restarts_on_errors never relaunches into the same divergence or hang (ftorch
#: reads the ending from the run store: orchestrator/backends/skypilot_state.py)
FINAL_ENDINGS = frozenset({"unhealthy"})


def _ended_as(store: RunStore, attempt: int, progress: dict[str, Any]) -> str:
    if progress.get("attempt") == attempt and progress.get("state") == "preempted":
        return "preempted"
    for record in store.epoch_records().values():
        if record.get("attempt") == attempt and record.get("ended") in FINAL_ENDINGS:
            return str(record["ended"])
    return ""


def ending(
    store: RunStore,
    attempt: int,
    wait_s: float = 0.0,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """How `attempt` ended as the run store says: `preempted` (a notice, its checkpoint written),
    `unhealthy` (the health checks ended the run), or "" (a crash, or nothing recorded). A worker node waits
    up to `wait_s` for rank 0's record while progress still says the attempt is running."""
    deadline = clock() + wait_s
    while True:
        progress = store.read_progress() or {}
        found = _ended_as(store, attempt, progress)
        if found:
            return found
        if (progress.get("attempt") == attempt and progress.get("state") != "running") or clock() >= deadline:
            return ""
        sleep(min(poll_s, max(0.0, deadline - clock())))


def open_run_store(run_uri: str) -> RunStore:
    """The run store as a run script reaches it: FTORCH_STORAGE_OPTIONS (e.g. an S3 endpoint) to read
    spec.json in the first place, then the job's own checkpoint.storage_options."""
    options = json.loads(os.environ.get("FTORCH_STORAGE_OPTIONS") or "{}")
    spec = RunStore(run_uri, options).read_spec()
    options = spec.get("job", {}).get("checkpoint", {}).get("storage_options") or options
    return RunStore(run_uri, options)


USAGE = "usage: python -m trainer.runstore.attempts RUN_URI [--preempted N | --ending N] [--wait SECONDS]\n"


def main(argv: list[str] | None = None) -> int:
    """`RUN_URI` prints this machine's attempt number; `RUN_URI --preempted N` exits 0 if N was preempted;
    `RUN_URI --ending N` prints how N ended (`preempted`, `unhealthy` or nothing)."""
    args = sys.argv[1:] if argv is None else argv
    wait_s = 0.0
    if len(args) == 5 and args[3] == "--wait" and args[4].isdigit():
        wait_s, args = float(args[4]), args[:3]
    asks = ("--preempted", "--ending")
    if len(args) not in (1, 3) or (len(args) == 3 and (args[1] not in asks or not args[2].isdigit())):
        sys.stderr.write(USAGE)
        return 2
    store = open_run_store(args[0])
    if len(args) == 3 and args[1] == "--ending":
        sys.stdout.write(ending(store, int(args[2]), wait_s) + "\n")
        return 0
    if len(args) == 3:
        return 0 if was_preempted(store, int(args[2]), wait_s) else 1
    sys.stdout.write(f"{claim_attempt(store)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
