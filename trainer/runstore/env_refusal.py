"""`python -m trainer.runstore.env_refusal LOCK RUN_URI`: the task's setup checks the installed environment
against the run's lock (trainer/envlock.py) and, when it is not the lock, records the refusal instead of
failing: the one line goes into the run store (REFUSED) and beside the lock on this node (LOCK +
REFUSED_SUFFIX), and it exits 0. The setup then succeeds and the run step, seeing the record, ends the
attempt with 0 without training. A non-zero setup would be a user error to SkyPilot, relaunched up to
max_restarts_on_errors times on newly provisioned machines, each refusing the same way; ftorch reads FAILED
from the store instead (orchestrator/backends/skypilot_state.py). When the record cannot be written it
exits ENV_MISMATCH (78), as a plain `check` does. No torch here.
"""

from __future__ import annotations

import socket
import sys
import time

from trainer.envlock import ENV_MISMATCH, matched, refusal

#: the run store's record of a setup that refused the environment
REFUSED = "env/refused.json"
#: beside the lock on the node: the run step reads it and ends the attempt without training
REFUSED_SUFFIX = ".refused"


def record_refusal(run_uri: str, line: str, lock_path: str) -> bool:
    """Write the refusal to the run store and beside the lock; False when the store could not be written."""
    from trainer.runstore.attempts import open_run_store

    try:
        open_run_store(run_uri).write_json(
            REFUSED, {"line": line, "at": time.time(), "host": socket.gethostname()}
        )
    except Exception as exc:  # noqa: BLE001 - unrecorded, the refusal stays an exit SkyPilot sees
        sys.stderr.write(f"ftorch: environment: could not record the refusal in the run store: {exc}\n")
        return False
    with open(lock_path + REFUSED_SUFFIX, "w", encoding="utf-8") as handle:
        handle.write(line + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m trainer.runstore.env_refusal LOCK RUN_URI\n")
        return 2
    lock_path, run_uri = args
    line = refusal(lock_path)
    if line is None:
        sys.stdout.write(matched(lock_path) + "\n")
        return 0
    sys.stderr.write(line + "\n")
    if not record_refusal(run_uri, line, lock_path):
        return ENV_MISMATCH
    sys.stderr.write("ftorch: the refusal is recorded in the run store; this attempt ends without training\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
