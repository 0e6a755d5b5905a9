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
from helpers import process_gone

from trainer import exitcodes

#: a "trainer" that beats 3 times (checkpoint step = its run number x 10 when `progress`, the given number
#: when one, else 10), then freezes itself with SIGSTOP, as a hung trainer looks from outside; the run
#: numbered argv[3] exits 0 instead
FREEZER = """
import json, os, signal, sys, time
mirror = os.environ["FTORCH_PROGRESS_MIRROR"]
runs = os.path.join(os.path.dirname(sys.argv[1]), "runs")
with open(runs, "a") as f:
    f.write("x")
n = len(open(runs).read())
ckpt = n * 10 if sys.argv[2] == "progress" else int(sys.argv[2]) if sys.argv[2].isdigit() else 10
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

    for kind in ("single", "node", "multinode"):
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
    else:  # under the heartbeat watch too; several nodes leave the rerun after a stall to a relaunch
        flags = "--unhealthy-exit 0 --stall-exit 75" if kind == "multinode" else "--unhealthy-exit 0"
        assert f"exec python -m trainer.stops.heartbeat_watch {flags} -- bash -c" in run, run
        assert run.index("FTORCH_LOCK:-}.refused") < run.index("heartbeat_watch")  # the refusal guard first
        assert (
            '--ending "$FTORCH_ATTEMPT"' in run and "unhealthy) exit 0" in run and "preempted) exit 75" in run
        )


#: torchrun's way: the "trainer" runs in a session of its own under its launcher (its pid in `<x>.pids`)
LAUNCHER = """
import subprocess, sys
child = subprocess.Popen([sys.executable, *sys.argv[1:]], start_new_session=True)
with open(sys.argv[2] + ".pids", "a") as f:
    f.write(f"{child.pid}\\n")
sys.exit(child.wait())
"""


@pytest.mark.timeout(120)
def test_a_stall_kills_every_process_below_the_command_even_in_sessions_of_their_own(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own: killing the command's process group alone would
    leave the frozen rank (and any rank waiting on it) behind."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    (tmp_path / "freezer.py").write_text(FREEZER)
    env = {k: v for k, v in os.environ.items() if k != "FTORCH_PROGRESS_MIRROR"}
    done = subprocess.run(
        [sys.executable, "-m", "trainer.stops.heartbeat_watch", "--", sys.executable, str(launcher),
         str(tmp_path / "freezer.py"), str(tmp_path / "x"), "none", "99"],
        env={**env, "FTORCH_HEARTBEAT_POLL_S": "0.2"}, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == exitcodes.UNHEALTHY, done.stderr
    pids = [int(line) for line in (tmp_path / "x.pids").read_text().split()]
    assert len(pids) == 2 and (tmp_path / "runs").read_text() == "xx", done.stderr
    assert all(process_gone(pid) for pid in pids), pids  # the frozen "ranks" were killed, not left stopped


def _store_with_epoch(run: Path, attempt: int) -> None:
    from trainer.runstore.store import RunStore

    store = RunStore(str(run))
    if not store.exists("spec.json"):
        store.write_json("spec.json", {"run_id": "r", "job": {}})
    store.claim_epoch({"attempt": attempt})


@pytest.mark.timeout(180)
def test_stall_exit_leaves_the_rerun_to_a_relaunch_and_counts_stalls_across_relaunches(
    tmp_path: Path,
) -> None:
    """The multi-node run script (`--stall-exit 75`): a stall is not rerun on this node (the other nodes'
    torchrun could not meet it again) but ends the node with 75, which SkyPilot recovers by relaunching
    every node; the stall is recorded in the run store, so a stall after the relaunch with no new
    checkpoint since ends the run UNHEALTHY (0 under `--unhealthy-exit 0`), and one after progress is
    relaunched again."""
    from trainer.runstore.attempts import ending
    from trainer.runstore.store import RunStore

    run = tmp_path / "run"
    flags = ("--unhealthy-exit", "0", "--stall-exit", "75")
    env = {"FTORCH_RUN_URI": str(run)}
    outcomes = []
    for attempt, checkpoint in ((1, "10"), (2, "20"), (3, "20")):  # each: a relaunch, a new attempt
        _store_with_epoch(run, attempt)
        outcomes.append(_watch(tmp_path, checkpoint, "99", flags=flags, env=env))
    assert [code for code, _log in outcomes] == [75, 75, 0], outcomes
    assert (tmp_path / "runs").read_text() == "xxx"  # never rerun by the watch itself
    assert "exiting 75, for a relaunch of every node" in outcomes[0][1]
    assert "stalled twice without progress (checkpoint step 20)" in outcomes[2][1]
    records = RunStore(str(run)).epoch_records()
    assert [records[n].get("ended") for n in sorted(records)] == ["stalled", "stalled", "unhealthy"]
    assert [records[n].get("stall_checkpoint_step") for n in sorted(records)] == [10, 20, 20]
    assert ending(RunStore(str(run)), 3) == "unhealthy" and ending(RunStore(str(run)), 2) == ""


#: a "trainer" under torchrun whose own watchdog ended it (exit 87, recorded in its epoch record), which
#: torchrun reports as 1; the second run (or, with "crash", the first) exits as told
OWN_STALL = """
import json, os, sys, time
from trainer.runstore.store import RunStore
runs = sys.argv[1]
with open(runs, "a") as f:
    f.write("x")
n = len(open(runs).read())
with open(os.environ["FTORCH_PROGRESS_MIRROR"], "w") as f:
    json.dump({"state": "running", "step": 3, "attempt": n, "updated_at": time.time(),
               "stall_timeout_s": 100, "last_checkpoint_step": n * 10}, f)
store = RunStore(os.environ["FTORCH_RUN_URI"])
store.claim_epoch({"attempt": n})
if n == 1 and sys.argv[2] == "stalled":
    store.update_epoch_record(ended="stalled", stop_detail="stalled: no progress for 9 s in step after step 3")
sys.exit(1 if n == 1 else 0)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["stalled", "crash"])
def test_the_trainers_own_stall_reported_as_1_by_torchrun_is_read_from_the_run_store(
    tmp_path: Path, how: str
) -> None:
    run = tmp_path / "run"
    from trainer.runstore.store import RunStore

    RunStore(str(run)).write_json("spec.json", {"run_id": "r", "job": {}})
    script = tmp_path / "own_stall.py"
    script.write_text(OWN_STALL)
    env = {k: v for k, v in os.environ.items() if k != "FTORCH_PROGRESS_MIRROR"}
    done = subprocess.run(
        [sys.executable, "-m", "trainer.stops.heartbeat_watch", "--", sys.executable, str(script),
         str(tmp_path / "runs"), how],
        env={**env, "FTORCH_RUN_URI": str(run), "FTORCH_HEARTBEAT_POLL_S": "0.2"},
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    if how == "stalled":  # restarted once, as after its own 87; the record keeps the trainer's own detail
        assert done.returncode == 0 and (tmp_path / "runs").read_text() == "xx", done.stderr
        assert "restarting after the stall (newest checkpoint step 10)" in done.stderr
        record = RunStore(str(run)).epoch_records()[1]
        assert record["ended"] == "stalled" and record["stop_detail"].startswith("stalled: no progress")
        assert record["stall_checkpoint_step"] == 10
    else:  # a crash stays a crash: its code passes through, for SkyPilot's max_restarts_on_errors
        assert done.returncode == 1 and (tmp_path / "runs").read_text() == "x", done.stderr


@pytest.mark.timeout(120)
def test_a_trainer_frozen_before_its_first_heartbeat_is_killed_after_the_set_up_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No heartbeat at all (frozen while loading the model): killed once the job's set-up timeout (the
    task's FTORCH_SETUP_TIMEOUT_S) and its margin have passed, run again once, then 86 with no progress.
    On a node other than node 0 (no heartbeat ever comes there) the bound is not applied."""
    from trainer.stops.heartbeat_watch import setup_bound
    from trainer.stops.watchdog import SETUP_ENV, outside

    script = tmp_path / "frozen.py"
    script.write_text(
        "import os, signal, sys\nopen(sys.argv[1], 'a').write('x')\nos.kill(os.getpid(), signal.SIGSTOP)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FTORCH_PROGRESS_MIRROR", "SKYPILOT_NODE_RANK")}
    env.update({SETUP_ENV: "1", "FTORCH_HEARTBEAT_POLL_S": "0.2"})
    done = subprocess.run(
        [sys.executable, "-m", "trainer.stops.heartbeat_watch", "--", sys.executable, str(script),
         str(tmp_path / "runs")],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == exitcodes.UNHEALTHY, done.stderr
    assert done.stderr.count("stalled: no first heartbeat") == 2, done.stderr
    assert (tmp_path / "runs").read_text() == "xx"  # killed and run again exactly once
    monkeypatch.setenv(SETUP_ENV, "1")
    monkeypatch.delenv("SKYPILOT_NODE_RANK", raising=False)
    assert setup_bound() == outside(1.0)
    monkeypatch.setenv("SKYPILOT_NODE_RANK", "1")
    assert setup_bound() is None
