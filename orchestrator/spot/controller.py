"""The controller for cloud jobs: applies the job's spot policy to a SkyPilot managed job.
(Over 400 lines: the switch protocol (stop request, wait for the checkpoint, cancel, relaunch) and the
relaunch after a preemption share one tick, one state file and their records, and must change together;
the SkyPilot wiring itself lives in backends/skypilot_controller.py. It is an optional optimiser: the
budget is the trainer's (trainer/stops/budget.py), notifications are the job's (trainer/recording/notify.py, the
task's event_callback), and the fallback to on demand is the task's own `ordered` list.)

SkyPilot recovers a managed job by itself, but only by walking its resources list from the top (spot
first) and never back from on demand. The controller decides instead, with the same policy objects as
the simulator and the local supervisor (orchestrator.spot.policy): every `tick_s` it reads SkyPilot's queue
record and the run store's progress, asks the policy, and when the policy wants the other kind of
capacity it switches:

1. asks the trainer to checkpoint, through the run store (`control/stop.json`, written by
   trainer.stops.interruptions.request_stop; the trainer polls it and stops as on a preemption notice,
   recording the attempt as stopped), and waits for the checkpoint (at most `stop_timeout_s`);
2. cancels the managed job;
3. launches the same run again with the other resources list: the whole ordered list (spot first, then
   on demand: SkyPilot falls back by itself while no controller watches), or on-demand entries only.
   The run id is the ftorch job id, so the new attempt resumes from the run store.

Spot capacity is not observable on a cloud without asking for it, so the controller infers it: a spot
launch that has not started running `spot_wait_s` after it was submitted (or after a preemption) means
no spot capacity; after that, spot is presumed back `spot_retry_s` later, when the policy may try it.
Policy mode NONE (wait) keeps the spot launch pending: SkyPilot keeps trying spot meanwhile.

The same loop runs for every SkyPilot job with spot offers under EAGER_NEXT_REGION, even when its
policy never switches (`Plan.switching` False):
- a preemption (the managed job leaves RUNNING for RECOVERING without a stop being asked): SkyPilot
  0.14.1 relaunches in the lost region first (EAGER_NEXT_REGION does not block it, notes/skypilot.md
  §6), so the controller cancels the recovering job and relaunches it with the lost region's entries
  last (orchestrator/spot/region_order.py);
- `hooks.on_event(event, reason)` hears preempted / budget / succeeded / failed / cancelled (notifications).

A relaunch comes after the cancel of the managed job it replaces, so one SkyPilot refuses would leave the
run with no managed job: it is tried again every tick (an API server or network hiccup) up to
`relaunch_tries`, and one SkyPilot refuses for good (no enabled cloud: `sky check`) ends the job FAILED
at once, with SkyPilot's error on one line (`hooks.on_failed`, the `failed` event).

Every switch is recorded (attempt, from, to, why) in the job folder's controller.json, with a heartbeat
and where the controller runs; `ftorch status JOB` shows them. If the controller dies, the managed job
keeps running under SkyPilot's own recovery with its current list; status says so, and
`ftorch controller JOB` (or `ftorch resume`) starts a new one.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.errors import one_line
from orchestrator.spot.controller_state import (
    STATE_RECORD,
    LaunchRefused,
    Pending,
    Placement,
    RefusedForGood,
    Relaunch,
    load_state,
    read_state,
    run_end,
    write_state,
)
from orchestrator.spot.policy import Mode, Observation, Policy
from orchestrator.spot.region_order import lost_region_last
from trainer.runstore.lease import Lease, LeaseError
from trainer.stops.budget import relaunch_reason
from trainer.stops.interruptions import STOP_REQUEST, newest_epoch, request_stop, withdraw_stop

#: SkyPilot statuses in which the job is over (for the controller: nothing left to control)
FINAL = {
    "SUCCEEDED",
    "CANCELLED",
    "FAILED",
    "FAILED_SETUP",
    "FAILED_PRECHECKS",
    "FAILED_NO_RESOURCE",
    "FAILED_CONTROLLER",
}
#: policies with something to switch; spot-only and on-demand keep one resources list for good
SWITCHING = ("deadline", "spot-fallback")
#: the start of the reason of a relaunch after a preemption (the registry records it as a preemption)
RELOCATED = "preempted in "


class SkyClient(Protocol):
    """The three SkyPilot calls the controller makes: the real SDK (backends/skypilot_sdk.SdkClient, which
    the backend passes in) or a test double."""

    def launch(self, task: dict[str, Any], name: str) -> int: ...

    def queue(self, job_ids: list[int]) -> list[dict[str, Any]]: ...

    def cancel(self, job_id: int) -> None: ...


class Store(Protocol):
    """What the controller needs of the run store (trainer.runstore.store.RunStore has it)."""

    def read_progress(self) -> dict[str, Any] | None: ...

    def write_json(self, rel: str, payload: Any, atomic: bool = True) -> None: ...

    def remove_file(self, rel: str) -> None: ...

    def read_json_or_none(self, rel: str) -> Any: ...

    def listdir(self, rel: str) -> list[str]: ...

    def write_bytes(self, rel: str, data: bytes, atomic: bool = True, create: bool = False) -> None: ...

    def epoch_records(self) -> dict[int, dict[str, Any]]: ...


@dataclass
class Config:
    tick_s: float = 60.0
    #: a spot launch not running this long after it was submitted (or preempted) means no spot capacity
    spot_wait_s: float = 600.0
    #: after spot was found missing, presume it back this much later (the policy may then try it)
    spot_retry_s: float = 1800.0
    #: how long to wait for the trainer's checkpoint before cancelling anyway
    stop_timeout_s: float = 600.0
    #: the controller counts as dead when its heartbeat is older than this many ticks
    dead_after_ticks: float = 3.0
    #: a relaunch SkyPilot refuses is tried again next tick, at most this many times in all
    relaunch_tries: int = 5
    #: SkyPilot lists no managed job and the run store shows neither progress nor an end this long:
    #: the run failed (the controller ends; it never launches for it)
    gone_after_s: float = 1800.0


@dataclass
class Plan:
    """What the controller needs to know about a job, fixed at launch."""

    job_id: str
    policy: Policy
    tasks: dict[Mode, dict[str, Any]]
    #: seconds on the controller's clock; None = no deadline
    start_s: float
    deadline_s: float | None
    restart_overhead_s: float
    #: planned compute seconds, used until the run store reports steps and a measured rate
    work_s_hint: float = 0.0
    #: planned seconds per training step, until the run store has a measured rate
    step_s_hint: float = 1.0
    #: False: the policy keeps one list (the controller is there for region re-bids)
    switching: bool = True
    #: regions of each offer ("cloud|GPU|count" -> regions), to spread a cloud-wide entry over its
    #: regions when one is lost; {} = cloud-wide entries stay as they are
    regions: dict[str, list[str]] = field(default_factory=dict)


def _ignore(*_args: Any) -> None:
    """The default hook: does nothing, returns None."""


@dataclass(frozen=True, kw_only=True)
class ControllerHooks:
    """What the controller tells its owner (the registry, notifications), and asks it; each optional."""

    #: after each launch (sky_job_id, mode, why); returns the run's attempt number it will be, or None
    on_launch: Callable[[int, Mode, str], int | None] = _ignore
    #: each tick not mid-switch, with SkyPilot's record of the managed job; returns nothing
    on_record: Callable[[dict[str, Any]], None] = _ignore
    #: on preempted / budget / succeeded / failed / cancelled (event, reason); returns nothing
    on_event: Callable[[str, str | None], None] = _ignore
    #: when the job ends FAILED (a relaunch refused, a run SkyPilot forgot), its reason; returns nothing
    on_failed: Callable[[str], None] = _ignore
    #: on the spot list, with SkyPilot's record; returns whether it landed on spot (None: not known)
    placed_spot: Callable[[Mapping[str, Any]], bool | None] = _ignore


class Controller:
    """One job's controller: `tick()` once per `config.tick_s`; `run()` loops until the job is over.
    It acts only while it holds the run's controller lease (trainer/runstore/lease.py)."""

    def __init__(
        self,
        plan: Plan,
        client: SkyClient,
        store: Store,
        job_dir: Any,
        config: Config | None = None,
        *,
        hooks: ControllerHooks | None = None,
        clock: Callable[[], float] = time.time,
        where: str | None = None,
    ) -> None:
        self.plan = plan
        self.client = client
        self.store = store
        self.job_dir = job_dir
        self.config = config or Config()
        self.clock = clock
        self.hooks = hooks or ControllerHooks()
        self.state = load_state(store, job_dir)
        self.state.where = where or f"{platform.node()} (pid {os.getpid()})"
        self.state.pid = os.getpid()
        ttl = self.config.dead_after_ticks * self.config.tick_s
        self.lease = Lease(store, f"{self.state.where} #{id(self):x}", ttl, clock)
        #: why this controller stopped acting without the job being over (the lease is another's)
        self.yielded: str | None = None
        for mode, entries in self.state.ordered.items():  # relaunch orders kept
            if Mode(mode) in plan.tasks:
                plan.tasks[Mode(mode)]["resources"]["ordered"] = entries

    # ---- state ----------------------------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        """The resources list of the current launch (SPOT: spot first, ON_DEMAND)."""
        return Mode(self.state.mode)

    def _save(self) -> None:
        self.state.heartbeat_at = self.clock()
        self.store.write_json(STATE_RECORD, self.state.to_json())  # the truth, for any machine
        write_state(self.job_dir, self.state)  # the copy `ftorch status` reads

    def launch(self, mode: Mode, why: str) -> int:
        """Submit the run with `mode`'s resources list; record it."""
        sky_job_id = self.client.launch(self.plan.tasks[mode], self.plan.job_id)
        now = self.clock()
        st = self.state
        st.mode, st.sky_job_id, st.launched_at, st.down_since, st.placed = (
            mode.value,
            sky_job_id,
            now,
            now,
            None,
        )
        st.missing_since = None
        st.launches.append({"sky_job_id": sky_job_id, "mode": mode.value, "at": now, "why": why})
        attempt = self.hooks.on_launch(sky_job_id, mode, why)  # the run's attempt number it will be
        if attempt is not None and st.switches and why != "launch":
            st.switches[-1]["attempt"] = attempt
        self._save()
        return sky_job_id

    # ---- what the controller sees -------------------------------------------------------------
    def _record(self) -> tuple[dict[str, Any] | None, bool]:
        """SkyPilot's record of the current managed job, and whether the queue answered at all."""
        job_id = self.state.sky_job_id
        if job_id is None:
            return None, True
        try:
            records = self.client.queue([int(job_id)])
        except Exception as exc:  # noqa: BLE001 - an API server away: the run store decides
            sys.stderr.write(f"controller: SkyPilot's queue: {one_line(exc)}\n")
            return None, False
        return next((r for r in records if str(r.get("job_id")) == str(job_id)), None), True

    def _on_spot(self, record: Mapping[str, Any] | None) -> bool:
        """The job runs (or would run) on spot: a spot-first launch that did not land on on-demand."""
        if self.mode is not Mode.SPOT:
            return False
        placed = self.hooks.placed_spot(record) if record else None
        return placed is not False

    def _spot_available(self, record: Mapping[str, Any] | None, now: float) -> bool:
        status, st = str((record or {}).get("status") or ""), self.state
        if self.mode is Mode.SPOT and self._on_spot(record):
            if status == "RUNNING":
                st.down_since, st.spot_missing_at, st.spot_misses, st.probing = None, None, 0, False
                return True
            if st.down_since is None:
                st.down_since = now  # preempted (RECOVERING) or waiting for capacity
            if now - float(st.down_since) >= self.config.spot_wait_s:
                if st.spot_missing_at is None or st.probing:
                    st.spot_misses += 1
                st.spot_missing_at, st.probing = now, False
                return False
            return True
        if self.mode is Mode.SPOT and status == "RUNNING" and (st.spot_missing_at is None or st.probing):
            # the spot-first list fell back to on-demand (SkyPilot walked its `ordered` list): no spot
            st.spot_missing_at, st.spot_misses, st.probing = now, st.spot_misses + 1, False
        missing = st.spot_missing_at
        if missing is None:
            return True
        # after a spot try that found none, wait twice as long before the next
        backoff = 2 ** min(1, max(0, (st.spot_misses or 1) - 1))
        return now - float(missing) >= self.config.spot_retry_s * backoff

    def observation(
        self, record: Mapping[str, Any] | None, progress: Mapping[str, Any], now: float
    ) -> Observation:
        status = str((record or {}).get("status") or "")
        total = int(progress.get("total_steps") or 0)
        step = int(progress.get("step") or 0)
        rate = float(progress.get("steps_per_s") or 0.0)
        per_step = 1.0 / rate if rate > 0 else self.plan.step_s_hint
        if total <= 0:  # no progress yet: the plan's estimate of the whole
            total, per_step = 1, self.plan.work_s_hint
        saved = progress.get("last_checkpoint_step") or 0
        if not self._on_spot(record):
            mode = Mode.ON_DEMAND
        else:
            mode = Mode.SPOT if status == "RUNNING" else Mode.NONE  # NONE: waiting for spot
        recoveries = int((record or {}).get("recovery_count") or 0) if self.mode is Mode.SPOT else 0
        return Observation(
            now_s=now,
            start_s=self.plan.start_s,
            deadline_s=self.plan.deadline_s,
            work_done_s=step * per_step,
            work_total_s=max(total, step) * per_step,
            restart_overhead_s=self.plan.restart_overhead_s,
            spot_available=self._spot_available(record, now),
            mode=mode,
            unsaved_work_s=max(0, step - int(saved)) * per_step,
            tick_s=self.config.tick_s,
            preemptions=self.state.preemptions_before + recoveries,
        )

    # ---- one tick -----------------------------------------------------------------------------
    def _hold_lease(self) -> bool:
        """Take or renew the run's controller lease; False (and `yielded` says why) when it is another's."""
        try:
            if self.lease.generation is None:
                self.lease.acquire()
            else:
                self.lease.renew()
        except LeaseError as exc:
            self.yielded = str(exc)
            sys.stderr.write(f"controller: {exc}\n")
            return False
        return True

    def tick(self) -> bool:
        """Look, decide, act. False once the job is over (nothing left to control) or the lease is
        another controller's (this one must not act)."""
        if not self._hold_lease():
            return False
        now = self.clock()
        if self.state.ended:
            return self._done()
        if self.state.relaunch:  # the managed job it replaces is (being) cancelled: finish that first
            self._relaunch(self.state.relaunch, now)
            self._save()
            return self._going()
        record, answered = self._record()
        if not self.state.pending and record is not None:
            self.hooks.on_record(record)  # not mid-switch: the stop it asked for is no preemption
        progress = self.store.read_progress() or {}
        status = str((record or {}).get("status") or "")
        if record is None and self._missing(answered, progress, now):
            return self._going()
        self.state.missing_since = None
        if progress.get("state") == "finished" or status in FINAL and not self.state.pending:
            return self._end(status or "finished", end_event(status, progress), record)
        if self.state.pending:
            self._continue_switch(self.state.pending, record, progress, now)
            self._save()
            return self._going()
        if self._stop_asked(now):  # `ftorch cancel` is stopping the job: no decision of ours meanwhile
            self.state.placed = None
            self._save()
            return True
        if self._follow_placement(record, progress, now) or not self.plan.switching:
            self._save()
            return self._going()
        self._decide(record, progress, now)
        self._save()
        return self._going()

    def _decide(self, record: Mapping[str, Any] | None, progress: Mapping[str, Any], now: float) -> None:
        obs = self.observation(record, progress, now)
        decision = self.plan.policy.decide(obs)
        want = Mode.SPOT if decision.mode is Mode.NONE else decision.mode
        self.state.last_decision = {"at": now, "mode": decision.mode.value, "why": decision.reason}
        placed = Mode.SPOT if obs.mode is Mode.NONE else obs.mode  # where it runs (or waits to)
        if want is not placed and want in self.plan.tasks:  # SPOT from on-demand: a probe (spot first)
            self._begin_switch(want, decision.reason, record, progress, now)

    def _going(self) -> bool:
        return not self.state.ended

    def _done(self) -> bool:
        self.lease.release()
        return False

    def _end(self, ended: str, event: str, record: Mapping[str, Any] | None) -> bool:
        self.state.ended = ended
        self._save()
        self._event(event, (record or {}).get("failure_reason"))
        return self._done()

    def _missing(self, answered: bool, progress: Mapping[str, Any], now: float) -> bool:
        """No record of the managed job (SkyPilot's jobs controller stopped, 10 min after the last job
        ended; or the API server is away): the run store decides, and nothing is launched or cancelled.
        True when this tick is done (the run ended by its store, or we wait)."""
        verdict = run_end(self.store)
        if verdict is not None:
            event = {"finished": "succeeded", "budget": "budget", "cancelled": "cancelled"}[verdict]
            self._end(verdict, event, None)
            return True
        if self.state.missing_since is None:
            self.state.missing_since = now
        quiet = now - float(progress.get("updated_at") or 0.0)
        gone = answered and now - self.state.missing_since >= self.config.gone_after_s
        if gone and quiet >= self.config.gone_after_s:
            reason = (
                f"SkyPilot lists no managed job {self.state.sky_job_id} and the run store shows no"
                f" progress for {quiet / 60:.0f} min and no end: the run failed; `ftorch resume JOB`"
                " continues from its newest checkpoint"
            )
            self.state.failed = reason
            self.hooks.on_failed(reason)
            self._end("gone", "failed", {"failure_reason": reason})
            return True
        self._save()  # wait: SkyPilot may list it again (an API server restart)
        return True

    def _event(self, event: str, reason: str | None) -> None:
        try:
            self.hooks.on_event(event, reason)
        except Exception as exc:  # a notification must never break the controller
            sys.stderr.write(f"controller: {event}: {exc.__class__.__name__}: {exc}\n")

    def _stop_asked(self, now: float) -> bool:
        """A stop request in the run store from someone else (`ftorch cancel`), recent enough to be
        waited on (one left behind by a cancel that died must not keep the controller idle for good)."""
        try:
            request = self.store.read_json_or_none(STOP_REQUEST)
        except Exception:  # advisory
            return False
        if not isinstance(request, dict):
            return False
        return now - float(request.get("at") or 0.0) <= self.config.stop_timeout_s + 2 * self.config.tick_s

    def _follow_placement(
        self, record: Mapping[str, Any] | None, progress: Mapping[str, Any], now: float
    ) -> bool:
        """Where the job runs; on a preemption, the event and (EAGER_NEXT_REGION) a relaunch with the
        lost region last. True when it relaunched.

        SkyPilot shows a crash restart (max_restarts_on_errors) as RECOVERING too, and a relaunch is a
        new managed job whose restart count starts again: so after one relaunch, the next needs training
        progress since (a trainer crashing at the same step is left to SkyPilot's restart limit)."""
        record = record or {}
        status, sky_job_id, st = str(record.get("status") or ""), self.state.sky_job_id, self.state
        if status == "RUNNING" and record.get("cloud"):
            st.placed = Placement(sky_job_id, str(record["cloud"]).lower(), record.get("region"))
            return False
        placed = st.placed
        if status not in ("RECOVERING", "PENDING", "STARTING") or not placed:
            return False
        st.placed = None
        if placed.sky_job_id != sky_job_id:
            return False
        lost = "/".join(p for p in (placed.cloud, placed.region) if p)
        self._event("preempted", f"preempted in {lost}")
        task = self.plan.tasks.get(self.mode)
        if not task or not placed.region or recovery_strategy(task) != "EAGER_NEXT_REGION":
            return False  # FAILOVER asks for the same region first: SkyPilot's own recovery does that
        entries = task["resources"]["ordered"]
        moved = lost_region_last(entries, placed.cloud, placed.region, self.plan.regions)
        step = int(progress.get("step") or 0)
        if moved == entries or (st.relocated_step is not None and step <= st.relocated_step):
            return False
        st.relocated_step = step
        st.relocations.append({"at": now, "lost": lost, "sky_job_id": sky_job_id})
        task["resources"]["ordered"] = moved
        st.ordered[self.mode.value] = moved
        why = f"{RELOCATED}{lost}: relaunched with that region last"
        intent = Relaunch(self.mode.value, why, now, replaces=sky_job_id)
        refused = self._replace(intent, cancel=True, first_try_only=True)
        if refused is not None:  # e.g. a region SkyPilot's catalog lacks: the list as it was
            sys.stderr.write(
                f"controller: relaunch with {lost} last refused ({refused}); the list as it was\n"
            )
            task["resources"]["ordered"] = entries
            st.ordered.pop(self.mode.value, None)
            intent.why = f"{RELOCATED}{lost}: relaunched (the reordered list was refused)"
            self._relaunch(intent, now)
        return True

    def _begin_switch(
        self,
        to: Mode | str,
        why: str,
        record: Mapping[str, Any] | None,
        progress: Mapping[str, Any],
        now: float,
    ) -> None:
        target = to.value if isinstance(to, Mode) else to
        pending = Pending(target, why, now, int(progress.get("step") or 0))
        self.state.pending = pending
        if str((record or {}).get("status")) == "RUNNING":
            reason = f"policy switch to {target}: {why}"
            # named for the attempt running now and any restart of it until withdrawn: SkyPilot
            # restarting the trainer (exit 75) before the cancel must not train on
            request_stop(self.store, reason, epoch=newest_epoch(self.store))
            pending.asked_checkpoint = True
        else:  # nothing is training: nothing to save
            self._finish_switch(pending, record, now)

    def _continue_switch(
        self, pending: Pending, record: Mapping[str, Any] | None, progress: Mapping[str, Any], now: float
    ) -> None:
        saved = checkpoint_saved(progress, pending.step)
        stopped = str((record or {}).get("status") or "") != "RUNNING"
        if saved or stopped or now - pending.at >= self.config.stop_timeout_s:
            self._finish_switch(pending, record, now)

    def _finish_switch(self, pending: Pending, record: Mapping[str, Any] | None, now: float) -> None:
        st = self.state
        old_mode, old_id = self.mode, st.sky_job_id
        if old_mode is Mode.SPOT:
            st.preemptions_before += int((record or {}).get("recovery_count") or 0)
        waited = round(now - pending.at, 1)
        live = old_id is not None and str((record or {}).get("status") or "") not in FINAL
        to = Mode(pending.to)
        st.pending = None
        st.probing = to is Mode.SPOT and st.spot_missing_at is not None
        st.switches.append(
            {
                "attempt": len(st.launches) + 1,
                "at": now,
                "from": old_mode.value,
                "to": to.value,
                "why": pending.why,
                "waited_for_checkpoint_s": waited,
            }
        )
        self._replace(Relaunch(to.value, pending.why, now, replaces=old_id if live else None), cancel=live)

    def _replace(self, intent: Relaunch, cancel: bool, first_try_only: bool = False) -> str | None:
        """Cancel the current managed job and launch its replacement, the intent saved in the run store
        first: a controller killed in between finishes it when it starts again (never no managed job).
        `first_try_only`: a refusal is returned (its line) instead of counted, for the caller to retry."""
        self.state.relaunch = intent
        self._save()
        if cancel and intent.replaces is not None:
            self.client.cancel(int(intent.replaces))
            intent.replaces = None
            self._save()
        if not first_try_only:
            self._relaunch(intent, intent.at)
            return None
        try:
            self._launch_for(intent)
        except Exception as exc:  # noqa: BLE001 - the caller tries again another way
            return exc.line if isinstance(exc, LaunchRefused) else one_line(exc)
        return None

    def _relaunch(self, intent: Relaunch, now: float) -> None:
        """A launch after the cancel of the managed job it replaces. A refusal is kept to be tried again
        next tick; one for good (RefusedForGood), or the last try, ends the job FAILED."""
        try:
            self._launch_for(intent)
        except Exception as exc:  # noqa: BLE001 - SkyPilot refusing it: kept, tried again next tick
            self._refused(intent, exc, now)

    def _launch_for(self, intent: Relaunch) -> None:
        """Carry out a relaunch intent: cancel the job it replaces if a kill came before that, then
        launch, unless the run is over by its store (finished or stopped meanwhile): never for it."""
        if intent.replaces is not None:
            self.client.cancel(int(intent.replaces))  # the kill came before the cancel: cancel now
            intent.replaces = None
            self._save()
        over = run_end(self.store)
        if over is not None:
            self.state.relaunch, self.state.ended = None, over
            self._event({"finished": "succeeded"}.get(over, over), "the run ended before the relaunch")
            return
        at_budget = relaunch_reason(self.store)  # its load and what must still fit would pass the budget
        if at_budget is not None:
            sys.stderr.write(f"controller: no relaunch: {at_budget}\n")
            self.state.relaunch, self.state.ended = None, "budget"
            self._event("budget", at_budget)
            return
        withdraw_stop(self.store)  # the stop asked of the old attempt is done: the new one trains
        self.launch(Mode(intent.mode), intent.why)
        self.state.relaunch = None

    def _refused(self, intent: Relaunch, exc: Exception, now: float) -> None:
        intent.tries += 1
        line = exc.line if isinstance(exc, LaunchRefused) else one_line(exc)
        intent.error = line
        self.state.relaunch = intent
        sys.stderr.write(f"controller: relaunch {intent.tries} refused: {line}\n")
        if isinstance(exc, RefusedForGood) or intent.tries >= self.config.relaunch_tries:
            tries = intent.tries
            reason = f"relaunch refused by SkyPilot{f' {tries} times' if tries > 1 else ''}: {line}"
            reason += "; `ftorch resume JOB` continues from the checkpoint once SkyPilot accepts it"
            self.state.relaunch, self.state.ended, self.state.failed = None, "relaunch refused", reason
            self.hooks.on_failed(reason)
            self._event("failed", reason)

    def run(
        self, stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        while not stop():
            try:
                if not self.tick():
                    return
            except LeaseError as exc:
                self.yielded = str(exc)
                return
            except Exception as exc:  # a flaky API server: keep the job, try again next tick
                sys.stderr.write(f"controller: {exc.__class__.__name__}: {exc}\n")
            sleep(self.config.tick_s)


def end_event(status: str, progress: Mapping[str, Any]) -> str:
    """The notification event of a job that ended with SkyPilot `status`."""
    if progress.get("state") == "finished" or status == "SUCCEEDED":
        return "succeeded"
    return "cancelled" if status == "CANCELLED" else "failed"


def recovery_strategy(task: Mapping[str, Any]) -> str:
    recovery = task.get("resources", {}).get("job_recovery") or "EAGER_NEXT_REGION"
    name = recovery.get("strategy") if isinstance(recovery, Mapping) else recovery
    return str(name or "EAGER_NEXT_REGION").upper()


# ---- a stop that waits for the checkpoint (policy switches and `ftorch cancel`) -------------------------
def checkpoint_saved(progress: Mapping[str, Any] | None, step: int) -> bool:
    """The trainer has saved (at or after `step`) and left, after a stop request."""
    progress = progress or {}
    return progress.get("state") in ("preempted", "finished") or (
        int(progress.get("last_checkpoint_step") or -1) >= step and progress.get("state") != "running"
    )


def stop_then_cancel(
    client: SkyClient,
    store: Any,
    sky_job_id: int,
    reason: str,
    timeout_s: float = Config.stop_timeout_s,
    poll_s: float = 10.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Ask a running trainer to checkpoint (run store control/stop.json), wait for it (at most
    `timeout_s`), then cancel the managed job. Returns what happened (for the caller's message)."""

    def record() -> Mapping[str, Any]:
        found = [r for r in client.queue([sky_job_id]) if str(r.get("job_id")) == str(sky_job_id)]
        return found[0] if found else {}

    status = str(record().get("status") or "")
    outcome: dict[str, Any] = {"asked_checkpoint": False, "saved": False, "waited_s": 0.0}
    if status == "RUNNING":
        progress = store.read_progress() or {}
        step = int(progress.get("step") or 0)
        start = clock()
        # in force for the attempt running now and any restart of it until withdrawn below: a
        # trainer that exits 75 and is restarted before the cancel stops again instead of training
        request_stop(store, reason, epoch=newest_epoch(store))
        outcome["asked_checkpoint"] = True
        while clock() - start < timeout_s:
            sleep(min(poll_s, max(0.0, timeout_s - (clock() - start))))
            if checkpoint_saved(store.read_progress(), step):
                outcome["saved"] = True
                break
            status = str(record().get("status") or "")
            if status != "RUNNING":
                break
        outcome["waited_s"] = round(clock() - start, 1)
    if status not in FINAL:
        client.cancel(int(sky_job_id))
    if outcome["asked_checkpoint"]:
        withdraw_stop(store)
    return outcome


# ---- status --------------------------------------------------------------------------------------
def status_fields(job_dir: Any, now: float | None = None, config: Config | None = None) -> dict[str, Any]:
    """What `ftorch status` shows about the controller: where it runs, alive or not, its switches."""
    state = read_state(job_dir)
    if not state:
        return {}
    now = time.time() if now is None else now
    config = config or Config()
    beat = state.get("heartbeat_at")
    alive = beat is not None and now - float(beat) <= config.dead_after_ticks * config.tick_s + 5
    ended = state.get("ended")
    out: dict[str, Any] = {
        "controller": {
            "where": state.get("where"),
            "alive": bool(alive) and not ended,
            "mode": state.get("mode"),
            "switches": state.get("switches") or [],
            "last_decision": state.get("last_decision"),
        }
    }
    if ended:
        out["controller"]["note"] = f"ended with the job ({ended})" + (
            f": {state['failed']}" if state.get("failed") else ""
        )
    elif not alive:
        out["controller"]["note"] = (
            f"not alive (last heartbeat {int(now - float(beat or 0))} s ago): the managed job keeps running "
            "under SkyPilot's own recovery with its current resources list; `ftorch resume JOB` starts a "
            "new controller"
        )
    return out
