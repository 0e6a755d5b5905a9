"""The health checks in the loop (the rules are trainer/health/rules.py, torch-free).

`HealthGuard.go` is handed to `step.update`: it sees the step's agreed loss and gradient norm before the
optimizer steps, all-reduces one "not finite" flag (every rank decides alike) and says whether to step.
After the step the loop calls `after`: a rollback is done there (the newest healthy checkpoint's weights
and optimizer, this step's position and schedule, checkpointed at once); an UNHEALTHY verdict is returned
through `poll`, the guard being a stop source (trainer/observers.py) whose stop carries its exit code.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from trainer import exitcodes
from trainer.health.rules import ROLLBACK, STEP, UNHEALTHY, HealthRules, HealthState, Verdict, finite
from trainer.observers import Stop
from trainer.runstore.progress import log


class HealthGuard:
    def __init__(self, a: Any) -> None:
        self.a = a
        # the counters the resumed checkpoint carried (a copy: the rules change theirs step by step)
        self.rules = HealthRules(a.spec.train.health, copy.deepcopy(a.state.health))
        self.verdict: Verdict = Verdict(STEP)
        self._ended: str | None = None
        self.scaled = a.opt.scaler is not None  # fp16: a finite loss with an overflowed gradient is normal
        a.checkpoints.before_save.append(self.record)

    def record(self) -> None:
        """Into the checkpointed state (and so the manifest's `healthy`: the newest loss finite and the
        trainable weights finite on every rank), before every save."""
        weights_bad = self.a.par.any(not _weights_finite(self.a.opt.model))
        self.a.state.health = HealthState.from_json(
            {**self.rules.state.to_json(), "healthy": self.rules.state.healthy and not weights_bad}
        )

    # ---- before the optimizer step ---------------------------------------------------------------
    def go_for(self, step: int, loss: float) -> Any:
        def go(grad_norm: float | None) -> bool:
            bad = not finite(loss) or (not self.scaled and not finite(grad_norm))
            not_finite = self.a.par.any(bad)  # the one collective: every rank decides alike
            self.verdict = self.rules.judge(step, loss, grad_norm, not_finite)
            return self.verdict.action == STEP

        return go

    # ---- after it --------------------------------------------------------------------------------
    def after(self) -> None:
        v, step = self.verdict, self.a.state.step
        if v.warning:
            log(f"health: {v.warning}")
        if v.action == ROLLBACK:
            self._roll_back(v.reason)
        elif v.action not in (STEP, UNHEALTHY):
            log(f"health: {v.reason}: optimizer step {step} skipped")
        if self.verdict.action == UNHEALTHY:
            self._ended = self.verdict.reason

    def _roll_back(self, reason: str) -> None:
        a = self.a
        a.checkpoints.wait()
        saved = a.opt.scheduler.state_dict()  # this step's schedule stays: the data window is stepped over
        position = (a.state.step, a.state.micro_batches, a.state.tokens_seen)
        loaded = a.checkpoints.load_newest_healthy(a.opt.model, a.opt.optimizer, a.opt.scheduler)
        if loaded is None:
            self.verdict = Verdict(UNHEALTHY, f"{reason}; no healthy checkpoint to roll back to")
            return
        a.opt.scheduler.load_state_dict(saved)
        for group, lr in zip(a.opt.optimizer.param_groups, a.opt.scheduler.get_last_lr(), strict=True):
            group["lr"] = lr
        a.state.step, a.state.micro_batches, a.state.tokens_seen = position
        self.rules.rolled_back(a.state.step, loaded.step, reason)
        n = len(self.rules.state.rollbacks)
        log(
            f"health: {reason}: rolled back to the healthy checkpoint of step {loaded.step} "
            f"(rollback {n} of {self.rules.spec.max_rollbacks}); steps {loaded.step + 1}-{a.state.step} "
            "of data stepped over"
        )
        a.store.update_epoch_record(health=self.rules.state.to_json())
        a.observers.checkpoint_start(a.state.step)  # the rolled-back state, durable now: a resume goes on
        saving = time.time()
        a.checkpoints.save(a.opt.model, a.opt.optimizer, a.opt.scheduler, a.state, wait=True)
        a.observers.checkpoint(a.state.step, time.time() - saving)

    # ---- the stop source -------------------------------------------------------------------------
    def poll(self, step: int) -> Stop | None:
        if self._ended is None:
            return None
        return Stop(f"unhealthy: {self._ended}", code=self.end(self._ended))

    def end(self, reason: str) -> int:
        """The UNHEALTHY ending: why in the epoch record and progress, a notification, no checkpoint."""
        a = self.a
        a.checkpoints.wait()  # a healthy upload in flight still lands
        healthy = a.checkpoints.newest_healthy_step()
        a.store.update_epoch_record(
            ended="unhealthy", stop_reason="unhealthy", stop_detail=f"unhealthy: {reason}",
            step=a.state.step, healthy_step=healthy, health=self.rules.state.to_json(), ended_at=time.time(),
            total_steps=a.rec.reporter.total_steps,  # the ledger's projected cost of the steps left
        )  # fmt: skip
        a.rec.reporter.extra["unhealthy"] = reason
        a.rec.reporter.extra["healthy_step"] = healthy
        a.rec.reporter.set_state("unhealthy", flush=True)
        a.rec.measurer.record(a.store, a.checkpoints.writer)
        kept = f"the newest healthy checkpoint is step {healthy}" if healthy else "no healthy checkpoint"
        log(f"unhealthy: {reason}; {kept}; exiting with code {exitcodes.UNHEALTHY} (not restarted)")
        a.rec.notifier.unhealthy(a.state.step, reason, healthy)
        return exitcodes.UNHEALTHY


def _weights_finite(model: Any) -> bool:
    """This rank's trainable weights (its shards under FSDP) are all finite: one pass at a checkpoint."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                local = p.to_local() if hasattr(p, "to_local") else p
                if not bool(torch.isfinite(local).all()):
                    return False
    return True
