"""data.packing: auto (the default): on only where packing is exact and faster (flash_attention_2 and a
model that passes the packing check), resolved per attempt, fingerprinted resolved, and counted by the
planner with the same torch-free rule."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import assert_bitwise_equal, final_weights, job_dict, prepare_run, run_trainer, write_data

from orchestrator.errors import SpecError
from orchestrator.jobfile.spec import validate_job
from trainer.checkpoints import fingerprint
from trainer.data.packing import resolve_packing
from trainer.model.attention import planned_packing
from trainer.runstore.store import RunStore
from trainer.train_step import packing_check


def test_the_rule_is_on_only_with_flash_attention_and_a_model_that_passes_the_check() -> None:
    assert resolve_packing("auto", "flash_attention_2") == (
        True,
        "data.packing: auto is on (flash_attention_2 reads packed sequences exactly)",
    )
    for attn in ("sdpa", "eager"):
        on, why = resolve_packing("auto", attn)
        assert not on and why.startswith(f"data.packing: auto is off: packing with {attn} needs a block")
    on, why = resolve_packing("auto", "flash_attention_2", "this model (bloom) mixes them")
    assert (
        not on
        and why == "data.packing: auto is off: the packing check failed (this model (bloom) mixes them)"
    )
    for attn in ("sdpa", "eager", "flash_attention_2"):  # explicit values are honoured, checked or not
        assert resolve_packing(True, attn, "failed")[0] is True
        assert resolve_packing(False, attn)[0] is False
    # the planner: `auto` attention is counted as SDPA (flash-attn is on the image only when asked for)
    assert planned_packing("auto", "flash_attention_2") and not planned_packing("auto", "auto")
    assert not planned_packing("auto", "sdpa") and planned_packing(True, "sdpa")


def test_auto_is_the_default_and_a_bad_value_is_one_line(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    assert validate_job(job_dict(tiny_model, data, tmp_path / "r")).data.packing == "auto"
    for given, want in (("true", True), ("false", False), (True, True), ("auto", "auto")):
        job = job_dict(tiny_model, data, tmp_path / "r", data={"packing": given})
        assert validate_job(job).data.packing == want
    with pytest.raises(SpecError) as bad:
        validate_job(job_dict(tiny_model, data, tmp_path / "r", data={"packing": "sometimes"}))
    assert str(bad.value) == "data.packing: must be auto, true or false (got 'sometimes')"


def _spec(tiny_model: Path, tmp_path: Path, attn: str) -> Any:
    data = write_data(tmp_path / "d.jsonl", "instruction", 8)
    job = validate_job(
        job_dict(tiny_model, data, tmp_path / "r", train={"attn_implementation": attn}), check_support=False
    )
    return job, {"job": job.model_dump(mode="json")}


def test_the_probe_passes_llama_refuses_alibi_and_draws_no_random_numbers(
    tmp_path: Path, tiny_model: Path
) -> None:
    from transformers import BloomConfig

    spec, _ = _spec(tiny_model, tmp_path, "sdpa")
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert packing_check.probe(spec, torch.device("cpu"), "sdpa") is None
    assert torch.equal(before, torch.get_rng_state())  # the run's random numbers are untouched
    bloom = tmp_path / "bloom"
    BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4).save_pretrained(bloom)  # ALiBi
    why = packing_check.probe(SimpleNamespace(model=str(bloom)), torch.device("cpu"), "eager")
    assert why is not None and why.startswith("this model (bloom) does not keep packed examples apart")
    missing = packing_check.probe(SimpleNamespace(model=str(tmp_path / "none")), torch.device("cpu"), "eager")
    assert missing is not None and missing.startswith("it could not run: ")  # not checked: not passed


def test_the_attempt_resolves_auto_after_attention_and_logs_why(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    spec, as_run = _spec(tiny_model, tmp_path, "sdpa")
    ran, job = packing_check.resolve_for_attempt(spec, as_run, torch.device("cpu"), said.append)
    assert (
        ran.data.packing is False and job["job"]["data"]["packing"] is False
    )  # what the fingerprint records
    assert as_run["job"]["data"]["packing"] == "auto" and said[0].startswith("data.packing: auto is off")

    flash, flash_run = _spec(tiny_model, tmp_path, "flash_attention_2")  # as a CUDA machine resolves it
    monkeypatch.setattr(packing_check, "probe", lambda *a: None)
    ran, job = packing_check.resolve_for_attempt(flash, flash_run, torch.device("cpu"), said.append)
    assert ran.data.packing is True and job["job"]["data"]["packing"] is True
    monkeypatch.setattr(packing_check, "probe", lambda *a: "this model (bloom) does not keep them apart")
    ran, job = packing_check.resolve_for_attempt(flash, flash_run, torch.device("cpu"), said.append)
    assert ran.data.packing is False and job["job"]["data"]["packing"] is False
    assert said[-1] == (
        "data.packing: auto is off: the packing check failed (this model (bloom) does not keep them apart)"
    )
    explicit = ran.model_copy(update={"data": ran.data.model_copy(update={"packing": True})})
    assert (
        packing_check.resolve_for_attempt(explicit, flash_run, torch.device("cpu"), said.append)[0]
        is explicit
    )


class _Store:
    """The newest checkpoint's manifest, as fingerprint.check_start reads it."""

    def __init__(self, recorded: dict[str, Any]) -> None:
        info = SimpleNamespace(step=4, meta={fingerprint.META_KEY: recorded})
        self.listing = SimpleNamespace(newest=info)
        self.epoch_record: dict[str, Any] = {}

    def list_checkpoints(self) -> Any:
        return self.listing

    def update_epoch_record(self, **fields: Any) -> None:
        self.epoch_record.update(fields)


def test_a_resume_whose_resolved_packing_changed_is_refused_unless_allowed(
    tmp_path: Path, tiny_model: Path
) -> None:
    spec, as_run = _spec(tiny_model, tmp_path, "sdpa")
    job = as_run["job"]
    flash_job = {**job, "data": {**job["data"], "packing": True}}  # a flash machine resolved auto: true
    store = _Store(fingerprint.record(flash_job, None))
    assert fingerprint.changes(store.listing.newest.meta["fingerprint"], job, 4) == []  # the CLI skips auto
    _, here = packing_check.resolve_for_attempt(spec, as_run, torch.device("cpu"), lambda _: None)
    with pytest.raises(fingerprint.SpecChanged) as refused:
        fingerprint.check_start(store, here, None, lambda _: None)
    assert refused.value.field == "data.packing"
    assert str(refused.value).startswith("data.packing: changed from true to false since checkpoint step 4")
    allowed = {**here, fingerprint.ALLOWED_KEY: [{"checkpoint_step": 4, "changes": []}]}
    check = fingerprint.check_start(store, allowed, None, lambda _: None)  # ftorch resume --allow-change
    assert check.allowed and [c.field for c in check.changes] == ["data.packing"]
    same = _Store(fingerprint.record(here["job"], None))
    assert fingerprint.check_start(same, here, None, lambda _: None).changes == []


def test_auto_on_cpu_is_off_and_bitwise_the_same_run_as_packing_false(
    tmp_path: Path, tiny_model: Path
) -> None:
    data = write_data(tmp_path / "d.jsonl", "text", 24)
    runs = {}
    for packing in ("auto", False):
        job = job_dict(
            tiny_model,
            data,
            tmp_path / "runs",
            data={"format": "text", "max_seq_len": 64, "packing": packing},
            train={"micro_batch_size": 2, "max_steps": 4},
            checkpoint={"every": 2},
        )
        runs[packing] = prepare_run(job, f"packing-{packing}")
        done = run_trainer(runs[packing])
        assert done.returncode == 0, done.stdout + done.stderr
        assert "packed " not in done.stdout and " packs" not in done.stdout
        if packing == "auto":
            assert "data.packing: auto is off: packing with sdpa needs a block" in done.stdout + done.stderr
    assert_bitwise_equal(final_weights(runs["auto"]), final_weights(runs[False]))
    store = RunStore(runs["auto"])
    assert fingerprint.newest_record(store)[1]["fields"]["data.packing"] is False  # recorded resolved
    assert store.read_spec()["job"]["data"]["packing"] == "auto"  # spec.json keeps the ask
