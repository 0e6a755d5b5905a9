"""trainer/envlock.py's pure parts: which version changes refuse a resume, and what a lock may hold."""

from __future__ import annotations

import pytest

from trainer import envlock
from trainer.checkpoints import versions


def test_only_compared_libraries_known_on_both_sides_count_as_changes() -> None:
    before = {"torch": "2.14.1", "peft": "0.21.2", "bitsandbytes": None, "ftorch": "0.1.0", "fsspec": "1"}
    after = {"torch": "2.14.1", "peft": "0.22.0", "bitsandbytes": "0.50.2", "ftorch": "0.2.0", "fsspec": "2"}
    (change,) = versions.compared_changes(before, after, 40)
    assert (change.field, change.before, change.after, change.step) == ("env.peft", "0.21.2", "0.22.0", 40)
    assert change.line().startswith("env.peft: changed from 0.21.2 to 0.22.0 since checkpoint step 40; ")
    assert versions.compared_changes({}, after, 40) == []  # a checkpoint from before versions were recorded


@pytest.mark.parametrize(
    "line", ["torch>=2.8", "torch", "torch==2.*", "-e .", "torch==2.14.1 --hash=md5:ab", "git+https://x/y"]
)
def test_a_lock_holds_exact_pins_only(line: str) -> None:
    with pytest.raises(envlock.LockError, match="lock:2: .* is not an exact pin"):
        envlock.parse(f"# target: x\n{line}\n")


def test_a_lock_line_round_trips_and_names_are_normalised() -> None:
    pins = envlock.parse("Huggingface_Hub==2.4.0 --hash=sha256:" + "a" * 64 + "\ntorch==2.13.0+cpu\n")
    assert pins["huggingface-hub"].line() == "huggingface-hub==2.4.0 --hash=sha256:" + "a" * 64
    assert pins["torch"] == envlock.Pin("torch", "2.13.0+cpu")
    with pytest.raises(envlock.LockError, match="pinned twice"):
        envlock.parse("torch==1\nTorch==2\n")
