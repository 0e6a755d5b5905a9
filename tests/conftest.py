"""Shared fixtures: a tiny model built from a config, a private FTORCH_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def ftorch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "ftorch-home"
    monkeypatch.setenv("FTORCH_HOME", str(home))
    return home
