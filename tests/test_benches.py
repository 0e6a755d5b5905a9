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


def test_the_unseen_traces_check_skips_what_the_table_was_built_from_and_judges_the_rest(tmp_path) -> None:  # noqa: ANN001
    """bench/hazards_unseen.py on a spot-traces layout: the bundled set is skipped, a GPU trace is set
    beside the prediction for its zone and node count, a CPU one is said to be out of scope."""
    import json

    def trace(rel: str, counts: list[int]) -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": counts}))

    trace("availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json", [1, 0] * 50)  # the bundled set
    trace("preemption/4-node/aws-08-03-2023/us-west-2c_v100_1.json", ([4] * 59 + [3]) * 24)  # 24 in 118 h
    trace("preemption/1-node/aws-04-19-2023/us-east-1b_intel_64.json", [1] * 100)
    # 16 instances counted, all lost at once: a job on any number of them sees the one-node rate (rho 1)
    trace("availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json", ([16] * 59 + [0]) * 24)
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hazards_unseen.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "aws-02-15-2023" not in done.stdout
    (row,) = [line for line in done.stdout.splitlines() if "us-west-2c_v100_1" in line]
    cells = [c.strip() for c in row.split("|")]
    assert cells[2:6] == ["p3.2xlarge", "4", "118", "24"], cells  # 1,416 ticks of 4 held, 24 falls below
    assert cells[8] == "zone" and cells[10] in ("yes", "NO"), cells
    assert "outside what ftorch plans" in done.stdout
    assert "GPU traces: 2;" in done.stdout
    (nodes,) = [
        line
        for line in done.stdout.splitlines()
        if line.startswith("| availability/16-node") and "x1" in line
    ]
    assert nodes.count("x1.00, 1.00") == 4, nodes  # 2, 4, 8 and 16 nodes: every loss hits them all
    assert "rho measured: median 1.00" in done.stdout and "bundled 0.92" in done.stdout
