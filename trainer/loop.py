"""The training loop: resume from the newest good checkpoint, train, checkpoint, stop on notice."""

from __future__ import annotations

import math
import os
import platform
import tempfile
import time
from typing import Any

import torch

from trainer import exitcodes
from trainer.checkpoints import fingerprint
from trainer.checkpoints.async_save import AsyncCheckpointer
from trainer.checkpoints.checkpoint import Decoded, TrainerState, UnloadableCheckpoint, decode, restore
from trainer.checkpoints.checkpointer import Checkpointer, CheckpointWriter
from trainer.checkpoints.sharded import ShardedWriter, load_newest, newest_is_sharded
from trainer.config import JobSpec
from trainer.data.cache import data_identity
from trainer.data.dataset import IGNORE, Dataset, collate, load_dataset
from trainer.data.packing import example_count, uses_flat_batches
from trainer.data.packing_check import verify as verify_packing
from trainer.distributed import Parallel, Sharded
from trainer.distributed import setup as setup_parallel
from trainer.faults import maybe_crash
from trainer.layout import check as check_layout
from trainer.layout import total_steps as steps_for
from trainer.loss import evaluate_batch, shifted_labels
from trainer.memory import allocator
from trainer.model import autocast_dtype, count_parameters, load_tokenizer, pick_device
from trainer.notify import TrainerNotifier
from trainer.runstore.progress import ProgressReporter, log
from trainer.runstore.store import CorruptCheckpoint, RunStore
from trainer.step import accumulate, make_scaler, restore_scaler, save_scaler, update
from trainer.stops.interruptions import SUPERVISOR_LOST, how_it_ended
from trainer.stops.notices import start_watcher
from trainer.stops.preemption import PreemptionFlag, install_signal_handlers
from trainer.stops.stop_request import start_stop_watcher
from trainer.trackers import Trackers


def total_steps(spec: JobSpec, dataset: Dataset) -> int:
    t = spec.train
    return steps_for(len(dataset.train), t.micro_batch_size, t.grad_accum, t.epochs, t.max_steps)


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
    if spec.train.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        from trainer.quant import make_8bit_optimizer

        return make_8bit_optimizer(spec, params)
    if spec.train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.train.lr, momentum=0.9, weight_decay=spec.train.weight_decay)
    if spec.train.optimizer == "adafactor":  # factored second moments, no first moment: ~4 B/param or less
        return torch.optim.Adafactor(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay)
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
            loss, predicted = evaluate_batch(model, batch)  # in chunks: no full-vocabulary logits
        labels = shifted_labels(batch["labels"])
        mask = labels != IGNORE
        losses += loss
        tokens += int(mask.sum())
        correct = (predicted == labels) | ~mask
        exact += int(correct.all(dim=1).sum())
    if was_training:
        model.train()
    return {
        "loss": losses / max(1, tokens),
        "exact_match": exact / len(dataset.held_out),
        "examples": len(dataset.held_out),
    }


def _quiet_evaluate(
    model: torch.nn.Module, dataset: Dataset, device: torch.device, spec: JobSpec
) -> dict[str, float]:
    """`evaluate` mid-run, leaving the random state as it found it: training then goes on exactly as
    without it (and as after a resume), so exact resume holds with train.eval_every."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return evaluate(model, dataset, device, spec)


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


def _record_output(
    store: RunStore,
    spec: JobSpec,
    resolved: dict[str, Any],
    steps: int,
    state: TrainerState,
    dataset: Dataset,
    attempt: int,
    output_uri: str,
) -> None:
    """training_summary.json and the model card in the output folder (trainer/model_card.py)."""
    from trainer import model_card

    try:
        model_card.record(
            store,
            RunStore(output_uri, spec.checkpoint.storage_options),
            spec,
            resolved,
            steps=steps,
            tokens_seen=state.tokens_seen,
            examples=example_count(dataset.train),
            held_out_examples=len(dataset.held_out),
            data_tokens=dataset.tokens,
            eval_before=state.extra.get("eval_before"),
            eval_after=state.extra.get("eval_after"),
            attempt=attempt,
            output_uri=output_uri,
        )
    except Exception as exc:  # noqa: BLE001 - the adapter is written; the card is a record of it
        log(f"could not write the model card ({exc.__class__.__name__}: {exc})")


def run(run_uri: str, attempt: int, storage_options: dict[str, Any] | None = None) -> int:
    flag = PreemptionFlag()
    install_signal_handlers(flag)
    start_watcher(flag, log=log)  # cloud preemption notices (AWS/GCP/Azure metadata); ends off-cloud
    store = RunStore(run_uri, storage_options)
    resolved = store.read_spec()
    spec = JobSpec.model_validate(resolved["job"])
    store = RunStore(run_uri, spec.checkpoint.storage_options)
    start_stop_watcher(flag, store, log=log)  # a cloud controller's switch request (run store)
    if int(os.environ.get("RANK", "0")) == 0:  # fencing: this attempt's epoch; older attempts stop writing
        epoch = store.claim_epoch({"attempt": attempt, "pid": os.getpid(), "host": platform.node()})
        log(f"attempt {attempt} holds epoch {epoch} of the run")
    output_uri = resolved["output_uri"]
    if spec.local.threads:
        torch.set_num_threads(spec.local.threads)
    device = pick_device(spec.local.device)
    # the same rules as the planner's: refuse a layout the job cannot run on before any work (exit 2)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    layout = check_layout(spec, world, int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None)
    # the spec fingerprint (trainer/checkpoints/fingerprint.py): a job or data changed since the newest checkpoint is
    # refused (exit 2) unless `ftorch resume --allow-change` allowed it; every checkpoint records it
    identity = data_identity(spec.data, spec.checkpoint.storage_options)
    start_check = fingerprint.check_start(store, resolved, identity, log)
    store.checkpoint_meta = start_check.meta
    # FSDP across ranks (torchrun, or a sharded run resumed by one process), or the identity
    par = setup_parallel(spec, device, store, resume_sharded=newest_is_sharded(store))
    log(f"attempt {attempt} of run {resolved['run_id']} on {device} (torch {torch.__version__})")
    log(f"layout: {layout.describe()}")

    log(f"loading the tokenizer of {spec.model}")
    tokenizer = load_tokenizer(spec)
    dataset = load_dataset(
        spec.data,
        tokenizer,
        spec.train.micro_batch_size,
        spec.train.seed,
        spec.checkpoint.storage_options,
        cache_store=store,
        identity=identity,
    )
    steps = total_steps(spec, dataset)
    loading = time.monotonic()
    log(f"loading the model {spec.model} ({spec.method}, {spec.train.precision})")
    model = par.load(spec, device)
    log(f"model loaded in {time.monotonic() - loading:.1f} s")
    params, trainable = count_parameters(model)
    optimizer = make_optimizer(spec, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_for(spec, steps))
    scaler = make_scaler(spec, device)  # fp16-mixed only
    if spec.data.packing:  # refuse (exit 2) a model whose attention would mix packed examples; after the
        # optimizer is made (under FSDP2 a forward before it broke the sharded optimizer state dict)
        verify_packing(model, uses_flat_batches(spec.train.attn_implementation), autocast_dtype(spec))
    log(
        f"model {os.path.basename(spec.model.rstrip('/'))}: {params:,} params, {trainable:,} trainable "
        f"({spec.method}); {example_count(dataset.train)} examples"
        f"{f' in {len(dataset.train)} packs' if spec.data.packing else ''}, {dataset.tokens:,} tokens; {steps} steps"
    )

    state = _resume(store, spec, par, model, optimizer, scheduler, steps)
    resumed = state is not None
    if state is not None:  # the same examples when the effective batch is split differently
        state.micro_batches = start_check.data_position(
            state.step, state.micro_batches, resolved["job"], len(dataset.train)
        )
    if state is None:
        state = TrainerState(step=0, micro_batches=0, tokens_seen=0, extra={})
        if dataset.held_out:
            state.extra["eval_before"] = evaluate(model, dataset, device, spec)
            log(f"held-out before training: {_fmt_eval(state.extra['eval_before'])}")
    state.extra["attempt"] = attempt
    restore_scaler(scaler, state.extra)
    if par.is_main:
        partial = store.remove_partial_checkpoints()
        if partial:
            log(f"removed incomplete checkpoint(s) left by earlier attempts: {', '.join(partial)}")
        store.prune_checkpoints(spec.checkpoint.keep)

    checkpointer = Checkpointer(store, spec, _writer(store, spec, par, attempt), state.step, agree=par.any)
    reporter = par.reporter(ProgressReporter(store, resolved["run_id"], attempt, steps, output_uri))
    reporter.last_checkpoint(checkpointer.last_step if resumed else None)
    cuda_allocator = allocator.record(device.type)  # expandable segments (trainer/memory/allocator.py)
    if cuda_allocator:
        reporter.extra["cuda_allocator"] = cuda_allocator
        log(f"CUDA allocator: {cuda_allocator['setting']} (set by {cuda_allocator['source']})")
    reporter.start(state.step)
    # notify: the webhook posts the trainer makes itself (trainer/notify.py; bounded, never raises)
    notifier = TrainerNotifier(store, resolved, attempt, steps, log)
    if resumed:
        notifier.resumed(state.step)
    trackers = Trackers(
        store,
        spec.train.report_to if par.is_main else [],
        attempt,
        state.step,
        resolved["run_id"],
        resolved["job"],
    )
    if state.step == 0 and state.extra.get("eval_before"):
        trackers.scalar("eval/loss", state.extra["eval_before"]["loss"], 0)

    model.train()
    log_every = spec.train.log_every or max(1, steps // 100)
    eval_every = spec.train.eval_every if dataset.held_out else None
    while state.step < steps:
        if par.any(flag.is_set()):  # all ranks stop at the same step
            code = _stop_on_notice(flag, checkpointer, model, optimizer, scheduler, state, reporter)
            notifier.stopped(state.step, flag.reason)  # the budget stop, or a preemption notice
            trackers.close()  # after the checkpoint: W&B's finish may take a while
            return code
        # the job's effective batch on this many ranks (trainer/layout.py): global micro-batches
        micro = layout.step_micro_batches(dataset, state.micro_batches)
        step_loss, seen = accumulate(
            model, micro, spec=spec, device=device, pad_id=dataset.pad_id, local=par.local,
            world=par.world, scaler=scaler, tokens=par.tokens,
        )  # fmt: skip
        state.tokens_seen += seen
        step_loss = par.mean(step_loss)
        grad_norm = update(model, optimizer, spec.train.max_grad_norm, scaler)
        save_scaler(scaler, state.extra)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.micro_batches += spec.train.grad_accum  # the data position, in the job's micro-batches
        lr = scheduler.get_last_lr()[0]
        maybe_crash("crash", state.step)
        reporter.step(state.step, step_loss, lr, state.tokens_seen, grad_norm)
        trackers.step(
            state.step,
            {
                "loss": step_loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_s": reporter.tokens_per_s() or None,
            },
        )
        if state.step % log_every == 0 or state.step == steps:
            log(
                f"step {state.step}/{steps} loss {step_loss:.4f} lr {lr:.2e} "
                f"tok/s {reporter.tokens_per_s():,.0f}"
            )
        if eval_every and state.step % eval_every == 0 and state.step < steps:
            result = _quiet_evaluate(model, dataset, device, spec)
            log(f"step {state.step}/{steps} held-out {_fmt_eval(result)}")
            reporter.eval_loss(state.step, result["loss"])
            trackers.scalar("eval/loss", result["loss"], state.step)
        if state.step < steps and checkpointer.due(state.step, time.time()):
            reporter.set_state("checkpointing")
            checkpointer.save(model, optimizer, scheduler, state)
            reporter.last_checkpoint(checkpointer.durable_step)
            trackers.flush()
            reporter.set_state("running")

    if checkpointer.last_step != state.step:
        checkpointer.save(model, optimizer, scheduler, state, wait=True)
    checkpointer.finish()
    reporter.last_checkpoint(state.step)
    if dataset.held_out:
        state.extra["eval_after"] = evaluate(model, dataset, device, spec)
        log(f"held-out after training:  {_fmt_eval(state.extra['eval_after'])}")
        reporter.eval_loss(state.step, state.extra["eval_after"]["loss"])
        trackers.scalar("eval/loss", state.extra["eval_after"]["loss"], state.step)
    trackers.close()
    reporter.set_state("writing_output")
    par.write_output(write_output, model, tokenizer, spec, output_uri)
    reporter.finish(eval_before=state.extra.get("eval_before"), eval_after=state.extra.get("eval_after"))
    if par.is_main:
        _record_output(store, spec, resolved, steps, state, dataset, attempt, output_uri)
    store.update_epoch_record(ended="finished", step=state.step)
    log(f"done: {steps} steps; output at {output_uri}")
    notifier.succeeded(state.step, getattr(reporter, "loss", None))
    return exitcodes.OK


def _resume(
    store: RunStore, spec: JobSpec, par: Parallel, model: Any, optimizer: Any, scheduler: Any, steps: int
) -> TrainerState | None:
    """Load the newest checkpoint this world can read into model, optimizer and scheduler; None if none."""

    def skipped(what: Any, why: str) -> None:
        name = what if isinstance(what, str) else what.path
        log(f"not using checkpoint {name}: {why}")

    if isinstance(par, Sharded):  # sharded (DCP) or single-process checkpoints, resharded onto these ranks
        loaded = load_newest(store, spec, par, model, optimizer, scheduler, on_skip=skipped)
        if loaded is None:
            return None
        info, state = loaded
    else:
        found = store.newest_valid_checkpoint(on_skip=skipped, decode=_decode_or_skip)
        if found is None:
            return None
        info, decoded = found
        state = restore(decoded, model, optimizer, scheduler)
    log(f"resumed from {info.path} (step {state.step}/{steps})")
    return state


def _writer(store: RunStore, spec: JobSpec, par: Parallel, attempt: int) -> CheckpointWriter:
    """DCP shards from every rank, or one process's files (snapshot, then a background upload)."""
    if isinstance(par, Sharded):
        return ShardedWriter(store, spec, par)
    return AsyncCheckpointer(store, spec.checkpoint.keep, log, meta={"attempt": attempt})


def _decode_or_skip(blobs: dict[str, bytes]) -> Decoded:
    """A checkpoint that cannot be loaded safely is skipped like a corrupt one."""
    try:
        return decode(blobs)
    except UnloadableCheckpoint as exc:
        raise CorruptCheckpoint(f"cannot be loaded safely: {exc}") from None


def _stop_on_notice(
    flag: PreemptionFlag,
    checkpointer: Checkpointer,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    state: TrainerState,
    reporter: ProgressReporter,
) -> int:
    ended = how_it_ended(checkpointer.store)  # a requested stop (cancel, budget) is no interruption
    if ended.get("stop_reason") == SUPERVISOR_LOST:
        log(f"the supervisor that started this trainer is gone (SIGTERM) at step {state.step}: saving")
    elif ended["ended"] == "stopped":
        log(f"stop requested ({ended['stop_reason']}) at step {state.step}: saving before leaving")
    else:
        log(f"preemption notice ({flag.reason}) at step {state.step}: saving before the machine goes")
    checkpointer.finish()  # the upload in flight first, then the final checkpoint
    if checkpointer.last_step != state.step:
        reporter.set_state("checkpointing")
        checkpointer.save(model, optimizer, scheduler, state, wait=True)
        checkpointer.finish()
    reporter.last_checkpoint(state.step)
    checkpointer.store.update_epoch_record(**ended, step=state.step)
    reporter.set_state("preempted", flush=True)
    log(f"checkpoint at step {state.step} is safe; exiting with code {exitcodes.PREEMPTED} (preempted)")
    return exitcodes.PREEMPTED


def _fmt_eval(result: dict[str, float]) -> str:
    return (
        f"loss {result['loss']:.4f}, exact match {result['exact_match']:.0%} "
        f"on {int(result['examples'])} examples"
    )
