"""Soak: records under random kills. Real trainer attempts on parquet, a saved data set and packing, with
TensorBoard and W&B (offline) reporting, killed at random times; every record must come out whole.

    .venv/bin/python bench/soak_records.py [--rounds 3] [--kills 4] [--steps 40] [--seed N]

Each round takes the next data source (a parquet folder, a `save_to_disk` folder) and packing on or off, runs the
job once without interruption, then again, killing the trainer at random steps (SIGKILL: no notice; SIGTERM:
a notice, it saves and exits 75; the signal lands wherever the trainer is then) and starting the next attempt each time, as a supervisor would. Checked
against the clean run: the final adapter bitwise equal; the metrics rows (`RunStore.read_metrics`) steps 1..N
each once with the clean run's losses; W&B's history in the run store's copies of the offline runs (what
`wandb sync` would send) steps 1..N each once, in order, with the clean run's losses; TensorBoard's
`train/loss` steps 1..N each once. Not part of the test suite (it takes minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import build_tiny_model, job_dict, prepare_run, trainer_cmd, wandb_records, write_data  # noqa: E402


def make_data(root: Path, kind: str) -> Path:
    """The same 80 instruction examples as a parquet folder or a saved data set."""
    import datasets

    rows = [
        json.loads(line)
        for line in write_data(root / "rows.jsonl", "instruction", 80).read_text().splitlines()
    ]
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = root / "parquet"
        folder.mkdir()
        pq.write_table(pa.Table.from_pylist(rows[:40]), folder / "a.parquet")
        pq.write_table(pa.Table.from_pylist(rows[40:]), folder / "b.parquet")
        return folder
    folder = root / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    return folder


def env_for(root: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb-local"),
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "FTORCH_PROGRESS_EVERY_S": "2",
        "FTORCH_TRACKER_FLUSH_S": "30",
    }
    env.update(
        {k: str(root / "wandb-home") for k in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")}
    )
    (root / "wandb-local").mkdir(exist_ok=True)
    return env


def attempt(run_uri: str, n: int, env: dict[str, str], kill: tuple[str, int] | None) -> tuple[int, bool]:
    """One trainer attempt; `kill` = (signal, the step after which to send it) or None. (Its exit code,
    whether the signal was sent.)"""
    log = open(Path(run_uri).parent / f"attempt-{n}.log", "w")  # noqa: SIM115
    mirror = Path(run_uri).parent / f"progress-{n}.json"
    env = {**env, "FTORCH_PROGRESS_MIRROR": str(mirror)}  # the step, rewritten every step
    proc = subprocess.Popen(trainer_cmd(run_uri, n), env=env, stdout=log, stderr=log, cwd=ROOT)
    sent = False
    while kill is not None and proc.poll() is None:
        try:
            progress = json.loads(mirror.read_text())
        except (OSError, ValueError):
            progress = {}
        if progress.get("first_step_at") and progress.get("step", 0) >= kill[1]:
            proc.send_signal(signal.SIGKILL if kill[0] == "SIGKILL" else signal.SIGTERM)
            sent = True
            break
        time.sleep(0.005)
    code = proc.wait(timeout=600)
    log.close()
    return code, sent and code != 0


def wandb_history(run_uri: str, run_id: str) -> list[tuple[int, float | None]]:
    out = []
    for folder in sorted((Path(run_uri) / "wandb").glob(f"offline-run-*-{run_id}")):
        for record in wandb_records(folder / f"run-{run_id}.wandb"):
            if record.HasField("history"):
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                }
                out.append((record.history.step.num, items.get("train/loss")))
    return out


def tb_steps(run_uri: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(run_uri) / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars("train/loss")]


COMBOS = [("parquet", False), ("saved", True), ("parquet", True), ("saved", False)]


def one_round(
    root: Path, tiny: Path, rng: random.Random, combo: tuple[str, bool], kills: int, steps: int
) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    from trainer.runstore.store import RunStore

    source, packing = combo
    data = make_data(root, source)
    env = env_for(root)
    train = {"max_steps": steps, "report_to": ["tensorboard", "wandb"], "log_every": 10}
    uris = {}
    for name in ("clean", "killed"):
        job = job_dict(
            tiny, data, root / name, train=train, checkpoint={"every": 6},
            data={"packing": packing, "max_seq_len": 128}, local={"threads": 1},
        )  # fmt: skip
        uris[name] = prepare_run(job, run_id=f"{name}-run")
    assert attempt(uris["clean"], 1, env, None)[0] == 0
    signals, exits, n, code = [], [], 0, None
    while code != 0:
        n += 1
        kill = (
            (rng.choice(["SIGKILL", "SIGTERM"]), rng.randint(1, steps - 1)) if len(signals) < kills else None
        )
        code, sent = attempt(uris["killed"], n, env, kill)
        exits.append(code)
        if sent and kill is not None:
            signals.append(kill[0])
        if n > 3 * kills + 5:
            raise RuntimeError(f"no success after {n} attempts (last exit {code})")
    clean, killed = RunStore(uris["clean"]), RunStore(uris["killed"])
    a = load_file(Path(uris["clean"]) / "output" / "adapter_model.safetensors")
    b = load_file(Path(uris["killed"]) / "output" / "adapter_model.safetensors")
    clean_rows, rows = clean.read_metrics(), killed.read_metrics()
    clean_wb, wb = wandb_history(uris["clean"], "clean-run"), wandb_history(uris["killed"], "killed-run")
    everything = list(range(1, steps + 1))
    return {
        "source": source,
        "packing": packing,
        "attempts": n,
        "exit_codes": exits,
        "sigkill": signals.count("SIGKILL"),
        "sigterm": signals.count("SIGTERM"),
        "bitwise": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        "rows": [r["step"] for r in rows] == everything
        and [r["loss"] for r in rows] == [r["loss"] for r in clean_rows],
        "wandb": [s for s, _ in wb] == everything and wb == clean_wb,
        "tensorboard": tb_steps(uris["killed"]) == everything,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=4, help="random kills per round")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="ftorch-soak-records-") as tmp:
        tiny = build_tiny_model(Path(tmp) / "tiny")
        for i in range(args.rounds):
            started = time.time()
            root = Path(tmp) / f"round-{i}"
            root.mkdir()
            result = one_round(root, tiny, rng, COMBOS[i % len(COMBOS)], args.kills, args.steps)
            results.append(result)
            print(json.dumps({"round": i + 1, **result, "s": round(time.time() - started)}), flush=True)
    checks = ("bitwise", "rows", "wandb", "tensorboard")
    kills = sum(r["sigkill"] + r["sigterm"] for r in results)
    print(
        f"{len(results)} rounds, {kills} kills: "
        + ", ".join(f"{c} {sum(r[c] for r in results)}/{len(results)}" for c in checks)
    )
    return 0 if all(r[c] for r in results for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
