"""`python -m trainer.stops.heartbeat_watch -- COMMAND...`: the SkyPilot run script's stall watch. No torch.

A frozen trainer (SIGSTOP, a hung collective, a dead mount) runs no watchdog thread, so this parent
watches its heartbeat: the progress mirror the trainer rewrites every step (FTORCH_PROGRESS_MIRROR, set
here to a file of its own when unset) with the trainer's own stall timeout in it. The rule is the local
supervisor's (trainer/stops/watchdog.py: `stale`): a heartbeat older than `outside(timeout)` is a stall;
the command's process group is killed and the command runs again once; a second stall (or the trainer's
own exit 87) with no new checkpoint since the previous one ends the run UNHEALTHY: recorded in the newest
attempt's epoch record (FTORCH_RUN_URI), and exitcodes.UNHEALTHY (86). `--unhealthy-exit 0` (the SkyPilot
run script) turns every unhealthy end, this watch's or the trainer's own 86, into that code: 86 is not in
recover_on_exit_codes, but SkyPilot's max_restarts_on_errors would still relaunch it into the same hang.

The command runs in its own process group; SIGTERM/SIGINT sent to this process (SkyPilot's cancel, a
preemption sent to the run script's group) are passed on to it, and its exit code is this one's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainer import exitcodes
from trainer.stops.watchdog import KEY, stale

POLL_S = float(os.environ.get("FTORCH_HEARTBEAT_POLL_S", "1"))


def log(message: str) -> None:
    print(f"[ftorch heartbeat] {message}", file=sys.stderr, flush=True)


def read_heartbeat(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_once(command: list[str], mirror: Path) -> tuple[int, dict[str, Any]]:
    """Run `command` until it exits (its code) or its heartbeat is stale (exitcodes.STALLED, after the
    kill); also the last heartbeat seen."""
    mirror.unlink(missing_ok=True)  # a previous run's heartbeat is not this one's
    env = {**os.environ, "FTORCH_PROGRESS_MIRROR": str(mirror)}
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    log(f"watching pid {proc.pid}")

    def forward(signum: int, _frame: Any) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    heartbeat: dict[str, Any] = {}
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            heartbeat = read_heartbeat(mirror) or heartbeat
            age = stale(heartbeat, time.time()) if heartbeat else None
            if age is not None and proc.poll() is None:
                log(
                    f"stalled: no heartbeat for {age:.0f} s at step {heartbeat.get('step')} "
                    f"(timeout {float(heartbeat[KEY]):.0f} s); killed"
                )
                _kill_group(proc)
                return exitcodes.STALLED, heartbeat
        return proc.returncode, read_heartbeat(mirror) or heartbeat
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def record_unhealthy(detail: str, checkpoint_step: int) -> None:
    """Mark the newest attempt of FTORCH_RUN_URI's run as ended unhealthy (best effort: the exit code still
    says it when the store cannot be reached)."""
    run_uri = os.environ.get("FTORCH_RUN_URI")
    if not run_uri:
        return
    try:
        from trainer.runstore.attempts import open_run_store

        store = open_run_store(run_uri)
        store.epoch = max(store.epoch_records() or {0: None})
        store.update_epoch_record(
            ended="unhealthy", stop_detail=detail, healthy_step=checkpoint_step or None, ended_at=time.time()
        )
    except Exception as exc:  # noqa: BLE001 - advisory
        log(f"could not record the unhealthy end in the run store ({exc.__class__.__name__}: {exc})")


def watch(command: list[str], mirror: Path) -> int:
    """Run `command`, again after a stall once per progress; 86 after two stalls without progress."""
    stalled_at: int | None = None
    while True:
        code, heartbeat = run_once(command, mirror)
        if code != exitcodes.STALLED:
            return code
        newest = int(heartbeat.get("last_checkpoint_step") or 0)
        if stalled_at is not None and newest <= stalled_at:
            detail = f"unhealthy: stalled twice without progress (checkpoint step {newest})"
            log(detail)
            record_unhealthy(detail.removeprefix("unhealthy: "), newest)
            return exitcodes.UNHEALTHY
        stalled_at = newest
        log(f"restarting after the stall (newest checkpoint step {newest})")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    unhealthy_exit = exitcodes.UNHEALTHY
    if args[:1] == ["--unhealthy-exit"] and len(args) > 1 and args[1].isdigit():
        unhealthy_exit, args = int(args[1]), args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(
            "usage: python -m trainer.stops.heartbeat_watch [--unhealthy-exit CODE] -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    given = os.environ.get("FTORCH_PROGRESS_MIRROR")
    if given:
        code = watch(args, Path(given))
    else:
        with tempfile.TemporaryDirectory(prefix="ftorch-heartbeat-") as tmp:
            code = watch(args, Path(tmp) / "progress.json")
    if code == exitcodes.UNHEALTHY and unhealthy_exit != code:
        log(f"ended unhealthy: exiting {unhealthy_exit} so that the run is not relaunched")
        return unhealthy_exit
    return code


if __name__ == "__main__":
    sys.exit(main())
