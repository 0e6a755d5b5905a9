"""The training loop: resume from the newest good checkpoint, train, checkpoint, stop on notice."""

from __future__ import annotations

import errno
import math
import os
import platform
import tempfile
import time
from typing import Any

import torch

from trainer import exitcodes
from trainer.async_checkpoint import AsyncCheckpointer, StagingError
from trainer.checkpoint import Decoded, TrainerState, UnloadableCheckpoint, decode, restore
from trainer.checkpoint_interval import AutoInterval, History
from trainer.config import JobSpec
from trainer.data import Dataset, collate, load_dataset
from trainer.distributed import setup as setup_parallel
from trainer.faults import maybe_crash
from trainer.interruptions import how_it_ended
from trainer.layout import check as check_layout
from trainer.model import autocast_dtype, count_parameters, load_model, load_tokenizer, pick_device
from trainer.notices import start_watcher
from trainer.preemption import PreemptionFlag, install_signal_handlers
from trainer.progress import ProgressReporter, debug, log
from trainer.stop_request import start_stop_watcher
from trainer.store import CorruptCheckpoint, Fenced, RunStore, StoreUnavailable, checkpoint_name
from trainer.trackers import Trackers


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
    if spec.train.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        from trainer.quant import make_8bit_optimizer

        return make_8bit_optimizer(spec, params)
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


class Checkpointer:
    """Decides when to checkpoint (every N steps, a duration, or auto = Young/Daly), and saves through
    the asynchronous writer. Store failures that must end the attempt become their exit codes."""

    def __init__(self, store: RunStore, spec: JobSpec, last_step: int, attempt: int) -> None:
        self.store = store
        self.spec = spec
        self.last_step = last_step
        self.last_time = time.time()
        self.writer = AsyncCheckpointer(store, spec.checkpoint.keep, log, meta={"attempt": attempt})
        self.writer.durable_step = last_step if last_step > 0 else None
        self.auto = AutoInterval(history=History.from_epochs(store.epoch_records(), store.epoch, time.time()))
        self.interval_s: float | None = None

    def due(self, step: int, now: float) -> bool:
        self.poll()
        every_steps = self.spec.checkpoint.every_steps()
        if every_steps is not None:
            return step % every_steps == 0
        interval = self.spec.checkpoint.every_seconds()
        if interval is None:
            interval = self._auto_interval()
        return now - self.last_time >= interval

    def _auto_interval(self) -> float:
        interval, why = self.auto.choose()
        if self.interval_s is None:  # the first choice; later re-estimates only at debug level
            log(f"checkpoint every {interval:.0f} s (auto; FTORCH_LOG_LEVEL=debug says why)")
        if self.interval_s is None or abs(interval - self.interval_s) > 0.2 * self.interval_s:
            debug(f"checkpoint interval (auto) {why}")
        self.interval_s = interval
        return interval

    def poll(self) -> None:
        try:
            self.writer.poll()
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            _stop_for(exc)

    def save(
        self, model: torch.nn.Module, optimizer: Any, scheduler: Any, state: TrainerState, wait: bool = False
    ) -> None:
        try:
            previous = self.writer.last
            result = self.writer.save(model, optimizer, scheduler, state, wait=wait)
            if wait:
                self.writer.wait()
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            _stop_for(exc)
        if result is None:
            return
        self.last_step = state.step
        self.last_time = time.time()
        done = self.writer.last if self.writer.last is not previous else None
        self.auto.observe(result.blocking_s, done.upload_s if done else self.auto.upload_s)

    def finish(self) -> None:
        """Wait for the upload in flight; fail the attempt if its checkpoint is not durable."""
        try:
            self.writer.wait()
            if self.writer.durable_step != self.last_step and self.last_step > 0:
                error = self.writer.last.error if self.writer.last is not None else None
                raise StoreUnavailable(
                    f"checkpoint {checkpoint_name(self.last_step)} could not be saved{_cause(error)}; "
                    f"the last good checkpoint is {self.writer._last_good()}"
                )
        except BaseException as exc:  # noqa: BLE001 - mapped to an exit code
            _stop_for(exc)


def _cause(error: BaseException | None) -> str:
    """Why a save failed, for the one line the supervisor shows: a full disk is named as such."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f": the run store's disk is full ({errno.errorcode[error.errno]}); free space, then resume"
    if error is not None:
        return f" ({error.__class__.__name__}: {' '.join(str(error).split())[:200]})"
    return ""


def _stop_for(exc: BaseException) -> None:
    """Fenced -> FENCED, store outage -> STORE_UNAVAILABLE, full staging disk -> ERROR; else re-raise."""
    if isinstance(exc, Fenced):
        log(f"fenced: {exc}")
        raise SystemExit(exitcodes.FENCED) from None
    if isinstance(exc, StoreUnavailable):
        log(f"error: {exc}" if "disk is full" in str(exc) else f"error: store unavailable: {exc}")
        raise SystemExit(exitcodes.STORE_UNAVAILABLE) from None
    if isinstance(exc, StagingError):
        log(f"error: {exc}")
        raise SystemExit(exitcodes.ERROR) from None
    raise exc


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
            examples=len(dataset.train),
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
    par = setup_parallel(spec, device, store)  # FSDP across ranks (torchrun), or the identity
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
    )
    steps = total_steps(spec, dataset)
    loading = time.monotonic()
    log(f"loading the model {spec.model} ({spec.method}, {spec.train.precision})")
    model = par.wrap(load_model(spec, device), spec)
    log(f"model loaded in {time.monotonic() - loading:.1f} s")
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

    if par.sharded:  # sharded (DCP) or single-process checkpoints, resharded onto these ranks
        found = par.load_newest(store, spec, model, optimizer, scheduler, on_skip=skipped)
    else:
        found = store.newest_valid_checkpoint(on_skip=skipped, decode=_decode_or_skip)
    if found is not None and par.sharded:
        info, state = found
        log(f"resumed from {info.path} (step {state.step}/{steps})")
    elif found is not None:
        info, blobs = found
        state = restore(blobs, model, optimizer, scheduler)
        log(f"resumed from {info.path} (step {state.step}/{steps})")
    else:
        state = TrainerState(step=0, micro_batches=0, tokens_seen=0, extra={})
        if dataset.held_out:
            state.extra["eval_before"] = evaluate(model, dataset, device, spec)
            log(f"held-out before training: {_fmt_eval(state.extra['eval_before'])}")
    state.extra["attempt"] = attempt
    if par.is_main:
        partial = store.remove_partial_checkpoints()
        if partial:
            log(f"removed incomplete checkpoint(s) left by earlier attempts: {', '.join(partial)}")
        store.prune_checkpoints(spec.checkpoint.keep)

    checkpointer = par.checkpointer(Checkpointer(store, spec, last_step=state.step, attempt=attempt))
    reporter = par.reporter(ProgressReporter(store, resolved["run_id"], attempt, steps, output_uri))
    reporter.last_checkpoint(checkpointer.last_step if found else None)
    reporter.start(state.step)
    trackers = Trackers(store, spec.train.report_to if par.is_main else [], attempt, state.step)
    if state.step == 0 and state.extra.get("eval_before"):
        trackers.scalar("eval/loss", state.extra["eval_before"]["loss"], 0)

    model.train()
    amp = autocast_dtype(spec)
    log_every = spec.train.log_every or max(1, steps // 100)
    while state.step < steps:
        if par.any(flag.is_set()):  # all ranks stop at the same step
            trackers.close()
            return _stop_on_notice(flag, checkpointer, model, optimizer, scheduler, state, reporter)
        step_loss = 0.0
        accum = layout.accum  # the job's effective batch on this many ranks (trainer/layout.py)
        for global_batch in layout.step_micro_batches(dataset, state.micro_batches):
            examples = par.local(global_batch)  # this rank's slice
            batch = collate(examples, dataset.pad_id, device)
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = par.loss(model, batch) / accum
            loss.backward()
            step_loss += float(loss.detach())
            state.tokens_seen += par.tokens(batch)
        step_loss = par.mean(step_loss)
        grad_norm = None
        if spec.train.max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], spec.train.max_grad_norm
            )
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # DTensor: FSDP
        optimizer.step()
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
        if state.step < steps and checkpointer.due(state.step, time.time()):
            reporter.set_state("checkpointing")
            checkpointer.save(model, optimizer, scheduler, state)
            reporter.last_checkpoint(checkpointer.writer.durable_step)
            trackers.flush()
            reporter.set_state("running")

    if checkpointer.last_step != state.step:
        checkpointer.save(model, optimizer, scheduler, state, wait=True)
    checkpointer.finish()
    reporter.last_checkpoint(state.step)
    if dataset.held_out:
        state.extra["eval_after"] = evaluate(model, dataset, device, spec)
        log(f"held-out after training:  {_fmt_eval(state.extra['eval_after'])}")
        trackers.scalar("eval/loss", state.extra["eval_after"]["loss"], state.step)
    trackers.close()
    reporter.set_state("writing_output")
    par.write_output(write_output, model, tokenizer, spec, output_uri)
    reporter.finish(eval_before=state.extra.get("eval_before"), eval_after=state.extra.get("eval_after"))
    if par.is_main:
        _record_output(store, spec, resolved, steps, state, dataset, attempt, output_uri)
    store.update_epoch_record(ended="finished", step=state.step)
    log(f"done: {steps} steps; output at {output_uri}")
    return exitcodes.OK


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
    if ended["ended"] == "stopped":
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
