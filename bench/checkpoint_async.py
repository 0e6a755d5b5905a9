"""Async vs synchronous checkpoints on a real S3 server (SeaweedFS on 127.0.0.1), same state, one run.

    .venv/bin/python bench/checkpoint_async.py [--params 4000000] [--repeats 5] [--store s3|local]

`--store local` writes to a folder on the local disk instead (the quickstart's store); `--params 45000`
is about the quickstart's checkpoint (549 KiB of LoRA weights and AdamW state).

Prints, side by side: how long training blocks per checkpoint (synchronous save vs the async writer:
copy only), and the checkpoint upload throughput (the store's manifest-last commit: files in parallel,
then the manifest) vs a plain s3fs put of the same bytes (one pipe_file per file, one after another).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from s3server import SeaweedS3, s3_env  # noqa: E402

from trainer.checkpoints.async_save import AsyncCheckpointer  # noqa: E402
from trainer.checkpoints.checkpoint import TrainerState, serialize, snapshot  # noqa: E402
from trainer.runstore.store import RunStore  # noqa: E402


def make_state(params: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    width = 1024 if params >= 1024 * 1024 else max(8, int(params**0.5))
    layers = max(1, params // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt, sched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store", choices=["s3", "local"], default="s3")
    args = parser.parse_args()
    if args.store == "local":
        with tempfile.TemporaryDirectory(prefix="ftorch-bench-") as tmp:
            run(None, args.params, args.repeats, tmp)
        return
    with tempfile.TemporaryDirectory(prefix="ftorch-bench-") as tmp:
        server = SeaweedS3(Path(tmp))
        try:
            os.environ.update(s3_env(server.endpoint))
            server.make_bucket("bench")
            run(server.endpoint, args.params, args.repeats)
        finally:
            server.stop()


def run(endpoint: str | None, params: int, repeats: int, local: str | None = None) -> None:
    model, opt, sched = make_state(params)
    store = RunStore(f"{local}/run", {}) if local else RunStore("s3://bench/run", {"endpoint_url": endpoint})
    where = f"local disk ({local})" if local else "SeaweedFS on 127.0.0.1"
    plain_root = f"{local}/plain" if local else "bench/plain"
    store.exists("spec.json")  # warm the client, as the trainer does at start
    sync_block, async_block, ours, plain = [], [], [], []
    nbytes = 0
    step = 0
    for _ in range(repeats):
        for mode in ("sync", "async"):
            step += 1
            writer = AsyncCheckpointer(store, keep=2, log=lambda m: None, asynchronous=mode == "async")
            state = TrainerState(step=step, micro_batches=step, tokens_seen=0)
            started = time.perf_counter()
            writer.save(model, opt, sched, state)
            blocked = time.perf_counter() - started
            writer.wait()
            (sync_block if mode == "sync" else async_block).append(blocked)
        blobs = serialize(snapshot(model, opt, sched, TrainerState(step=0, micro_batches=0, tokens_seen=0)))
        nbytes = sum(len(b) for b in blobs.values())
        step += 1
        started = time.perf_counter()
        store.commit_checkpoint(step, blobs)
        ours.append(nbytes / (time.perf_counter() - started))
        started = time.perf_counter()
        for name, data in blobs.items():
            if local:
                os.makedirs(f"{plain_root}/{step}", exist_ok=True)
            store.fs.pipe_file(f"{plain_root}/{step}/{name}", data)
        plain.append(nbytes / (time.perf_counter() - started))
    mib = 2**20
    sb, ab = statistics.median(sync_block), statistics.median(async_block)
    ot, pt = statistics.median(ours), statistics.median(plain)
    print(
        f"checkpoint: {nbytes / mib:.2f} MiB ({params / 1e6:.2f}M params + AdamW), {where}, "
        f"median of {repeats}, torch threads {torch.get_num_threads()}"
    )
    print("| measure | async writer | synchronous / plain s3fs | ratio |")
    print("|---|---|---|---|")
    print(
        f"| training blocked per checkpoint | {ab * 1000:.0f} ms | {sb * 1000:.0f} ms (sync save) | "
        f"{sb / ab:.1f}x less blocking |"
    )
    print(
        f"| upload throughput | {ot / mib:.0f} MiB/s (commit: parallel files + manifest) | "
        f"{pt / mib:.0f} MiB/s (plain pipe_file per file) | {ot / pt:.2f}x |"
    )


if __name__ == "__main__":
    main()
