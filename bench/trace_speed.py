"""How long `ftorch estimate --trace` takes on an 8B model, and how much host memory it uses.

    PYTHONPATH=. python bench/trace_speed.py [JOB.yaml ...]

Runs the trace (trainer/memtrace/steptrace.py, one training step on fake tensors) of each job in a fresh
subprocess, as `ftorch estimate --trace` does, without the cache, and prints its wall time, CPU time
(user + system: what it costs on an idle machine, whatever else runs), peak resident memory, the
machine's load average, and the traced peaks. Target: at most 60 s and 3 GB on 2 cores for an 8B model.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.jobfile.spec import load_job  # noqa: E402
from orchestrator.sizing.shapes import resolve_shape  # noqa: E402

DEFAULT_JOBS = [
    "examples/llama3-8b-lora.yaml",
    "examples/llama3-8b-qlora.yaml",
    "examples/llama3-8b-full.yaml",
]


def measure(job: str) -> dict:
    spec = load_job(str(REPO / job), [], check_support=False)
    shape = resolve_shape(spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "spec.json").write_text(json.dumps(spec.model_dump(mode="json")))
        (Path(tmp) / "config.json").write_text(json.dumps(shape.config))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "trainer.memtrace.steptrace", f"{tmp}/spec.json", f"{tmp}/config.json"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    result = out.get("results", [{}])[0]
    return {
        "job": job,
        "params_b": shape.params / 1e9,
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "max_rss_gb": after.ru_maxrss * 1024 / 1e9,  # the largest child so far (kB on Linux)
        "error": out.get("error"),
        "peak_allocated_gib": result.get("peak_allocated_gib"),
        "peak_reserved_gib": result.get("peak_reserved_gib"),
        "total_gib": result.get("total_gib"),
        "peak_phase": result.get("peak_phase"),
    }


def main() -> int:
    jobs = sys.argv[1:] or DEFAULT_JOBS
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.1f}")
    print("| job | params | wall s | CPU s | max RSS GB | allocated GiB | reserved GiB | +context | phase |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for job in jobs:
        r = measure(job)
        if r["error"]:
            print(
                f"| {job} | {r['params_b']:.1f}B | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | - | {r['error']} |"
            )
            continue
        print(
            f"| {job} | {r['params_b']:.1f}B | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['max_rss_gb']:.2f} "
            f"| {r['peak_allocated_gib']:.2f} | {r['peak_reserved_gib']:.2f} | {r['total_gib']:.2f} "
            f"| {r['peak_phase']} |"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f} (wall time grows with it; CPU time does not)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
