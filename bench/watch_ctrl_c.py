"""Ctrl-C at random moments of `status --watch`'s loop: does the live view always stop at once?

Runs a child on a pseudo-terminal (50x40, like the resize in tests/orchestrator_tests/backends/
test_watch.py) that watches a RUNNING job with `follow.live` polling every 20 ms (so a signal lands in
a frame's reading and drawing, not in the sleep between frames), sends itself SIGINT after a random
delay, and records per trial: how the view ended ("interrupted"; "escaped" = the KeyboardInterrupt got
out of the view, i.e. `ftorch` would exit 130), whether the interrupt was swallowed (the view still
drawing 3 s later; a second SIGINT then ends the trial and a traceback is kept) and the lag from the
signal to the view's return. Prints the counts and the worst lag.

Usage: PYTHONPATH=. python bench/watch_ctrl_c.py [TRIALS] [MAX_DELAY_S] [SEED]
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import pty
import random
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = "llama3-8b-support-a1b2c3"


def child(out_path: str, trials: int, span: float, seed: int) -> None:
    import faulthandler

    home = Path(tempfile.mkdtemp())
    os.environ["FTORCH_HOME"] = str(home / "h")
    sys.path.insert(0, str(REPO / "tests"))
    from fakejobs import add_job

    from orchestrator.cli import follow
    from orchestrator.registry import Registry
    from orchestrator.views.cells import console

    attempts = [
        {"start": 0, "end": 131, "reason": "preempted (with notice, random)", "seconds": 2620},
        {"start": 130, "end": 212, "reason": None, "seconds": 1640},
    ]
    add_job(Registry(home / "h"), home / "runs", JOB, "RUNNING", 212, total=600, attempts=attempts,
            checkpoints=[150, 180, 210], supervisor_pid=os.getpid())  # fmt: skip
    rng, results = random.Random(seed), []
    with open(out_path + ".tb", "w") as tracebacks:
        for i in range(trials):
            state: dict[str, object] = {"returned": None, "swallowed": False}
            delay = rng.uniform(0.05, span)

            def shoot(i: int = i, delay: float = delay, state: dict[str, object] = state) -> None:
                time.sleep(delay)
                state["sent"] = time.time()
                os.kill(os.getpid(), signal.SIGINT)
                while state["returned"] is None:
                    time.sleep(0.1)
                    if time.time() - float(state["sent"]) > 3:  # type: ignore[arg-type]
                        tracebacks.write(f"--- trial {i}: interrupt swallowed\n")
                        faulthandler.dump_traceback(tracebacks)
                        state["swallowed"], state["sent"] = True, time.time()
                        os.kill(os.getpid(), signal.SIGINT)

            shooter = threading.Thread(target=shoot, daemon=True)
            shooter.start()
            try:
                outcome = follow.live(JOB, out=console(), poll_s=0.02)
            except KeyboardInterrupt:
                outcome = "escaped"
            state["returned"] = time.time()
            shooter.join()
            lag = float(state["returned"]) - float(state["sent"])  # type: ignore[arg-type]
            results.append({"delay": delay, "outcome": outcome, "swallowed": state["swallowed"], "lag": lag})
            Path(out_path).write_text(json.dumps(results))


def main() -> None:
    trials, span, seed = int(sys.argv[1]) if len(sys.argv) > 1 else 100, 1.5, 0
    if len(sys.argv) > 2:
        span = float(sys.argv[2])
    if len(sys.argv) > 3:
        seed = int(sys.argv[3])
    out = str(Path(tempfile.mkdtemp()) / "trials.json")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 50, 0, 0))
    argv = [sys.executable, __file__, "--child", out, str(trials), str(span), str(seed)]
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            env={**os.environ, "TERM": "xterm-256color"})  # fmt: skip
    os.close(slave)
    screen = bytearray()

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    threading.Thread(target=drain, daemon=True).start()
    code = proc.wait()
    results = json.loads(Path(out).read_text())
    counts = collections.Counter(
        (r["outcome"], "swallowed" if r["swallowed"] else "at once") for r in results
    )
    print(f"child exit {code}; {len(results)} trials: {dict(counts)}")
    print(f"worst lag signal -> view returned: {max(r['lag'] for r in results) * 1000:.0f} ms")
    print(f"'Exception ignored' lines on the terminal: {bytes(screen).count(b'Exception ignored')}")
    print(f"tracebacks of swallowed interrupts (if any): {out}.tb")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
