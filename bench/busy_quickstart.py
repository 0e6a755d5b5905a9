"""The quickstart's step on a busy machine: `local.threads` 2 (the old quickstart) vs auto, with and
without a CPU hog beside it, interleaved, in one run.

    .venv/bin/python bench/busy_quickstart.py [--rounds 5] [--steps 8] [--hogs 1]

The step is the trainer's (`trainer.loop._train_step` on the quickstart job's own objects, as
bench/step_parity.py builds them). A hog is a process spinning on one core (`--hogs` of them). `auto`
is resolved by trainer/threads.py at the start of each block, as the trainer does at its start (so with
the hog running it sees the hog). Each round runs every setting in turn (the order rotating), `--steps`
steps each; the figure per setting is the median of its rounds' seconds per step. Prints, last,
`busy/quiet R`: the median step time with auto and the hog over auto without it (goal: within 2x).
`--fixed 0` leaves out the fixed count (on a machine others load, 2 threads can take 20 s a step).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from step_parity import ftorch_side, load_spec, run_ftorch  # noqa: E402

from trainer.threads import thread_count  # noqa: E402

HOG = "while True: pass"


def block(a: object, setting: int | str, steps: int) -> tuple[float, int]:
    """Seconds per step of `steps` trainer steps under `local.threads: setting`; the threads used."""
    threads = thread_count(setting)
    torch.set_num_threads(threads)
    _, seconds, _ = run_ftorch(a, steps)
    return seconds / steps, threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=1)
    parser.add_argument("--fixed", type=int, default=2, help="the fixed count set beside auto (0: auto only)")
    args = parser.parse_args(argv)
    a = ftorch_side(load_spec(args.job, "lora", "auto"), torch.device("cpu"))
    run_ftorch(a, 2)  # warm-up
    settings: list[tuple[str, int | str]] = [("quiet", "auto"), ("hog", "auto")]
    if args.fixed:
        settings += [("quiet", args.fixed), ("hog", args.fixed)]
    times: dict[tuple[str, int | str], list[float]] = {s: [] for s in settings}
    used: dict[tuple[str, int | str], set[int]] = {s: set() for s in settings}
    for r in range(args.rounds):
        for k in range(len(settings)):
            where, setting = settings[(r + k) % len(settings)]
            hogs = []
            if where == "hog":
                hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
                time.sleep(0.5)  # the hog is on its core before the threads are chosen
            try:
                seconds, threads = block(a, setting, args.steps)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
            times[(where, setting)].append(seconds)
            used[(where, setting)].add(threads)
        print(
            f"round {r + 1}: "
            + "  ".join(f"{w}/threads {s}: {times[(w, s)][-1]:.3f} s" for w, s in settings),
            flush=True,
        )
    median = {s: statistics.median(v) for s, v in times.items()}
    for (where, setting), value in median.items():
        print(
            f"{where:5} threads {setting!s:4} -> {sorted(used[(where, setting)])}: median {value:.3f} s/step"
        )
    if args.fixed:
        fixed = median[("hog", args.fixed)] / median[("quiet", args.fixed)]
        print(f"hog/quiet with threads {args.fixed}: {fixed:.2f}")
    print(f"busy/quiet {median[('hog', 'auto')] / median[('quiet', 'auto')]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
