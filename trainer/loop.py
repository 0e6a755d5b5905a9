"""The training loop: `setup` (resume from the newest good checkpoint) -> `fit` (train, checkpoint, stop on
notice) -> `finish` (last checkpoint, evaluation, output).

A notice (SIGTERM, a cloud notice, a stop request) is honoured in every phase, not only between steps:
before the first step (tokenisation, model load, checkpoint read, the evaluation before training) the
attempt leaves with nothing to save (`Interrupted`); between the batches of every evaluation (the budget
too, in the mid-run ones); during the evaluation after the last step, once the final checkpoint is
committed (a resume redoes only that evaluation and the output)."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from trainer import envlock, exitcodes, resume_check
from trainer.checkpoints import fingerprint
from trainer.checkpoints.checkpoint import TrainerState
from trainer.checkpoints.checkpointer import Checkpointer
from trainer.checkpoints.sharded import is_sharded
from trainer.checkpoints.versions import check_start as check_versions
from trainer.config import JobSpec
from trainer.data.cache import data_identity
from trainer.data.dataset import IGNORE, Dataset, collate, load_dataset
from trainer.data.packing import example_count, uses_flat_batches
from trainer.distributed import Parallel, collective_timed_out, collective_timeout
from trainer.distributed import setup as setup_parallel
from trainer.faults import (
    maybe_crash,
    maybe_hang,
    maybe_hang_in,
    maybe_nan_grad,
    maybe_oom,
    maybe_poison,
    maybe_slow,
    spike,
)
from trainer.health.guard import HealthGuard
from trainer.health.rules import STEP
from trainer.layout import Layout
from trainer.layout import total_steps as steps_for
from trainer.memory import allocator
from trainer.model.attention import resolve as resolve_attention
from trainer.model.load import autocast_dtype, count_parameters, load_tokenizer, pick_device
from trainer.observers import Observers, StepRecord, StopSource, poll_all
from trainer.optim.build import make_optimizer
from trainer.recording import ledger, recorders
from trainer.recording.measure import Measurer
from trainer.recording.notify import TrainerNotifier
from trainer.recording.recorders import fmt_eval as _fmt_eval
from trainer.recording.trackers import Trackers
from trainer.runstore import scratch
from trainer.runstore.progress import ProgressReporter, log
from trainer.runstore.store import CheckpointListing, RunStore, check_output, check_pinned, output_store
from trainer.stops import budget
from trainer.stops.interruptions import SUPERVISOR_LOST, how_it_ended, process_started_at
from trainer.stops.notices import start_watcher
from trainer.stops.preemption import PreemptionFlag, install_signal_handlers
from trainer.stops.sources import BudgetStop, Interrupted, SpotProbeStop, arm_setup, disarm_setup
from trainer.stops.spot_probe import SpotProbe
from trainer.stops.stop_request import start_stop_watcher
from trainer.stops.watchdog import Watchdog, exit_now, setup_timeout
from trainer.threads import set_threads
from trainer.train_step import oom
from trainer.train_step.loss import evaluate_batch, shifted_labels
from trainer.train_step.packing_check import resolve_for_attempt as resolve_packing
from trainer.train_step.packing_check import verify as verify_packing
from trainer.train_step.step import accumulate, make_scaler, restore_scaler, save_scaler, update


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


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    dataset: Dataset,
    device: torch.device,
    spec: JobSpec,
    stop: Any = None,
    fault: str = "slow-eval",
) -> dict[str, float]:
    """Loss and exact match (every response token predicted) on the held-back examples. `stop()` true
    before a batch (a preemption notice, the budget: the loop's flag) abandons the evaluation ({}), so the
    notice's checkpoint is not kept waiting behind it. `fault`: the FTORCH_FAULTS delay after each batch
    (tests: `slow-eval`, `slow-eval-before`, `slow-eval-after`)."""
    if not dataset.held_out:
        return {}
    was_training = model.training
    model.eval()
    losses, exact, tokens = 0.0, 0, 0
    for start in range(0, len(dataset.held_out), spec.train.micro_batch_size):
        if stop is not None and stop():
            if was_training:
                model.train()
            return {}
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
        maybe_slow(fault)  # FTORCH_FAULTS=slow-eval@MS (tests: a long evaluation)
    if was_training:
        model.train()
    return {
        "loss": losses / max(1, tokens),
        "exact_match": exact / len(dataset.held_out),
        "examples": len(dataset.held_out),
    }


def _quiet_evaluate(
    model: torch.nn.Module, dataset: Dataset, device: torch.device, spec: JobSpec, stop: Any = None
) -> dict[str, float]:
    """`evaluate` mid-run, leaving the random state as it found it: training then goes on exactly as
    without it (and as after a resume), so exact resume holds with train.eval_every."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return evaluate(model, dataset, device, spec, stop)


def write_output(
    model: torch.nn.Module, tokenizer: Any, spec: JobSpec, output_uri: str, run_uri: str | None = None
) -> None:
    """The final PEFT adapter (LoRA) or HF model folder (full), uploaded to output_uri (never through a
    link out of the run store: trainer.runstore.store.output_store)."""
    output = output_store(output_uri, run_uri or output_uri, spec.checkpoint.storage_options)
    with scratch.folder("ftorch-out-") as tmp:
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
    """training_summary.json and the model card in the output folder (trainer/outputs/model_card.py)."""
    from trainer.outputs import model_card

    try:
        model_card.record(
            store,
            output_store(output_uri, store.run_uri, spec.checkpoint.storage_options),
            spec,
            resolved,
            steps=steps,
            tokens_seen=state.tokens_seen,
            examples=example_count(dataset.train),
            held_out_examples=len(dataset.held_out),
            data_tokens=dataset.tokens,
            eval_before=state.evals.before,
            eval_after=state.evals.after,
            attempt=attempt,
            output_uri=output_uri,
        )
    except Exception as exc:  # noqa: BLE001 - the adapter is written; the card is a record of it
        log(f"could not write the model card ({exc.__class__.__name__}: {exc})")


@dataclass
class Optimization:
    """What an optimizer step changes: the model, the optimizer, the LR schedule, fp16's loss scaler."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any


@dataclass
class Recording:
    """The recorders' own objects (trainer/recording/): what they write, never the training state."""

    reporter: ProgressReporter  # progress.json, metrics rows, the log
    trackers: Trackers  # TensorBoard, W&B
    notifier: TrainerNotifier  # the notify: webhook
    #: what this attempt measures (trainer/recording/measure.py): recorded at each checkpoint and at its end
    measurer: Measurer = field(default_factory=Measurer)


@dataclass(kw_only=True)
class Attempt:
    """What one attempt trains with: made by `setup`, used by `fit` and `finish`."""

    number: int
    resolved: dict[str, Any]  # spec.json: the job, run_id, output_uri
    spec: JobSpec
    store: RunStore
    flag: PreemptionFlag
    device: torch.device
    layout: Layout
    par: Parallel
    tokenizer: Any
    dataset: Dataset
    steps: int
    opt: Optimization
    checkpoints: Checkpointer
    state: TrainerState
    rec: Recording
    budget: budget.BudgetWatch | None = None  # rank 0's budget stop (trainer/stops/budget.py)
    budget_stop: BudgetStop | None = None  # its stop source: polled after each step and each eval batch
    #: the recorders called at the loop's named points, and what can end the attempt (trainer/observers.py)
    observers: Observers = field(default_factory=Observers)
    stop_sources: list[StopSource] = field(default_factory=list)
    health: HealthGuard | None = None  # train.health (trainer/health/guard.py), made by `fit`
    watchdog: Watchdog | None = None  # stalls (trainer/stops/watchdog.py), started by `fit`


def run(run_uri: str, attempt: int, storage_options: dict[str, Any] | None = None) -> int:
    """One attempt of the run: set up (resuming from the newest good checkpoint), train, finish."""
    try:
        a = setup(run_uri, attempt, storage_options)
    except Interrupted as stop:  # a notice before the first step: recorded, nothing to save
        return stop.code if stop.code is not None else exitcodes.PREEMPTED
    try:
        stopped = fit(a)
    except RuntimeError as exc:  # a collective timed out (trainer/distributed.py): the stall ending, exit 87
        if a.watchdog is None or not collective_timed_out(exc):
            raise
        _stalled(a, a.watchdog.phase, a.watchdog.clock() - a.watchdog.since, str(exc).splitlines()[0])
    if stopped is not None:
        return stopped
    try:
        return finish(a)
    except (
        RuntimeError
    ) as exc:  # the last checkpoint, eval or output gather: no watchdog, the group's timeout
        if not collective_timed_out(exc):
            raise
        _collective_stalled(a.store, "finishing", a.state.step, getattr(a.par, "timeout_s", None), exc)


# ---- setup ---------------------------------------------------------------------------------------
def setup(run_uri: str, attempt: int, storage_options: dict[str, Any] | None) -> Attempt:
    """Claim the run, build data, model and optimizer, and resume from the newest good checkpoint. A
    notice before the first step (tokenisation, model load, checkpoint read, the evaluation before
    training) ends it there: `Interrupted`, its exit code set once the stop is recorded."""
    # measured facts (trainer/recording/measure.py): phases count from the process's start
    measurer = Measurer()
    flag = PreemptionFlag()
    install_signal_handlers(flag)
    start_watcher(flag, log=log)  # cloud preemption notices (AWS/GCP/Azure metadata); ends off-cloud
    store, resolved, spec = _open_store(run_uri, attempt, storage_options, flag)
    check_output(resolved["output_uri"], run_uri, spec.checkpoint.storage_options)  # a linked output/: exit 2
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:  # the data and model loaders' own checks (one process)
        arm_setup(flag)
    watchdog = _start_setup_watchdog(store, spec)
    try:
        return _prepare(attempt, store, resolved, spec, flag, measurer)
    except Interrupted as stop:
        stop.code = _leave_before_training(store, flag, stop.where)
        raise
    except RuntimeError as exc:  # a peer hung before the first step: the group's first timeout raised
        if not collective_timed_out(exc):
            raise
        timeout = collective_timeout(spec.train.health.stall_timeout_s)
        _collective_stalled(store, "setting up", _newest_step(store), timeout, exc)
    finally:
        watchdog.close()
        disarm_setup()


def _start_setup_watchdog(store: RunStore, spec: JobSpec) -> Watchdog:
    """The set-up's stall bound (trainer/stops/watchdog.py `setup_timeout`): a model download or a data
    read that hangs (a dead mount, a hub that stopped answering) ends the attempt as a stall, exit 87,
    recorded first, instead of holding the machine until someone looks."""
    timeout = setup_timeout(spec.train.health.setup_timeout_s)

    def stalled(phase: str, waited: float) -> None:
        detail = f"stalled: no first step {waited:.0f} s into setting up (model, data, checkpoint)"
        _end_stalled(store, detail, f"setup timeout {timeout:.0f} s", _newest_step(store) or 0)

    return Watchdog(timeout, stalled, phase="setup").start()


def _prepare(
    attempt: int,
    store: RunStore,
    resolved: dict[str, Any],
    spec: JobSpec,
    flag: PreemptionFlag,
    measurer: Measurer,
) -> Attempt:
    """`setup` once the run store is open: data, model, optimizer, the resumed state, the recorders."""
    set_threads(spec.local.threads)  # local.threads: a count, 0 (torch's default) or auto
    device = pick_device(spec.local.device)
    # the same rules as the planner's: refuse a layout the job cannot run on before any work (exit 2)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # out-of-memory adaptations (trainer/train_step/oom.py): the micro-batch per rank recorded in spec.json
    spec, layout = oom.layout_for_attempt(
        spec, resolved, world, int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None
    )
    # the store's checkpoints, listed once for this start (rank 0; the other ranks get its listing)
    listing = store.list_checkpoints() if int(os.environ.get("RANK", "0")) == 0 else None
    identity = data_identity(spec.data, spec.checkpoint.storage_options)
    spec, as_run = _resolve_attention(spec, resolved, device.type)
    spec, as_run = resolve_packing(spec, as_run, device, log)  # data.packing: auto, as attention
    start_check, checked = _check_unchanged(store, resolved, as_run, identity, listing)
    # FSDP across ranks (torchrun, or a sharded run resumed by one process), or the identity
    par = setup_parallel(
        spec, device, store, resume_sharded=listing is not None and is_sharded(listing.newest)
    )
    maybe_hang_in("setup")  # FTORCH_FAULTS=hang-rank1@setup (tests)
    log(f"attempt {attempt} of run {resolved['run_id']} on {device} (torch {torch.__version__})")
    log(f"layout: {layout.describe()}")
    noticed = _agreed(par, flag)  # the flag, as every rank sees it: all leave at the same point
    tokenizer, dataset = _load_data(spec, store, identity)
    if noticed():
        raise Interrupted("tokenising the data")
    steps = total_steps(spec, dataset)
    loading = time.time()
    model, optimizer, scheduler, scaler = _build_model(spec, par, device, dataset, steps)
    measurer.phase("model_load_s", time.time() - loading)
    if noticed():
        raise Interrupted("loading the model")
    checkpoints = Checkpointer(par, store, spec, attempt, listing, start_meta=checked)
    # budget: the trainer stops itself at resources.budget_usd (rank 0 holds the epoch and its price)
    watch = budget.start_watch(store, resolved, checkpoints.auto, log) if store.epoch else None
    stopper = BudgetStop(watch, store, flag, checkpoints, steps, log) if watch is not None else None
    reading = time.time()
    stop = _eval_stop(par, flag, stopper, 0)
    state = _resume(checkpoints, model, optimizer, scheduler, dataset, device, steps, stop)
    measurer.phase(
        "checkpoint_read_s", time.time() - reading if checkpoints.resumed_from is not None else 0.0
    )
    # the same examples when the effective batch is split differently
    if checkpoints.resumed_from is not None:
        state.micro_batches = start_check.data_position(
            state.step, state.micro_batches, resolved["job"], len(dataset.train)
        )
    state.attempt = attempt
    if store.epoch:  # the ledger's steps redone: where this attempt starts, where the last one got to
        ledger.record_start(store, attempt, state.step)
    restore_scaler(scaler, state.scaler)
    checkpoints.clean_up()
    reporter, trackers = _open_reporting(
        store, spec, resolved, par, device, attempt, steps, state, checkpoints
    )
    # notify: the webhook posts the trainer makes itself (trainer/recording/notify.py; bounded, never raises)
    notifier = TrainerNotifier(store, resolved, attempt, steps, log)
    if checkpoints.resumed_from is not None:
        _check_resumed(spec, steps, state, scheduler, start_check, notifier)
    measurer.ready(device, layout.ranks, layout.micro_batch, layout.accum, spec.train.gradient_checkpointing)
    return Attempt(
        number=attempt, resolved=resolved, spec=spec, store=store, flag=flag, device=device, layout=layout,
        par=par, tokenizer=tokenizer, dataset=dataset, steps=steps, checkpoints=checkpoints, state=state,
        opt=Optimization(model, optimizer, scheduler, scaler),
        rec=Recording(reporter, trackers, notifier, measurer), budget=watch, budget_stop=stopper,
    )  # fmt: skip


def _agreed(par: Parallel, flag: PreemptionFlag) -> Callable[[], bool]:
    """The flag as every rank sees it (set on any: one all-reduce), so that all ranks act at one point."""
    return (lambda: par.any(flag.is_set())) if par.world > 1 else flag.is_set


def _eval_stop(
    par: Parallel, flag: PreemptionFlag, stopper: BudgetStop | None, step: int
) -> Callable[[], bool]:
    """Asked before each evaluation batch: a notice, or the budget (rank 0's rule raises the flag first,
    never after the last step), agreed by every rank."""
    noticed = _agreed(par, flag)
    if stopper is None:
        return noticed

    def stop() -> bool:
        stopper.in_eval(step)
        return noticed()

    return stop


def _leave_before_training(store: RunStore, flag: PreemptionFlag, where: str) -> int:
    """A notice (a stop request, the budget) before the first step: nothing to save (a resumed attempt's
    checkpoint stays as it is), nothing half-written. Recorded as `_stop_on_notice` records it; exit
    PREEMPTED (BUDGET_STOPPED for the budget)."""
    ended = how_it_ended(store)
    newest = _newest_step(store)
    said: dict[str, Any] = {}
    if ended.get("stop_reason") == budget.BUDGET:
        own = (store.epoch_records() or {}).get(store.epoch) or {}
        said["stop_detail"] = str(own.get("stop_detail") or budget.BUDGET) + budget.kept_note(store)
    code = exitcodes.BUDGET_STOPPED if ended.get("stop_reason") == budget.BUDGET else exitcodes.PREEMPTED
    stopped = ended["ended"] == "stopped"
    why = f"stop requested ({ended['stop_reason']})" if stopped else f"preemption notice ({flag.reason})"
    kept = f"the checkpoint at step {newest} is kept" if newest else "nothing to save before the first step"
    log(f"{why} while {where}: {kept}; exiting with code {code}")
    store.update_epoch_record(**ended, **said, step=newest or 0, ended_at=time.time())
    return code


def _newest_step(store: RunStore) -> int | None:
    """The newest complete checkpoint's step (rank 0: the one that holds the epoch), or None."""
    if not store.epoch:
        return None
    try:
        newest = store.list_checkpoints().newest
    except Exception:  # noqa: BLE001 - advisory: the record's step only
        return None
    return newest.step if newest is not None else None


def _check_unchanged(
    store: RunStore,
    resolved: dict[str, Any],
    as_run: dict[str, Any],
    identity: str | None,
    listing: CheckpointListing | None,
) -> tuple[fingerprint.StartCheck, dict[str, Any]]:
    """The job and the library versions compared with the newest checkpoint's: the check, and the meta
    every checkpoint of this attempt records (fingerprint and versions; handed to the `Checkpointer`).

    The spec fingerprint (trainer/checkpoints/fingerprint.py): a job or data changed since the newest
    checkpoint is refused (exit 2) unless `ftorch resume --allow-change` allowed it. The library versions
    (trainer/envlock.py) are recorded with the attempt too; a resume under other versions than the newest
    checkpoint's is refused (exit 2) unless --allow-change allowed it."""
    start_check = fingerprint.check_start(store, as_run, identity, log, listing)
    versions = check_versions(store, resolved, log, listing)
    return start_check, {**start_check.meta, envlock.META_KEY: versions}


def _load_data(spec: JobSpec, store: RunStore, identity: str | None) -> tuple[Any, Dataset]:
    """The tokenizer and the tokenized dataset (an earlier attempt's, from the run store's cache, when the
    data's `identity` matches)."""
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
    return tokenizer, dataset


def _check_resumed(
    spec: JobSpec,
    steps: int,
    state: TrainerState,
    scheduler: Any,
    start_check: fingerprint.StartCheck,
    notifier: TrainerNotifier,
) -> None:
    """After a resume: the webhook's post, and the log line that says whether the LR and the data position
    are the ones planned for the resumed step."""
    notifier.resumed(state.step)
    expected = state.micro_batches if start_check.changes else state.step * spec.train.grad_accum
    resume_check.check(  # "resumed at step N: lr and data position as planned" (or what differs)
        state.step, scheduler, lr_lambda_for(spec, steps), state.micro_batches, expected, log
    )


def _open_store(
    run_uri: str, attempt: int, storage_options: dict[str, Any] | None, flag: PreemptionFlag
) -> tuple[RunStore, dict[str, Any], JobSpec]:
    """The run store (with the spec's storage options), its resolved spec, and this attempt's epoch: the
    one `RunStore` of this start, which every part of the attempt is handed."""
    store = RunStore(run_uri, storage_options)  # `storage_options`: how to reach spec.json
    resolved = store.read_spec()
    check_pinned(resolved)  # the spec.json the local supervisor wrote for this attempt, not one since
    spec = JobSpec.model_validate(resolved["job"])
    if spec.checkpoint.storage_options != store.storage_options:  # spec.json names other options: they
        store = RunStore(run_uri, spec.checkpoint.storage_options)  # hold for the run (the first is let go)
    start_stop_watcher(flag, store, log=log)  # a cloud controller's switch request (run store)
    # budget: the price this attempt runs at, and a run already at its budget leaves at once (every rank)
    price = budget.price_record(_gpu_name(), process_started_at())
    over = budget.over_at_start(store, resolved["job"], attempt, price)
    if int(os.environ.get("RANK", "0")) == 0:  # fencing: this attempt's epoch; older attempts stop writing
        record = {"attempt": attempt, "pid": os.getpid(), "host": platform.node(), **price}
        epoch = store.claim_epoch(record)
        log(f"attempt {attempt} holds epoch {epoch} of the run")
    if over:
        budget.leave_at_start(store, over)  # raises BudgetReached: exit 0 with one line
    return store, resolved, spec


def _resolve_attention(
    spec: JobSpec, resolved: dict[str, Any], device_type: str
) -> tuple[JobSpec, dict[str, Any]]:
    """train.attn_implementation resolved on this device (trainer/model/attention.py): the spec the attempt
    runs, and the resolved spec with it that the fingerprint records (spec.json keeps `auto`)."""
    requested = spec.train.attn_implementation
    chosen = resolve_attention(requested, device_type)
    if chosen == requested:
        return spec, resolved
    log(f"attention: {chosen} (train.attn_implementation: {requested})")
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"attn_implementation": chosen})})
    job = {
        **resolved["job"],
        "train": {**(resolved["job"].get("train") or {}), "attn_implementation": chosen},
    }
    return spec, {**resolved, "job": job}


def _gpu_name() -> str | None:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def _build_model(
    spec: JobSpec, par: Parallel, device: torch.device, dataset: Dataset, steps: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    """The model (wrapped for this parallelism), its optimizer, LR schedule and loss scaler."""
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
    return model, optimizer, scheduler, scaler


def _resume(
    checkpoints: Checkpointer,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    dataset: Dataset,
    device: torch.device,
    steps: int,
    stop: Callable[[], bool],
) -> TrainerState:
    """The state of the newest good checkpoint, loaded; or a fresh start (evaluated before training).
    `stop()` (the flag, agreed by every rank) after the read and between the evaluation's batches raises
    `Interrupted`: before the first step there is nothing to save, and a resume evaluates again."""
    state = checkpoints.load_newest(model, optimizer, scheduler)
    if stop():
        raise Interrupted("reading the checkpoint" if state is not None else "setting up")
    if state is not None:
        assert checkpoints.resumed_from is not None
        log(f"resumed from {checkpoints.resumed_from.path} (step {state.step}/{steps})")
        return state
    state = TrainerState(step=0, micro_batches=0, tokens_seen=0)
    if dataset.held_out:
        log(f"evaluating {len(dataset.held_out)} held-out examples before training")
        state.evals.before = evaluate(model, dataset, device, checkpoints.spec, stop, "slow-eval-before")
        if not state.evals.before:
            raise Interrupted("evaluating before training")
        log(f"held-out before training: {_fmt_eval(state.evals.before)}")
    return state


def _open_reporting(
    store: RunStore,
    spec: JobSpec,
    resolved: dict[str, Any],
    par: Parallel,
    device: torch.device,
    attempt: int,
    steps: int,
    state: TrainerState,
    checkpoints: Checkpointer,
) -> tuple[ProgressReporter, Trackers]:
    """Progress in the run store and the experiment trackers, started at the resumed step."""
    reporter = par.reporter(
        ProgressReporter(store, resolved["run_id"], attempt, steps, resolved["output_uri"])
    )
    reporter.last_checkpoint(checkpoints.last_step if checkpoints.resumed_from is not None else None)
    cuda_allocator = allocator.record(device.type)  # expandable segments (trainer/memory/allocator.py)
    if cuda_allocator:
        reporter.extra["cuda_allocator"] = cuda_allocator
        log(f"CUDA allocator: {cuda_allocator['setting']} (set by {cuda_allocator['source']})")
    reporter.start(state.step)
    report_to = spec.train.report_to if par.is_main else []
    trackers = Trackers(store, report_to, attempt, state.step, resolved["run_id"], resolved["job"])
    if state.step == 0 and state.evals.before:
        trackers.scalar("eval/loss", state.evals.before["loss"], 0)
    # issue 23: records go with the checkpoint that covers them (flushed before its manifest), and W&B
    # gets again what an earlier attempt handed it but it never durably got, up to the resumed checkpoint
    checkpoints.before_save += [reporter.flush, trackers.flush]
    trackers.catch_up(state.step, (state.evals.before or {}).get("loss"))
    return reporter, trackers


# ---- fit -----------------------------------------------------------------------------------------
def fit(a: Attempt) -> int | None:
    """Train to the last step, checkpointing when due; the exit code if a stop source or a notice
    ended it, else None. Recorders are `a.observers`, what can end the attempt `a.stop_sources`
    (trainer/observers.py)."""
    a.opt.model.train()
    log_every = a.spec.train.log_every or max(1, a.steps // 100)
    eval_every = a.spec.train.eval_every if a.dataset.held_out else None
    if a.spec.train.health.enabled:
        a.health = HealthGuard(a)
        a.stop_sources.append(a.health)  # its UNHEALTHY stop carries its own exit code
    a.observers.extend(recorders.standard(a, log_every))
    a.stop_sources.extend(_stop_sources(a))
    a.watchdog = _start_watchdog(a)
    heartbeat = recorders.WatchdogObserver(a.watchdog, a.rec.reporter)
    a.observers.insert(0, heartbeat)
    if eval_every and a.state.evals.cut_short_at is not None:  # the mark is taken off here
        cut_short_at, a.state.evals.cut_short_at = a.state.evals.cut_short_at, None
        if cut_short_at == a.state.step:
            _evaluate_now(a, heartbeat)  # the notice's checkpoint came before this step's evaluation
    while a.state.step < a.steps:
        if a.par.any(a.flag.is_set()):  # all ranks stop at the same step
            heartbeat.enter("checkpoint")  # the final save is timed as a checkpoint, not as a step
            code = _stop_on_notice(a)
            a.observers.stop(a.state.step, a.flag.reason)  # the budget stop, or a preemption notice
            return code
        try:  # out of memory: every rank agrees, a smaller micro-batch is recorded (trainer/train_step/oom.py)
            tokens_before = a.state.tokens_seen
            step_loss, lr, grad_norm = _train_step(a)
            out_of_memory = None
        except Exception as exc:  # noqa: BLE001 - only CUDA's out-of-memory error is caught
            if not oom.is_oom(exc):
                raise
            out_of_memory = exc
        if a.par.any(out_of_memory is not None):
            a.rec.measurer.record(a.store, a.checkpoints.writer)
            return oom.on_oom(a, out_of_memory, log)
        maybe_crash("crash", a.state.step)
        skipped = a.health is not None and a.health.verdict.action != STEP
        record = StepRecord(
            a.state.step, step_loss, lr, grad_norm, a.state.tokens_seen - tokens_before, a.state.tokens_seen,
            skipped,
        )  # fmt: skip
        a.observers.step(record)
        a.par.follow_stall_timeout(a.watchdog, a.spec.train.health.stall_timeout_s)  # after warm-up
        if a.health is not None:
            a.health.after()  # a rollback happens here; an UNHEALTHY end through the stop sources
        for stop in poll_all(a.stop_sources, a.state.step):
            if stop.code is not None:  # ends the attempt now, without a checkpoint
                a.observers.stop(a.state.step, stop.reason)
                return stop.code
            a.flag.set(stop.reason)
        if eval_every and a.state.step % eval_every == 0 and a.state.step < a.steps:
            _evaluate_now(a, heartbeat)
        saved = a.checkpoints.last_step == a.state.step  # a rollback checkpointed this step already
        if a.state.step < a.steps and not saved and a.checkpoints.due(a.state.step, time.time()):
            a.observers.checkpoint_start(a.state.step)
            saving = time.time()
            a.checkpoints.save(a.opt.model, a.opt.optimizer, a.opt.scheduler, a.state)
            if a.budget is not None:  # the stop's own save is reserved at the slowest recent one
                a.budget.observe_save(time.time() - saving)
            a.observers.checkpoint(a.state.step, time.time() - saving)
    return None


def _evaluate_now(a: Attempt, heartbeat: recorders.WatchdogObserver) -> None:
    """The held-out evaluation at this step. One a notice or the budget cuts short (so that the stop's
    checkpoint is not kept waiting) is marked in that checkpoint, and the attempt resuming from it makes it
    up first."""
    heartbeat.enter("eval")
    stop = _eval_stop(a.par, a.flag, a.budget_stop, a.state.step)  # a notice or the budget, all ranks alike
    result = _quiet_evaluate(a.opt.model, a.dataset, a.device, a.spec, stop)
    if result:
        a.state.evals.cut_short_at = None
        a.observers.eval(a.state.step, result)
    else:  # {}: a notice (or the budget) came during it; the loop saves at once
        a.state.evals.cut_short_at = a.state.step
        heartbeat.enter("step")


def _start_watchdog(a: Attempt) -> Watchdog:
    """The stall watchdog (trainer/stops/watchdog.py): a step that does not come in time ends the process
    with exitcodes.STALLED, recorded first (the training thread is stuck: nothing else can run)."""

    return Watchdog(
        a.spec.train.health.stall_timeout_s, lambda phase, waited: _stalled(a, phase, waited)
    ).start()


def _stalled(a: Attempt, phase: str, waited: float, collective: str | None = None) -> None:
    """The stall ending: recorded, then exit at once. From the watchdog thread, or from the training
    thread when a collective gave up at the process group's timeout (`collective`: what it raised)."""
    detail = f"stalled: no progress for {waited:.0f} s in {phase.replace('_', ' ')} after step {a.state.step}"
    if collective is None:
        how = f"watchdog; timeout {a.watchdog.timeout(phase):.0f} s" if a.watchdog else "watchdog"
    else:
        detail += " (a collective timed out)"
        how = f"process group timeout {getattr(a.par, 'timeout_s', None)} s: {collective}"
    _end_stalled(a.store, detail, how, a.state.step)


def _collective_stalled(
    store: RunStore, where: str, step: int | None, timeout_s: float | None, exc: BaseException
) -> NoReturn:
    """The stall ending outside the step loop (setup, the last checkpoint, eval and output), where no
    watchdog runs: a collective gave up at the process group's timeout because a peer hung. Recorded as
    `_stalled` records it (the supervisor restarts a stall once), then exit at once."""
    after = f" after step {step}" if step else ""
    detail = f"stalled: a collective timed out while {where}{after}"
    how = f"process group timeout {timeout_s:.0f} s" if timeout_s else "process group timeout"
    _end_stalled(store, detail, f"{how}: {str(exc).splitlines()[0]}", step or 0)


def _end_stalled(store: RunStore, detail: str, how: str, step: int) -> NoReturn:
    """Every stall ending: one log line, the epoch record (the launcher restarts a stall once), exit 87 at
    once (the training thread may be stuck: no cleanup runs)."""
    log(f"{detail} ({how}): exiting with code {exitcodes.STALLED}")
    try:
        store.update_epoch_record(ended="stalled", stop_detail=detail, step=step, ended_at=time.time())
    finally:
        exit_now(exitcodes.STALLED)


def _stop_sources(a: Attempt) -> list[StopSource]:
    """What can end this attempt besides the flag's own threads: the budget, the spot probe (rank 0)."""
    sources: list[StopSource] = []
    if a.budget_stop is None and a.budget is not None:
        a.budget_stop = BudgetStop(a.budget, a.store, a.flag, a.checkpoints, a.steps, log)
    if a.budget_stop is not None:  # the budget stop (trainer/stops/budget.py), made by `setup`
        sources.append(a.budget_stop)
    # spot return (issue 19): records where this attempt landed; on demand, may probe back to spot
    probe = SpotProbe.open(a.store, a.spec, a.resolved, a.number, log) if a.par.is_main else None
    if probe is not None:
        sources.append(SpotProbeStop(probe, a.steps, a.rec.reporter))
    return sources


def _train_step(a: Attempt) -> tuple[float, float, float]:
    """One optimizer step over the job's effective batch: (loss, learning rate, gradient norm)."""
    state = a.state
    # the job's effective batch on this many ranks (trainer/layout.py): global micro-batches
    micro = a.layout.step_micro_batches(a.dataset, state.micro_batches)
    maybe_oom(a.layout.micro_batch)  # FTORCH_FAULTS=oom-above@K (tests)
    maybe_poison(a.opt.model, state.step + 1)  # FTORCH_FAULTS=nan@K (tests)
    maybe_hang(state.step + 1)  # FTORCH_FAULTS=hang@K (tests)
    step_loss, seen = accumulate(
        a.opt.model, micro, spec=a.spec, device=a.device, pad_id=a.dataset.pad_id, local=a.par.local,
        world=a.par.world, scaler=a.opt.scaler, tokens=a.par.tokens,
    )  # fmt: skip
    state.tokens_seen += seen
    step_loss = a.par.mean(step_loss) * spike(state.step + 1)  # FTORCH_FAULTS=spike@K (tests)
    maybe_nan_grad(a.opt.model, state.step + 1)  # FTORCH_FAULTS=nan-grad-rank1@K (tests)
    # the health checks (trainer/health/guard.py) may skip the optimizer step (a non-finite loss or norm)
    go = a.health.go_for(state.step + 1, step_loss) if a.health is not None else None
    grad_norm = update(a.opt.model, a.opt.optimizer, a.spec.train.max_grad_norm, a.opt.scaler, go)
    state.scaler = save_scaler(a.opt.scaler, state.scaler)
    a.opt.scheduler.step()
    a.opt.optimizer.zero_grad(set_to_none=True)
    maybe_slow("slow-step")  # FTORCH_FAULTS=slow-step@MS (tests: a slow machine on demand)
    state.step += 1
    state.micro_batches += a.spec.train.grad_accum  # the data position, in the job's micro-batches
    return step_loss, a.opt.scheduler.get_last_lr()[0], grad_norm


def _stop_on_notice(a: Attempt) -> int:
    """A notice or a requested stop: the upload in flight, then a final checkpoint; exit PREEMPTED."""
    state, checkpoints = a.state, a.checkpoints
    ended = how_it_ended(a.store)  # a requested stop (cancel, budget) is no interruption
    if ended.get("stop_reason") == SUPERVISOR_LOST:
        log(f"the supervisor that started this trainer is gone (SIGTERM) at step {state.step}: saving")
    elif ended["ended"] == "stopped":
        log(f"stop requested ({ended['stop_reason']}) at step {state.step}: saving before leaving")
    else:
        log(f"preemption notice ({a.flag.reason}) at step {state.step}: saving before the machine goes")
    checkpoints.wait()  # the upload in flight first, then the final checkpoint
    if checkpoints.last_step != state.step:
        a.rec.reporter.set_state("checkpointing")
        checkpoints.save(a.opt.model, a.opt.optimizer, a.opt.scheduler, state, wait=True)
        checkpoints.wait()
    a.rec.reporter.last_checkpoint(state.step)
    said = {}
    if ended.get("stop_reason") == budget.BUDGET and a.budget is not None and a.budget.reason:
        said["stop_detail"] = a.budget.reason + budget.kept_note(a.store)  # what the store holds now
    a.store.update_epoch_record(**ended, **said, step=state.step, ended_at=time.time())
    a.rec.measurer.record(a.store, checkpoints.writer)
    if ended.get("stop_reason") == budget.BUDGET:  # exit 0: SkyPilot does not restart it
        a.rec.reporter.set_state("stopped", flush=True)
        log(
            f"checkpoint at step {state.step} is safe; stopped at the budget (exit {exitcodes.BUDGET_STOPPED})"
        )
        return exitcodes.BUDGET_STOPPED
    a.rec.reporter.set_state("preempted", flush=True)
    log(f"checkpoint at step {state.step} is safe; exiting with code {exitcodes.PREEMPTED} (preempted)")
    return exitcodes.PREEMPTED


# ---- finish --------------------------------------------------------------------------------------
def finish(a: Attempt) -> int:
    """The last checkpoint, the held-out evaluation, the output and its records. A notice during the
    evaluation abandons it after the last checkpoint is committed: exit PREEMPTED, and the attempt that
    resumes from that checkpoint trains nothing, evaluates and writes the output."""
    state, output_uri = a.state, a.resolved["output_uri"]
    if a.watchdog is not None:  # the last checkpoint, eval and output: no stall rule (not steps)
        a.watchdog.close()
        a.par.follow_stall_timeout(None, None)  # the process group's first timeout again
    a.rec.reporter.set_state("finishing")  # a launcher watching the heartbeat leaves this state alone
    if a.checkpoints.last_step != state.step:
        a.checkpoints.save(a.opt.model, a.opt.optimizer, a.opt.scheduler, state, wait=True)
    a.checkpoints.wait()
    a.rec.reporter.last_checkpoint(state.step)
    if a.dataset.held_out:
        log(f"evaluating {len(a.dataset.held_out)} held-out examples after training")
        stop = _eval_stop(a.par, a.flag, a.budget_stop, state.step)  # the budget: never after the last step
        state.evals.after = evaluate(a.opt.model, a.dataset, a.device, a.spec, stop, "slow-eval-after")
        if not state.evals.after:  # a notice: the final checkpoint is committed, a resume redoes the rest
            return _stop_after_last_step(a)
        log(f"held-out after training:  {_fmt_eval(state.evals.after)}")
        a.rec.reporter.eval_loss(state.step, state.evals.after["loss"])
        a.rec.trackers.scalar("eval/loss", state.evals.after["loss"], state.step)
    a.rec.trackers.close()
    a.store.check_intact()  # a run store deleted under this attempt: StoreGone (exit 2), never "done"
    a.rec.reporter.set_state("writing_output")
    maybe_hang_in("finish")  # FTORCH_FAULTS=hang-rank1@finish (tests)
    a.par.write_output(write_output, a.opt.model, a.tokenizer, a.spec, output_uri, a.store.run_uri)
    a.rec.reporter.finish(eval_before=state.evals.before, eval_after=state.evals.after)
    if a.par.is_main:
        _record_output(a.store, a.spec, a.resolved, a.steps, state, a.dataset, a.number, output_uri)
    health = {"health": a.health.rules.state.to_json()} if a.health is not None else {}
    a.store.update_epoch_record(ended="finished", step=state.step, **health)
    a.rec.measurer.record(a.store, a.checkpoints.writer)
    log(f"done: {a.steps} steps; output at {output_uri}")
    a.rec.notifier.succeeded(state.step, getattr(a.rec.reporter, "loss", None))
    return exitcodes.OK


def _stop_after_last_step(a: Attempt) -> int:
    """A notice during the evaluation after the last step: the last checkpoint is committed already
    (`finish` saved and waited before evaluating), so nothing is lost; leave as on any notice."""
    state = a.state
    log(
        f"the evaluation after training was cut short ({a.flag.reason}); the checkpoint of the last step "
        f"({state.step}) is committed: a resume evaluates and writes the output, nothing is trained again"
    )
    state.evals.after = None
    code = _stop_on_notice(a)
    a.observers.stop(state.step, a.flag.reason)
    return code
