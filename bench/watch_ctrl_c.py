"""Ctrl-C at random moments of `status --watch`'s loop: does the live view always stop at once?

Runs a child on a pseudo-terminal (50x40, like the resize in tests/orchestrator_tests/cli/test_watch.py)
that watches a RUNNING job with `follow.live` polling every 20 ms and sends itself SIGINT, per trial:
- after a random delay (the default; the signal lands in a frame's reading and drawing or in the sleep);
- with `--events`, at a random trace event of the loop (one iteration at 50 columns is about 58,000
  Python call/line/return events, counted from the start of the second frame's read), so that every
  moment of the read and the drawing is as likely as any other; with the delay a window of a few
  microseconds is almost never hit. This is what found the swallowed Ctrl-C: the `closed` property of
  fsspec's LocalFileOpener, which io.IOBase's finalizer evaluates after each run-store read (15 of the
  58,081 events), and a KeyboardInterrupt raised there is cleared by the interpreter without a word;
  `--in=closed` sends it at the first event after the drawn one in a function of that name (every trial
  then lands in such a finalizer: 15 events in 58,081 are otherwise one trial in 3,900);
- with `--ignored`, the child ignores SIGINT from its start, as a process started by a non-interactive
  shell's background job (`cmd &`) does: before the fix Python kept ignoring it and no Ctrl-C got through.

Records per trial how the view ended ("interrupted"; "escaped" = the KeyboardInterrupt got out of the
view, i.e. `ftorch` would exit 130), whether the interrupt was swallowed (the view still drawing 3 s later;
a second SIGINT is then sent and a traceback kept; if that one is lost too the child stops: "stuck"), the
lag from the signal to the view's return and, with `--events`, the event the signal was sent at.

Usage: PYTHONPATH=. python bench/watch_ctrl_c.py [TRIALS] [MAX_DELAY_S] [SEED] [--events [--in=NAME]] [--ignored]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JOB = "llama3-8b-support-a1b2c3"
EVENTS = 60_000  # --events: the event is drawn from 1..EVENTS (a later one lands in the next iteration)


def _firing_at(
    read: Callable[..., Any], event: int, state: dict[str, Any], within: str | None
) -> Callable[..., Any]:
    """`follow._frame` that, from its second call on, counts the main thread's trace events and sends
    SIGINT at the `event`-th (or the first after it in a function named `within`), recording where."""
    calls, seen = [0], [0]

    def tracer(frame: Any, kind: str, arg: Any) -> Any:
        seen[0] += 1
        if seen[0] < event or (within is not None and frame.f_code.co_name != within):
            return tracer
        sys.settrace(None)
        code = frame.f_code
        state["where"] = (
            f"{kind} {code.co_name} ({code.co_filename.split('site-packages/')[-1]}:{frame.f_lineno})"
        )
        state["sent"] = time.time()
        os.kill(os.getpid(), signal.SIGINT)
        return None

    def reading(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            sys.settrace(tracer)
        return read(*args, **kwargs)

    return reading


def child(
    out_path: str, trials: int, span: float, seed: int, at_events: bool, within: str | None, ignored: bool
) -> None:
    import faulthandler

    home = Path(tempfile.mkdtemp())
    os.environ["FTORCH_HOME"] = str(home / "h")
    sys.path.insert(0, str(REPO / "tests"))
    from fakejobs import add_job

    from orchestrator.cli import follow
    from orchestrator.registry import Registry
    from orchestrator.views.cells import console

    if ignored:  # as inherited: Python installs no handler for a SIGINT ignored when it starts
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    attempts = [
        {"start": 0, "end": 131, "reason": "preempted (with notice, random)", "seconds": 2620},
        {"start": 130, "end": 212, "reason": None, "seconds": 1640},
    ]
    add_job(Registry(home / "h"), home / "runs", JOB, "RUNNING", 212, total=600, attempts=attempts,
            checkpoints=[150, 180, 210], supervisor_pid=os.getpid())  # fmt: skip
    rng, results, real_frame = random.Random(seed), [], follow._frame
    with open(out_path + ".tb", "w") as tracebacks:
        for i in range(trials):
            state: dict[str, Any] = {"returned": None, "sent": None, "swallowed": False, "where": None}
            delay, event = rng.uniform(0.05, span), rng.randint(1, EVENTS)
            follow._frame = _firing_at(real_frame, event, state, within) if at_events else real_frame

            def watchdog(
                i: int = i, delay: float = delay, event: int = event, state: dict[str, Any] = state
            ) -> None:
                if not at_events:
                    time.sleep(delay)
                    state["sent"] = time.time()
                    os.kill(os.getpid(), signal.SIGINT)
                while state["returned"] is None:
                    time.sleep(0.1)
                    if state["sent"] is None or time.time() - state["sent"] <= 3:
                        continue
                    if state["swallowed"]:  # the second Ctrl-C is lost too: nothing will stop the view
                        results.append({"delay": delay, "event": event, "where": state["where"],
                                        "outcome": "stuck", "swallowed": True, "lag": None})  # fmt: skip
                        Path(out_path).write_text(json.dumps(results))
                        os._exit(3)
                    tracebacks.write(f"--- trial {i}: interrupt swallowed ({state['where'] or 'delay'})\n")
                    faulthandler.dump_traceback(tracebacks)
                    tracebacks.flush()
                    state["swallowed"], state["sent"] = True, time.time()
                    os.kill(os.getpid(), signal.SIGINT)

            watcher = threading.Thread(target=watchdog, daemon=True)
            watcher.start()
            try:
                outcome = follow.live(JOB, out=console(), poll_s=0.02)
            except KeyboardInterrupt:
                outcome = "escaped"
            state["returned"] = time.time()
            watcher.join()
            lag = state["returned"] - state["sent"]
            results.append({"delay": delay, "event": event, "where": state["where"], "outcome": outcome,
                            "swallowed": state["swallowed"], "lag": lag})  # fmt: skip
            Path(out_path).write_text(json.dumps(results))


def main() -> None:
    flags = {a.split("=")[0]: a.partition("=")[2] for a in sys.argv[1:] if a.startswith("--")}
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    trials = int(args[0]) if args else 100
    span = float(args[1]) if len(args) > 1 else 1.5
    seed = int(args[2]) if len(args) > 2 else 0
    out = str(Path(tempfile.mkdtemp()) / "trials.json")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 50, 0, 0))
    argv = [sys.executable, __file__, "--child", out, str(trials), str(span), str(seed),
            str(int("--events" in flags)), flags.get("--in", ""), str(int("--ignored" in flags))]  # fmt: skip
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
    results = json.loads(Path(out).read_text()) if Path(out).exists() else []
    counts = collections.Counter(
        (r["outcome"], "swallowed" if r["swallowed"] else "at once") for r in results
    )
    print(f"child exit {code}; {len(results)} of {trials} trials: {dict(counts)}")
    lags = [r["lag"] for r in results if r["lag"] is not None]
    if lags:
        print(f"worst lag signal -> view returned: {max(lags) * 1000:.0f} ms")
    for r in results:
        if r["swallowed"]:
            where = r["where"] or f"{r['delay']:.3f} s"
            print(f"  swallowed at {where}: {r['outcome']}")
    print(f"'Exception ignored' lines on the terminal: {bytes(screen).count(b'Exception ignored')}")
    print(f"tracebacks of swallowed interrupts (if any): {out}.tb")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1",
              sys.argv[7] or None, sys.argv[8] == "1")  # fmt: skip
    else:
        main()
