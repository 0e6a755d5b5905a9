"""The cost ledger (trainer/recording/ledger.py): spent, on-demand counterpart and savings, $/1M tokens, and each
preemption's loss split; the orchestrator's view (status, the jobs table) and the model card."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainer.recording.ledger import compute_ledger, ledger_lines


def records() -> dict[int, dict[str, Any]]:
    """Two attempts' epoch records: the first preempted at step 50, the second resumed from 40."""
    phases = {"process_start_s": 4.0, "model_load_s": 20.0, "checkpoint_read_s": 2.0, "first_step_s": 3.0}
    return {
        1: {"attempt": 1, "claimed_at": 1000.0, "ended": "notice", "step": 50,
            "measured": {"steps": 50, "tokens": 5000, "step_s": 2.0, "phases": {**phases}}},
        2: {"attempt": 2, "claimed_at": 1200.0, "ended": "finished", "step": 100,
            "measured": {"steps": 60, "tokens": 6000, "step_s": 2.5, "phases": phases}},
    }  # fmt: skip


ATTEMPTS = [
    {"n": 1, "started_at": 990.0, "ended_at": 1105.0, "start_step": 0, "end_step": 50, "preempted": True},
    {"n": 2, "started_at": 1150.0, "ended_at": 1400.0, "start_step": 40, "end_step": 100, "preempted": False},
]


def test_the_orchestrator_ledger_splits_each_preemption_and_prices_on_demand() -> None:
    spent = (115 + 250) / 3600.0
    ledger = compute_ledger(
        records(), spent_usd=spent, hourly_usd=1.0, ondemand_hourly_usd=3.0, attempts=ATTEMPTS,
        last_step_at={1: 1100.0},
    )  # fmt: skip
    (loss,) = ledger["preemptions"]
    assert loss == {
        "attempt": 1, "next_attempt": 2, "detection_s": 5.0, "provisioning_s": 45.0, "setup_s": 4.0,
        "loading_s": 22.0, "redo_s": 20.0, "steps_redone": 10, "total_s": 96.0,
        "detection_source": "ftorch", "provisioning_source": "ftorch", "setup_source": "trainer",
    }  # fmt: skip
    ondemand = (365 - 4 - 22 - 20) / 3600.0 * 3.0  # the billed time less what the restart cost
    assert ledger["ondemand_usd"] == pytest.approx(ondemand, abs=1e-6)
    assert ledger["savings_usd"] == pytest.approx(ondemand - spent, abs=1e-6)
    assert ledger["savings_pct"] == pytest.approx(100 * (ondemand - spent) / ondemand, abs=0.01)
    assert ledger["tokens"] == 11000
    assert ledger["usd_per_million_tokens"] == pytest.approx(spent / 11000 * 1e6, abs=1e-5)


def test_the_trainer_side_knows_less_and_says_so() -> None:
    ledger = compute_ledger(records(), spent_usd=None, hourly_usd=None, ondemand_hourly_usd=None, tokens=9000)
    (loss,) = ledger["preemptions"]
    assert loss["detection_s"] is None and loss["provisioning_s"] is None
    assert (loss["setup_s"], loss["loading_s"], loss["steps_redone"], loss["redo_s"]) == (4.0, 22.0, 10, 20.0)
    assert ledger["savings_usd"] is None and ledger["usd_per_million_tokens"] is None
    lines = dict(ledger_lines(ledger))
    assert lines["spent"] == "-" and lines["saved"].startswith("n/a")
    assert "detection -" in lines["preemption 1"] and "loading 22.0s" in lines["preemption 1"]


def test_a_finished_run_without_preemptions_has_no_losses() -> None:
    one = {1: {"attempt": 1, "claimed_at": 0.0, "ended": "finished", "step": 10, "measured": {"tokens": 100}}}
    ledger = compute_ledger(one, spent_usd=0.5, hourly_usd=2.0, ondemand_hourly_usd=4.0)
    assert ledger["preemptions"] == [] and ledger["lost_s"] == 0.0
    assert ledger["ondemand_usd"] == pytest.approx(1.0) and ledger["savings_pct"] == pytest.approx(50.0)


def test_the_model_card_shows_the_ledger(tmp_path: Any) -> None:
    from trainer.outputs import model_card
    from trainer.runstore.store import RunStore

    output = RunStore(str(tmp_path / "out"))
    summary = {"method": "lora", "base_model": "m", "job_id": "j", "data": {"path": "d", "format": "text",
               "training_examples": 1, "training_tokens": 10, "max_seq_len": 8}, "steps": 1, "tokens_seen": 10,
               "first_loss": None, "final_loss": None, "attempts": 2, "interruptions": 1,
               "hyperparameters": {}, "prompt_format": "plain", "cost_usd": None}  # fmt: skip
    model_card.write(output, summary)
    ledger = compute_ledger(
        records(), spent_usd=0.1, hourly_usd=1.0, ondemand_hourly_usd=3.0, attempts=ATTEMPTS
    )
    assert model_card.add_run_facts(output, cost_usd=0.1, preemptions=1, ledger=ledger)
    kept = json.loads(output.read_bytes(model_card.SUMMARY))
    assert kept["ledger"]["savings_usd"] == ledger["savings_usd"]
    card = output.read_bytes(model_card.CARD).decode()
    assert "| cost: saved | $" in card and "| cost: preemption 1 | detection -" in card


def test_steps_redone_after_a_machine_vanished_come_from_the_next_attempts_record() -> None:
    """A machine gone without a notice leaves no end step in its record; the next trainer records where
    the last progress report had it (`previous_attempt_step`) and where it resumed (`start_step`), so the
    ledger counts the steps redone even when the orchestrator's attempts carry no steps (SkyPilot)."""
    got = records()
    del got[1]["step"], got[1]["ended"]  # SIGKILL: the trainer never wrote how it ended
    got[2] = {**got[2], "start_step": 40, "previous_attempt_step": {"attempt": 1, "step": 47}}
    sky = [{**a, "start_step": None, "end_step": None} for a in ATTEMPTS]  # SkyPilot's registry attempts
    ledger = compute_ledger(got, spent_usd=0.1, hourly_usd=1.0, ondemand_hourly_usd=3.0, attempts=sky)
    (loss,) = ledger["preemptions"]
    assert (loss["steps_redone"], loss["redo_s"]) == (7, 14.0)
    without = {1: got[1], 2: {k: v for k, v in got[2].items() if k != "previous_attempt_step"}}
    (unknown,) = compute_ledger(
        without, spent_usd=0.1, hourly_usd=1.0, ondemand_hourly_usd=3.0, attempts=sky
    )["preemptions"]
    assert unknown["steps_redone"] is None  # no report: unknown, not zero


def test_an_unhealthy_stop_shows_what_it_saved_against_the_projected_cost() -> None:
    unhealthy = {0: {"attempt": 1, "ended": "unhealthy", "step": 30, "total_steps": 100,
                     "measured": {"step_s": 36.0}}}  # fmt: skip
    ledger = compute_ledger(unhealthy, spent_usd=1.5, hourly_usd=3.0, ondemand_hourly_usd=None)
    # 70 steps x 36 s = 0.7 h x $3 = $2.10 not spent, of $3.60 projected
    assert ledger["unhealthy_stop"] == {"at_step": 30, "total_steps": 100, "steps_left": 70,
                                        "projected_remaining_h": 0.7, "saved_usd": 2.1, "projected_usd": 3.6}  # fmt: skip
    assert dict(ledger_lines(ledger))["unhealthy stop saved"] == (
        "$2.10 (70 steps left, 0.70 h) of $3.60 projected; spent $1.50"
    )
    unpriced = compute_ledger(unhealthy, spent_usd=None, hourly_usd=None, ondemand_hourly_usd=None)
    assert unpriced["unhealthy_stop"]["saved_usd"] is None and unpriced["unhealthy_stop"]["steps_left"] == 70
    finished = {0: {**unhealthy[0], "ended": "finished"}}
    assert (
        compute_ledger(finished, spent_usd=1.5, hourly_usd=3.0, ondemand_hourly_usd=None)["unhealthy_stop"]
        is None
    )
    assert "unhealthy stop saved" not in dict(ledger_lines(compute_ledger(finished, spent_usd=1.5, hourly_usd=3.0,
                                                                            ondemand_hourly_usd=None)))  # fmt: skip
