"""Recovery time with and without the tokenised-data cache, measured side by side in one run.

    .venv/bin/python bench/recovery_cache.py [--rows 20000] [--repeats 2]

For each mode the same job (tiny Llama + LoRA, chat-format data) runs until step 8, is SIGKILLed, and
a new attempt starts at once; recovery = from the kill to the new attempt's first optimizer step
(its `step 9` line). With the cache the new attempt loads the tokenised set from the run store; without
it (FTORCH_DATA_CACHE=0) it tokenises the file again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import build_tiny_model, job_dict, prepare_run, trainer_cmd, write_data  # noqa: E402


def _until(proc: subprocess.Popen[str], needle: str) -> float:
    assert proc.stdout is not None
    for line in proc.stdout:
        if needle in line:
            return time.perf_counter()
    raise RuntimeError(f"the trainer ended before {needle!r}")


def recovery(job: dict, run_id: str, cache: bool) -> float:
    run_uri = prepare_run(job, run_id)
    env = {**os.environ, "FTORCH_DATA_CACHE": "1" if cache else "0", "FTORCH_PROGRESS_EVERY_S": "5"}
    first = subprocess.Popen(
        trainer_cmd(run_uri, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    _until(first, "] step 8/")
    first.kill()
    killed = time.perf_counter()
    first.wait()
    second = subprocess.Popen(
        trainer_cmd(run_uri, 2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    resumed = _until(second, "] step 9/") - killed
    second.kill()
    second.wait()
    return resumed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftorch-bench-") as tmp:
        folder = Path(tmp)
        model = build_tiny_model(folder / "model")
        data = write_data(folder / "train.jsonl", "chat", args.rows)
        job = job_dict(
            model,
            data,
            folder / "runs",
            data={"format": "chat"},
            train={"max_steps": 1000},
            checkpoint={"every": 4},
        )
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.repeats):
            for cache in (False, True):
                times[cache].append(recovery(job, f"r{i}-{int(cache)}", cache))
    without, with_cache = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.rows} chat rows, tiny Llama + LoRA on CPU, kill at step 8, median of {args.repeats}")
    print("| recovery (kill -> first new optimizer step) | without cache | with cache | ratio |")
    print("|---|---|---|---|")
    print(f"| seconds | {without:.2f} s | {with_cache:.2f} s | {without / with_cache:.2f}x faster |")


if __name__ == "__main__":
    main()
