"""QLoRA's load peak per GPU, before and after sharded 4-bit loading, traced and estimated, side by side.

    PYTHONPATH=. python bench/load_peaks.py [--offload]

For Llama-3.1-8B and Llama-3.1-70B QLoRA (the examples' settings, AdamW: the 8-bit paged optimizer is
one-GPU only) on 2 and 4 GPUs, it prints, per GPU (GiB, + CUDA context):
- before: every rank quantizing the whole base on its GPU as it loads (the trainer's path before sharded
  loading, and its fallback when bitsandbytes cannot run on the CPU): traced by
  trainer/memtrace/loadtrace.py's `trace_whole`, and the analytic figure for one GPU
  (trainer/memory/load_memory.py, `load_peak_bytes(..., ranks=1)`);
- after: sharded loading (trainer/model/sharded_load.py), traced by running the trainer's own functions on rank 1
  of a fake process group, and the planner's analytic figure (`ftorch estimate --gpus N`'s load phase);
- the ratio after/before, and rank 0's host copy of the 4-bit model.
`--offload` adds the rows with `train.offload: params` (the shards in host RAM).
Each trace runs in this process on fake tensors: no weights, no GPU.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.jobfile.spec import load_job  # noqa: E402
from orchestrator.sizing.memory import estimate, settings_from_spec  # noqa: E402
from orchestrator.sizing.shapes import resolve_shape  # noqa: E402

JOBS = ("examples/llama3-8b-qlora.yaml", "examples/llama3-70b-qlora.yaml")


def rows(offload: bool) -> list[dict]:
    from trainer.config import JobSpec
    from trainer.memtrace.loadtrace import trace_load, trace_whole

    out = []
    for job in JOBS:
        spec = load_job(str(REPO / job), ["train.optimizer=adamw"], check_support=False)
        shape = resolve_shape(spec.model)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(shape.config))
            before = trace_whole(spec, shape.config)
            whole_est = estimate(shape, settings_from_spec(spec, 1)).load_gib_per_gpu
            for ranks in (2, 4):
                for off in ("none", "params") if offload else ("none",):
                    data = spec.model_dump(mode="json")
                    data["train"]["offload"] = off
                    one = JobSpec.model_validate(data)
                    started = time.perf_counter()
                    after = trace_load(one, shape.config, ranks)
                    est = estimate(shape, settings_from_spec(one, ranks))
                    out.append(
                        {
                            "model": shape.name, "ranks": ranks, "offload": off,
                            "before_traced": before.total_gib, "before_estimated": whole_est,
                            "after_traced": after.total_gib, "after_estimated": est.load_gib_per_gpu,
                            "after_allocated": after.peak_allocated_gib, "host_shards": after.host_gib,
                            "rank0_copy": after.rank0_copy_gib, "seconds": time.perf_counter() - started,
                        }
                    )  # fmt: skip
    return out


def main() -> int:
    offload = "--offload" in sys.argv
    started = time.perf_counter()
    table = rows(offload)
    print(
        "| model | GPUs | offload | before: traced | before: estimated | after: traced | after: estimated "
        "| after/before (traced) | rank 0 host copy | shards in host RAM | trace s |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(
            f"| {r['model']} | {r['ranks']} | {r['offload']} | {r['before_traced']:.2f} | "
            f"{r['before_estimated']:.2f} | {r['after_traced']:.2f} | {r['after_estimated']:.2f} | "
            f"{r['after_traced'] / r['before_traced']:.2f}x | {r['rank0_copy']:.1f} | {r['host_shards']:.1f} | "
            f"{r['seconds']:.1f} |"
        )
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
