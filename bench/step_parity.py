"""Step parity: ftorch's training step next to a plain PEFT/PyTorch loop on the same job, interleaved.

    .venv/bin/python bench/step_parity.py [--job examples/quickstart.yaml] [--method lora|full]
                                          [--rounds 9] [--steps 10] [--threads 1] [--loss auto]

Both sides train the same model (the job's, loaded by each side its own way, the same seed), on the same
data in the same order (the trainer's tokenized dataset and its step's micro-batches), with the same
LoRA, batch, precision, optimizer (AdamW), LR schedule and clipping, in one process:

- ftorch: `trainer.loop._train_step` on the trainer's own objects (model, optimizer, scheduler, data,
  layout): the step as `fit` runs it (collation, the loss path of `train.loss`, accumulation normalised by
  label tokens, clipping, the update), without fit's checkpoints and progress reports;
- plain: a textbook loop: `AutoModelForCausalLM.from_pretrained` + `get_peft_model`, pad with
  `pad_sequence`, `model(**batch, labels=...).loss.backward()`, `clip_grad_norm_`, `AdamW.step()`,
  scheduler, `zero_grad`.

Each round runs `--steps` optimizer steps per side, one step each in turn, alternating which side goes
first (so a change of the machine's load hits both alike); a round's ratio is its tokens/s ftorch over
plain. Tokens/s
counts the input tokens (no padding) each side trained on (the same examples). The first step's losses
of both sides are printed next to each other (they must agree). Prints per round, then, last,
`ratio R (min A, max B over N rounds)`: the median of the per-round ratios ftorch tokens/s over plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def load_spec(job: str, method: str, loss: str) -> Any:
    from orchestrator.jobfile.spec import load_job

    overrides = [f"method={method}", f"train.loss={loss}", "local.threads=0"]
    return load_job(job, overrides, check_support=False)


def ftorch_side(spec: Any, device: torch.device) -> Any:
    """The trainer's own objects, as `trainer.loop.setup` builds them for a single process."""
    from trainer.checkpoints.checkpoint import TrainerState
    from trainer.data.dataset import load_dataset
    from trainer.distributed import Parallel
    from trainer.layout import layout_for
    from trainer.loop import Optimization, lr_lambda_for, make_optimizer, total_steps
    from trainer.model.load import load_model, load_tokenizer
    from trainer.train_step.step import make_scaler

    tokenizer = load_tokenizer(spec)
    dataset = load_dataset(spec.data, tokenizer, spec.train.micro_batch_size, spec.train.seed)
    steps = total_steps(spec, dataset)
    model = load_model(spec, device)
    model.train()
    optimizer = make_optimizer(spec, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_for(spec, steps))
    return SimpleNamespace(
        spec=spec, device=device, dataset=dataset, layout=layout_for(spec, 1), par=Parallel(), steps=steps,
        opt=Optimization(model, optimizer, scheduler, make_scaler(spec, device)),
        state=TrainerState(step=0, micro_batches=0, tokens_seen=0), health=None, watchdog=None,
    )  # fmt: skip


def plain_side(spec: Any, device: torch.device, steps: int) -> Any:
    """A textbook PEFT loop's objects: the model as transformers and PEFT load it, torch's AdamW."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.loop import lr_lambda_for
    from trainer.model.load import base_dtype

    torch.manual_seed(spec.train.seed)
    model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=base_dtype(spec))
    model.config.use_cache = False
    if spec.method == "lora":
        torch.manual_seed(spec.train.seed)
        lora = spec.lora
        config = LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=lora.target_modules, task_type="CAUSAL_LM",
        )  # fmt: skip
        model = get_peft_model(model, config)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_for(spec, steps))
    return SimpleNamespace(model=model, params=params, optimizer=optimizer, scheduler=scheduler, step=0)


def run_ftorch(a: Any, n: int) -> tuple[int, float, list[float]]:
    """n optimizer steps of the trainer's step: (input tokens, seconds, losses)."""
    from trainer.loop import _train_step

    losses = []
    tokens_before = a.state.tokens_seen
    started = time.perf_counter()
    for _ in range(n):
        if a.state.step >= a.steps:  # wrap around: the data's order again (the timing is what counts)
            a.state.step, a.state.micro_batches = 0, 0
        loss, _lr, _norm = _train_step(a)
        losses.append(loss)
    return a.state.tokens_seen - tokens_before, time.perf_counter() - started, losses


def run_plain(p: Any, a: Any, n: int, pad_id: int) -> tuple[int, float, list[float]]:
    """n optimizer steps of the plain loop over the same micro-batches the trainer's step takes."""
    from torch.nn.utils.rnn import pad_sequence

    spec, device = a.spec, a.device
    accum = spec.train.grad_accum
    amp = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(spec.train.precision)
    losses, tokens = [], 0
    started = time.perf_counter()
    for _ in range(n):
        if p.step >= a.steps:
            p.step = 0
        micro = a.layout.step_micro_batches(a.dataset, p.step * accum)
        total = 0.0
        for examples in micro:
            ids = [torch.tensor(e.input_ids) for e in examples]
            labels = [torch.tensor(e.labels) for e in examples]
            batch = {
                "input_ids": pad_sequence(ids, batch_first=True, padding_value=pad_id).to(device),
                "attention_mask": pad_sequence(
                    [torch.ones_like(t) for t in ids], batch_first=True, padding_value=0
                ).to(device),
                "labels": pad_sequence(labels, batch_first=True, padding_value=-100).to(device),
            }
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = p.model(**batch).loss / len(micro)
            loss.backward()
            total += float(loss.detach())
            tokens += sum(len(e.input_ids) for e in examples)
        if spec.train.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(p.params, spec.train.max_grad_norm)
        p.optimizer.step()
        p.scheduler.step()
        p.optimizer.zero_grad(set_to_none=True)
        p.step += 1
        losses.append(total)
    return tokens, time.perf_counter() - started, losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--method", default="lora", choices=["lora", "full"])
    parser.add_argument("--loss", default="auto", choices=["auto", "chunked", "plain"], help="train.loss")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per side per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per side first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    spec = load_spec(args.job, args.method, args.loss)
    a = ftorch_side(spec, device)
    p = plain_side(spec, device, a.steps)
    pad_id = a.dataset.pad_id
    _, _, first_f = run_ftorch(a, 1)
    _, _, first_p = run_plain(p, a, 1, pad_id)
    print(
        f"{spec.method}, train.loss {spec.train.loss}, {spec.train.precision}, micro-batch "
        f"{spec.train.micro_batch_size} x accum {spec.train.grad_accum}, {args.threads} thread(s), torch "
        f"{torch.__version__}"
    )
    print(f"first step's loss: ftorch {first_f[0]:.6f}  plain {first_p[0]:.6f}")
    run_ftorch(a, args.warmup)
    run_plain(p, a, args.warmup, pad_id)
    ratios = []
    for r in range(args.rounds):
        totals = {"ftorch": [0, 0.0], "plain": [0, 0.0]}
        for i in range(args.steps):  # one step each, alternating which goes first: load drifts cancel
            order = ("ftorch", "plain") if (r + i) % 2 == 0 else ("plain", "ftorch")
            for side in order:
                tokens, seconds, _ = run_ftorch(a, 1) if side == "ftorch" else run_plain(p, a, 1, pad_id)
                totals[side][0] += tokens
                totals[side][1] += seconds
        rates = {side: tokens / seconds for side, (tokens, seconds) in totals.items()}
        ratios.append(rates["ftorch"] / rates["plain"])
        print(
            f"round {r + 1}: ftorch {rates['ftorch']:8.0f} tok/s  plain {rates['plain']:8.0f} tok/s"
            f"  ratio {ratios[-1]:.3f}",
            flush=True,
        )
    print(
        f"ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
