"""Issue 28 (6): the stop flag and the budget are honoured inside the evaluations, tokenisation and model
load, not only at step boundaries. Real tiny-model runs on the CPU; FTORCH_FAULTS slow-* points
(trainer/faults.py) hold each phase open long enough to send a SIGTERM into it once its log line is out.

- before the first step (tokenising, loading the model, the evaluation before training) a notice ends the
  attempt at once with exit 75 and nothing written (no checkpoint, no cached data); the resume ends
  bitwise equal to an uninterrupted run;
- a notice during the evaluation after the last step leaves the last checkpoint committed; the resume
  trains nothing, evaluates and writes the same output as an uninterrupted run;
- the budget stop lands inside a long mid-run evaluation, not after it: the spend stays inside the budget.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import (
    REPO,
    assert_bitwise_equal,
    final_weights,
    job_dict,
    prepare_run,
    run_trainer,
    trainer_cmd,
    write_data,
)

from trainer import exitcodes
from trainer.runstore.store import RunStore
from trainer.stops import budget

HELD_OUT = 8  # two evaluation batches of train.micro_batch_size 4
SLOW_MS = 3000


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> SimpleNamespace:
    """The job every test here interrupts, and its uninterrupted run: final weights and summary."""
    folder = tmp_path_factory.mktemp("stop-in-eval")
    data = write_data(folder / "d.jsonl", "instruction", 32)
    held = write_data(folder / "held.jsonl", "instruction", HELD_OUT, seed=1)
    job = job_dict(
        tiny_model, data, folder / "runs", data={"eval_path": str(held)}, train={"max_steps": 8},
        checkpoint={"every": 100},
    )  # fmt: skip
    run_uri = prepare_run(job, "reference")
    done = run_trainer(run_uri)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return SimpleNamespace(job=job, weights=final_weights(run_uri), summary=_summary(run_uri))


def _summary(run_uri: str) -> dict[str, Any]:
    return json.loads((Path(run_uri) / "output" / "training_summary.json").read_text())


def _record(run_uri: str, attempt: int) -> dict[str, Any]:
    return next(r for r in RunStore(run_uri).epoch_records().values() if r.get("attempt") == attempt)


def signal_on(
    run_uri: str, attempt: int, line: str, env: dict[str, str], timeout: float = 180.0
) -> tuple[int, str, float]:
    """Start the trainer, send SIGTERM once it logs a line containing `line`: its exit code, its log, and
    the seconds from the signal to its exit."""
    proc = subprocess.Popen(
        trainer_cmd(run_uri, attempt), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=REPO, env={**os.environ, **env},
    )  # fmt: skip
    killer = threading.Timer(timeout, proc.kill)  # a trainer that never leaves fails the test, not hangs it
    killer.start()
    out, sent_at = [], None
    try:
        assert proc.stdout is not None
        for text in proc.stdout:
            out.append(text)
            if sent_at is None and line in text:
                proc.send_signal(signal.SIGTERM)
                sent_at = time.monotonic()
        code = proc.wait()
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(out)
    assert sent_at is not None, f"never logged {line!r}:\n{log[-3000:]}"
    return code, log, time.monotonic() - sent_at


def _resume_and_compare(run_uri: str, reference: SimpleNamespace) -> str:
    done = run_trainer(run_uri, 2)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_bitwise_equal(final_weights(run_uri), reference.weights)
    summary = _summary(run_uri)
    assert summary["eval_before"] == reference.summary["eval_before"]
    assert summary["eval_after"] == reference.summary["eval_after"]
    return done.stdout + done.stderr


def _left_before_training(run_uri: str, log: str, took_s: float) -> None:
    """Exit 75 within the slowed phase, nothing saved, the attempt recorded as a notice."""
    assert "nothing to save before the first step; exiting with code 75" in log, log[-3000:]
    assert took_s < SLOW_MS / 1000 + 15, took_s  # the slowed chunk or batch, then out: no model, no step
    store = RunStore(run_uri)
    assert store.complete_checkpoints() == [] and store.checkpoint_names() == []
    record = _record(run_uri, 1)
    assert record["ended"] == "notice" and record["step"] == 0, record


def test_a_notice_while_tokenising_ends_the_attempt_with_nothing_written(reference: SimpleNamespace) -> None:
    run_uri = prepare_run(reference.job, "tokenising")
    env = {"FTORCH_FAULTS": f"slow-tokenize@{SLOW_MS}:1"}
    code, log, took = signal_on(run_uri, 1, "tokenising: 32 examples", env)
    assert code == exitcodes.PREEMPTED, log[-3000:]
    assert "while tokenising" in log and "loading the model" not in log
    _left_before_training(run_uri, log, took)
    cache = Path(run_uri) / "cache"
    assert not cache.exists() or not any(cache.rglob("*.safetensors"))  # nothing half-tokenised cached
    again = _resume_and_compare(run_uri, reference)
    assert "from the run store's cache" not in again  # tokenised afresh


def test_a_notice_while_loading_the_model_ends_the_attempt(reference: SimpleNamespace) -> None:
    run_uri = prepare_run(reference.job, "loading")
    env = {"FTORCH_FAULTS": f"slow-load@{SLOW_MS}:1"}
    code, log, took = signal_on(run_uri, 1, "loading the model", env)
    assert code == exitcodes.PREEMPTED, log[-3000:]
    assert "while loading the model" in log and "model loaded in" not in log  # between base and adapters
    _left_before_training(run_uri, log, took)
    _resume_and_compare(run_uri, reference)


def test_a_notice_during_the_evaluation_before_training_saves_nothing_and_the_resume_evaluates(
    reference: SimpleNamespace,
) -> None:
    run_uri = prepare_run(reference.job, "eval-before")
    env = {"FTORCH_FAULTS": f"slow-eval-before@{SLOW_MS}:1"}
    code, log, took = signal_on(run_uri, 1, f"evaluating {HELD_OUT} held-out examples before training", env)
    assert code == exitcodes.PREEMPTED, log[-3000:]
    assert "while evaluating before training" in log and "held-out before training:" not in log
    assert "] step 1/" not in log
    _left_before_training(run_uri, log, took)
    again = _resume_and_compare(run_uri, reference)
    assert "held-out before training:" in again  # made in full by the resumed attempt


def test_a_notice_during_the_final_evaluation_keeps_the_last_checkpoint_and_the_resume_only_evaluates(
    reference: SimpleNamespace,
) -> None:
    run_uri = prepare_run(reference.job, "eval-after")
    env = {"FTORCH_FAULTS": f"slow-eval-after@{SLOW_MS}:1"}
    code, log, took = signal_on(run_uri, 1, f"evaluating {HELD_OUT} held-out examples after training", env)
    assert code == exitcodes.PREEMPTED, log[-3000:]
    assert took < SLOW_MS / 1000 + 15, took
    assert "held-out after training:" not in log and "done:" not in log
    store = RunStore(run_uri)
    assert [c.step for c in store.complete_checkpoints()] == [8]  # committed before the evaluation
    assert not (Path(run_uri) / "output" / "adapter_model.safetensors").exists()  # no output yet
    assert (store.read_progress() or {})["state"] == "preempted"
    record = _record(run_uri, 1)
    assert record["ended"] == "notice" and record["step"] == 8, record
    again = _resume_and_compare(run_uri, reference)
    assert "resumed from checkpoints/step-00000008" in again
    assert "] step " not in again  # nothing trained again: the evaluation and the output only


def test_the_budget_stops_inside_a_long_mid_run_evaluation(tmp_path: Path, tiny_model: Path) -> None:
    """Each mid-run evaluation takes 30 s (60 batches, slowed 0.5 s each); the budget is 30 s of this
    machine. The stop lands inside the first evaluation (at step 3) and its checkpoint marks it cut short;
    before, the evaluation ran to its end, past the budget, and the stop came at the next step."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    held = write_data(tmp_path / "held.jsonl", "instruction", 240, seed=1)
    budget_usd = 0.6  # at $72/h: 30 s, start-up included
    job = job_dict(
        tiny_model, data, tmp_path / "runs", data={"eval_path": str(held)},
        train={"max_steps": 100000, "eval_every": 3}, checkpoint={"every": "1s"},
        resources={"budget_usd": budget_usd},
    )  # fmt: skip
    run_uri = prepare_run(job)
    env = {"FTORCH_HOURLY_USD": "72", "FTORCH_FAULTS": "slow-eval@500"}
    done = run_trainer(run_uri, 1, env)
    assert done.returncode == exitcodes.BUDGET_STOPPED, done.stdout[-3000:] + done.stderr[-3000:]
    record = _record(run_uri, 1)
    assert record["stop_reason"] == "budget" and record["step"] == 3, record
    store = RunStore(run_uri)
    newest = store.complete_checkpoints()[-1]
    assert newest.step == 3
    state = json.loads(store.read_checkpoint(newest)["trainer_state.json"])["extra"]
    assert state["eval_cut_short"] == 3  # the resumed attempt makes the evaluation up first
    spent = budget.spend_usd(store.epoch_records())
    assert spent <= budget_usd, (spent, record)


def test_the_budget_is_asked_in_evaluations_without_counting_them_as_steps() -> None:
    """`BudgetStop.in_eval`: the budget rule between evaluation batches observes no step (the guard's
    step times stay the steps'), raises the flag with a stop request when over, and never after the last
    step (the final evaluation and output end the run)."""
    from trainer.stops.preemption import PreemptionFlag
    from trainer.stops.sources import BudgetStop

    asked: list[int | None] = []

    class Watch:
        def __init__(self, over: str | None) -> None:
            self.result = over

        def over(self, step: int | None, _at: float | None) -> str | None:
            asked.append(step)
            return self.result

    written: list[str] = []
    store = SimpleNamespace(write_json=lambda rel, _payload: written.append(rel))
    checkpoints = SimpleNamespace(last_time=0.0)
    flag = PreemptionFlag()
    under = BudgetStop(Watch(None), store, flag, checkpoints, 10, lambda _m: None)
    assert not under.in_eval(4) and asked == [None] and not flag.is_set()
    over = BudgetStop(Watch("budget: over"), store, flag, checkpoints, 10, lambda _m: None)
    assert not over.in_eval(10) and asked == [None]  # after the last step: not asked
    assert over.in_eval(4) and flag.is_set() and flag.reason == budget.BUDGET
    assert written == ["control/stop.json"]  # recorded as a requested stop, not an interruption


def test_the_loaders_check_only_when_armed() -> None:
    from trainer.stops.preemption import PreemptionFlag
    from trainer.stops.sources import Interrupted, arm_setup, check_setup, disarm_setup

    flag = PreemptionFlag()
    flag.set("SIGTERM")
    check_setup("tokenising")  # not armed (several ranks, or outside an attempt): nothing happens
    arm_setup(flag)
    try:
        with pytest.raises(Interrupted) as raised:
            check_setup("tokenising")
        assert raised.value.where == "tokenising"
    finally:
        disarm_setup()
    check_setup("tokenising")


def test_a_points_attempt_is_the_trainers_own_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """`slow-eval-after@MS:1` above is armed for a trainer started with `--attempt 1` and no FTORCH_ATTEMPT
    (as these tests start it): before, it was never armed there, and the notice landed in the evaluation
    only when the machine was fast enough (it failed under load)."""
    import importlib

    from trainer import faults

    monkeypatch.delenv("FTORCH_ATTEMPT", raising=False)
    monkeypatch.setenv("FTORCH_FAULTS", "slow-eval-after@3000:1,hang-rank1@setup")
    importlib.reload(faults)
    try:
        assert faults.delay_s("slow-eval-after") == 0.0  # no attempt known yet
        faults.use_attempt(1)  # what `python -m trainer RUN --attempt 1` does first
        assert faults.delay_s("slow-eval-after") == 3.0
        faults.use_attempt(2)
        assert faults.delay_s("slow-eval-after") == 0.0
        assert ("hang-rank1", "setup", None) in faults._POINTS  # a phase, not a step
    finally:
        monkeypatch.delenv("FTORCH_FAULTS")
        importlib.reload(faults)


def test_a_notice_during_a_mid_run_evaluation_saves_at_once_and_the_resume_makes_it_up(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The issue's own example: a preemption notice while a mid-run evaluation is slowed (3 s a batch)
    ends the attempt within a batch with the step's checkpoint, marked cut short; the resumed attempt
    evaluates that step first and ends bitwise equal to an uninterrupted run, with the same held-out
    figures at every evaluation."""
    data = write_data(tmp_path / "d.jsonl", "instruction", 32)
    held = write_data(tmp_path / "held.jsonl", "instruction", HELD_OUT, seed=1)
    job = job_dict(
        tiny_model, data, tmp_path / "runs", data={"eval_path": str(held)},
        train={"max_steps": 8, "eval_every": 4, "log_every": 1}, checkpoint={"every": 100},
    )  # fmt: skip
    clean_uri = prepare_run(job, "clean")
    clean = run_trainer(clean_uri)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    run_uri = prepare_run(job, "noticed")
    code, log, took = signal_on(run_uri, 1, "] step 4/8 loss", {"FTORCH_FAULTS": f"slow-eval@{SLOW_MS}:1"})
    assert code == exitcodes.PREEMPTED, log[-3000:]
    assert took < SLOW_MS / 1000 + 15, took  # within a batch, not after the whole evaluation
    assert "step 4/8 held-out" not in log and "] step 5/8" not in log, log[-3000:]
    store = RunStore(run_uri)
    assert [c.step for c in store.complete_checkpoints()] == [4]
    state = json.loads(store.read_checkpoint(store.complete_checkpoints()[-1])["trainer_state.json"])["extra"]
    assert state["eval_cut_short"] == 4
    again = run_trainer(run_uri, 2)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert_bitwise_equal(final_weights(run_uri), final_weights(clean_uri))

    def held_out(text: str) -> list[str]:
        return [
            line.split("] ", 1)[1]
            for line in text.splitlines()
            if "/8 held-out" in line or "after training:" in line
        ]

    assert held_out(again.stdout + again.stderr)[0].startswith("step 4/8 held-out")  # made up first
    assert held_out(again.stdout + again.stderr) == held_out(clean.stdout + clean.stderr)
