"""train.health (trainer/health/rules.py, health_guard.py): the rules on their own, then real trainer runs
with the faults a real part cannot make on a CPU (FTORCH_FAULTS nan@K, spike@K), then a whole local job
that diverges (lr=10) and ends UNHEALTHY with its good weights kept and every view still rendering."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from helpers import (
    assert_bitwise_equal,
    final_weights,
    ftorch,
    job_dict,
    prepare_run,
    run_trainer,
    write_data,
)
from http_fakes import Hook

from trainer import exitcodes
from trainer.config import HealthSpec
from trainer.health.rules import ROLLBACK, SKIP, STEP, UNHEALTHY, HealthRules
from trainer.runstore import finite_json
from trainer.runstore.runfiles import progress_problem
from trainer.runstore.store import RunStore

NAN = float("nan")


# ---- the rules ------------------------------------------------------------------------------------
def test_non_finite_steps_are_skipped_then_rolled_back_then_the_run_is_unhealthy() -> None:
    rules = HealthRules(HealthSpec(max_skips_in_a_row=2, max_rollbacks=1))
    assert rules.judge(1, 2.0, 1.0, not_finite=False).action == STEP
    assert [rules.judge(s, NAN, None, not_finite=True).action for s in (2, 3)] == [SKIP, SKIP]
    third = rules.judge(4, NAN, None, not_finite=True)
    assert third.action == ROLLBACK and "loss NaN at step 4 (3 in a row)" in third.reason
    rules.rolled_back(4, 0, third.reason)
    # a finite step between two streaks starts the count again
    assert [rules.judge(s, v, 1.0, not_finite=not math.isfinite(v)).action for s, v in
            ((5, NAN), (6, 2.0), (7, NAN), (8, NAN))] == [SKIP, STEP, SKIP, SKIP]  # fmt: skip
    last = rules.judge(9, 1.5, math.inf, not_finite=True)
    assert (
        last.action == UNHEALTHY
        and last.reason == "gradient norm inf at step 9 (3 in a row) after 1 rollback"
    )


def test_a_spike_rolls_back_after_warm_up_and_a_sustained_rise_warns() -> None:
    spec = HealthSpec(warmup_steps=3, rise_window=4, rise_patience=2)
    rules = HealthRules(spec)
    assert rules.judge(1, 100.0, 1.0, False).action == STEP  # warm-up: counted in the max, not judged
    assert rules.judge(2, 5.0, 1.0, False).action == STEP
    spike = rules.judge(4, 1001.0, 1.0, False)
    assert spike.action == ROLLBACK and "loss spike at step 4" in spike.reason
    assert rules.judge(5, 999.0, 1.0, False).action == STEP  # under 10x the largest seen (100)
    rise = HealthRules(spec)
    warnings = [rise.judge(s, v, 1.0, False).warning for s, v in enumerate([1, 1, 1, 1, 5, 5, 5], 1)]
    assert warnings[:5] == [None] * 5 and warnings[5] is not None and "loss rising" in warnings[5]
    assert warnings[6] is None  # said once per rise
    off = HealthRules(HealthSpec(enabled=False))
    assert off.judge(1, NAN, NAN, True).action == STEP


def test_non_finite_numbers_are_written_as_null_with_a_flag(tmp_path: Path) -> None:
    progress = {"step": 5, "loss": NAN, "eval_after": {"loss": math.inf, "exact_match": 0.5}}
    text = finite_json.dumps(progress)
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    back = json.loads(text)
    assert back["loss"] is None and back["nonfinite"] == {"loss": "NaN"}
    assert back["eval_after"] == {"loss": None, "exact_match": 0.5, "nonfinite": {"loss": "inf"}}
    assert progress_problem(back) is None  # the supervisor and status take it
    store = RunStore(str(tmp_path / "run"))
    store.write_json("x.json", {"loss": -math.inf})  # every JSON file of the store
    assert json.loads((tmp_path / "run" / "x.json").read_text()) == {
        "loss": None,
        "nonfinite": {"loss": "-inf"},
    }


def test_keep_never_deletes_the_newest_healthy_checkpoint(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.claim_epoch({"attempt": 1})
    for step, healthy in ((2, True), (4, False), (6, False), (8, False)):
        store.commit_checkpoint(step, {"x.bin": b"x"}, meta={"healthy": healthy})
    store.prune_checkpoints(2)
    assert [(c.step, c.meta["healthy"]) for c in store.complete_checkpoints()] == [
        (2, True), (6, False), (8, False),
    ]  # fmt: skip


# ---- real runs ------------------------------------------------------------------------------------
def _run(tmp_path: Path, tiny_model: Path, name: str, faults: str, **sections: Any) -> tuple[str, Any]:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_dict(tiny_model, data, tmp_path / name, **sections)
    run_uri = prepare_run(job)
    # saves in the step (not in the background, where a save that comes due while the last upload is in
    # flight is skipped, as on a loaded machine): the healthy checkpoint rolled back to is the step's own
    done = run_trainer(run_uri, 1, {"FTORCH_FAULTS": faults, "FTORCH_ASYNC_CHECKPOINT": "0"})
    return run_uri, done


def test_a_transient_nan_rolls_back_succeeds_finite_and_the_same_fault_twice_ends_equal(
    tmp_path: Path, tiny_model: Path
) -> None:
    weights = []
    for name in ("a", "b"):
        run_uri, done = _run(tmp_path, tiny_model, name, "nan@12")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        assert "loss NaN at step 12: optimizer step 12 skipped" in out
        assert "rolled back to the healthy checkpoint of step 10 (rollback 1 of 2)" in out
        store = RunStore(run_uri)
        assert (store.read_progress() or {})["state"] == "finished"
        record = next(iter(store.epoch_records().values()))
        assert record["ended"] == "finished" and record["health"]["rollbacks"][0]["to_step"] == 10
        from trainer.recording.ledger import compute_ledger, ledger_lines

        ledger = compute_ledger(
            store.epoch_records(), spent_usd=0.0, hourly_usd=0.0, ondemand_hourly_usd=None
        )
        assert ledger["health"]["skipped_steps"] == 4 and ledger["health"]["rollbacks"][0]["at_step"] == 15
        assert "at step 15 to the healthy checkpoint of step 10" in dict(ledger_lines(ledger))["rollback"]
        rows = {r["step"]: r for r in store.read_metrics()}
        assert rows[12]["loss"] is None and rows[12]["nonfinite"]["loss"] == "NaN"  # metrics stay JSON
        final = final_weights(run_uri)
        assert all(bool(t.isfinite().all()) for t in final.values())
        weights.append(final)
    assert_bitwise_equal(*weights)


def test_a_spike_rolls_back(tmp_path: Path, tiny_model: Path) -> None:
    run_uri, done = _run(tmp_path, tiny_model, "s", "spike@17")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "loss spike at step 17" in out and "rolled back to the healthy checkpoint of step 15" in out


# ---- a whole local job that diverges ------------------------------------------------------------------
DIVERGE = {"lr": 10, "max_grad_norm": 1e9, "warmup_steps": 0, "max_steps": 40, "optimizer": "sgd"}


def test_a_diverging_local_job_ends_unhealthy_keeps_its_good_weights_and_every_view_renders(
    tmp_path: Path, tiny_model: Path, ftorch_home: Path, request: pytest.FixtureRequest
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    hook = Hook()
    request.addfinalizer(hook.close)
    job = job_dict(tiny_model, data, tmp_path / "runs", train=DIVERGE, checkpoint={"every": 2, "keep": 2},
                   local={"threads": 1, "restart_backoff_s": 0.2, "max_restarts_on_errors": 3},
                   notify={"webhook": hook.url, "on": ["unhealthy", "failed"]})  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    launched = ftorch("launch", str(job_file), "--follow")
    job_id = launched.stdout.splitlines()[0].strip()
    assert launched.returncode == 6, launched.stdout[-3000:] + launched.stderr[-2000:]  # UNHEALTHY
    detail = json.loads(ftorch("status", job_id, "--json").stdout)
    assert detail["state"] == "UNHEALTHY" and detail["attempts"] == 1  # never restarted
    # one `unhealthy` notification: the trainer's own (the supervisor sees its marker and does not repeat
    # it), and no `failed`; the supervisor's last post, if any, comes after --follow returns
    time.sleep(2.0)
    assert [p["body"]["event"] for p in hook.received] == ["unhealthy"], hook.received
    assert detail["reason"].startswith("unhealthy: ") and "after 2 rollbacks" in detail["reason"]
    store = RunStore(detail["run_uri"])
    healthy = [c for c in store.complete_checkpoints() if c.meta.get("healthy") is not False]
    assert healthy and f"newest healthy checkpoint: step {healthy[-1].step}" in detail["reason"]
    record = next(iter(store.epoch_records().values()))
    first_bad = min(
        r["step"] for r in store.read_metrics() if r.get("nonfinite") or r.get("grad_norm") is None
    )
    assert record["step"] - first_bad <= 12  # ended within a few steps of the first non-finite number
    # the ledger: what stopping saved against the projected cost (the steps left x this run's step time)
    stop = detail["ledger"]["unhealthy_stop"]
    assert (
        stop["at_step"] == record["step"] and stop["steps_left"] == DIVERGE["max_steps"] - record["step"] > 0
    )
    from trainer.recording.ledger import compute_ledger, ledger_lines

    priced = compute_ledger(store.epoch_records(), spent_usd=0.01, hourly_usd=100.0, ondemand_hourly_usd=None)
    step_s = record["measured"]["step_s"]
    saved = stop["steps_left"] * step_s / 3600.0 * 100.0
    assert priced["unhealthy_stop"]["saved_usd"] == pytest.approx(saved, abs=1e-6) and saved > 0
    assert priced["unhealthy_stop"]["projected_usd"] == pytest.approx(0.01 + saved, abs=1e-6)
    assert f"{stop['steps_left']} steps left" in dict(ledger_lines(priced))["unhealthy stop saved"]
    for args in ((job_id,), (job_id, "--plot", str(tmp_path / "loss.png"))):
        shown = ftorch("status", *args)
        assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "UNHEALTHY" in ftorch("status", job_id).stdout
    metrics = ftorch("metrics", job_id)
    assert metrics.returncode == 0 and "-" in metrics.stdout, metrics.stderr
    exported = ftorch("export", job_id, "--to", str(tmp_path / "exported"))
    assert exported.returncode == 0 and f"from step {healthy[-1].step}" in exported.stdout, exported.stderr
    from safetensors.torch import load_file

    adapter = load_file(str(tmp_path / "exported" / "adapter_model.safetensors"))
    assert all(bool(t.isfinite().all()) for t in adapter.values())
    _equals_checkpoint(store, healthy[-1], adapter)


def _equals_checkpoint(store: RunStore, info: Any, adapter: dict[str, Any]) -> None:
    """The exported adapter holds exactly the checkpoint's trained weights."""
    from trainer.outputs.export import _weights

    saved = _weights(store, info)
    exported = {k.replace(".default", ""): v for k, v in adapter.items()}
    for key, tensor in saved.items():
        name = key.replace("base_model.model.", "").replace(".default", "")
        match = [v for k, v in exported.items() if k.replace("base_model.model.", "") == name]
        assert match and bool((match[0] == tensor).all()), key


def test_an_unhealthy_exit_is_never_recovered_by_skypilot() -> None:
    from orchestrator.backends.skypilot_render import job_recovery

    spec = SimpleNamespace(resources=SimpleNamespace(recovery="FAILOVER", max_restarts_on_errors=2))
    assert exitcodes.UNHEALTHY not in job_recovery(spec)["recover_on_exit_codes"]  # type: ignore[arg-type]


def test_two_fsdp_ranks_with_a_non_finite_gradient_on_one_rank_end_unhealthy_together(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsdp_helpers import fsdp_job, new_run, run

    from trainer.outputs.export import export

    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = fsdp_job(tiny_model, data, tmp_path / "runs", checkpoint={"every": 2, "keep": 2})
    run_uri = new_run(job, "two")
    faults = ",".join(f"nan-grad-rank1@{k}" for k in range(8, 20))  # rank 1 only, every step from 8
    monkeypatch.setenv("FTORCH_FAULTS", faults)
    done = run(run_uri, 1, 2, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    # every rank skipped the same steps (rank 0 logs; its own gradients were finite)
    assert "gradient norm inf at step 8: optimizer step 8 skipped" in out
    assert "(rollback 1 of 2)" in out and "(rollback 2 of 2)" in out
    store = RunStore(run_uri)
    record = next(iter(store.epoch_records().values()))
    assert record["ended"] == "unhealthy" and "after 2 rollbacks" in record["stop_detail"], record
    assert (store.read_progress() or {})["state"] == "unhealthy"
    healthy = [c for c in store.complete_checkpoints() if c.meta.get("healthy") is not False]
    assert healthy and healthy[-1].step == record["healthy_step"]
    result = export(run_uri, str(tmp_path / "exported"))
    assert result["step"] == healthy[-1].step
    from safetensors.torch import load_file

    adapter = load_file(str(tmp_path / "exported" / "adapter_model.safetensors"))
    assert all(bool(t.isfinite().all()) for t in adapter.values())
    _equals_checkpoint(store, healthy[-1], adapter)


def test_a_notice_during_a_mid_run_evaluation_abandons_it() -> None:
    """The loop's flag is checked between evaluation batches: a notice does not wait for a long eval."""
    import torch

    from trainer.config import TrainSpec
    from trainer.loop import evaluate

    model = torch.nn.Linear(2, 2)
    model.train()
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return True

    spec = SimpleNamespace(train=TrainSpec(micro_batch_size=1))
    held_out = SimpleNamespace(held_out=[object()] * 500, pad_id=0)
    assert evaluate(model, held_out, torch.device("cpu"), spec, stop) == {}  # type: ignore[arg-type]
    assert asked == [1] and model.training  # left at the first batch, in training mode again
