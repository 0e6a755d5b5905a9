"""docs/job-file.md is the schema's reference, regenerated: it fails when a field changes without it."""

from __future__ import annotations

import importlib.util

from helpers import REPO

# the docs generator is a script (scripts/jobfile_ref.py), not part of the installed package
_spec = importlib.util.spec_from_file_location("jobfile_ref", REPO / "scripts" / "jobfile_ref.py")
assert _spec is not None and _spec.loader is not None
jobfile_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobfile_ref)


def test_job_file_reference_is_in_sync_with_the_schema() -> None:
    expected = jobfile_ref.render()
    actual = (REPO / "docs" / "job-file.md").read_text(encoding="utf-8")
    assert actual == expected, "regenerate: python scripts/jobfile_ref.py > docs/job-file.md"


def test_every_field_has_a_row_with_type_and_default() -> None:
    text = (REPO / "docs" / "job-file.md").read_text(encoding="utf-8")
    for path, kind, default, _bounds, section in jobfile_ref.rows():
        if "." in path or not section:
            assert f"| `{path}` | {kind} | {default} |" in text, path
    assert "| `train.micro_batch_size` | int | `1` | >= 1, <= 65536 |" in text
    assert "| `data.path` | str | **required** |" in text


def test_notes_come_from_the_readme_example() -> None:
    notes = jobfile_ref.readme_notes()
    assert notes["train.precision"].startswith("fp32 | bf16")
    assert notes["resources.budget_usd"].startswith("stop cleanly")


def test_json_schema_is_in_sync_and_checks_job_files(tmp_path) -> None:
    """docs/job-file.schema.json is the schema's JSON Schema, regenerated; it accepts the example jobs
    (shorthands included) and refuses what the loader refuses."""
    import json

    import jsonschema
    import yaml

    actual = json.loads((REPO / "docs" / "job-file.schema.json").read_text(encoding="utf-8"))
    assert actual == jobfile_ref.schema(), (
        "regenerate: python scripts/jobfile_ref.py --schema > docs/job-file.schema.json"
    )
    validator = jsonschema.Draft202012Validator(actual)
    examples = sorted(REPO.glob("examples/*.yaml"))
    assert examples
    for path in examples:
        job = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(job.get("notify"), dict) and True in job["notify"]:  # PyYAML's YAML 1.1 reads `on:`
            job["notify"]["on"] = job["notify"].pop(True)  # as true; editors (YAML 1.2) read "on"
        assert not list(validator.iter_errors(job)), path
    short = {"model": "m", "data": "d.jsonl", "checkpoint": "./runs"}
    assert not list(validator.iter_errors(short))
    wrong = {**short, "learning_rate": 1e-4, "train": {"lr": -1}}
    assert len(list(validator.iter_errors(wrong))) == 2
    props = actual["$defs"]["TrainSpec"]["properties"]
    assert props["precision"]["description"].startswith("fp32 | bf16")  # the README's note
    assert "held-out loss" in props["eval_every"]["description"]  # the `#:` comment in trainer/config.py
