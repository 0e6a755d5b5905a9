"""How fast `ftorch status` and `ftorch --help` answer with 1,000 jobs in the registry, side by side with
the interpreter's own start (`python -c pass`), interleaved, in one run; the last line is `ratio R`, the
median `ftorch status` over the median `python -c pass` (issue 32's goal: R <= 5).

    .venv/bin/python bench/status_speed.py [--jobs 1000] [--runs 15] [--write docs/benchmarks.md]

`ftorch` is the console script's entry point, orchestrator/entry.py (run as the script runs it, so an
install still pointing at orchestrator.cli.app measures the same code); `via typer` rows run orchestrator.cli.app,
the full CLI, for comparison. Exits 1 if R > 5, if the median `ftorch status` takes 0.3 s or more, or if
a command loads a module it does not print with (HEAVY).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fakejobs import bulk_registry  # noqa: E402

LIMIT_S = 0.3
SECTION = "## Status speed"


GOAL_RATIO = 5.0
#: what each command must not load: the status list needs rich to draw its table, nothing else here
HEAVY = {
    "status": ("torch", "sky", "fsspec", "matplotlib", "transformers", "yaml", "typer", "pydantic"),
    "status --json": ("torch", "sky", "fsspec", "matplotlib", "transformers", "yaml", "typer", "pydantic", "rich"),
    "--help": ("torch", "sky", "fsspec", "typer", "pydantic", "rich", "click"),
}  # fmt: skip


def _ftorch() -> list[str]:
    """The console script's code: orchestrator/entry.py's main, as `ftorch` runs it."""
    return [
        sys.executable,
        "-c",
        "import sys; from orchestrator.entry import main; sys.argv[0] = 'ftorch'; sys.exit(main())",
    ]


def _typer() -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.app"]


def _time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.decode()[-500:]}")
    return elapsed


def _heavy_modules(env: dict[str, str]) -> list[str]:
    """`command: module` for each top-level module in HEAVY that the command loads."""
    found = []
    for args, heavy in HEAVY.items():
        done = subprocess.run(
            [sys.executable, "-X", "importtime", *_ftorch()[1:], *args.split()],
            env=env, capture_output=True, text=True, cwd=REPO,
        )  # fmt: skip
        names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        found += sorted({f"{args}: {n.split('.')[0]}" for n in names if n.split(".")[0] in heavy})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--write", help="replace the '## Status speed' section of this markdown file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home, runs = Path(tmp) / "home", Path(tmp) / "runs"
        bulk_registry(home, runs, n=args.jobs, active=10)
        env = {**os.environ, "FTORCH_HOME": str(home), "COLUMNS": "120"}
        # bytecode as an installed ftorch has it (pip compiles at install; an editable checkout writes it on
        # its first run): with PYTHONDONTWRITEBYTECODE set in the shell, every run would compile ~60
        # modules from source, which `python -c pass` never does
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "ftorch --help": [*_ftorch(), "--help"],
            "ftorch status": [*_ftorch(), "status"],
            "ftorch status --json": [*_ftorch(), "status", "--json"],
            "ftorch --help via typer": [*_typer(), "--help"],
            "ftorch status via typer": [*_typer(), "status"],
        }
        for cmd in cases.values():  # warm the page cache, write the bytecode
            _time(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in cases}
        rounds: list[float] = []  # per round: ftorch status over python -c pass
        for _ in range(args.runs):  # interleaved, so load on the machine hits every case alike
            for name, cmd in cases.items():
                times[name].append(_time(cmd, env))
            rounds.append(times["ftorch status"][-1] / times["python -c pass"][-1])
        heavy = _heavy_modules(env)
    med = {name: statistics.median(v) for name, v in times.items()}
    base = med["python -c pass"]
    lines = [
        SECTION,
        "",
        "Produced by `bench/status_speed.py`; regenerate with",
        "",
        "```",
        ".venv/bin/python bench/status_speed.py --jobs 1000 --runs 15 --write docs/benchmarks.md",
        "```",
        "",
        f"A registry with {args.jobs} jobs ({args.jobs - 10} finished, 10 running with a progress.json in their "
        f"run store); each command run {args.runs} times, interleaved, wall clock of the whole process "
        f"(median, min-max). Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}.",
        "",
        "| command | median | min - max | vs `python -c pass` |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        lines.append(
            f"| `{name}` | {med[name] * 1000:.0f} ms | {min(values) * 1000:.0f} - {max(values) * 1000:.0f} ms "
            f"| {med[name] / base:.1f}x |"
        )
    load = os.getloadavg()[0]
    ratio = med["ftorch status"] / base
    lines += [
        "",
        f"`ftorch status` over {args.jobs} jobs: {med['ftorch status'] * 1000:.0f} ms median "
        f"(limit {LIMIT_S * 1000:.0f} ms), {ratio:.1f}x `python -c pass` (goal <= {GOAL_RATIO:.0f}x; per round "
        f"{min(rounds):.1f}-{max(rounds):.1f}x); `ftorch --help`: {med['ftorch --help'] / base:.1f}x; through "
        f"typer (orchestrator.cli.app, which every other command takes): `--help` "
        f"{med['ftorch --help via typer'] / base:.1f}x, `status` {med['ftorch status via typer'] / base:.1f}x. "
        f"Load average at the end: {load:.1f} on {os.cpu_count()} CPUs (a shared machine). Modules loaded that "
        f"the command does not print with (bench/status_speed.py's HEAVY): {', '.join(heavy) if heavy else 'none'}. "
        "The console script (orchestrator/entry.py) prints `--help` from a command list a test keeps equal to "
        "typer's (orchestrator/cli/fast_help.py) and runs the plain `status` forms without typer, click or "
        "pydantic; the list reads one SQLite snapshot (jobs, attempts, and the last progress of finished "
        "jobs, cached in the registry), reads progress.json only for active jobs and builds full rows only "
        "for the jobs the table shows (the finished ones it collapses are counted). Not covered: `status "
        "JOB` (one job's detail) and the other commands, which go through typer.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        _write_section(Path(args.write), text)
    ok = ratio <= GOAL_RATIO and med["ftorch status"] < LIMIT_S and not heavy
    if not ok:
        print(f"FAIL: median {med['ftorch status']:.3f} s (limit {LIMIT_S} s); heavy modules: {heavy}")
    print(
        f"ratio {ratio:.2f} (ftorch status over python -c pass; per round {min(rounds):.2f}-{max(rounds):.2f})"
    )
    return 0 if ok else 1


def _write_section(path: Path, text: str) -> None:
    """Replace our section (up to the next '## ' heading) or append it; other sections stay as they are."""
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _m: text + "\n", doc, count=1)
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    path.write_text(doc)


if __name__ == "__main__":
    sys.exit(main())
