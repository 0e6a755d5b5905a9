"""$FTORCH_HOME is readable by its owner only: every folder and cache file ftorch makes under it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from orchestrator.home import private_dir, write_private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_caches_under_ftorch_home_are_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("FTORCH_HOME", str(home))
    folder = private_dir("hub", "org--model")
    write_private(folder / "config.json", b"{}")
    assert [_mode(p) for p in (home, home / "hub", folder)] == [0o700] * 3
    assert _mode(folder / "config.json") == 0o600 and (folder / "config.json").read_bytes() == b"{}"


def test_the_trace_cache_is_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real trace of a tiny bundled shape, cached under $FTORCH_HOME/traces."""
    pytest.importorskip("transformers")
    from dataclasses import replace

    from orchestrator.jobfile.spec import validate_job
    from orchestrator.sizing import tracing
    from orchestrator.sizing.shapes import bundled_shape

    home = tmp_path / "home"
    monkeypatch.setenv("FTORCH_HOME", str(home))
    shape = bundled_shape("smollm2-135m")
    shape = replace(shape, layers=1, config={**shape.config, "num_hidden_layers": 1})
    job = {
        "model": "smollm2-135m",
        "method": "lora",
        "data": {"path": str(tmp_path / "d.jsonl"), "max_seq_len": 32},
        "checkpoint": {"uri": str(tmp_path / "runs")},
    }
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    traced = tracing.trace_job(validate_job(job), shape, [1])
    assert traced.results, traced.error
    (cached,) = (home / "traces").iterdir()
    assert _mode(home / "traces") == 0o700 and _mode(cached) == 0o600
