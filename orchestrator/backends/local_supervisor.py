"""`python -m orchestrator.backends.local_supervisor JOB_ID`: runs one job's attempts to the end.

State machine (registry states):
    PROVISIONING -> RUNNING -> SUCCEEDED
                            -> PREEMPTED -> RECOVERING -> RUNNING ...   (simulated or real notice)
                            -> RECOVERING (crash, within local.max_restarts_on_errors) -> RUNNING ...
                            -> FAILED (bad config, or too many crashes)
                            -> CANCELLED (ftorch cancel: SIGTERM to the trainer, which checkpoints)
                            -> STOPPED "budget: ..." (the trainer stopped itself at budget_usd: it
                               exits 0 and its epoch record says budget; trainer/stops/budget.py)
The budget is the trainer's (it holds with this process frozen, as on a sleeping laptop); this process
keeps the spend for status and refuses to start an attempt of a run already at its budget (the same rule).
Notifications (`notify:`) go out on SUCCEEDED, FAILED, CANCELLED, the budget stop and each preemption.
The trainer gets SIGTERM if this process dies, so it never runs unsupervised.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

from orchestrator import procs
from orchestrator.backends.capacity import PolicyDriver, TraceCapacity
from orchestrator.backends.local_parts import (
    Chaos,
    PatientRegistry,
    ProgressTail,
    kill_group,
    newest_checkpoint_step,
    own_step,
    policy_inputs,
    record_run_facts,
    start_trainer,
    stop_trainer,
    store_failure_reason,
    times,
    trainer_command,
)
from orchestrator.backends.local_queue import DeviceQueue
from orchestrator.backends.notify import notify_job
from orchestrator.logtail import LogTail
from orchestrator.records import cost_usd
from orchestrator.registry import Registry
from orchestrator.spot.policy import Mode
from orchestrator.states import AttemptEnd, JobState, Outcome
from trainer import exitcodes
from trainer.config import JobSpec
from trainer.health.rules import ended_as, stall_reason, unhealthy_reason
from trainer.runstore.store import SPEC_DIGEST_ENV, RunStore, spec_digest
from trainer.stops.budget import BudgetGuard, budget_stop_of, kept_note, restart_reason
from trainer.stops.interruptions import request_stop
from trainer.stops.watchdog import KEY as STALL_KEY
from trainer.stops.watchdog import outside, setup_timeout, stale

POLL_S = 0.05


class Supervisor:
    def __init__(self, job_id: str) -> None:
        self.registry = cast(Registry, PatientRegistry(Registry(), self.log))
        self.job_id = job_id
        job = self.registry.get(job_id)
        self.spec = JobSpec.model_validate(job.spec)
        self.store = RunStore(job.run_uri, self.spec.checkpoint.storage_options)
        self.cancelled = False
        fired = {
            int(e["detail"].split()[1])
            for e in self.registry.events(job_id)
            if e["kind"] == "chaos" and (e["detail"] or "").startswith("step ")
        }
        self.chaos = Chaos(
            self.spec.local.chaos,
            fired=fired,
            rng=random.Random((self.spec.local.chaos.seed if self.spec.local.chaos else 0) + len(fired)),
        )
        self.crashes = 0
        self.stalled_at: int | None = None  # the newest checkpoint step at the last stall
        self.attempt_n: int | None = None  # the running attempt (set when its trainer starts)
        self.start_step = 0  # the current attempt's start (the newest checkpoint when it began)
        self.proc: subprocess.Popen[bytes] | None = None
        self.budget_stop: str | None = None
        # simulated spot capacity (local.chaos.trace) and the policy that reacts to it
        self.capacity = TraceCapacity.from_spec(self.spec)
        self.driver = PolicyDriver.from_spec(self.spec, self.capacity) if self.capacity else None
        self.mode = Mode.NONE
        self.pending_mode: Mode | None = None
        self.preemptions = 0
        self.pinned: dict | None = None  # the spec.json every attempt starts with (pin_spec)

    def log(self, message: str) -> None:
        sys.stdout.write(f"{time.strftime('%H:%M:%S')} [supervisor] {message}\n")
        sys.stdout.flush()

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        self.cancelled = True

    def notify(self, event: str) -> None:
        notify_job(self.registry, self.job_id, event, self.log)

    def end(self, state: JobState, reason: str | None = None, event: str | None = None) -> None:
        """Record a final state and send its notification."""
        self.registry.set_state(self.job_id, state, reason)
        self.notify(event or state.lower())

    def record_run_facts(self) -> None:
        record_run_facts(self.registry, self.job_id, self.spent())

    def budget_guard(self) -> BudgetGuard:
        progress = self.store.read_progress() or {}
        return BudgetGuard.for_spec(self.registry.get(self.job_id).spec, self.spec.local.hourly_usd, progress)

    def spent(self) -> float:
        return cost_usd(self.registry.attempts(self.job_id), JobState.RUNNING, time.time())

    def restart_over(self) -> str | None:
        """The trainer's restart rule (trainer/stops/budget.py `restart_reason`: the spend in the run
        store, the expected load, never less than the last budget stop's reserve) before an attempt
        starts, with what is kept said only of a checkpoint that is there."""
        job = self.registry.get(self.job_id).spec
        if (job.get("resources") or {}).get("budget_usd") is None:
            return None
        try:
            records = self.store.epoch_records()
            progress = self.store.read_progress() or {}
        except Exception:  # noqa: BLE001 - advisory: the trainer checks again at its start
            over = self.budget_guard().check(self.spent())
        else:
            over = restart_reason(records, job, self.spec.local.hourly_usd, progress)
        if over is None:
            return None
        return over + kept_note(self.store)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, self.on_sigterm)
        self.registry.update(
            self.job_id, supervisor_pid=os.getpid(), supervisor_started=procs.start_time(os.getpid())
        )
        if not self.take_device():  # cancelled while queued for the device
            self.end(JobState.CANCELLED, "cancelled by the user while queued; checkpoints kept")
            return 0
        self.share_group_budget()
        self.pinned = self.launched_spec()
        first = not self.registry.attempts(self.job_id)
        self.registry.set_state(self.job_id, JobState.PROVISIONING if first else JobState.RECOVERING)
        while True:
            if self.cancelled or self.registry.get(self.job_id).cancel_requested:
                self.end(JobState.CANCELLED, "cancelled by the user; checkpoints kept")
                return 0
            over = self.restart_over()
            if over:  # e.g. a resume without a higher budget: stop before starting anything
                self.registry.event(self.job_id, "budget", over.removeprefix("budget: "))
                self.end(JobState.STOPPED, over, event="budget")
                return 0
            if self.driver is not None:
                pending, self.pending_mode = self.pending_mode, None
                self.mode = pending if pending not in (None, Mode.NONE) else self.wait_for_capacity()
                if self.mode is Mode.NONE:  # cancelled while waiting
                    continue
            end = self.run_attempt()
            outcome = end.outcome
            if outcome is Outcome.ADAPTED:  # out of memory: a smaller micro-batch, at once, no crash
                self.registry.set_state(self.job_id, JobState.RECOVERING, end.reason)
                continue
            if outcome is Outcome.SWITCH:  # the policy moved the job: no backoff, no preemption
                self.registry.set_state(self.job_id, JobState.RECOVERING, end.reason)
                continue
            if outcome is Outcome.SUCCEEDED:
                self.record_run_facts()
                self.end(JobState.SUCCEEDED)
                return 0
            if outcome is Outcome.CANCELLED:
                self.end(JobState.CANCELLED, "cancelled by the user; checkpoints kept")
                return 0
            if outcome is Outcome.BUDGET:  # the trainer stopped itself (it sent its own notification)
                self.registry.event(self.job_id, "budget", end.reason.removeprefix("budget: "))
                self.end(JobState.STOPPED, end.reason, event="budget")
                return 0
            if outcome is Outcome.FAILED:
                self.end(JobState.FAILED, end.detail)
                return 1
            if (
                outcome is Outcome.UNHEALTHY
            ):  # the health checks ended it (trainer/health/rules.py): no restart
                self.registry.event(self.job_id, "unhealthy", end.reason)
                self.end(JobState.UNHEALTHY, end.reason)
                return 1
            if outcome is Outcome.FENCED:  # never restarted: that would fence the attempt that owns it
                owner = self.registry.get(self.job_id)
                if owner.supervisor_pid != os.getpid() and procs.alive(
                    owner.supervisor_pid, owner.supervisor_started
                ):
                    self.registry.event(
                        self.job_id, "fenced", f"{end.reason}; pid {owner.supervisor_pid} goes on"
                    )
                    return 0
                self.end(JobState.FAILED, end.reason)
                return 1
            if outcome is Outcome.STALLED:
                self.registry.set_state(self.job_id, JobState.RECOVERING, end.reason)
                continue
            if outcome is Outcome.PREEMPTED:
                self.preemptions += 1
                self.mode = Mode.NONE
                self.notify("preempted")
            time.sleep(self.spec.local.restart_backoff_s)
            self.registry.set_state(self.job_id, JobState.RECOVERING, end.reason)

    def take_device(self) -> bool:
        """Wait (PENDING) until this machine's device is free: local jobs take turns (local_queue.py)."""
        self.queue = DeviceQueue(self.registry.home, self.job_id)

        def waiting(reason: str) -> None:
            self.log(reason)
            self.registry.set_state(self.job_id, JobState.PENDING, reason)
            self.registry.event(self.job_id, "queued", reason)

        return self.queue.wait(
            lambda: self.cancelled or self.registry.get(self.job_id).cancel_requested, waiting
        )

    def share_group_budget(self) -> None:
        """A job of a group (`ftorch sweep`) with a shared budget gets what the group's other jobs have not
        spent, as its own `resources.budget_usd` (registry and spec.json), so the trainer's one budget rule
        keeps the whole group inside it. Local jobs take turns, so the others' spend is settled by now."""
        group = self.registry.groups().get(self.job_id)
        if not group or group["budget_usd"] is None:
            return
        now = time.time()
        others = sum(
            cost_usd(self.registry.attempts(j), self.registry.get(j).state, now)
            for j, g in self.registry.groups().items()
            if g["group_id"] == group["group_id"] and j != self.job_id
        )
        left = round(max(0.0, group["budget_usd"] - others), 6)
        job = self.registry.get(self.job_id)
        spec = dict(job.spec)
        spec["resources"] = {**(spec.get("resources") or {}), "budget_usd": left}
        resolved = self.store.read_spec()
        resolved["job"] = {**resolved["job"], "resources": spec["resources"]}
        self.store.write_spec(resolved)
        self.registry.update(self.job_id, spec_json=json.dumps(spec))
        self.registry.event(
            self.job_id, "group", f"group {group['group_id']}: ${left:.2f} of ${group['budget_usd']:.2f} left"
        )

    def launched_spec(self) -> dict:
        """The spec.json this job's attempts start with: the run store's as launch or resume wrote it, its
        job, run id and output as the registry has them (a run store is data: whoever can write the bucket
        does not set this machine's job; docs/storage.md)."""
        job = self.registry.get(self.job_id)
        try:
            resolved = self.store.read_spec()
        except Exception:  # noqa: BLE001 - unreadable: rebuilt from the registry
            resolved = {"created_at": job.created_at}
        if not isinstance(resolved, dict):
            resolved = {"created_at": job.created_at}
        return {**resolved, "job": job.spec, "run_id": self.job_id, "output_uri": job.output_uri}

    def pin_spec(self) -> None:
        """Before an attempt: the run store's spec.json is the launched one (launched_spec, with the
        trainer's own out-of-memory records): one changed in the store between attempts is rewritten, and
        the change named in the log and the job's events."""
        if self.pinned is None:
            self.pinned = self.launched_spec()
        try:
            found = self.store.read_json_or_none("spec.json")
        except Exception:  # noqa: BLE001 - unreadable: written again below
            found = None
        if found == self.pinned:
            return
        changed = spec_changes(found, self.pinned)
        try:
            self.store.write_spec(self.pinned)
        except Exception as exc:  # noqa: BLE001 - the trainer reports an unreachable store
            self.log(f"cannot rewrite spec.json in the run store: {exc.__class__.__name__}: {exc}")
            return
        said = f"spec.json in the run store was changed outside this job ({changed}); rewritten from the registry's copy"
        self.log(said)
        self.registry.event(self.job_id, "spec", said)

    def take_adaptation(self, resolved: dict, attempt: int | None) -> None:
        """The trainer's out-of-memory record of `attempt` (trainer/train_step/oom.py) joins the pinned
        spec.json, so the next attempt runs the smaller layout."""
        from trainer.train_step import oom

        if self.pinned is None:
            return
        mine = [e for e in oom.adaptations(resolved) if e.get("attempt") == attempt]
        known = oom.adaptations(self.pinned)
        self.pinned[oom.ADAPTATIONS_KEY] = known + [e for e in mine if e not in known]
        if any((e.get("to") or {}).get("gradient_checkpointing") for e in mine):
            job = json.loads(json.dumps(self.pinned["job"]))
            job.setdefault("train", {})["gradient_checkpointing"] = True
            self.pinned["job"] = job

    def run_attempt(self) -> AttemptEnd:
        """One attempt: start the trainer from the newest checkpoint, watch it until it exits or is
        stopped, and record how it ended."""
        attempt_n, log_path, mirror = self._start_trainer()
        tail = LogTail(log_path)
        progress_tail = ProgressTail(mirror)
        preempted = self._watch(attempt_n, progress_tail)
        return self._end_attempt(attempt_n, preempted, progress_tail, tail)

    def _start_trainer(self) -> tuple[int, Path, Path]:
        """Record a new attempt and start its trainer (log to the attempt's file); the attempt number,
        the log and the progress mirror the trainer writes."""
        self.pin_spec()  # the settings this job was launched with, whatever the store says now
        start_step = newest_checkpoint_step(self.store)  # progress.json can lag the newest checkpoint
        self.start_step = start_step
        spot = None if self.driver is None else self.mode is Mode.SPOT
        attempt = self.registry.start_attempt(
            self.job_id,
            start_step,
            instance="local" if spot is None else f"local ({self.mode.value}, simulated)",
            spot=spot,
            hourly_usd=self.spec.local.hourly_usd,
        )
        log_path = self.registry.job_dir(self.job_id) / "logs" / f"attempt-{attempt.n:03d}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        job = self.registry.get(self.job_id)
        env = dict(os.environ)
        env["FTORCH_ATTEMPT"] = str(attempt.n)
        env["FTORCH_SUPERVISOR_PID"] = str(os.getpid())  # its SIGTERM on our death is no preemption
        # for the trackers (train.report_to): what only the supervisor knows
        env.update(FTORCH_PREEMPTIONS=str(self.preemptions), FTORCH_COST_USD=f"{self.spent():.6f}")
        env["FTORCH_HOURLY_USD"] = str(self.spec.local.hourly_usd)
        mirror = log_path.parent / f"progress-{attempt.n:03d}.json"
        env["FTORCH_PROGRESS_MIRROR"] = str(mirror)
        if self.pinned is not None:  # the trainer checks that it reads the spec.json pinned just now
            env[SPEC_DIGEST_ENV] = spec_digest(self.pinned)
        log_file = procs.open_private(log_path)
        with log_file:
            self.attempt_n = attempt.n
            self.proc = start_trainer(
                trainer_command(self.spec.local.nproc, job.run_uri, attempt.n), log_file, env
            )
        self.registry.update_attempt(self.job_id, attempt.n, pid=self.proc.pid)
        self.log(f"attempt {attempt.n} started (pid {self.proc.pid}) from step {start_step}")
        return attempt.n, log_path, mirror

    def _watch(self, attempt_n: int, progress_tail: ProgressTail) -> AttemptEnd | None:
        """Poll the running trainer until it exits, or stop it: on cancel or the budget (None: the exit
        code tells), or on a policy switch or a simulated preemption (returned)."""
        assert self.proc is not None
        running = False
        last = started = time.time()
        while self.proc.poll() is None:
            time.sleep(POLL_S)
            now = time.time()
            step = progress_tail.poll()
            if step is not None and not running:
                running = True
                fields = {} if progress_tail.resumed is None else {"start_step": progress_tail.resumed}
                self.registry.update_attempt(self.job_id, attempt_n, first_step_at=now, **fields)
                self.registry.set_state(self.job_id, JobState.RUNNING)
            if self._stop_if_cancelled(ask_registry=now - last > 1.0):
                return None
            switch = self.follow_policy(now, step)
            if switch is not None:
                return switch
            if running:
                stalled = self._kill_if_stalled(step, progress_tail, now)
            else:
                stalled = self._kill_if_setup_stalled(now - started)
            if stalled is not None:
                return stalled
            due = self.chaos.due(step or 0, now - last) if running else None
            last = now
            if due is not None:
                return self._simulate_preemption(attempt_n, step, *due)
        return None

    def _kill_if_stalled(
        self, step: int | None, progress_tail: ProgressTail, now: float
    ) -> AttemptEnd | None:
        """A frozen trainer runs no watchdog: kill it when its heartbeat (the progress mirror it rewrites
        every step) is older than its own stall timeout (trainer/stops/watchdog.py)."""
        age = stale(progress_tail.progress, now)
        if age is None:
            return None
        timeout = progress_tail.progress[STALL_KEY]
        return self._kill_stalled(
            f"stalled: no heartbeat for {age:.0f} s at step {step} (timeout {timeout:.0f} s); killed"
        )

    def _kill_if_setup_stalled(self, age: float) -> AttemptEnd | None:
        """A trainer frozen before its first step (model load, data, checkpoint read) runs no watchdog
        and writes no heartbeat: kill it once it has been setting up past its set-up timeout's margin."""
        timeout = setup_timeout(self.spec.train.health.setup_timeout_s)
        if age <= outside(timeout):
            return None
        return self._kill_stalled(
            f"stalled: no first step {age:.0f} s after the start (setup timeout {timeout:.0f} s); killed"
        )

    def _kill_stalled(self, reason: str) -> AttemptEnd:
        self.log(reason)
        self.registry.event(self.job_id, "stalled", reason)
        assert self.proc is not None
        kill_group(self.proc)
        return AttemptEnd(Outcome.STALLED, reason)

    def stalled(self, end: AttemptEnd) -> AttemptEnd:
        """Restart a stalled trainer once per progress: two stalls with no new checkpoint between them end
        the run UNHEALTHY (NVIDIA's resiliency extension: no restarts without progress)."""
        newest = newest_checkpoint_step(self.store)
        if self.stalled_at is not None and newest <= self.stalled_at:
            return AttemptEnd(
                Outcome.UNHEALTHY,
                f"unhealthy: stalled twice without progress (checkpoint step {newest}); {end.reason}",
            )
        self.stalled_at = newest
        return end

    def _stop_if_cancelled(self, ask_registry: bool) -> bool:
        """On `ftorch cancel` (a signal, or the registry's flag when `ask_registry`): the trainer
        checkpoints and stops."""
        if not (self.cancelled or (ask_registry and self.registry.get(self.job_id).cancel_requested)):
            return False
        self.cancelled = True
        request_stop(self.store, "cancel")  # not an interruption (trainer/stops/interruptions.py)
        self.stop_trainer(notice=True, grace=max(60.0, self._grace()))
        return True

    def _simulate_preemption(self, attempt_n: int, step: int | None, what: str, notice: bool) -> AttemptEnd:
        """local.chaos: a spot preemption, with the notice (SIGTERM, then a grace) or without (SIGKILL)."""
        preempted = AttemptEnd(
            Outcome.PREEMPTED, f"preempted ({'with' if notice else 'without'} notice, {what})"
        )
        self.registry.event(self.job_id, "chaos", f"{what} notice={notice} attempt={attempt_n}")
        self.registry.set_state(self.job_id, JobState.PREEMPTED, preempted.reason)
        self.log(f"simulated spot preemption at step {step} ({what}, notice={notice})")
        self.stop_trainer(notice=notice, grace=self._grace())
        return preempted

    def _end_attempt(
        self, attempt_n: int, preempted: AttemptEnd | None, progress_tail: ProgressTail, tail: LogTail
    ) -> AttemptEnd:
        """Wait for the trainer's exit, then record the attempt's end step, exit code and outcome."""
        assert self.proc is not None
        code = self.proc.wait()
        kill_group(self.proc)  # what the trainer left running (e.g. a tokeniser worker) goes with it
        progress_tail.poll()
        end_progress = self.store.read_progress() or {}
        ended_at = time.time()
        stopped = budget_stop_of(self.store, attempt_n) if code == exitcodes.BUDGET_STOPPED else None
        self.budget_stop = (stopped or {}).get("stop_detail") or ("budget" if stopped else None)
        if stopped and stopped.get("ended_at"):  # this process may have been frozen since (a laptop asleep)
            ended_at = min(ended_at, float(stopped["ended_at"]) + 1.0)
        self.registry.update_attempt(
            self.job_id,
            attempt_n,
            ended_at=ended_at,
            exit_code=code,
            end_step=progress_tail.step
            if progress_tail.step is not None
            else own_step(end_progress, attempt_n, self.start_step),
        )
        end = self.classify(code, preempted, end_progress, tail)
        if end.outcome is Outcome.STALLED:
            end = self.stalled(end)
        self.registry.update_attempt(self.job_id, attempt_n, end_reason=end.reason, outcome=end.outcome)
        self.log(f"attempt {attempt_n} ended: exit code {code}, {end.reason}")
        return end

    def _grace(self) -> float:
        return self.spec.local.chaos.grace_s if self.spec.local.chaos else 30.0

    def classify(self, code: int, preempted: AttemptEnd | None, progress: dict, tail: LogTail) -> AttemptEnd:
        succeeded = AttemptEnd.of(Outcome.SUCCEEDED)
        if self.cancelled:
            return AttemptEnd.of(Outcome.CANCELLED)
        noticed = code == exitcodes.PREEMPTED or self.ranks_preempted(code, progress)
        if self.budget_stop and progress.get("state") != "finished":  # the trainer's budget stop
            return AttemptEnd(Outcome.BUDGET, self.budget_stop)
        if preempted and code == exitcodes.OK and progress.get("state") == "finished":
            # a switch or a simulated preemption that came after the last step's output was written: the
            # run is done, nothing was lost, nothing to run again (the trainer already said `succeeded`)
            return succeeded
        if preempted:
            return preempted
        if code == exitcodes.OK and progress.get("state") == "finished":
            return succeeded
        if noticed:
            self.registry.set_state(self.job_id, JobState.PREEMPTED, "preemption notice (SIGTERM)")
            return AttemptEnd(Outcome.PREEMPTED, "preempted (notice from outside)")
        last = " | ".join(tail.last_lines(1)) or "no output"
        memory = self.out_of_memory(code)  # trainer/train_step/oom.py: a smaller layout, or a re-plan
        if memory is not None:
            return memory
        ended = (
            ended_as(self.store, self.attempt_n) if code not in (exitcodes.OK, exitcodes.PREEMPTED) else None
        )
        if ended in ("unhealthy", "stalled") and code != exitcodes.UNHEALTHY and code != exitcodes.STALLED:
            code = (
                exitcodes.UNHEALTHY if ended == "unhealthy" else exitcodes.STALLED
            )  # torchrun exits 1 for them
        if code == exitcodes.STALLED:  # the trainer's own watchdog; the epoch record says where
            return AttemptEnd(Outcome.STALLED, stall_reason(self.store, self.attempt_n))
        if code == exitcodes.UNHEALTHY:  # never restarted; the epoch record says why
            return AttemptEnd(Outcome.UNHEALTHY, unhealthy_reason(self.store, self.attempt_n))
        if code == exitcodes.BAD_CONFIG:
            return AttemptEnd.of(Outcome.FAILED, f"the trainer refused the job: {last}")
        if code == exitcodes.STORE_UNAVAILABLE:
            return AttemptEnd.of(Outcome.FAILED, store_failure_reason(last))
        if code == exitcodes.FENCED:
            return AttemptEnd.of(Outcome.FENCED, f"another attempt owns this run: {last}")
        self.crashes += 1
        limit = self.spec.local.max_restarts_on_errors
        if self.crashes > limit:
            return AttemptEnd.of(
                Outcome.FAILED, f"the trainer crashed {times(self.crashes)} (exit code {code}); last: {last}"
            )
        self.registry.event(
            self.job_id, "crash", f"exit code {code} ({self.crashes}/{limit} restarts): {last}"
        )
        return AttemptEnd(Outcome.CRASHED, f"crashed (exit code {code}); restart {self.crashes} of {limit}")

    def out_of_memory(self, code: int) -> AttemptEnd | None:
        """An attempt that ran out of memory (its exit code, or under torchrun spec.json's record of this
        attempt): ADAPTED with the new layout, or FAILED when the smallest does not fit (re-plan)."""
        from trainer.train_step import oom

        if code == exitcodes.OK or code < 0:
            return None
        try:
            resolved = self.store.read_spec()
        except Exception:  # noqa: BLE001 - without spec.json the exit code alone cannot tell the layout
            resolved = {}
        attempt = getattr(self, "attempt_n", None)
        entries = oom.adaptations(resolved)
        if entries and (code == exitcodes.OOM_ADAPT or entries[-1].get("attempt") == attempt):
            line = oom.describe(entries[-1])
            self.take_adaptation(resolved, attempt)
            self.registry.event(self.job_id, "adapt", line)
            return AttemptEnd(Outcome.ADAPTED, f"adapted: {line}")
        replan = oom.replan_line(resolved)
        unfit = (resolved.get(oom.DOES_NOT_FIT_KEY) or {}).get("attempt") == attempt
        if replan and (code == exitcodes.DOES_NOT_FIT or unfit):
            self.registry.event(self.job_id, "does-not-fit", replan)
            return AttemptEnd.of(Outcome.FAILED, f"does not fit: {replan}")
        return None

    def policy_inputs(self, step: int | None) -> tuple[int, int, int, float]:
        return policy_inputs(self.store.read_progress() or {}, step)

    def wait_for_capacity(self) -> Mode:
        """Before an attempt: ask the policy until it says spot or on demand (or the job is cancelled)."""
        assert self.driver is not None and self.capacity is not None
        waiting_logged = False
        while not (self.cancelled or self.registry.get(self.job_id).cancel_requested):
            step, total, ckpt, per_step = self.policy_inputs(None)
            decision = self.driver.decide(
                time.time(), Mode.NONE, step, total, ckpt, per_step, self.preemptions
            )
            if decision.mode is not Mode.NONE:
                self.registry.event(self.job_id, "policy", f"{decision.mode.value}: {decision.reason}")
                return decision.mode
            if not waiting_logged:
                self.registry.event(self.job_id, "policy", f"wait: {decision.reason}")
                self.registry.set_state(self.job_id, JobState.PENDING, decision.reason)
                waiting_logged = True
            time.sleep(min(self.capacity.wall_tick_s, 0.5))
        return Mode.NONE

    def follow_policy(self, now: float, step: int | None) -> AttemptEnd | None:
        """While an attempt runs: spot capacity lost under a spot job is a preemption; a policy that wants
        another mode gets a graceful switch. Returns the attempt's end reason, or None to go on."""
        if self.driver is None or self.capacity is None:
            return None
        if now - getattr(self, "_last_policy_check", 0.0) < min(self.capacity.wall_tick_s, 0.5):
            return None
        self._last_policy_check = now
        tick = self.capacity.tick(now)
        if self.mode is Mode.SPOT and not self.capacity.spot_available(now):
            chaos = self.spec.local.chaos
            notice = (
                chaos.notice_for(0)
                if chaos and chaos.preempt_at_steps
                else bool(chaos and chaos.notice is True)
            )
            reason = f"preempted ({'with' if notice else 'without'} notice, spot capacity gone at trace tick {tick})"
            self.registry.event(self.job_id, "chaos", f"trace tick {tick} notice={notice}")
            # decide where to go next now, as the simulator does, not after the trainer has left
            progress = self.policy_inputs(step)
            after = self.driver.decide(now, Mode.NONE, *progress, self.preemptions + 1)
            self.pending_mode = after.mode
            self.registry.event(self.job_id, "policy", f"{after.mode.value}: {after.reason}")
            self.registry.set_state(self.job_id, JobState.PREEMPTED, reason)
            self.log(f"simulated spot capacity gone at trace tick {tick} (step {step}, notice={notice})")
            self.stop_trainer(notice=notice, grace=self._grace())
            return AttemptEnd(Outcome.PREEMPTED, reason)
        done, total, ckpt, per_step = self.policy_inputs(step)
        decision = self.driver.decide(now, self.mode, done, total, ckpt, per_step, self.preemptions)
        if decision.mode is self.mode:
            return None
        self.pending_mode = decision.mode
        reason = f"switch to {decision.mode.value} at trace tick {tick}: {decision.reason}"
        self.registry.event(self.job_id, "policy", reason)
        self.log(f"policy: {reason}; asking the trainer to checkpoint first")
        request_stop(self.store, "policy switch")
        self.stop_trainer(notice=True, grace=max(60.0, self._grace()))
        return AttemptEnd(Outcome.SWITCH, reason)

    def ranks_preempted(self, code: int, progress: dict) -> bool:
        """torchrun exits 1 after forwarding SIGTERM; rank 0's progress says whether it saved and left."""
        return (
            self.spec.local.nproc > 1
            and code != exitcodes.OK
            and progress.get("state") == "preempted"
            and progress.get("attempt") == getattr(self, "attempt_n", None)
        )

    def stop_trainer(self, notice: bool, grace: float) -> None:
        assert self.proc is not None
        stop_trainer(self.proc, notice, grace, self.log)


def spec_changes(found: object, pinned: dict) -> str:
    """The top-level keys (job's: by section) in which `found` differs from `pinned`, for one log line."""
    if not isinstance(found, dict):
        return "missing or not a JSON object"
    keys = sorted(set(found) | set(pinned), key=str)
    names = []
    for key in keys:
        if key == "job" and isinstance(found.get(key), dict) and isinstance(pinned.get(key), dict):
            job, mine = found[key], pinned[key]
            names += [f"job.{k}" for k in sorted(set(job) | set(mine), key=str) if job.get(k) != mine.get(k)]
        elif found.get(key) != pinned.get(key):
            names.append(str(key))
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def main() -> int:
    job_id = sys.argv[1]
    supervisor = Supervisor(job_id)
    try:
        return supervisor.run()
    except Exception as exc:
        supervisor.end(JobState.FAILED, f"supervisor error: {exc.__class__.__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main())
