"""Issue 28: the process group's timeout follows the stall watchdog's rule after warm-up, so a hung
collective raises, and the trainer turns that into its stall ending (exit 87, `ended: stalled`).

Two mechanisms end a rank that waits in a collective for a frozen peer, both on the same figure: the
watchdog thread (trainer/stops/watchdog.py, checks every second) and the collective itself, which raises
at the process group's timeout in the training thread (trainer/distributed.py, trainer/loop.py `run`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import write_data

from trainer import exitcodes
from trainer.distributed import collective_timed_out, collective_timeout
from trainer.runstore.store import RunStore
from trainer.stops.watchdog import FLOOR_S, WARMUP_STEPS, Watchdog


def _watchdog(given: float | None, steps: list[float], **phases: float) -> Watchdog:
    dog = Watchdog(given, lambda phase, waited: None)  # not started: only its figures
    dog.step_times = list(steps)
    dog.phase_s = dict(phases)
    return dog


def test_the_collective_timeout_is_the_watchdogs_after_warm_up() -> None:
    # before warm-up: the job's figure, else 3x the floor (rank 0 may load a large model meanwhile)
    assert collective_timeout(None) == 3 * FLOOR_S
    assert collective_timeout(7.0) == 7.0
    assert collective_timeout(None, _watchdog(None, [1.0] * WARMUP_STEPS)) == 3 * FLOOR_S
    # after: max(300 s, 5x the p95 step), as the watchdog's own
    assert collective_timeout(None, _watchdog(None, [1.0] * (WARMUP_STEPS + 1))) == FLOOR_S
    slow = _watchdog(None, [1.0] * WARMUP_STEPS + [100.0] * 10)
    assert collective_timeout(None, slow) == 500.0 == slow.timeout("step")
    # never shorter than the watchdog's timeout of a phase it has timed (a long checkpoint)
    assert collective_timeout(None, _watchdog(None, [1.0] * 10, checkpoint=200.0)) == 1000.0
    assert collective_timeout(5.0, _watchdog(5.0, [0.1] * 10)) == 5.0


def test_only_a_timed_out_collective_is_taken_for_a_stall() -> None:
    import torch.distributed as dist

    gloo = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete"
    assert collective_timed_out(RuntimeError(gloo))
    assert collective_timed_out(RuntimeError("Application timeout caused pair closure"))
    assert collective_timed_out(dist.DistBackendError("NCCL: operation timed out"))
    assert not collective_timed_out(RuntimeError("CUDA error: an illegal memory access"))
    assert not collective_timed_out(ValueError("Timed out waiting"))


# ---- a real gloo group of 2 ranks: the live group's timeout tightens, and a hung collective raises ----
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import torch

    from trainer import distributed
    from trainer.stops import watchdog

    watchdog.FLOOR_S = 2.0  # the rule's floor, small enough for a test (the rule itself unchanged)
    par = distributed.Sharded(torch.device("cpu"), False, 60.0)
    dog = _watchdog(None, [0.01] * WARMUP_STEPS)
    par.follow_stall_timeout(dog, None)
    seen: dict[str, Any] = {"during_warm_up": par.timeout_s}
    dog.step_times.append(0.01)  # warm-up ends: max(floor, 5x p95) = 2 s
    par.follow_stall_timeout(dog, None)
    seen["after_warm_up"] = par.timeout_s
    par.barrier()
    if rank == 1:  # the hung rank: in no collective until rank 0 is done
        while not Path(out, "done").exists():
            time.sleep(0.1)
        os._exit(0)
    began = time.monotonic()
    try:
        par.any(True)
        seen["raised"] = None
    except Exception as exc:  # noqa: BLE001 - what the collective raises is the point
        seen.update(raised=str(exc).splitlines()[0], stall=distributed.collective_timed_out(exc))
    seen["waited_s"] = time.monotonic() - began
    par.follow_stall_timeout(None, None)
    seen["after_finish"] = par.timeout_s
    Path(out, "rank0.json").write_text(json.dumps(seen))
    Path(out, "done").write_text("")
    os._exit(0)


def test_a_live_gloo_group_tightens_after_warm_up_and_a_hung_collective_raises(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not alive, "a rank was left hanging"
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["during_warm_up"] == 60.0 and seen["after_warm_up"] == 2.0, seen
    assert seen["raised"] and seen["stall"], seen  # raised, and the loop takes it for a stall
    assert seen["waited_s"] < 10.0, seen  # the tightened 2 s, not the group's first 60 s
    assert seen["after_finish"] == 60.0, seen  # the last checkpoint, eval and output: the first timeout


# ---- the real trainer, 2 FSDP ranks under torchrun: rank 1 freezes, rank 0 ends as stalled ----------
def test_rank_0_of_two_ends_as_stalled_when_rank_1_freezes_in_a_step(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsdp_helpers import fsdp_job, new_run, run

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = fsdp_job(tiny_model, data, tmp_path / "runs", checkpoint={"every": 4, "keep": 2})
    job["train"] = {**job.get("train", {}), "health": {"stall_timeout_s": 8}}
    run_uri = new_run(job, "hang")
    monkeypatch.setenv("FTORCH_FAULTS", "hang-rank1@8")  # rank 1 freezes (GIL held) at step 8
    started = time.time()
    done = run(run_uri, 1, 2, timeout=300)  # torchrun ends rank 1 once rank 0 has exited
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    frozen = re.search(r"injected fault hang-rank1@8: frozen at ([0-9.]+)", out)
    assert frozen, out[-3000:]
    record = next(iter(RunStore(run_uri).epoch_records().values()))
    assert record["ended"] == "stalled" and record["step"] == 7, record
    assert record["stop_detail"].startswith("stalled: no progress for"), record
    ended_after = record["ended_at"] - float(frozen.group(1))
    assert ended_after < 60, (ended_after, record)  # not the group's 10-30 minutes
    line = next(x for x in out.splitlines() if "stalled: no progress" in x)
    by_collective = "(a collective timed out)" in record["stop_detail"]
    assert by_collective == ("process group timeout 8.0 s" in line), line
    assert by_collective or "(watchdog; timeout 8 s)" in line, line
    assert f"exiting with code {exitcodes.STALLED}" in line
    assert _ranks_left(run_uri) == [], "a rank of the run is still there"  # the frozen one too
    print(  # which of the two mechanisms ended rank 0 this time (both use the same 8 s)
        f"rank 0 ended {ended_after:.1f} s after rank 1 froze, by "
        f"{'the collective timeout' if by_collective else 'its watchdog'}; whole run {time.time() - started:.0f} s"
    )


def _ranks_left(run_uri: str, wait_s: float = 10.0) -> list[int]:
    """The live processes whose command line names the run (its ranks), after up to `wait_s`."""
    deadline = time.time() + wait_s
    while True:
        left = []
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if proc.name.isdigit() and run_uri in cmd and state != "Z":
                left.append(int(proc.name))
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


# ---- outside the step loop (no watchdog runs there): the group's own timeout is the only bound ----------
@pytest.mark.parametrize("phase", ["setup", "finish"])
def test_a_peer_frozen_outside_the_step_loop_ends_rank_0_as_stalled_not_in_a_traceback(
    phase: str, tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsdp_helpers import fsdp_job, new_run, output_weights, run

    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    job = fsdp_job(tiny_model, data, tmp_path / "runs", checkpoint={"every": 4, "keep": 2})
    job["train"] = {**job.get("train", {}), "max_steps": 6, "health": {"stall_timeout_s": 8}}
    run_uri = new_run(job, f"hang-{phase}")
    monkeypatch.setenv("FTORCH_FAULTS", f"hang-rank1@{phase}")  # rank 1 freezes (GIL held) in that phase
    done = run(run_uri, 1, 2, timeout=300)
    out = done.stdout + done.stderr
    frozen = re.search(rf"injected fault hang-rank1@{phase}: frozen at ([0-9.]+)", out)
    assert frozen, out[-3000:]
    # one line, no stack from the collective (torchrun prints a traceback of its own)
    assert "trainer/loop.py" not in out, out[-3000:]
    where = "setting up" if phase == "setup" else "finishing after step 6"
    line = next(x for x in out.splitlines() if "stalled: a collective timed out" in x)
    assert f"while {where} (process group timeout 8 s:" in line, line
    assert line.endswith(f"exiting with code {exitcodes.STALLED}"), line
    record = next(iter(RunStore(run_uri).epoch_records().values()))
    assert record["ended"] == "stalled" and record["ended_at"] - float(frozen.group(1)) < 60, record
    assert _ranks_left(run_uri) == [], "a rank of the run is still there"
    # the next attempt (the supervisor restarts a stall once) ends the run: from the committed step 6 when
    # the stall came after the last checkpoint, with nothing trained again
    monkeypatch.delenv("FTORCH_FAULTS")
    again = run(run_uri, 2, 2, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert output_weights(run_uri)
    if phase == "finish":
        assert "(step 6/6)" in again.stdout + again.stderr, again.stdout[-2000:]
