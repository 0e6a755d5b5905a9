"""The CLI's spinner and the silencing of library noise (orchestrator/views/progress.py)."""

from __future__ import annotations

import io
import sys
import warnings

import pytest

from orchestrator.views.progress import quiet_libraries, spinner


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_spinner_draws_on_a_terminal_and_not_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    with spinner("tracing"):
        pass
    assert pipe.getvalue() == ""  # captured output gets no escape codes
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with spinner("tracing the step"):
        import time

        time.sleep(0.3)
    assert "tracing the step" in terminal.getvalue()


def test_library_noise_is_silenced_inside_and_restored_after(capsys: pytest.CaptureFixture) -> None:
    from transformers.utils import logging as hf_logging

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_libraries():
            warnings.warn("deprecated", FutureWarning, stacklevel=1)
            hf_logging.get_logger("transformers").warning("a library's note")
            assert not hf_logging.is_progress_bar_enabled()
        assert not caught  # the FutureWarning was dropped
        warnings.warn("after", FutureWarning, stacklevel=1)
        assert len(caught) == 1  # and warnings work again outside
    assert "a library's note" not in capsys.readouterr().err
