"""The benches behind docs/benchmarks.md's figures still run (two had stopped running after a change to the
trainer's attempt object). Each runs in its smallest form and prints its closing ratio; the figures
themselves are measured by hand, side by side, and recorded with their commands (not asserted here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

SMALLEST = {
    "step_parity.py": ["--rounds", "1", "--steps", "2", "--warmup", "1"],
    "busy_quickstart.py": ["--rounds", "1", "--steps", "2", "--hogs", "1"],
    "health_cost.py": ["--steps", "5", "--threads", "1"],
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bench", sorted(SMALLEST))
def test_the_bench_runs_and_prints_its_ratio(bench: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / bench), *SMALLEST[bench]],
        capture_output=True, text=True, timeout=280, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert re.search(r"(ratio|busy/quiet)\s+\S*\s*\d+\.\d+", done.stdout), done.stdout[-2000:]
