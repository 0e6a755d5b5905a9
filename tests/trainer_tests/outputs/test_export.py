"""The output folder's record (model card, training_summary.json), `ftorch export` from checkpoints,
`ftorch metrics`, and TensorBoard (`train.report_to`) across attempts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import job_dict, prepare_run, run_trainer, wandb_records, write_data

from orchestrator.cli import outputs as cli_outputs
from orchestrator.errors import UserError
from orchestrator.registry import Registry
from trainer.outputs import model_card
from trainer.outputs.export import export
from trainer.runstore.store import RunStore

WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"  # a made-up key: it must never be written


@pytest.fixture(scope="module")
def trained(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A 10-step LoRA run with TensorBoard, W&B and the held-out loss every 4 steps: attempt 1 crashes at
    step 8 (checkpoint 5), attempt 2 resumes and finishes (checkpoint 10); its output folder."""
    root = tmp_path_factory.mktemp("export-run")
    data = write_data(root / "train.jsonl", "instruction", 60)
    train = {"max_steps": 10, "report_to": ["tensorboard", "wandb"], "eval_every": 4}
    job = job_dict(tiny_model, data, root / "runs", train=train, data={"eval_examples": 8})
    run_uri = prepare_run(job, run_id="tiny-abc123")
    # W&B offline, everything it writes under this test's folder (the run's folders in wandb/)
    wandb_env = {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_API_KEY": WANDB_KEY}
    wandb_env.update(
        {k: str(root / "wandb-home") for k in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
    )
    # attempt 1 logs steps 1-7 (metrics and trackers flushed every step) and crashes at 8
    flush = {"FTORCH_TRACKER_FLUSH_S": "0", "FTORCH_PROGRESS_EVERY_S": "0", **wandb_env}
    first = run_trainer(run_uri, 1, env={"FTORCH_FAULTS": "crash@8", **flush})
    assert first.returncode != 0 and "injected fault crash@8" in first.stdout + first.stderr
    done = run_trainer(run_uri, 2, env=wandb_env)  # resumes at 5: trains 6-10 again
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run_uri, tiny_model


def _register(registry: Registry, run_uri: str) -> str:
    """The run in this FTORCH_HOME's registry (nothing written to the run store)."""
    spec = RunStore(run_uri).read_spec()["job"]
    registry.create_job("tiny-abc123", "tiny", "local", run_uri, f"{run_uri}/output", spec, 0.0)
    return "tiny-abc123"


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 9, 12, 7, 3, 2]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def _adapter_logits(base: Path, adapter: str) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    return _logits(model)


def test_output_has_a_filled_model_card_and_summary(trained: tuple[str, Path]) -> None:
    run_uri, tiny = trained
    output = Path(run_uri) / "output"
    summary = json.loads((output / model_card.SUMMARY).read_text())
    assert summary["base_model"] == str(tiny) and summary["method"] == "lora" and summary["steps"] == 10
    assert summary["data"]["training_examples"] == 52 and summary["hyperparameters"]["lr"] == 5e-3
    assert summary["final_loss"] < summary["first_loss"] and summary["eval_after"]["examples"] == 8
    assert summary["attempts"] == 2 and summary["interruptions"] == 1
    card = (output / model_card.CARD).read_text()
    # a local base is named in the text: the Hub refuses a path as `base_model` metadata (a Hub id goes
    # there: test_results.py); the front matter is huggingface_hub's ModelCardData
    assert card.startswith("---\nlibrary_name: peft\npipeline_tag: text-generation\n")
    assert f"of `{tiny}`, trained with ftorch" in card
    assert "### Instruction:" in card and "PeftModel.from_pretrained" in card
    assert "prompt = '### Instruction:\\nYour instruction here\\n\\n### Response:\\n'\n" in card
    assert f"{summary['final_loss']:.4f}" in card and "held-out loss" in card and "| cost | - |" in card
    assert [step for step, _ in summary["eval_curve"]] == [
        4,
        8,
        10,
    ] and "held-out loss during training" in card
    # the orchestrator adds what only it knows
    assert model_card.add_run_facts(RunStore(str(output)), cost_usd=0.12, preemptions=2)
    assert "| cost | $0.12 |" in (output / "README.md").read_text()
    assert json.loads((output / model_card.SUMMARY).read_text())["preemptions"] == 2


def test_exported_adapter_gives_the_trained_models_logits(trained: tuple[str, Path], tmp_path: Path) -> None:
    run_uri, tiny = trained
    final = export(run_uri, str(tmp_path / "final"))
    assert final["step"] == 10 and "adapter_model.safetensors" in final["files"]
    trained_logits = _adapter_logits(tiny, str(Path(run_uri) / "output"))  # what the trainer wrote
    assert torch.equal(_adapter_logits(tiny, str(tmp_path / "final")), trained_logits)

    earlier = export(run_uri, str(tmp_path / "step5"), step=5)  # an intermediate checkpoint
    assert earlier["step"] == 5
    step5 = _adapter_logits(tiny, str(tmp_path / "step5"))
    assert not torch.allclose(step5, trained_logits) and torch.isfinite(step5).all()

    merged = export(run_uri, str(tmp_path / "merged"), merge=True)
    assert merged["kind"] == "merged model" and not (tmp_path / "merged" / "adapter_config.json").exists()
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert torch.allclose(_logits(plain), trained_logits, atol=1e-4)


def test_export_writes_again_into_its_own_earlier_export_and_with_force(
    trained: tuple[str, Path], tmp_path: Path
) -> None:
    run_uri, _tiny = trained
    target = tmp_path / "again"
    export(run_uri, str(target), step=5)
    again = export(run_uri, str(target))  # a previous ftorch export: replaced, no --force needed
    assert again["step"] == 10 and (target / "adapter_model.safetensors").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    forced = export(run_uri, str(mine), force=True)  # the user said so: written beside their files
    assert forced["step"] == 10 and (mine / "notes.txt").read_text() == "keep me\n"


def test_export_command_picks_steps_and_refuses_missing_ones(
    trained: tuple[str, Path], tmp_path: Path, ftorch_home: Path, capsys
) -> None:
    run_uri, _tiny = trained
    registry = Registry()
    job_id = _register(registry, run_uri)
    with pytest.raises(UserError, match=r"--step: no complete checkpoint at step 7; complete ones: 5, 10"):
        cli_outputs.export_cmd(job_id, step=7)
    assert not (Path(run_uri) / "exports").exists()
    cli_outputs.export_cmd(job_id, step=5)
    assert f"PEFT adapter from step 5 of {job_id}" in capsys.readouterr().out
    assert (Path(run_uri) / "exports" / "step-00000005" / "adapter_config.json").exists()


def test_metrics_command_lists_every_step_with_grad_norm(
    trained: tuple[str, Path], ftorch_home: Path, capsys
) -> None:
    import csv
    import io

    run_uri, _tiny = trained
    job_id = _register(Registry(), run_uri)
    cli_outputs.metrics_cmd(job_id, as_csv=True)
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(r["step"]) for r in rows] == list(range(1, 11))  # 6 and 7 once: the second attempt's
    assert [r["attempt"] for r in rows] == ["1"] * 5 + ["2"] * 5
    assert all(float(r["grad_norm"]) > 0 for r in rows) and float(rows[0]["lr"]) > 0
    assert all(
        float(r["tokens_per_s"]) > 0 for i, r in enumerate(rows) if i not in (0, 5)
    )  # not across attempts
    assert [(int(r["step"]), r["attempt"]) for r in rows if r["eval_loss"]] == [(4, "1"), (8, "2"), (10, "2")]
    cli_outputs.metrics_cmd(job_id)
    table = capsys.readouterr().out.splitlines()
    header = ["step", "attempt", "loss", "lr", "grad_norm", "eval_loss", "tokens/s"]
    assert table[0].split() == header and len(table) == 11


def test_tensorboard_one_run_across_attempts_without_repeated_steps(trained: tuple[str, Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_uri, _tiny = trained
    folder = Path(run_uri) / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one file per attempt, one run
    runs = EventAccumulator(str(folder))
    runs.Reload()
    tags = set(runs.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "eval/loss",
        "run/attempt",
    } <= tags
    assert [e.step for e in runs.Scalars("train/loss")] == list(range(1, 11))  # 6, 7 logged twice, kept once
    assert [e.step for e in runs.Scalars("eval/loss")] == [0, 4, 8, 10]  # train.eval_every: 4
    assert [(e.step, e.value) for e in runs.Scalars("run/attempt")] == [(1, 1.0), (6, 2.0)]


def test_wandb_one_run_across_attempts_without_repeated_steps(trained: tuple[str, Path]) -> None:
    run_uri, _tiny = trained
    root = Path(run_uri).parent.parent
    runs = sorted((root / "wandb").glob("offline-run-*-tiny-abc123"))
    assert len(runs) == 2  # one per attempt, both the job's run
    steps: list[int] = []
    keys: set[str] = set()
    attempts: list[tuple[int, float]] = []
    for folder in runs:
        records = wandb_records(folder / "run-tiny-abc123.wandb")
        assert {r.run.run_id for r in records if r.HasField("run")} == {"tiny-abc123"}
        for record in records:
            if record.HasField("history"):
                steps.append(record.history.step.num)
                items = {
                    item.key or "/".join(item.nested_key): item.value_json for item in record.history.item
                }
                keys |= set(items)
                if "run/attempt" in items:
                    attempts.append((record.history.step.num, float(items["run/attempt"])))
            if record.HasField("config"):
                assert "storage_options" not in str(record.config)
        assert WANDB_KEY.encode() not in (folder / "run-tiny-abc123.wandb").read_bytes()
    assert steps == list(range(0, 11))  # eval at 0, steps 1-7, then 8-10 (6 and 7 stay as first logged)
    expected = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss"}
    assert expected | {"run/attempt", "run/preemptions"} <= keys
    assert attempts == [(1, 1.0), (8, 2.0)]  # attempt 2 from its first step W&B had not seen
    # the run store keeps the offline run of each attempt (for `wandb sync`) and the last step logged
    store = Path(run_uri) / "wandb"
    assert json.loads((store / "state.json").read_text()) == {"run_id": "tiny-abc123", "last_step": 10}
    assert {p.name for p in store.glob("offline-run-*")} == {p.name for p in runs}


def test_wandb_refusing_the_key_is_one_line_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from trainer.recording.trackers import Trackers

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("HOME", "WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "online")  # no key: W&B refuses before any network call
    trackers = Trackers(RunStore(str(tmp_path / "run")), ["wandb"], 1, 0, "job-1", {})
    trackers.step(1, {"loss": 1.0})
    trackers.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if "W&B" in line]
    assert len(lines) == 1 and "W&B is not reporting this attempt: UsageError: No API key" in lines[0]
