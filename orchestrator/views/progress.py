"""A spinner on stderr for the CLI's long silent waits (tracing the step, loading a model, exporting), and
the libraries' own noise (transformers' progress bars and FutureWarnings) kept out of the output.

Only on a terminal: piped or captured output gets neither the spinner nor its escape codes.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def spinner(text: str) -> Iterator[None]:
    """`text` with a spinner on stderr while the block runs (nothing when stderr is not a terminal)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(text, spinner="dots"):
        yield


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """No transformers/huggingface_hub progress bars, info logs or FutureWarnings inside the block
    (transformers' verbosity and bars are as they were after it)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        disable_progress_bars()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
