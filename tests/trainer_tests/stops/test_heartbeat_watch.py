"""The run script's stall watch (trainer/stops/heartbeat_watch.py) on real processes whose heartbeat
freezes: killed, run again once, 86 after two stalls without progress; a trainer's own code passes through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import exitcodes

#: a "trainer" that beats `beats` times (checkpoint step = its run number x 10 when `progress`), then
#: freezes itself with SIGSTOP, as a hung trainer looks from outside
FREEZER = """
import json, os, signal, sys, time
mirror = os.environ["FTORCH_PROGRESS_MIRROR"]
runs = os.path.join(os.path.dirname(sys.argv[1]), "runs")
with open(runs, "a") as f:
    f.write("x")
n = len(open(runs).read())
ckpt = n * 10 if sys.argv[2] == "progress" else 10
for step in range(3):
    with open(mirror, "w") as f:
        json.dump({"state": "running", "step": step, "updated_at": time.time(),
                   "stall_timeout_s": 0.2, "last_checkpoint_step": ckpt}, f)
    time.sleep(0.05)
if n >= int(sys.argv[3]):
    sys.exit(0)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _watch(
    tmp_path: Path,
    *args: str,
    timeout: float = 60,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    script = tmp_path / "freezer.py"
    script.write_text(FREEZER)
    env = {**{k: v for k, v in os.environ.items() if k != "FTORCH_PROGRESS_MIRROR"}, **(env or {})}
    env["FTORCH_HEARTBEAT_POLL_S"] = "0.2"
    done = subprocess.run(
        [sys.executable, "-m", "trainer.stops.heartbeat_watch", *flags, "--", sys.executable, str(script),
         str(tmp_path / "x"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return done.returncode, done.stderr


@pytest.mark.timeout(120)
def test_two_stalls_without_progress_end_unhealthy_and_are_not_relaunched(tmp_path: Path) -> None:
    code, log = _watch(tmp_path, "none", "99")
    assert code == exitcodes.UNHEALTHY == 86, log
    assert log.count("stalled: no heartbeat") == 2 and "restarting after the stall" in log, log
    assert (tmp_path / "runs").read_text() == "xx"  # killed and run again exactly once
    from orchestrator.backends.skypilot_render import load_template

    for kind in ("single",):
        recover = load_template(kind).get("resources", {}).get("job_recovery", {})
        assert exitcodes.UNHEALTHY not in recover.get("recover_on_exit_codes", []), recover


@pytest.mark.timeout(120)
def test_a_stall_with_progress_since_is_restarted_and_the_trainers_exit_passes_through(
    tmp_path: Path,
) -> None:
    code, log = _watch(tmp_path, "progress", "3")
    assert code == 0, log  # stalled twice, each time after a new checkpoint: restarted both times
    assert log.count("stalled: no heartbeat") == 2 and (tmp_path / "runs").read_text() == "xxx", log


@pytest.mark.timeout(60)
def test_sigterm_reaches_the_watched_trainer_and_its_code_is_the_watchers(tmp_path: Path) -> None:
    script = tmp_path / "preempted.py"
    script.write_text("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
                      "print('ready', flush=True)\ntime.sleep(60)\n")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.stops.heartbeat_watch", "--", sys.executable, str(script)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    os.killpg(proc.pid, signal.SIGTERM)  # what a preemption sends to the run script's group
    assert proc.wait(30) == exitcodes.PREEMPTED


def test_the_heartbeat_file_is_read_as_the_trainer_writes_it(tmp_path: Path) -> None:
    from trainer.stops.heartbeat_watch import read_heartbeat

    path = tmp_path / "p.json"
    assert read_heartbeat(path) == {}
    path.write_text('{"loss": null, "nonfinite": ["loss"]')  # half-written: ignored, not fatal
    assert read_heartbeat(path) == {}
    path.write_text(json.dumps({"step": 3}))
    assert read_heartbeat(path) == {"step": 3}


@pytest.mark.timeout(120)
def test_the_cloud_run_script_ends_an_unhealthy_run_with_0_and_records_why(tmp_path: Path) -> None:
    """SkyPilot relaunches any non-zero exit up to max_restarts_on_errors (86 included), into the same hang:
    the run script's `--unhealthy-exit 0` ends it for good, and the run store says it was unhealthy."""
    from trainer.runstore.attempts import ending
    from trainer.runstore.store import RunStore

    run = tmp_path / "run"
    store = RunStore(str(run))
    store.write_json("spec.json", {"run_id": "r", "job": {}})
    store.claim_epoch({"attempt": 2})
    code, log = _watch(
        tmp_path, "none", "99", flags=("--unhealthy-exit", "0"), env={"FTORCH_RUN_URI": str(run)}
    )
    assert code == 0, log
    assert "stalled twice without progress" in log and "so that the run is not relaunched" in log, log
    (record,) = RunStore(str(run)).epoch_records().values()
    assert record["ended"] == "unhealthy" and "stalled twice" in record["stop_detail"], record
    assert ending(RunStore(str(run)), 2) == "unhealthy" and ending(RunStore(str(run)), 1) == ""


@pytest.mark.timeout(60)
def test_the_trainers_own_unhealthy_exit_is_mapped_and_other_codes_pass_through(tmp_path: Path) -> None:
    for trainer_code, expected in (
        (exitcodes.UNHEALTHY, 0),
        (1, 1),
        (exitcodes.PREEMPTED, exitcodes.PREEMPTED),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "trainer.stops.heartbeat_watch", "--unhealthy-exit", "0", "--",
             sys.executable, "-c", f"import sys; sys.exit({trainer_code})"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == expected, (trainer_code, done.stderr)


@pytest.mark.parametrize("kind", ["single", "node", "multinode"])
def test_every_task_template_ends_an_unhealthy_run_without_a_relaunch(kind: str) -> None:
    """The single-GPU script maps through the heartbeat watch; the torchrun scripts (torchrun reports a
    worker's 86 as 1) ask the run store how the attempt ended."""
    from orchestrator.backends.skypilot_render import load_template

    run = load_template(kind)["run"]
    if kind == "single":
        assert "trainer.stops.heartbeat_watch --unhealthy-exit 0 --" in run
    else:
        assert (
            '--ending "$FTORCH_ATTEMPT"' in run and "unhealthy) exit 0" in run and "preempted) exit 75" in run
        )
