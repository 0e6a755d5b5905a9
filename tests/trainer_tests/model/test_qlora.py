"""QLoRA on the CPU (bitsandbytes >= 0.49 runs NF4 there): the 4-bit NF4 base with double quantization,
bf16 compute, LoRA on every linear layer, 8-bit optimizers, exact resume with checkpoints that hold only
the adapters; and the early, clear refusal where bitsandbytes cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsdp_helpers import SIGKILL, finish, interrupt, new_run
from helpers import assert_bitwise_equal, final_weights, job_dict, run_trainer, write_data

from trainer import exitcodes
from trainer.runstore.store import RunStore

bnb = pytest.importorskip("bitsandbytes")
QLORA = {
    "method": "qlora",
    "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": "all-linear"},
    "train": {"precision": "bf16-mixed", "optimizer": "paged_adamw_8bit", "max_steps": 8},
    "checkpoint": {"every": 3},
}


def _job(tmp_path: Path, tiny_model: Path, **over: dict) -> dict:
    data = write_data(tmp_path / "d.jsonl", "instruction", 40)
    return job_dict(tiny_model, data, tmp_path / "runs", **{**QLORA, **over})


def test_qlora_model_is_nf4_double_quant_with_lora_on_all_linear(tmp_path: Path, tiny_model: Path) -> None:
    from orchestrator.jobfile.spec import validate_job
    from trainer.loop import make_optimizer
    from trainer.model.load import load_model, trainable_parameters
    from trainer.model.quant import quantized_modules

    spec = validate_job(_job(tmp_path, tiny_model))
    model = load_model(spec, torch.device("cpu"))
    linear4 = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized_modules(model) == len(linear4) == 2 * 7  # q k v o gate up down, in each layer
    for layer in linear4:
        state = layer.weight.quant_state
        assert state.quant_type == "nf4" and state.nested  # double quantization: the absmax quantized
        assert layer.compute_dtype == torch.bfloat16
        # packed 4-bit values stored in the compute dtype (bnb_4bit_quant_storage), so FSDP can shard them
        assert layer.weight.dtype == torch.bfloat16 and not layer.weight.requires_grad
    trainable = trainable_parameters(model)
    assert trainable and all("lora_" in n for n in trainable)
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not isinstance(model.get_base_model().lm_head, bnb.nn.Linear4bit)
    optimizer = make_optimizer(spec, model)
    assert isinstance(optimizer, bnb.optim.PagedAdamW8bit)
    spec.train.optimizer = "adamw_8bit"
    assert type(make_optimizer(spec, model)) is bnb.optim.AdamW8bit


def test_qlora_resume_is_bitwise_and_checkpoints_hold_only_adapters(tmp_path: Path, tiny_model: Path) -> None:
    job = _job(tmp_path, tiny_model)
    reference = new_run(job, "reference")
    finish(reference, 1, nproc=1)
    run_uri = new_run(job, "killed")
    code, out, _ = interrupt(run_uri, 1, 1, at_step=5, sig=SIGKILL)
    assert code == -9, out
    out = finish(run_uri, 2, nproc=1)
    assert "resumed from checkpoints/step-00000003" in out, out
    assert_bitwise_equal(final_weights(run_uri), final_weights(reference))

    store = RunStore(run_uri)
    info = store.complete_checkpoints()[-1]
    blobs = store.read_checkpoint(info)
    from safetensors.torch import load

    weights = load(blobs["weights.safetensors"])
    assert weights and all("lora_" in k for k in weights), sorted(weights)[:5]
    assert sum(len(b) for b in blobs.values()) < 200_000  # adapters + 8-bit optimizer + RNG, no base
    states = torch.load(__import__("io").BytesIO(blobs["optimizer.pt"]), weights_only=True)["optimizer"]
    slot = next(iter(states["state"].values()))
    # bitsandbytes' optimizer state came through the checkpoint (tensors this small keep 32-bit states;
    # from 4096 elements on they are 8-bit)
    assert "__bnb_optimizer_quant_state__" in slot
    adapter = json.loads((Path(run_uri) / "output" / "adapter_config.json").read_text())
    linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {t.rsplit(".", 1)[-1] for t in adapter["target_modules"]} == linear


def test_qlora_fails_early_and_clearly_without_a_usable_bitsandbytes(
    tmp_path: Path, tiny_model: Path
) -> None:
    from trainer.model.quant import QuantUnavailable, check_available

    with pytest.raises(QuantUnavailable, match="no GPU"):
        check_available(torch.device("cpu"), devices={"cuda"})
    with pytest.raises(QuantUnavailable, match="pip install"):
        check_available(torch.device("cpu"), devices=set())
    check_available(torch.device("cpu"), devices={"cpu", "cuda"})

    run_uri = new_run(_job(tmp_path, tiny_model), "refused")
    done = run_trainer(run_uri, env={"FTORCH_BNB_DEVICES": "cuda"})
    assert done.returncode == exitcodes.BAD_CONFIG, done.stdout + done.stderr
    assert "qlora cannot run here: this machine has no GPU" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert not RunStore(run_uri).complete_checkpoints()


def test_qlora_on_two_ranks_fsdp_resumes_bitwise(tmp_path: Path, tiny_model: Path) -> None:
    """FSDP2 over the 4-bit base (2 gloo ranks): a notice mid-run, the resume ends bitwise equal to an
    uninterrupted 2-rank run; the sharded checkpoints hold the adapters only."""
    from fsdp_helpers import SIGTERM, finish, interrupt, new_run

    job = _job(tmp_path, tiny_model, train={**QLORA["train"], "optimizer": "adamw", "max_steps": 6})
    job["local"] = {**job["local"], "nproc": 2}
    reference = new_run(job, "reference")
    out = finish(reference, 1, nproc=2)
    assert "sharded over 2 ranks" in out and "layout: 2 ranks" in out, out
    run_uri = new_run(job, "interrupted")
    code, out, _ = interrupt(run_uri, 1, 2, at_step=3, sig=SIGTERM)
    assert "is safe; exiting with code 75" in out, out
    newest = RunStore(run_uri).complete_checkpoints()[-1]
    assert newest.meta["kind"] == "dcp" and newest.meta["world_size"] == 2
    from torch.distributed.checkpoint import FileSystemReader

    folder = Path(run_uri) / newest.path / f"e{newest.epoch:08d}"
    keys = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)  # adapters only: no 4-bit base
    out = finish(run_uri, 2, nproc=2)
    assert f"resumed from checkpoints/step-{newest.step:08d}" in out, out
    assert_bitwise_equal(final_weights(run_uri), final_weights(reference))
