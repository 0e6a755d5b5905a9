"""data.packing: packed examples stay apart (positions restart, attention and labels stay within an
example), packs are deterministic, a packed run resumes bitwise, and the planner counts the same packs."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import torch
from helpers import (
    assert_bitwise_equal,
    final_weights,
    job_dict,
    prepare_run,
    run_trainer,
    write_data,
)

from trainer.config import DataSpec
from trainer.data.dataset import IGNORE, DataError, Example, collate, load_dataset
from trainer.data.packing import packed_count, plan_packs
from trainer.train_step.loss import hidden_states, label_tokens, loss_sum
from trainer.train_step.packing_check import NotIsolated, verify


def _model(folder: Path, attn: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
    model.config.use_cache = False  # as trainer/model/load.py prepares it
    return model.eval()


def test_plan_packs_is_best_fit_decreasing_and_deterministic() -> None:
    assert plan_packs([5, 3, 8, 2, 7, 1, 4, 6], 10) == [[2, 3], [1, 4], [6, 7], [0, 5]]
    rng = random.Random(3)
    lengths = [rng.randint(1, 64) for _ in range(3000)]
    packs = plan_packs(lengths, 64)
    assert packs == plan_packs(list(lengths), 64)  # a pure function of the lengths
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))  # every example exactly once
    assert all(sum(lengths[i] for i in p) <= 64 for p in packs)
    assert len(packs) <= 1.03 * sum(lengths) / 64 + 1  # nearly full packs
    assert packed_count(lengths, 64) == len(packs)
    with pytest.raises(ValueError, match="packs hold 1 to 64"):
        plan_packs([65], 64)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_examples_match_the_examples_alone(tmp_path: Path, tiny_model: Path, attn: str) -> None:
    from transformers import AutoTokenizer

    data = write_data(tmp_path / "d.jsonl", "text", 24)
    spec = DataSpec(path=str(data), max_seq_len=96, packing=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    examples = load_dataset(DataSpec(path=str(data), max_seq_len=96), tokenizer, 2, 7)
    dataset = load_dataset(spec, tokenizer, 2, 7)
    assert dataset.train == load_dataset(spec, tokenizer, 2, 7).train  # deterministic
    assert dataset.tokens == examples.tokens and len(dataset.train) < len(examples.train) // 2
    assert label_tokens(dataset.train) == label_tokens(examples.train)  # no label crosses a boundary
    model = _model(tiny_model, attn)
    verify(model)  # the trainer's check at start passes for llama

    packs = dataset.micro_batch(0)
    batch = collate(packs, dataset.pad_id)
    assert "attention_mask" not in batch
    with torch.no_grad():
        hidden = hidden_states(model, batch)
        packed_loss = loss_sum(model, batch)
        flat_loss = loss_sum(model, collate(packs, dataset.pad_id, flat=True))  # flash attention's layout
        alone_loss = torch.zeros(())
        for row, p in enumerate(packs):
            start = 0
            for n in p.lengths:
                one = Example(p.input_ids[start : start + n], [IGNORE, *p.labels[start + 1 : start + n]])
                assert batch["position_ids"][row, start : start + n].tolist() == list(range(n))
                assert batch["labels"][row, start] == IGNORE  # not predicted from the previous example
                alone = hidden_states(model, collate([one], dataset.pad_id))
                torch.testing.assert_close(hidden[row, start : start + n], alone[0], rtol=1e-5, atol=1e-5)
                alone_loss += loss_sum(model, collate([one], dataset.pad_id))
                start += n
    torch.testing.assert_close(packed_loss, alone_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flat_loss, alone_loss, rtol=1e-5, atol=1e-5)

    # perturbing the first example of a pack leaves the next one's outputs unchanged; a plain causal mask
    # (what a 2D attention mask gives) would not
    p = next(p for p in packs if len(p.lengths) >= 2)
    first, second = p.lengths[0], p.lengths[1]
    changed = [(t + 1) % 50 + 3 for t in p.input_ids[:first]] + p.input_ids[first:]
    perturbed = type(p)(changed, p.labels, p.lengths)
    with torch.no_grad():
        outs = [hidden_states(model, collate([q], dataset.pad_id)) for q in (p, perturbed)]
        causal = [
            hidden_states(model, {**b, "attention_mask": torch.ones_like(b["input_ids"])})
            for b in (collate([q], dataset.pad_id) for q in (p, perturbed))
        ]
    window = slice(first, first + second)
    torch.testing.assert_close(outs[0][0, window], outs[1][0, window], rtol=0, atol=1e-6)
    assert (causal[0][0, window] - causal[1][0, window]).abs().max() > 1e-3


def test_a_model_that_would_mix_packed_examples_is_refused() -> None:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4))  # ALiBi
    with pytest.raises(NotIsolated, match=r"^data.packing: this model \(bloom\) does not keep packed"):
        verify(bloom)
    assert issubclass(NotIsolated, DataError)  # python -m trainer exits 2 with this one line


def test_packed_run_resumes_bitwise_and_counts_packed_steps(tmp_path: Path, tiny_model: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", "text", 48)
    job = job_dict(
        tiny_model,
        data,
        tmp_path / "runs",
        data={"format": "text", "max_seq_len": 64, "packing": True},
        train={"micro_batch_size": 2, "grad_accum": 1, "max_steps": None, "epochs": 2},
        checkpoint={"every": 3},
    )
    reference = prepare_run(job, "reference")
    done = run_trainer(reference)
    assert done.returncode == 0, done.stdout + done.stderr
    packed = next(line for line in done.stdout.splitlines() if "packed 48 examples into" in line)
    sequences = int(packed.split(" into ")[1].split()[0])
    steps = 2 * (sequences // 2)  # epochs x packs / effective batch
    assert f"48 examples in {sequences} packs" in done.stdout and f"{steps} steps" in done.stdout

    from trainer.runstore.store import RunStore

    killed = prepare_run(job, "killed")  # SIGKILL mid-run, while step 6's checkpoint is being written
    first = run_trainer(
        killed, 1, env={"FTORCH_ASYNC_CHECKPOINT": "0", "FTORCH_FAULTS": "checkpoint-partial@6"}
    )
    assert first.returncode == -signal.SIGKILL
    second = run_trainer(killed, 2)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from checkpoints/step-00000003" in second.stdout
    assert RunStore(killed).read_progress()["total_steps"] == steps
    assert_bitwise_equal(final_weights(killed), final_weights(reference))

    # the planner counts the same packs (on its ~4 chars/token estimate of the lengths) and steps
    from orchestrator.jobfile.spec import validate_job
    from orchestrator.sizing.throughput import count_local_tokens, workload

    spec = validate_job(job)
    lengths: list[int] = []
    count_local_tokens(spec.data, lengths)
    work = workload(spec)
    assert work.sequences_per_epoch == packed_count(lengths, 64) < len(lengths)
    assert work.steps(2) == 2 * (work.sequences_per_epoch // 2)
    assert work.tokens_per_sequence == pytest.approx(sum(lengths) / work.sequences_per_epoch)
