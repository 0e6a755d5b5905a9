"""How long `pip install` of ftorch's wheel takes in a fresh virtual environment that already has torch,
with and without the tested set as constraints (scripts/constraints-tested.txt, which the README's one
route, scripts/setup.sh, always applies), and whether pip is left with a conflict.

    python bench/install_time.py [--cap 480] [--torch-index URL] [--cases skypilot,every-extra,skypilot-raw]

Each case starts from a copy of one venv holding only torch (installed once, not timed) and installs the
wheel with its extras; it runs twice with one pip cache: the first run includes downloads, the second
("warm") is what resolving and installing cost, downloads aside. The unconstrained SkyPilot case is run
once, warm, stopped at --cap seconds. Figures go in docs/benchmarks.md ("Install time").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "scripts" / "constraints-tested.txt"
#: name -> (extras, use the constraints file, runs)
CASES = {
    "skypilot": ("s3,skypilot,plot", True, 2),
    "every-extra": ("s3,gcs,skypilot,qlora,plot,tensorboard,wandb", True, 2),
    "skypilot-raw": ("s3,skypilot,plot", False, 1),
}
WATCH = (
    "torch", "transformers", "huggingface-hub", "datasets", "peft", "click", "skypilot", "matplotlib",
    "wandb", "fsspec",
)  # fmt: skip


def run(cmd: list[str], timeout: float | None = None, **kw) -> tuple[float, int, str]:
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = -1, f"stopped after {timeout} s: {(exc.stderr or b'')[-400:]!r}"
    return time.perf_counter() - start, code, out


def versions(python: Path) -> dict[str, str]:
    _t, _c, out = run([str(python), "-m", "pip", "list", "--format", "json"])
    try:
        rows = json.loads(out[out.index("[") :])
    except ValueError:
        return {}
    return {r["name"].lower().replace("_", "-"): r["version"] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap", type=float, default=480.0, help="seconds before a case is stopped")
    parser.add_argument("--torch", default="torch==2.13.0")
    parser.add_argument("--torch-index", default=None, help="e.g. https://download.pytorch.org/whl/cpu")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ftorch-install-"))
    env_cache = {"PIP_CACHE_DIR": str(work / "pip-cache")}
    import os

    env = {**os.environ, **env_cache}
    try:
        t, code, out = run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(REPO)]
        )
        assert code == 0, out[-2000:]
        wheel = next(work.glob("ftorch-*.whl"))
        base = work / "base"
        subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
        index = ["--index-url", args.torch_index] if args.torch_index else []
        t, code, out = run(
            [str(base / "bin" / "python"), "-m", "pip", "install", "-q", args.torch, *index], env=env
        )
        assert code == 0, out[-2000:]
        print(f"torch in the base venv: {t:.0f} s (not counted)")
        results = []
        for name in args.cases.split(","):
            extras, constrained, runs = CASES[name]
            for attempt in range(runs):
                venv = work / f"{name}-{attempt}"
                shutil.copytree(base, venv, symlinks=True)
                python = venv / "bin" / "python"
                cmd = [str(python), "-m", "pip", "install", "-q", f"{wheel}[{extras}]"]
                cmd += ["-c", str(CONSTRAINTS)] if constrained else []
                seconds, code, out = run(cmd, timeout=args.cap, env=env)
                _t, check_code, check = run([str(python), "-m", "pip", "check"])
                found = versions(python) if code == 0 else {}
                conflicts = [] if check_code == 0 else [line for line in check.splitlines() if line.strip()]
                label = "cold" if attempt == 0 and runs > 1 else "warm"
                row = {
                    "case": name,
                    "extras": extras,
                    "constraints": constrained,
                    "cache": label,
                    "seconds": round(seconds, 1),
                    "ok": code == 0,
                    "pip_check_conflicts": conflicts,
                    "versions": {k: found.get(k) for k in WATCH},
                }
                results.append(row)
                print(json.dumps(row), flush=True)
                shutil.rmtree(venv, ignore_errors=True)
        warm = {r["case"]: r for r in results if r["cache"] == "warm"}
        if "skypilot" in warm and "skypilot-raw" in warm:
            raw, fixed = warm["skypilot-raw"], warm["skypilot"]
            stopped = "" if raw["ok"] else f" (stopped at the {args.cap:.0f} s cap)"
            print(
                f"[s3,skypilot,plot] warm: {raw['seconds']:.0f} s without constraints{stopped} vs "
                f"{fixed['seconds']:.0f} s with scripts/constraints-tested.txt: "
                f"{raw['seconds'] / fixed['seconds']:.1f}x"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
