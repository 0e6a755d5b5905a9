"""FTORCH_FAULTS (trainer/faults.py): a point armed at every step (`@*`), and slow steps and saves."""

from __future__ import annotations

import pytest

from trainer import faults


def test_a_point_at_every_step_and_slow_steps_and_saves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        faults, "_POINTS", faults._parse("checkpoint-partial@*:1,slow-step@1500,slow-save@250:2")
    )
    monkeypatch.setattr(faults, "_ATTEMPT", 1)
    assert faults._armed("checkpoint-partial", 0) and faults._armed("checkpoint-partial", 37)
    assert not faults._armed("before-manifest", 37)
    assert faults.delay_s("slow-step") == 1.5 and faults.delay_s("slow-save") == 0.0
    monkeypatch.setattr(faults, "_ATTEMPT", 2)  # `:A` limits a point to attempt A
    assert not faults._armed("checkpoint-partial", 37)
    assert faults.delay_s("slow-save") == 0.25
    monkeypatch.setattr(faults, "_POINTS", set())
    assert faults.delay_s("slow-step") == 0.0  # unset: nothing armed, nothing slowed
