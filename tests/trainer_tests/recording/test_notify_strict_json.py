"""Notifications are strict JSON: a run whose last loss was NaN (health checks off) or inf still posts a
body every receiver parses (the test hook refuses NaN and Infinity, as JavaScript's or Go's JSON would),
with the number as null and a `nonfinite` flag, from the trainer and from the supervisor alike."""

from __future__ import annotations

import math

from http_fakes import Hook

from orchestrator.backends import notify as supervisor_notify
from trainer.recording.notify import send_webhook


def test_a_non_finite_loss_is_posted_as_null_with_a_flag() -> None:
    hook = Hook()
    try:
        lines: list[str] = []
        notify = {"webhook": hook.url, "on": ["succeeded"]}
        assert send_webhook(notify, "succeeded", {"step": 30, "loss": math.nan}, lines.append) is True
        assert (
            supervisor_notify.send(notify, "succeeded", {"step": 30, "loss": -math.inf}, lines.append) == []
        )
        assert [r.get("body") for r in hook.received] == [
            {"step": 30, "loss": None, "nonfinite": {"loss": "NaN"}},
            {"step": 30, "loss": None, "nonfinite": {"loss": "-inf"}},
        ], hook.received
    finally:
        hook.close()
