"""Fencing: an attempt wrongly declared dead (paused here, as a partition or a slow machine would) comes
back after a newer attempt took over the run. It is refused (exit FENCED) and changes nothing of the
newer attempt: not its checkpoints, not its output, not its progress."""

from __future__ import annotations

import signal
from pathlib import Path

from helpers import assert_bitwise_equal, write_data
from s3runs import (
    job_for,
    local_reference,
    object_keys,
    prepare_s3_run,
    run,
    s3_final_weights,
    start,
    wait_for_line,
)

from trainer import exitcodes


def test_the_older_attempt_is_refused_and_never_touches_the_newer_ones(
    tiny_model: Path, tmp_path: Path, s3
) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    job = job_for(tiny_model, data, f"{s3.uri}/runs", checkpoint={"keep": 10})
    expected = local_reference(job, tmp_path)
    store = prepare_s3_run(job, "fenced", s3.endpoint)

    old = start(store, s3.endpoint, 1)
    seen: list[str] = []
    assert wait_for_line(old, "checkpoint 5 saved", seen), "".join(seen)
    old.send_signal(signal.SIGSTOP)  # wrongly declared dead
    try:
        new = run(store, s3.endpoint, 2)
        assert new.returncode == 0, new.stdout
        assert "holds epoch 2" in new.stdout
        snapshot = {k: store.read_bytes(k) for k in object_keys(store, "") if not k.startswith("fence/")}
    finally:
        old.send_signal(signal.SIGCONT)
    assert old.stdout is not None
    seen += list(old.stdout)
    assert old.wait(timeout=120) == exitcodes.FENCED, "".join(seen)
    assert "fenced: attempt epoch 1 was replaced by epoch 2" in "".join(seen)
    after = {k: store.read_bytes(k) for k in object_keys(store, "") if not k.startswith("fence/")}
    changed = sorted(k for k in snapshot if after.get(k) != snapshot[k])
    assert not changed, changed
    extra = sorted(set(after) - set(snapshot))
    assert all(k.startswith("metrics/0001-") or "/e00000001/" in k for k in extra), extra
    assert store.read_progress()["state"] == "finished"
    assert_bitwise_equal(s3_final_weights(store), expected)
