"""Experiment trackers (`train.report_to`): TensorBoard and W&B, one run per job across all attempts.

TensorBoard: every attempt appends its own event file to `<run store>/tensorboard/`, so TensorBoard shows
one run across all attempts. An attempt that resumes from step S opens its writer with `purge_step=S + 1`:
TensorBoard's reader then drops what an earlier attempt logged after that checkpoint (steps it is about
to train again), so no step appears twice. Events are written to a local folder and copied into the
run store at each flush (the store may be a bucket).

W&B: the run id is the job id and every attempt resumes it (`resume="allow"`). W&B cannot rewind a run, so
an attempt logs only the steps after the last one W&B durably holds: online, W&B's own resumed step; in
offline mode (WANDB_MODE=offline), the newest step in the run store's copies of the earlier attempts'
offline runs (`<run store>/wandb/offline-run-*`, copied at each flush, for `wandb sync` later; read with
trainer/recording/wandb_log.py). What was only handed to `wandb.log` is not counted: a kill loses it. Steps up to the
checkpoint an attempt resumes from that W&B lacks are logged again from the metrics rows (`catch_up`), which
are written with that checkpoint; the steps it trains again after it are the same steps (exact resume) and
stay as first logged. `<run store>/wandb/state.json` says the newest step W&B holds (a record, not used to
skip). The API key comes from the environment (WANDB_API_KEY; on SkyPilot a secret of the task), the project
from WANDB_PROJECT (default `ftorch`). The job's settings are the run's config, without storage options.

Both are flushed before each checkpoint's manifest (trainer/checkpoints/checkpointer.py `before_save`), so a
checkpoint never covers tracker steps the run store lacks.

Logged to both: loss, lr, grad norm, tokens/s (`train/...`), the held-out loss (`eval/loss`), the attempt
number and the preemptions before it (`run/attempt`, `run/preemptions`), and the cost so far
(`run/cost_usd`) where the trainer knows the price: the local backend passes it in FTORCH_HOURLY_USD; on
SkyPilot the job's controller writes it to the run store (`control/spend.json`) every tick.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import time
from typing import Any

from trainer.runstore import scratch
from trainer.runstore.store import RunStore

FOLDER = "tensorboard"
WANDB_FOLDER = "wandb"
WANDB_STATE = f"{WANDB_FOLDER}/state.json"
FLUSH_EVERY_S = float(os.environ.get("FTORCH_TRACKER_FLUSH_S", "30"))

#: this process's scratch folders (TensorBoard's event files, W&B's run): removed on close, and by
#: `remove_scratch` when the attempt ends any other way (trainer/__main__.py, atexit)
_SCRATCH: set[str] = set()


def _scratch(prefix: str) -> str:
    folder = scratch.make(prefix)
    _SCRATCH.add(folder)
    return folder


def remove_scratch() -> None:
    """Delete every scratch folder this process made and has not removed yet."""
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


atexit.register(remove_scratch)


def _missing(name: str, extra: str) -> Exception:
    from trainer.data.check import DataError

    return DataError(f"train.report_to: {name} is not installed here; pip install 'ftorch[{extra}]'")


def run_facts(store: RunStore, environ: dict[str, str] | None = None) -> dict[str, float]:
    """Preemptions before this attempt, and the cost so far and the hourly price where known.

    The local supervisor passes what it knows (FTORCH_PREEMPTIONS, FTORCH_COST_USD, FTORCH_HOURLY_USD);
    elsewhere the preemptions are the earlier attempts that ended neither finished nor stopped (fencing
    records in the run store), and the cost from a spend record (control/spend.json) brought forward to now at its
    price, else from the epoch records' prices and alive times (no price: no cost logged)."""
    from trainer.stops.interruptions import NOT_INTERRUPTIONS, SPEND_RECORD

    env = os.environ if environ is None else environ
    facts: dict[str, float] = {}
    try:
        if env.get("FTORCH_PREEMPTIONS"):
            facts["preemptions"] = float(env["FTORCH_PREEMPTIONS"])
        else:
            records = store.epoch_records()
            earlier = [r for n, r in records.items() if n < (store.epoch or max(records, default=0) + 1)]
            facts["preemptions"] = float(sum(1 for r in earlier if r.get("ended") not in NOT_INTERRUPTIONS))
        if env.get("FTORCH_HOURLY_USD"):
            facts["hourly_usd"] = float(env["FTORCH_HOURLY_USD"])
            facts["cost_usd"] = float(env.get("FTORCH_COST_USD") or 0.0)
        else:
            spend = store.read_json_or_none(SPEND_RECORD)
            if isinstance(spend, dict) and spend.get("hourly_usd") is not None:
                hourly, at = float(spend["hourly_usd"]), float(spend.get("at") or time.time())
                facts["hourly_usd"] = hourly
                facts["cost_usd"] = (
                    float(spend.get("spent_usd") or 0.0) + hourly * max(0.0, time.time() - at) / 3600
                )
            else:  # each attempt's price and alive time in its epoch record (trainer/stops/budget.py)
                from trainer.stops.budget import spend_usd

                records = store.epoch_records()
                own = records.get(store.epoch) or {}
                if own.get("hourly_usd"):
                    facts["hourly_usd"] = float(own["hourly_usd"])
                    facts["cost_usd"] = spend_usd(records, store.epoch, time.time())
    except (ValueError, TypeError, OSError):  # advisory
        pass
    return facts


def _config(job: dict[str, Any]) -> dict[str, Any]:
    """The job's settings for W&B's config: storage options (which could hold keys) left out."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k != "storage_options"}
        return value

    return clean(job)


NONFINITE_SUFFIX = "_nonfinite"


def finite_only(metrics: dict[str, float]) -> dict[str, float]:
    """NaN and inf never reach W&B or TensorBoard as raw floats (a NaN breaks W&B's charts and summary,
    TensorBoard's smoothing): each is left out and `<name>_nonfinite` = 1.0 logged in its place, the
    trackers' form of the run files' `null` + `nonfinite` flag (trainer/runstore/finite_json.py)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if math.isfinite(value):
            out[name] = value
        else:
            out[f"{name}{NONFINITE_SUFFIX}"] = 1.0
    return out


class _TensorBoard:
    def __init__(self, store: RunStore, start_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard", "tensorboard") from None
        self.store = store
        self.local = _scratch("ftorch-tb-")
        self.writer = SummaryWriter(self.local, purge_step=start_step + 1 if start_step else None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self.writer.flush()
        for name in sorted(os.listdir(self.local)):
            with open(os.path.join(self.local, name), "rb") as handle:
                self.store.write_bytes(f"{FOLDER}/{name}", handle.read())

    def close(self) -> None:
        self.writer.close()
        shutil.rmtree(self.local, ignore_errors=True)
        _SCRATCH.discard(self.local)


class _WandB:
    def __init__(self, store: RunStore, run_id: str, job: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing("wandb", "wandb") from None
        self.store = store
        self.logged = -1  # the newest step W&B durably holds (never what was only handed to wandb.log)
        self.local = os.environ.get("WANDB_DIR") or _scratch("ftorch-wandb-")
        settings = wandb.Settings(console="off", silent=True, save_code=False, x_disable_stats=True)
        self.run = wandb.init(
            id=run_id,
            resume="allow",
            project=os.environ.get("WANDB_PROJECT") or "ftorch",
            name=run_id,
            dir=self.local,
            config=_config(job),
            settings=settings,
        )
        self.offline = bool(self.run.settings.mode in ("offline", "dryrun"))
        if self.offline:  # what the earlier attempts' copies in the run store hold
            self.logged = self._stored_step()
        elif self.run.resumed:  # online: what W&B already holds for this run
            self.logged = int(self.run.starting_step or 0) - 1
        self.floor = self.logged
        self.carry: dict[str, float] = {}

    def _stored_step(self) -> int:
        """The newest history step in the run store's copies of this run's offline runs (-1: none)."""
        from trainer.recording.wandb_log import history_steps

        newest = -1
        for name in self.store.listdir(WANDB_FOLDER):
            rel = f"{WANDB_FOLDER}/{name}/run-{self.run.id}.wandb"
            if (
                name.startswith("offline-run-")
                and name.endswith(f"-{self.run.id}")
                and self.store.exists(rel)
            ):
                newest = max([newest, *history_steps(self.store.read_bytes(rel))])
        return newest

    def catch_up(self, rows: list[dict[str, Any]], upto: int, eval_before: float | None) -> None:
        """Log again, from the metrics rows, the steps up to `upto` (the checkpoint this attempt resumed
        from) that W&B does not hold: an earlier attempt handed them over but was killed before W&B's
        copy reached the run store."""
        if self.floor < 0 and eval_before is not None and upto > 0:
            self.run.log({"eval/loss": float(eval_before)}, step=0)
        previous: dict[str, Any] | None = None
        for row in rows:
            step = row["step"]
            if self.floor < step <= upto:
                values = {
                    f"train/{k}": float(row[k]) for k in ("loss", "lr", "grad_norm") if row.get(k) is not None
                }
                if isinstance(row.get("eval_loss"), (int, float)):
                    values["eval/loss"] = float(row["eval_loss"])
                flagged = row.get("nonfinite")  # the row's null numbers: flagged as the live steps are
                for k in flagged if isinstance(flagged, dict) else ():
                    values[f"train/{k}{NONFINITE_SUFFIX}"] = 1.0
                if previous is None or previous.get("attempt") != row.get("attempt"):
                    values["run/attempt"] = float(row.get("attempt") or 0)
                self.run.log(values, step=step)
            previous = row
        self.floor = max(self.floor, upto)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if step <= self.floor:  # W&B keeps what earlier attempts logged up to `floor`
            self.carry.update({k: v for k, v in metrics.items() if k.startswith("run/")})
            return
        self.run.log({**self.carry, **metrics}, step=step)  # this attempt's number at its first new step
        self.carry = {}
        if not self.offline:  # online: handed over is what W&B's resumed step will count
            self.logged = max(self.logged, step)

    def summary(self, values: dict[str, float]) -> None:
        self.run.summary.update(values)

    def flush(self) -> None:
        if self.offline:
            self._copy_offline()
        self.store.write_json(WANDB_STATE, {"run_id": self.run.id, "last_step": self.logged})

    def _copy_offline(self) -> None:
        """Copy the offline run into the run store; count the steps the copy holds as W&B's."""
        from trainer.recording.wandb_log import history_steps

        folder = os.path.dirname(self.run.dir)  # <dir>/wandb/offline-run-<time>-<id>
        name = os.path.basename(folder)
        for root, _dirs, files in os.walk(folder):
            for file in sorted(files):
                path = os.path.join(root, file)
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                with open(path, "rb") as handle:
                    data = handle.read()
                self.store.write_bytes(f"{WANDB_FOLDER}/{name}/{rel}", data)
                if file == f"run-{self.run.id}.wandb":
                    self.logged = max([self.logged, *history_steps(data)])

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # finish returns before W&B's service has written the run's log; this waits for it
        self.flush()  # the offline run's files complete now
        if not os.environ.get("WANDB_DIR"):
            shutil.rmtree(self.local, ignore_errors=True)
            _SCRATCH.discard(self.local)


class Trackers:
    """What the training loop logs to, whichever trackers the job asked for (none: every call is a no-op)."""

    def __init__(
        self,
        store: RunStore,
        report_to: list[str],
        attempt: int,
        start_step: int,
        run_id: str = "",
        job: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.last_flush = time.monotonic()
        self.sinks: list[Any] = []
        if "tensorboard" in report_to:
            self.sinks.append(_TensorBoard(store, start_step))
        if "wandb" in report_to:
            self._start_wandb(store, run_id or store.root_uri.rstrip("/").rsplit("/", 1)[-1], job or {})
        self.facts = run_facts(store) if self.sinks else {}
        self.started = time.time()
        first = {"run/attempt": float(attempt)}
        if "preemptions" in self.facts:
            first["run/preemptions"] = self.facts["preemptions"]
        self.first = first  # logged with the attempt's first step
        if self.sinks:  # an attempt that ends on an error still leaves whole copies in the run store
            atexit.register(self.close)
        for sink in self.sinks:
            if isinstance(sink, _WandB):
                sink.summary(
                    {"attempts": attempt, **{k: v for k, v in self.facts.items() if k != "hourly_usd"}}
                )

    def _start_wandb(self, store: RunStore, run_id: str, job: dict[str, Any]) -> None:
        """W&B not installed is the job's error (exit 2); W&B unreachable or refusing the key is logged
        and training goes on without it (a spot attempt is not lost to a tracker)."""
        from trainer.data.check import DataError
        from trainer.runstore.progress import log

        try:
            self.sinks.append(_WandB(store, run_id, job))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001
            text = " ".join(str(exc).split())[:300]
            log(f"W&B is not reporting this attempt: {exc.__class__.__name__}: {text}")

    def catch_up(self, start_step: int, eval_before: float | None = None) -> None:
        """Before the first step of an attempt that resumed at `start_step`: W&B gets again, from the
        metrics rows, the steps up to it that it lacks (TensorBoard's copy is whole up to any checkpoint)."""
        for sink in self.sinks:
            if isinstance(sink, _WandB) and start_step > 0 and sink.floor < start_step:
                try:
                    sink.catch_up(self.store.read_metrics(), start_step, eval_before)
                except Exception as exc:  # noqa: BLE001 - tracking is advisory
                    from trainer.runstore.progress import log

                    log(
                        f"W&B could not be given the steps before {start_step} again ({exc.__class__.__name__})"
                    )

    @property
    def writer(self) -> Any:
        """The TensorBoard writer, if any (kept for callers that check it)."""
        return next((s.writer for s in self.sinks if isinstance(s, _TensorBoard)), None)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        metrics = finite_only(metrics)
        for sink in self.sinks:
            sink.log(metrics, step)

    def step(self, step: int, metrics: dict[str, float | None]) -> None:
        if not self.sinks:
            return
        values = {f"train/{name}": float(v) for name, v in metrics.items() if v is not None}
        if self.first:
            values.update(self.first)
            self.first = {}
        if "hourly_usd" in self.facts:
            spent = self.facts["cost_usd"] + self.facts["hourly_usd"] * (time.time() - self.started) / 3600.0
            values["run/cost_usd"] = spent
        self._log(values, step)
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush()

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.sinks:
            self._log({name: float(value)}, step)

    def flush(self) -> None:
        """Copy what the trackers wrote into the run store (a failure waits for the next flush)."""
        self.last_flush = time.monotonic()
        for sink in self.sinks:
            try:
                sink.flush()
            except Exception:  # noqa: BLE001 - tracking is advisory, like progress
                pass

    def close(self) -> None:
        for sink in self.sinks:
            try:
                if isinstance(sink, _TensorBoard):
                    sink.flush()
                sink.close()
            except Exception:  # noqa: BLE001
                pass
        self.sinks = []
