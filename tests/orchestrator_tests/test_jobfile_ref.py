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
