"""Every plan runs: for every example job, the trainer's layout check accepts each of the planner's top 10
candidates, and a tiny stand-in of the job (the example's method, LoRA, quantisation, batch, precision
and optimizer on a tiny model) trains on CPU in the layout of the chosen offer (ranks capped at 4),
is preempted after its first steps (SIGTERM: save, exit 75), and resumes to the end in that layout.
Examples whose stand-ins are the same run (same job on the tiny model, same ranks and layout) train once:
`TWINS` names them, and a test checks that they are indeed the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fsdp_helpers import SIGTERM, finish, interrupt, new_run
from helpers import REPO, write_data

from orchestrator.jobfile.spec import load_job
from orchestrator.sizing.planner import make_plan
from trainer.layout import check, layout_for
from trainer.runstore.store import RunStore

EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
MAX_RANKS = 4
STEPS = 4  # the notice comes after step 1; the trainer saves at the next step boundary, then resumes
#: examples whose stand-in run is identical to another example's (the key's), checked by a test below
TWINS = {"llama3-8b-qlora.yaml": ("llama2-7b-qlora.yaml", "llama3-8b-qlora-deadline.yaml")}
RUN_ONCE = [name for name in EXAMPLES if not any(name in twins for twins in TWINS.values())]


def example_spec(name: str, quickstart_dir: Path) -> Any:
    path = quickstart_dir / name if name == "quickstart.yaml" else REPO / "examples" / name
    return load_job(path)


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 8 and "quickstart.yaml" in EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_trainer_accepts_the_top_candidates(name: str, quickstart_dir: Path) -> None:
    spec = example_spec(name, quickstart_dir)
    plan = make_plan(spec, offline=True)
    assert plan.chosen is not None, plan.why_none()
    assert plan.chosen.layout is not None and plan.chosen.layout.ok
    for cand in plan.candidates[:10]:
        layout = check(spec, cand.ranks, cand.count)  # raises LayoutError on a refusal
        assert layout == cand.layout
        assert layout.micro_batch <= spec.train.micro_batch_size
        assert layout.micro_batch * layout.accum * layout.ranks == (
            spec.train.micro_batch_size * spec.train.grad_accum
        )


def stand_in(spec: Any, tiny_model: Path, tmp: Path, ranks: int) -> dict[str, Any]:
    """The example's job on a tiny model and tiny data, run locally with `ranks` processes."""
    job = spec.model_dump(mode="json", exclude_defaults=True)
    data = write_data(tmp / "d.jsonl", spec.data.format, 24)
    job.update(
        model=str(tiny_model),
        data={"path": str(data), "format": spec.data.format, "max_seq_len": 96},
        checkpoint={"uri": str(tmp / "runs"), "every": 100, "keep": 2},
        resources={"backend": "local"},
        local={"threads": 1, "nproc": ranks},
    )
    job["train"] = {**job["train"], "max_steps": STEPS, "log_every": 1, "warmup_steps": 1}
    job["train"].pop("epochs", None)
    if spec.method != "full":
        job["lora"] = {**job.get("lora", {}), "r": 4, "target_modules": ["q_proj", "v_proj"]}
    job.pop("notify", None)
    return job


def _stand_in_run(name: str, quickstart_dir: Path, tiny_model: Path, tmp: Path) -> tuple[Any, int, Any]:
    spec = example_spec(name, quickstart_dir)
    chosen = make_plan(spec, offline=True).chosen
    assert chosen is not None
    ranks = min(MAX_RANKS, chosen.ranks)
    job = stand_in(spec, tiny_model, tmp, ranks)
    job.pop("name", None)
    return job, ranks, layout_for(spec, ranks)


@pytest.mark.parametrize("name", sorted(TWINS))
def test_twin_examples_have_the_same_stand_in_run(
    name: str, quickstart_dir: Path, tiny_model: Path, tmp_path: Path
) -> None:
    assert name in RUN_ONCE
    run = _stand_in_run(name, quickstart_dir, tiny_model, tmp_path)
    for twin in TWINS[name]:
        assert _stand_in_run(twin, quickstart_dir, tiny_model, tmp_path) == run, twin


@pytest.mark.parametrize("name", RUN_ONCE)
def test_a_stand_in_trains_and_resumes_in_the_chosen_layout(
    name: str, quickstart_dir: Path, tiny_model: Path, tmp_path: Path
) -> None:
    spec = example_spec(name, quickstart_dir)
    chosen = make_plan(spec, offline=True).chosen
    assert chosen is not None
    ranks = min(MAX_RANKS, chosen.ranks)
    layout = layout_for(spec, ranks)
    assert layout.ok, layout.reason
    run_uri = new_run(stand_in(spec, tiny_model, tmp_path, ranks), "standin")

    code, out, _ = interrupt(run_uri, 1, ranks, at_step=1, sig=SIGTERM)
    assert f"layout: {layout.describe()}" in out, out[-3000:]
    assert "is safe; exiting with code 75" in out, out[-3000:]
    saved = RunStore(run_uri).complete_checkpoints()[-1].step
    assert 1 <= saved < STEPS

    out = finish(run_uri, 2, ranks)
    assert f"resumed from checkpoints/step-{saved:08d}" in out, out[-3000:]
    assert f"layout: {layout.describe()}" in out
    assert f"step {STEPS}/{STEPS}" in out and "done:" in out
