"""`python -m trainer RUN_URI [--attempt N]`: the entry every backend runs.

Exit codes are in trainer/exitcodes.py: 0 done, 75 preempted (checkpoint written), 76 fenced (a newer
attempt holds the run), 77 store unavailable or full, 88 out of memory (a smaller micro-batch is recorded;
relaunch me), 89 does not fit even the smallest layout (re-plan), 2 bad config or data, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from trainer.memory import allocator  # noqa: E402 - no torch: the setting must precede CUDA's first use

allocator.configure()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="ftorch trainer")
    parser.add_argument("run_uri", help="the run folder in the run store (spec.json inside)")
    parser.add_argument("--attempt", type=int, default=int(os.environ.get("FTORCH_ATTEMPT", "1")))
    args = parser.parse_args(argv)
    from trainer import faults

    faults.use_attempt(args.attempt)  # FTORCH_FAULTS' `:A`: this attempt, however the trainer was started
    # every file this process writes is owner-only, whoever writes it (torch's DCP writer of sharded and
    # offloaded checkpoints, tokenizers, TensorBoard): a run store holds weights and the resolved job
    os.umask(0o077)

    import warnings

    from pydantic import ValidationError

    # noise from libraries that says nothing about this run
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    # `datasets` (loading parquet, JSON, hub data) draws no bars in the log: the trainer logs its phases
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from trainer import exitcodes
    from trainer.checkpoints.fingerprint import SpecChanged
    from trainer.data.dataset import DataError
    from trainer.layout import LayoutError
    from trainer.model.check import DeviceUnavailable, LoraTargetMissing, ModelUnavailable
    from trainer.model.quant import QuantUnavailable
    from trainer.runstore.progress import log
    from trainer.runstore.storage import LinkRefused
    from trainer.runstore.store import Fenced, SpecNotPinned, StoreGone
    from trainer.stops.budget import BudgetReached

    try:
        from trainer.loop import run

        # how to reach the store before spec.json (which holds checkpoint.storage_options) is read
        options = json.loads(os.environ.get("FTORCH_STORAGE_OPTIONS") or "{}")
        return run(args.run_uri, args.attempt, options)
    except (DataError, LayoutError, SpecChanged, SpecNotPinned, ValidationError) as exc:
        log(f"error: {exc}")
        return exitcodes.BAD_CONFIG
    except (ModelUnavailable, LoraTargetMissing, DeviceUnavailable, QuantUnavailable) as exc:  # no retry
        # changes these: a gated/missing/uncached model, a LoRA target it lacks, a device not here
        log(f"error: {exc}")
        return exitcodes.BAD_CONFIG
    except (FileNotFoundError, LinkRefused, StoreGone) as exc:  # no retry helps: a link out of the
        # run store, or the run store deleted under the attempt
        log(f"error: {exc}")
        return exitcodes.BAD_CONFIG
    except BudgetReached as exc:  # a resumed run at its budget: one line, nothing trained, not restarted
        log(f"stopped at once: {exc}")
        return exitcodes.BUDGET_STOPPED
    except Fenced as exc:  # a newer attempt holds the run: stop, write nothing more, do not be restarted
        log(f"fenced: {exc}")
        return exitcodes.FENCED
    finally:  # os._exit skips atexit: the trackers' scratch folders go now, however the attempt ended
        trackers = sys.modules.get("trainer.recording.trackers")
        if trackers is not None:
            trackers.remove_scratch()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown with torch loaded (about a second): everything is flushed and closed
    os._exit(code)
