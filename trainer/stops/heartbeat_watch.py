"""`python -m trainer.stops.heartbeat_watch -- COMMAND...`: the SkyPilot run script's stall watch. No torch.

A frozen trainer (SIGSTOP, a hung collective, a dead mount) runs no watchdog thread, so this parent
watches its heartbeat: the progress mirror rank 0 rewrites every step (FTORCH_PROGRESS_MIRROR, set here to
a file of its own when unset) with the trainer's own stall timeout in it. The rule is the local
supervisor's (trainer/stops/watchdog.py: `stale`): a heartbeat older than `outside(timeout)` is a stall;
the command is killed and runs again once; a second stall (or the trainer's own exit 87) with no new
checkpoint since the previous one ends the run UNHEALTHY: recorded in the attempt's epoch record
(FTORCH_RUN_URI), and exitcodes.UNHEALTHY (86). Each stall is recorded there too (`ended: stalled`,
`stall_checkpoint_step`), so the rule also holds across relaunches of the task.

The kill takes the whole process tree, not only the command's process group: torchrun starts each worker
in a session of its own, so a group kill would leave the ranks (the frozen one, the others waiting on it)
behind. torchrun reports a worker's 87 as 1: a non-zero exit whose attempt (the heartbeat's) the run store
says `ended: stalled` is the trainer's own stall.

`--stall-exit CODE` (the multi-node run script): a stall does not run the command again on this node (the
other nodes' torchrun could not meet it again in the same rendezvous) but ends this watch with CODE (75:
SkyPilot relaunches every node together, a new attempt from the newest checkpoint); a stall with no new
checkpoint since the one before the relaunch still ends UNHEALTHY. `--unhealthy-exit 0` (the SkyPilot run
scripts) turns every unhealthy end, this watch's or the trainer's own 86, into that code: 86 is not in
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
import time
from pathlib import Path
from typing import Any

from trainer import exitcodes
from trainer.runstore import scratch
from trainer.stops.watchdog import KEY, SETUP_ENV, outside, setup_timeout, stale

#: the codes that say how the trainer ended by themselves; any other non-zero one may be torchrun's 1
OWN_CODES = (exitcodes.OK, exitcodes.PREEMPTED, exitcodes.UNHEALTHY, exitcodes.STALLED)

POLL_S = float(os.environ.get("FTORCH_HEARTBEAT_POLL_S", "1"))


def log(message: str) -> None:
    print(f"[ftorch heartbeat] {message}", file=sys.stderr, flush=True)


def read_heartbeat(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tree(root: int) -> list[int]:
    """`root` and every process below it, parents first (Linux's /proc; elsewhere `root` alone)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    order, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo.extend(children.get(pid, []))
    return order


def _signal(pid: int, signum: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command, everything below it and their process groups. The tree is stopped first
    (until no new process appears), so nothing in it starts another process or notices the others die."""
    pids: list[int] = []
    while new := [pid for pid in _tree(proc.pid) if pid not in pids]:
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        pids += new
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            pass
    groups.discard(os.getpgid(0))  # never this watch's own group (the run script's)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    for group in groups:
        _signal(group, signal.SIGKILL, group=True)
    proc.wait()


def setup_bound() -> float | None:
    """Seconds a trainer may run without a first heartbeat (its set-up: model load, data, checkpoint
    read), from the job's set-up timeout the task carries; None where no heartbeat comes (nodes other
    than node 0) or none was given."""
    raw = os.environ.get(SETUP_ENV)
    if not raw or os.environ.get("SKYPILOT_NODE_RANK", "0") not in ("", "0"):
        return None
    try:
        return outside(setup_timeout(float(raw)))
    except ValueError:
        return None


def run_once(command: list[str], mirror: Path) -> tuple[int, dict[str, Any]]:
    """Run `command` until it exits (its code) or its heartbeat is stale, or never came within the
    set-up's bound (exitcodes.STALLED, after the kill); also the last heartbeat seen."""
    mirror.unlink(missing_ok=True)  # a previous run's heartbeat is not this one's
    bound, started = setup_bound(), time.time()
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
            setting_up = time.time() - started
            if not heartbeat and bound is not None and setting_up > bound and proc.poll() is None:
                log(
                    f"stalled: no first heartbeat {setting_up:.0f} s after the start (set-up bound {bound:.0f} s); killed"
                )
                _kill_tree(proc)
                return exitcodes.STALLED, heartbeat
            if age is not None and proc.poll() is None:
                log(
                    f"stalled: no heartbeat for {age:.0f} s at step {heartbeat.get('step')} "
                    f"(timeout {float(heartbeat[KEY]):.0f} s); killed"
                )
                _kill_tree(proc)
                return exitcodes.STALLED, heartbeat
        return proc.returncode, read_heartbeat(mirror) or heartbeat
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_store() -> Any:
    """FTORCH_RUN_URI's run store, or None (no run, or it cannot be reached: the exit code still tells)."""
    run_uri = os.environ.get("FTORCH_RUN_URI")
    if not run_uri:
        return None
    try:
        from trainer.runstore.attempts import open_run_store

        return open_run_store(run_uri)
    except Exception as exc:  # noqa: BLE001 - advisory
        log(f"could not reach the run store ({exc.__class__.__name__}: {exc})")
        return None


def _epoch_of(store: Any, heartbeat: dict[str, Any]) -> int | None:
    """The epoch record of the heartbeat's attempt (the newest one when the heartbeat names none)."""
    records = store.epoch_records()
    attempt = heartbeat.get("attempt")
    mine = [n for n, r in records.items() if not isinstance(attempt, int) or r.get("attempt") == attempt]
    return max(mine) if mine else None


def _update(store: Any, epoch: int | None, **fields: Any) -> None:
    if epoch is None:
        return
    store.epoch = epoch
    store.update_epoch_record(**fields)


def record_unhealthy(detail: str, checkpoint_step: int, heartbeat: dict[str, Any] | None = None) -> None:
    """Mark the attempt (the heartbeat's, else the newest) of FTORCH_RUN_URI's run as ended unhealthy (best
    effort: the exit code still says it when the store cannot be reached)."""
    store = _run_store()
    try:
        if store is not None:
            _update(
                store,
                _epoch_of(store, heartbeat or {}),
                ended="unhealthy",
                stop_detail=detail,
                healthy_step=checkpoint_step or None,
                ended_at=time.time(),
            )
    except Exception as exc:  # noqa: BLE001 - advisory
        log(f"could not record the unhealthy end in the run store ({exc.__class__.__name__}: {exc})")


def own_stall(code: int, heartbeat: dict[str, Any]) -> bool:
    """Did the trainer's own watchdog end the attempt? torchrun reports its 87 as 1: the heartbeat's
    attempt is `ended: stalled` in the run store."""
    attempt = heartbeat.get("attempt")
    if code in OWN_CODES or not isinstance(attempt, int):
        return False
    store = _run_store()
    try:
        from trainer.health.rules import ended_as

        return store is not None and ended_as(store, attempt) == "stalled"
    except Exception:  # noqa: BLE001 - advisory: then it is the crash it looks like
        return False


def record_stall(heartbeat: dict[str, Any], checkpoint_step: int) -> int | None:
    """Record the stall in its attempt's epoch record (the trainer's own, if it wrote one, is kept); the
    checkpoint step at the stall recorded before this attempt's, or None."""
    store = _run_store()
    try:
        if store is None:
            return None
        epoch = _epoch_of(store, heartbeat)
        records = store.epoch_records()
        before = [
            (n, r["stall_checkpoint_step"])
            for n, r in records.items()
            if (epoch is None or n < epoch) and isinstance(r.get("stall_checkpoint_step"), int)
        ]
        own = records.get(epoch, {}) if epoch is not None else {}
        detail = own.get("stop_detail") if own.get("ended") == "stalled" else None
        _update(
            store,
            epoch,
            ended="stalled",
            stop_detail=detail
            or f"stalled: no heartbeat at step {heartbeat.get('step')} (run script's watch)",
            stall_checkpoint_step=checkpoint_step,
            ended_at=own.get("ended_at") or time.time(),
        )
        return max(before)[1] if before else None
    except Exception as exc:  # noqa: BLE001 - advisory
        log(f"could not record the stall in the run store ({exc.__class__.__name__}: {exc})")
        return None


def watch(command: list[str], mirror: Path, stall_exit: int | None = None) -> int:
    """Run `command`, again after a stall once per progress; 86 after two stalls without progress. With
    `stall_exit`, a stall ends the watch with that code instead (a relaunch of every node runs it again)."""
    stalled_at: int | None = None
    while True:
        code, heartbeat = run_once(command, mirror)
        if code != exitcodes.STALLED and not own_stall(code, heartbeat):
            return code
        newest = int(heartbeat.get("last_checkpoint_step") or 0)
        before = record_stall(heartbeat, newest)
        if stalled_at is None:
            stalled_at = before
        if stalled_at is not None and newest <= stalled_at:
            detail = f"unhealthy: stalled twice without progress (checkpoint step {newest})"
            log(detail)
            record_unhealthy(detail.removeprefix("unhealthy: "), newest, heartbeat)
            return exitcodes.UNHEALTHY
        if stall_exit is not None:
            log(
                f"stalled (newest checkpoint step {newest}): exiting {stall_exit}, for a relaunch of every node"
            )
            return stall_exit
        stalled_at = newest
        log(f"restarting after the stall (newest checkpoint step {newest})")


def _flag(args: list[str], name: str) -> tuple[int | None, list[str]]:
    if args[:1] == [name] and len(args) > 1 and args[1].isdigit():
        return int(args[1]), args[2:]
    return None, args


USAGE = (
    "usage: python -m trainer.stops.heartbeat_watch [--unhealthy-exit CODE] [--stall-exit CODE] -- COMMAND..."
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    unhealthy_exit, stall_exit = exitcodes.UNHEALTHY, None
    while args[:1] in (["--unhealthy-exit"], ["--stall-exit"]):
        name = args[0]
        value, rest = _flag(args, name)
        if value is None:
            break
        args = rest
        if name == "--unhealthy-exit":
            unhealthy_exit = value
        else:
            stall_exit = value
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    given = os.environ.get("FTORCH_PROGRESS_MIRROR")
    if given:
        code = watch(args, Path(given), stall_exit)
    else:
        with scratch.folder("ftorch-heartbeat-") as tmp:
            code = watch(args, Path(tmp) / "progress.json", stall_exit)
    if code == exitcodes.UNHEALTHY and unhealthy_exit != code:
        log(f"ended unhealthy: exiting {unhealthy_exit} so that the run is not relaunched")
        return unhealthy_exit
    return code


if __name__ == "__main__":
    sys.exit(main())
