"""The budget stop, enforced by the job itself: one rule for the trainer, the local supervisor and the planner.

The rule (`BudgetGuard`): when the spend so far plus the cost of what must still fit would pass
`resources.budget_usd`, stop now (checkpoint, record the stop as `budget`, exit 0), so the last
checkpoint lands inside the budget. What must still fit (`reserve_s`):
- the next checkpoint interval: `checkpoint.every` steps at the observed step rate, or `every` seconds,
  or (for `auto`) the gap between the last two checkpoints seen; until two have been seen, the interval
  the trainer starts with (trainer.stops.interval: the one interval model);
- the stop's own save at the slowest recent one seen (blocking plus upload, timed by the loop with the
  records flushed before it), never less than the interval model's measured cost; and for `every`
  seconds or `auto` a periodic save too, which may come between two checks (for `every` N steps the
  observed step rate already counts the periodic saves);
- the reaction: the trainer looks once a second, between steps and between evaluation batches, so up to
  a second and then a step at the slowest recent pace pass before it stops (an evaluation batch, a
  forward pass only, takes less than a step); never less than `margin_s`;
- for a restart (`restart_reason`: the local supervisor before it starts an attempt, the trainer before
  any work, the cloud controller before a relaunch): the load time earlier attempts measured (process
  start, model load, checkpoint read, first step), and never less than the reserve the run's last budget
  stop reckoned (`budget_reserve_usd` in its epoch record): a run stopped at its budget is not restarted
  under the same budget because one estimate came out smaller than the other.

The spend is the run store's, so it holds with nobody watching (a laptop asleep, a frozen supervisor):
every attempt records in its epoch record the price it runs at (`attempt_price`) and when it was last
alive; spend = sum over attempts of alive time x that attempt's price (`spend_usd`).

Where the price comes from (`attempt_price`):
- the local supervisor passes its simulated price: FTORCH_HOURLY_USD (local.hourly_usd);
- on SkyPilot the launcher passes every offer's price per node, FTORCH_PRICES = {price_key(...): usd},
  keyed cloud:region:accelerator:count:market (region "*" for the dearest region of the offer); the
  trainer finds its own from SKYPILOT_CLUSTER_INFO (cloud, region, nodes), SKYPILOT_NUM_GPUS_PER_NODE,
  the GPU's name and the market from the instance metadata (AWS IMDS `instance-life-cycle`, GCP
  `scheduling/preemptible`), else the dearest market that matches (never under-counting).

No torch here.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.stops.interval import AutoInterval, fixed_interval_s

#: what the guard itself adds: it looks once a second, and the trainer takes a moment to save and exit
MARGIN_S = 2.0
#: how often the trainer's guard looks (BudgetWatch.over)
CHECK_EVERY_S = 1.0
PRICES_ENV = "FTORCH_PRICES"
HOURLY_ENV = "FTORCH_HOURLY_USD"
#: the epoch record's `alive_at` is refreshed this often (what an attempt killed without a word is billed to)
ALIVE_EVERY_S = 30.0
#: the stop reason in the epoch record and stop request (trainer/stops/interruptions.py)
BUDGET = "budget"
#: how many recent steps and saves the guard remembers: it reserves room for the slowest of them
RECENT = 20
#: the measured phases (trainer/recording/measure.py) a restart pays before it trains
LOAD_PHASES = ("process_start_s", "model_load_s", "checkpoint_read_s", "first_step_s")


class BudgetReached(Exception):
    """A resumed run is already at its budget: the attempt leaves at once (exit 0), nothing trained."""


@dataclass
class BudgetGuard:
    budget_usd: float | None
    hourly_usd: float
    every_steps: int | None = None
    every_seconds: float | None = None
    #: steps per second from earlier attempts (progress.json), until this attempt has its own
    prior_rate: float | None = None
    #: the reaction time: the trainer checks once a second, then saves and exits
    margin_s: float = MARGIN_S
    #: `auto`: the trainer's interval model (its prior MTBF and first cost) until two checkpoints are seen
    auto: AutoInterval = field(default_factory=AutoInterval)
    #: a restart's expected load time (earlier attempts' measured phases); 0 inside a running attempt
    load_s: float = 0.0
    #: the reserve the run's last budget stop reckoned: a restart never reckons less
    floor_usd: float = 0.0
    _first: tuple[float, int] | None = None
    _last: tuple[float, int] | None = None
    _ckpt_times: list[float] = field(default_factory=list)
    _step_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    _save_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    _unsubtracted_save_s: float = 0.0

    @classmethod
    def for_spec(cls, spec: Mapping[str, Any], hourly_usd: float, progress: Mapping[str, Any]) -> BudgetGuard:
        from trainer.config import read_every

        steps, seconds = read_every((spec.get("checkpoint") or {}).get("every", "auto"))
        return cls(
            budget_usd=(spec.get("resources") or {}).get("budget_usd"),
            hourly_usd=hourly_usd,
            every_steps=steps,
            every_seconds=seconds,
            prior_rate=progress.get("steps_per_s") or None,
        )

    def observe_step(self, step: int, now: float) -> None:
        if self._first is None:
            self._first = (now, step)
        if self._last is not None and step == self._last[1] + 1 and now > self._last[0]:
            # one step's wall time, less a periodic save made between the two steps (reserved apart)
            self._step_s.append(max(0.0, now - self._last[0] - self._unsubtracted_save_s))
        self._unsubtracted_save_s = 0.0
        if self._last is None or step != self._last[1]:
            self._last = (now, step)

    def observe_checkpoint(self, at: float | None) -> None:
        if at and (not self._ckpt_times or at != self._ckpt_times[-1]):
            self._ckpt_times.append(at)

    def observe_save(self, seconds: float) -> None:
        """A save this attempt made took `seconds` of wall time (the stop's own save waits as long)."""
        self._save_s.append(max(0.0, float(seconds)))
        self._unsubtracted_save_s += max(0.0, float(seconds))

    def rate(self) -> float | None:
        if self._first and self._last and self._last[1] > self._first[1] and self._last[0] > self._first[0]:
            return (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
        return self.prior_rate

    def interval_s(self) -> float | None:
        """Seconds until the next checkpoint interval is done; None while the step rate is unknown."""
        if self.every_steps is not None or self.every_seconds is not None:
            rate = self.rate()
            return fixed_interval_s(self.every_steps, self.every_seconds, 1.0 / rate if rate else None)
        if len(self._ckpt_times) >= 2:
            return self._ckpt_times[-1] - self._ckpt_times[-2]
        return self.auto.choose()[0]

    def save_s(self) -> float:
        """The stop's own save: the slowest recent one seen, never under the interval model's cost."""
        return max(self.auto.cost_s or 0.0, max(self._save_s, default=0.0)) + self.auto.upload_s

    def slowest_step_s(self) -> float:
        return max(self._step_s, default=0.0)

    def reserve_s(self) -> float:
        """Seconds that must still fit in the budget (the module's docstring says which)."""
        interval = self.interval_s() or 0.0
        save = self.save_s()
        # a periodic save may come before the next check (every N steps the observed rate counts it)
        periodic = 0.0 if self.every_steps is not None else save
        # between the last check that passed and the stop: up to a second, then the step under way
        reaction = max(self.margin_s, CHECK_EVERY_S + self.slowest_step_s())
        return interval + periodic + save + reaction + self.load_s

    def reserve_usd(self) -> float:
        return max(self.reserve_s() / 3600.0 * self.hourly_usd, self.floor_usd)

    def check(self, spent_usd: float) -> str | None:
        """A reason starting with 'budget' when the run must stop now, else None. It says nothing of a
        checkpoint: the caller knows whether one is kept (`kept_line`)."""
        if self.budget_usd is None or self.hourly_usd <= 0:
            return None
        next_cost = self.reserve_usd()
        if spent_usd + next_cost <= self.budget_usd:
            return None
        load = f", the restart's load ({self.load_s:.0f} s)" if self.load_s else ""
        return (
            f"budget: ${spent_usd:.4f} spent + ${next_cost:.4f} for the next checkpoint interval (with its "
            f"save, a step at the slowest recent pace{load}) would pass budget_usd ${self.budget_usd:g}"
        )


def kept_line(step: int | None) -> str:
    """What the budget stop kept: said only of a checkpoint that is there."""
    if step is None:
        return "no checkpoint was saved: a resume starts from step 0"
    return f"checkpoint at step {step} kept"


# ---- prices ----------------------------------------------------------------------------------------
def price_key(cloud: str, region: str | None, accelerator: str, count: int, spot: bool) -> str:
    return f"{cloud.lower()}:{region or '*'}:{accelerator}:{int(count)}:{'spot' if spot else 'on-demand'}"


def _parse_key(key: str) -> tuple[str, str, str, int, str] | None:
    parts = key.split(":")
    if len(parts) != 5 or not parts[3].isdigit():
        return None
    return parts[0], parts[1], parts[2], int(parts[3]), parts[4]


def market_from_metadata(cloud: str, timeout: float = 0.5) -> str | None:
    """'spot' or 'on-demand' from the instance metadata where the cloud says, else None: the one probe of
    trainer/stops/lifecycle.py (`cloud` and `timeout` are kept for the callers; it asks every provider)."""
    from trainer.stops.lifecycle import on_spot

    answer = on_spot({**os.environ, "FTORCH_NOTICE_PROBE_TIMEOUT_S": str(timeout)})
    return None if answer is None else ("spot" if answer else "on-demand")


def attempt_price(
    environ: Mapping[str, str] | None = None,
    accelerator: str | None = None,
    market_probe: Callable[[str], str | None] = market_from_metadata,
) -> dict[str, Any]:
    """The price this attempt runs at, for its epoch record: {hourly_usd, market, price_source}; {} when
    nothing says (no budget can be enforced then)."""
    env = os.environ if environ is None else environ
    if env.get(HOURLY_ENV):
        try:
            return {"hourly_usd": float(env[HOURLY_ENV]), "price_source": "local.hourly_usd"}
        except ValueError:
            return {}
    try:
        prices = json.loads(env.get(PRICES_ENV) or "{}")
        info = json.loads(env.get("SKYPILOT_CLUSTER_INFO") or "{}")
        gpus = int(env.get("SKYPILOT_NUM_GPUS_PER_NODE") or 0)
        nodes = int(env.get("SKYPILOT_NUM_NODES") or info.get("num_nodes") or 1)
    except (ValueError, TypeError, AttributeError):
        return {}
    cloud, region = str(info.get("cloud") or "").lower(), str(info.get("region") or "")
    if not prices or not cloud:
        return {}
    found: dict[str, dict[str, float]] = {}  # market -> {region or "*": price}
    for key, usd in prices.items():
        parsed = _parse_key(key)
        if parsed is None or parsed[0] != cloud or (gpus and parsed[3] != gpus):
            continue
        if accelerator and parsed[2].lower() not in accelerator.lower():
            continue
        if parsed[1] in (region, "*"):
            found.setdefault(parsed[4], {})[parsed[1]] = float(usd)
    if not found:
        return {}
    market = market_probe(cloud) if len(found) > 1 else next(iter(found))
    source = "instance metadata" if len(found) > 1 and market in found else "offer list"
    if market not in found:  # the cloud does not say: the dearest that matches (never under-count)
        market = max(found, key=lambda m: max(found[m].values()))
        source = "offer list (dearest market)"
    by_region = found[market]
    per_node = by_region.get(region, by_region.get("*", 0.0))
    return {"hourly_usd": round(per_node * nodes, 6), "market": market, "price_source": source}


# ---- spend -----------------------------------------------------------------------------------------
def alive_s(record: Mapping[str, Any], now: float | None = None) -> float:
    """How long an attempt was paid for: from its start to its end, or to when it was last seen alive
    (`now` for the caller's own attempt)."""
    start = _first(record, "started_at", "claimed_at")
    if start is None:
        return 0.0
    end = now if now is not None else _first(record, "ended_at", "alive_at", "started_at", "claimed_at")
    return max(0.0, float(end or 0.0) - float(start))


def _first(record: Mapping[str, Any], *keys: str) -> Any:
    return next((record[k] for k in keys if record.get(k) is not None), None)


def spend_usd(
    records: Mapping[int, Mapping[str, Any]], own_epoch: int = 0, now: float | None = None
) -> float:
    """Sum over the run's attempts (epoch records) of alive time x that attempt's price."""
    total = 0.0
    for n, record in records.items():
        price = record.get("hourly_usd")
        if price:
            total += alive_s(record, now if n == own_epoch else None) * float(price) / 3600.0
    return total


def budget_stop_of(store: Any, attempt: int) -> dict[str, Any] | None:
    """The epoch record of `attempt` if it stopped at its budget (its `stop_detail` says why)."""
    try:
        records = store.epoch_records()
    except Exception:  # noqa: BLE001 - advisory
        return None
    for _n, record in sorted(records.items(), reverse=True):
        if record.get("attempt") == attempt and record.get("stop_reason") == BUDGET:
            return dict(record)
    return None


# ---- in the trainer --------------------------------------------------------------------------------
class BudgetWatch:
    """The trainer's budget stop (rank 0): `over(step, last_checkpoint_at)` once a step, and between
    evaluation batches (`over(None, ...)`); a reason when the job must stop now. Keeps the epoch record's
    `alive_at` fresh (through a long evaluation too)."""

    def __init__(
        self,
        store: Any,
        job: Mapping[str, Any],
        progress: Mapping[str, Any],
        log: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.log, self.clock = store, log, clock
        records = store.epoch_records()
        self.own = dict(records.get(store.epoch) or {})
        self.hourly = float(self.own.get("hourly_usd") or 0.0)
        self.guard = BudgetGuard.for_spec(job, self.hourly, progress)
        self.past_usd = spend_usd({n: r for n, r in records.items() if n != store.epoch})
        start = _first(self.own, "started_at", "claimed_at")
        self.started = float(start if start is not None else clock())
        self._checked = self._alive = 0.0
        self.reason: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.store.epoch) and self.guard.budget_usd is not None and self.hourly > 0

    def spent(self, now: float) -> float:
        return self.past_usd + max(0.0, now - self.started) * self.hourly / 3600.0

    def over(self, step: int | None, last_checkpoint_at: float | None) -> str | None:
        """`step`: the step just made (its time observed); None between evaluation batches (no step: the
        evaluation's time goes into the next step's, as before)."""
        if not self.active or self.reason:
            return None
        now = self.clock()
        if step is not None:
            self.guard.observe_step(step, now)
        self.guard.observe_checkpoint(last_checkpoint_at)
        if now - self._alive >= ALIVE_EVERY_S:
            self._alive = now
            self.store.update_epoch_record(alive_at=now)
        if now - self._checked < CHECK_EVERY_S:
            return None
        self._checked = now
        self.reason = self.guard.check(self.spent(now))
        if self.reason:  # the reserve it reckoned: a restart under the same budget never reckons less
            self.store.update_epoch_record(
                stop_detail=self.reason, budget_reserve_usd=round(self.guard.reserve_usd(), 6), alive_at=now
            )
        return self.reason

    def observe_save(self, seconds: float) -> None:
        self.guard.observe_save(seconds)


def price_record(accelerator: str | None, started_at: float) -> dict[str, Any]:
    """The fields an attempt's epoch record starts with: its price (where known) and when it started."""
    return {**attempt_price(accelerator=accelerator), "started_at": started_at}


def load_s(records: Mapping[int, Mapping[str, Any]]) -> float:
    """A restart's expected load time: the slowest of the earlier attempts' measured start-up (process
    start, model load, checkpoint read, first step: trainer/recording/measure.py), 0 when none measured it."""
    from trainer.runstore.store import MEASURED as KEY

    slowest = 0.0
    for record in records.values():
        phases = (record.get(KEY) or {}).get("phases") or {}
        try:
            slowest = max(slowest, sum(float(phases.get(k) or 0.0) for k in LOAD_PHASES))
        except (TypeError, ValueError):  # a damaged record: it says nothing
            continue
    return slowest


def last_reserve_usd(records: Mapping[int, Mapping[str, Any]]) -> float:
    """The reserve the run's newest budget stop in training reckoned (0.0 when none did)."""
    for _n, record in sorted(records.items(), reverse=True):
        if record.get("stop_reason") == BUDGET and record.get("budget_reserve_usd") is not None:
            try:
                return max(0.0, float(record.get("budget_reserve_usd") or 0.0))
            except (TypeError, ValueError):
                return 0.0
    return 0.0


def restart_reason(
    records: Mapping[int, Mapping[str, Any]],
    job: Mapping[str, Any],
    hourly_usd: float,
    progress: Mapping[str, Any],
) -> str | None:
    """Before a restart (a new attempt, a relaunch): the reason not to begin it when the spend so far
    (`records`: the earlier attempts) plus its expected load and the reserve of the rule would pass the
    budget; None when it fits or the run has no budget or price. The one check of every restart path."""
    if (job.get("resources") or {}).get("budget_usd") is None or not hourly_usd:
        return None
    guard = BudgetGuard.for_spec(job, float(hourly_usd), progress)
    guard.load_s, guard.floor_usd = load_s(records), last_reserve_usd(records)
    return guard.check(spend_usd(records))


def over_at_start(store: Any, job: Mapping[str, Any], attempt: int, price: Mapping[str, Any]) -> str | None:
    """Before any work, on every rank alike (the same earlier records, the same price): the reason to
    leave at once when the run is at its budget already (a resume without a higher budget)."""
    if (job.get("resources") or {}).get("budget_usd") is None or not price.get("hourly_usd"):
        return None
    records = store.epoch_records()
    earlier = {n: r for n, r in records.items() if r.get("attempt") != attempt}
    return restart_reason(earlier, job, float(price["hourly_usd"]), store.read_progress() or {})


def kept_note(store: Any) -> str:
    """'; checkpoint at step N kept' (or that none was saved) from the store's newest complete
    checkpoint; '' when the store cannot say: nothing is claimed then."""
    try:
        newest = store.list_checkpoints().newest
    except Exception:  # noqa: BLE001 - advisory
        return ""
    return f"; {kept_line(newest.step if newest is not None else None)}"


def relaunch_reason(store: Any) -> str | None:
    """The cloud controller's check before it relaunches a run (a switch, a move): `restart_reason` at
    the price the run last ran at (its newest priced epoch record); None when it fits or nothing says."""
    try:
        job = (store.read_json_or_none("spec.json") or {}).get("job") or {}
        records = store.epoch_records()
        progress = store.read_progress() or {}
    except Exception:  # noqa: BLE001 - advisory: the trainer checks again at its start
        return None
    priced = [r for _n, r in sorted(records.items()) if r.get("hourly_usd")]
    if not priced:
        return None
    over = restart_reason(records, job, float(priced[-1]["hourly_usd"]), progress)
    return None if over is None else over + kept_note(store)


def leave_at_start(store: Any, reason: str) -> None:
    """Record the stop (rank 0 holds the epoch) and raise BudgetReached: exit 0, one line."""
    from trainer.stops.interruptions import request_stop

    reason += kept_note(store)
    if store.epoch:
        request_stop(store, BUDGET)
        store.update_epoch_record(
            ended="stopped", stop_reason=BUDGET, stop_detail=reason, ended_at=time.time()
        )
    raise BudgetReached(f"{reason}; `ftorch resume JOB --set resources.budget_usd=...` continues")


def start_watch(
    store: Any, resolved: Mapping[str, Any], auto: AutoInterval | None, log: Callable[[str], None]
) -> BudgetWatch | None:
    """This attempt's budget watch (rank 0: it holds the epoch), sharing the checkpointer's interval
    model; None when the run has no budget or no price."""
    watch = BudgetWatch(store, resolved.get("job") or {}, store.read_progress() or {}, log)
    if not watch.active:
        return None
    if auto is not None:
        watch.guard.auto = auto
    log(
        f"budget ${watch.guard.budget_usd:g}: ${watch.past_usd:.4f} spent before this attempt, "
        f"${watch.hourly:g}/h now ({watch.own.get('price_source')}); the trainer stops itself at it"
    )
    return watch


def stop_now(store: Any, flag: Any, reason: str, log: Callable[[str], None]) -> None:
    """The budget stop: a stop request (so the attempt ends `stopped: budget`, no interruption) and the
    flag the loop checkpoints and leaves on."""
    from trainer.stops.interruptions import request_stop

    log(f"{reason}: checkpointing and stopping")
    request_stop(store, BUDGET)
    flag.set(BUDGET)
