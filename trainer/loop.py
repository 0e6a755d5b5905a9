"""The training loop: resume from the newest good checkpoint, train, checkpoint, stop on notice."""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer import exitcodes
from trainer.checkpoint import TrainerState, capture, restore
from trainer.config import JobSpec
from trainer.data import Dataset, collate, load_dataset
from trainer.faults import maybe_crash
from trainer.model import autocast_dtype, count_parameters, load_model, load_tokenizer, pick_device
from trainer.notices import start_watcher
from trainer.preemption import PreemptionFlag, install_signal_handlers
from trainer.progress import ProgressReporter, log
from trainer.store import RunStore, checkpoint_name

#: assumed mean time between preemptions for `checkpoint.every: auto` (Young/Daly interval)
AUTO_MTBF_S = float(os.environ.get("FTORCH_AUTO_MTBF_S", "3600"))
AUTO_MIN_INTERVAL_S = float(os.environ.get("FTORCH_AUTO_MIN_INTERVAL_S", "5"))
AUTO_MAX_INTERVAL_S = 1800.0


def total_steps(spec: JobSpec, dataset: Dataset) -> int:
    if spec.train.max_steps:
        return spec.train.max_steps
    micro = spec.train.epochs * dataset.micro_batches_per_epoch
    return max(1, int(micro // spec.train.grad_accum))


def lr_lambda_for(spec: JobSpec, steps: int) -> Any:
    warmup = spec.train.warmup_steps
    if warmup is None:
        warmup = math.ceil(spec.train.warmup_ratio * steps)
    schedule = spec.train.schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_optimizer(spec: JobSpec, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.train.lr, momentum=0.9, weight_decay=spec.train.weight_decay)
    return torch.optim.AdamW(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay, foreach=False)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, dataset: Dataset, device: torch.device, spec: JobSpec
) -> dict[str, float]:
    """Loss and exact match (every response token predicted) on the held-back examples."""
    if not dataset.held_out:
        return {}
    was_training = model.training
    model.eval()
    losses, exact, tokens = 0.0, 0, 0
    for start in range(0, len(dataset.held_out), spec.train.micro_batch_size):
        chunk = dataset.held_out[start : start + spec.train.micro_batch_size]
        batch = collate(chunk, dataset.pad_id, device)
        with torch.autocast(
            device.type, dtype=autocast_dtype(spec) or torch.float32, enabled=autocast_dtype(spec) is not None
        ):
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits.float()
        labels = batch["labels"][:, 1:]
        logits = logits[:, :-1]
        mask = labels != -100
        loss = torch.nn.functional.cross_entropy(logits[mask], labels[mask], reduction="sum")
        losses += float(loss)
        tokens += int(mask.sum())
        correct = (logits.argmax(-1) == labels) | ~mask
        exact += int(correct.all(dim=1).sum())
    if was_training:
        model.train()
    return {
        "loss": losses / max(1, tokens),
        "exact_match": exact / len(dataset.held_out),
        "examples": len(dataset.held_out),
    }


@dataclass
class Checkpointer:
    """Decides when to checkpoint, and writes checkpoints to the run store."""

    store: RunStore
    spec: JobSpec
    last_step: int = -1
    last_time: float = 0.0
    last_seconds: float = 0.0

    def due(self, step: int, now: float) -> bool:
        every_steps = self.spec.checkpoint.every_steps()
        if every_steps is not None:
            return step % every_steps == 0
        interval = self.spec.checkpoint.every_seconds()
        if interval is None:  # auto: Young's interval sqrt(2 * cost * MTBF), clamped
            interval = math.sqrt(2.0 * max(self.last_seconds, 0.05) * AUTO_MTBF_S)
            interval = min(AUTO_MAX_INTERVAL_S, max(AUTO_MIN_INTERVAL_S, interval))
        return now - self.last_time >= interval

    def save(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, state: TrainerState) -> float:
        started = time.time()
        blobs = capture(model, optimizer, scheduler, state)
        self.store.commit_checkpoint(state.step, blobs, meta={"attempt": state.extra.get("attempt")})
        self.store.prune_checkpoints(self.spec.checkpoint.keep)
        self.last_step = state.step
        self.last_time = time.time()
        self.last_seconds = self.last_time - started
        log(
            f"checkpoint {checkpoint_name(state.step)} saved in {self.last_seconds * 1000:.0f} ms "
            f"({sum(len(b) for b in blobs.values()) / 1024:.0f} KiB)"
        )
        return self.last_seconds


def write_output(model: torch.nn.Module, tokenizer: Any, spec: JobSpec, output_uri: str) -> None:
    """The final PEFT adapter (LoRA) or HF model folder (full), uploaded to output_uri."""
    output = RunStore(output_uri, spec.checkpoint.storage_options)
    with tempfile.TemporaryDirectory(prefix="ftorch-out-") as tmp:
        if spec.method == "full":
            model.save_pretrained(tmp, safe_serialization=True)
        else:  # the adapter only, never the base's weights (even when lm_head is a LoRA target)
            model.save_pretrained(tmp, safe_serialization=True, save_embedding_layers=False)
        tokenizer.save_pretrained(tmp)
        for root, _dirs, files in os.walk(tmp):
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, tmp)
                with open(path, "rb") as handle:
                    output.write_bytes(rel, handle.read())


def run(run_uri: str, attempt: int, storage_options: dict[str, Any] | None = None) -> int:
    flag = PreemptionFlag()
    install_signal_handlers(flag)
    start_watcher(flag, log=log)  # cloud preemption notices (AWS/GCP/Azure metadata); ends off-cloud
    store = RunStore(run_uri, storage_options)
    resolved = store.read_spec()
    spec = JobSpec.model_validate(resolved["job"])
    store = RunStore(run_uri, spec.checkpoint.storage_options)
    output_uri = resolved["output_uri"]
    if spec.local.threads:
        torch.set_num_threads(spec.local.threads)
    device = pick_device(spec.local.device)
    log(f"attempt {attempt} of run {resolved['run_id']} on {device} (torch {torch.__version__})")

    tokenizer = load_tokenizer(spec)
    dataset = load_dataset(
        spec.data, tokenizer, spec.train.micro_batch_size, spec.train.seed, spec.checkpoint.storage_options
    )
    steps = total_steps(spec, dataset)
    model = load_model(spec, device)
    params, trainable = count_parameters(model)
    optimizer = make_optimizer(spec, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_for(spec, steps))
    log(
        f"model {os.path.basename(spec.model.rstrip('/'))}: {params:,} params, {trainable:,} trainable "
        f"({spec.method}); {len(dataset.train)} examples, {dataset.tokens:,} tokens; {steps} steps"
    )

    def skipped(what: Any, why: str) -> None:
        name = what if isinstance(what, str) else what.path
        log(f"not using checkpoint {name}: {why}")

    found = store.newest_valid_checkpoint(on_skip=skipped)
    if found is not None:
        info, blobs = found
        state = restore(blobs, model, optimizer, scheduler)
        log(f"resumed from {info.path} (step {state.step}/{steps})")
    else:
        state = TrainerState(step=0, micro_batches=0, tokens_seen=0, extra={})
        if dataset.held_out:
            state.extra["eval_before"] = evaluate(model, dataset, device, spec)
            log(f"held-out before training: {_fmt_eval(state.extra['eval_before'])}")
    state.extra["attempt"] = attempt
    store.prune_checkpoints(spec.checkpoint.keep)

    checkpointer = Checkpointer(store, spec, last_step=state.step, last_time=time.time())
    reporter = ProgressReporter(store, resolved["run_id"], attempt, steps, output_uri)
    reporter.last_checkpoint(checkpointer.last_step if found else None)
    reporter.start(state.step)

    model.train()
    amp = autocast_dtype(spec)
    accum = spec.train.grad_accum
    log_every = spec.train.log_every or max(1, steps // 100)
    while state.step < steps:
        if flag.is_set():
            return _stop_on_notice(flag, checkpointer, model, optimizer, scheduler, state, reporter)
        step_loss = 0.0
        for k in range(accum):
            batch = collate(dataset.micro_batch(state.micro_batches + k), dataset.pad_id, device)
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = model(**batch).loss / accum
            loss.backward()
            step_loss += float(loss.detach())
            state.tokens_seen += int(batch["attention_mask"].sum())
        if spec.train.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], spec.train.max_grad_norm
            )
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.micro_batches += accum
        lr = scheduler.get_last_lr()[0]
        maybe_crash("crash", state.step)
        reporter.step(state.step, step_loss, lr, state.tokens_seen)
        if state.step % log_every == 0 or state.step == steps:
            log(
                f"step {state.step}/{steps} loss {step_loss:.4f} lr {lr:.2e} "
                f"tok/s {reporter.tokens_per_s():,.0f}"
            )
        if state.step < steps and checkpointer.due(state.step, time.time()):
            reporter.set_state("checkpointing")
            checkpointer.save(model, optimizer, scheduler, state)
            reporter.last_checkpoint(state.step)
            reporter.set_state("running")

    if checkpointer.last_step != state.step:
        checkpointer.save(model, optimizer, scheduler, state)
        reporter.last_checkpoint(state.step)
    if dataset.held_out:
        state.extra["eval_after"] = evaluate(model, dataset, device, spec)
        log(f"held-out after training:  {_fmt_eval(state.extra['eval_after'])}")
    reporter.set_state("writing_output")
    write_output(model, tokenizer, spec, output_uri)
    reporter.finish(eval_before=state.extra.get("eval_before"), eval_after=state.extra.get("eval_after"))
    log(f"done: {steps} steps; output at {output_uri}")
    return exitcodes.OK


def _stop_on_notice(
    flag: PreemptionFlag,
    checkpointer: Checkpointer,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    state: TrainerState,
    reporter: ProgressReporter,
) -> int:
    log(f"preemption notice ({flag.reason}) at step {state.step}: saving before the machine goes")
    if checkpointer.last_step != state.step:
        reporter.set_state("checkpointing")
        checkpointer.save(model, optimizer, scheduler, state)
        reporter.last_checkpoint(state.step)
    reporter.set_state("preempted", flush=True)
    log(f"checkpoint at step {state.step} is safe; exiting with code {exitcodes.PREEMPTED} (preempted)")
    return exitcodes.PREEMPTED


def _fmt_eval(result: dict[str, float]) -> str:
    return (
        f"loss {result['loss']:.4f}, exact match {result['exact_match']:.0%} "
        f"on {int(result['examples'])} examples"
    )
