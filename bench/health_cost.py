"""What the health checks (train.health, trainer/health/rules.py) cost per step, side by side.

The quickstart's model and job (examples/quickstart.yaml: LoRA on the tiny model, micro-batch 16, fp32,
max_grad_norm 1.0) take real optimizer steps through the trainer's own `accumulate` and `update`, with the
health guard's `go` (the all-reduced flag through `Parallel.any`, the rules' judgement) and without it.
The two kinds are interleaved step by step, so drift in the machine's load hits both alike. The figure is
the median step time of each and their ratio; the goal is under 1%. On a loaded machine the ratio is
mostly noise, so the checks' own work is also timed alone (10,000 judgements) against the step.

It covers one process on this machine's CPU: the flag's all-reduce is then the identity, and a GPU's small
all-reduce per step is not measured. The per-checkpoint pass over the trainable weights is timed too
(it runs once per checkpoint, not per step).

Usage: python bench/health_cost.py [--steps 60] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps of each kind")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from orchestrator.jobfile.spec import load_job
    from trainer.data.dataset import load_dataset
    from trainer.distributed import Parallel
    from trainer.health.guard import HealthGuard, _weights_finite
    from trainer.health.rules import HealthRules
    from trainer.layout import layout_for
    from trainer.loop import make_optimizer
    from trainer.model.load import load_tokenizer
    from trainer.train_step.step import accumulate, update

    spec = load_job(REPO / "examples" / "quickstart.yaml")
    par = Parallel()
    device = torch.device("cpu")
    tokenizer = load_tokenizer(spec)
    data = load_dataset(spec.data, tokenizer, spec.train.micro_batch_size, spec.train.seed)
    model = par.load(spec, device)
    model.train()
    optimizer = make_optimizer(spec, model)
    layout = layout_for(spec)
    guard = HealthGuard.__new__(HealthGuard)  # the guard's per-step part only: no attempt around it
    guard.a = SimpleNamespace(par=par)
    guard.rules = HealthRules(spec.train.health)
    guard.scaled = False

    def step(position: int, checked: bool) -> float:
        micro = layout.step_micro_batches(data, position)
        started = time.perf_counter()
        loss, _seen = accumulate(model, micro, spec=spec, device=device, pad_id=data.pad_id)
        go = guard.go_for(position + 1, loss) if checked else None
        update(model, optimizer, spec.train.max_grad_norm, None, go)
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    for position in range(3):  # warm-up
        step(position, True)
    on, off = [], []
    for i in range(args.steps):
        (on if i % 2 == 0 else off).append(step(3 + i, i % 2 == 0))
        (off if i % 2 == 0 else on).append(step(3 + i, i % 2 != 0))
    started = time.perf_counter()
    for k in range(10_000):  # the checks' own work per step, alone: the flag and the rules' judgement
        guard.go_for(10_000 + k, 2.5)(1.0)
    alone_s = (time.perf_counter() - started) / 10_000
    started = time.perf_counter()
    for _ in range(10):
        _weights_finite(model)
    weights_s = (time.perf_counter() - started) / 10
    on_s, off_s = statistics.median(on), statistics.median(off)
    print(f"quickstart step on {args.threads} CPU thread(s), median of {len(on)} steps each:")
    print(f"  health checks off  {off_s * 1e3:8.2f} ms")
    print(f"  health checks on   {on_s * 1e3:8.2f} ms")
    print(f"  ratio on/off       {on_s / off_s:8.4f}  ({(on_s / off_s - 1) * 100:+.2f}%; goal < +1%)")
    print(f"  the checks alone   {alone_s * 1e6:8.2f} us per step ({alone_s / off_s * 100:.4f}% of a step)")
    print(
        f"  per checkpoint: finite-weights pass {weights_s * 1e3:.2f} ms ({weights_s / off_s * 100:.2f}% of a step)"
    )


if __name__ == "__main__":
    main()
