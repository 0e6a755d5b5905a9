"""Data through `datasets`: every local source kind tokenises alike, bad sources are one-line errors naming
the field (exit 2 at validate), hub ids reach `datasets.load_dataset` with the split and subset, tokenising
in 2 processes and from the run store's cache gives the same tokens, and the held-out, train_on_inputs
and chat_template settings do what they say."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from helpers import ftorch, write_data

from trainer.config import DataSpec, JobSpec
from trainer.data.check import read_jsonl
from trainer.data.dataset import IGNORE, DataError, load_dataset


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _ids(dataset) -> list[tuple[list[int], list[int]]]:
    return [(e.input_ids, e.labels) for e in dataset.train]


def _spec(path: Path | str, **data) -> DataSpec:
    return DataSpec(path=str(path), format=data.pop("format", "instruction"), max_seq_len=256, **data)


def test_every_local_source_kind_gives_the_same_examples(tmp_path: Path, tokenizer) -> None:
    jsonl = write_data(tmp_path / "d.jsonl", "instruction", 24)
    rows = [{k: v for k, v in r.items() if k != "_line"} for r in read_jsonl(str(jsonl))]
    table = datasets.Dataset.from_list(rows)
    (tmp_path / "d.json").write_text(json.dumps(rows))  # a JSON array
    table.to_parquet(str(tmp_path / "d.parquet"))
    (tmp_path / "parts").mkdir()
    table.select(range(12)).to_parquet(str(tmp_path / "parts" / "a.parquet"))
    table.select(range(12, 24)).to_parquet(str(tmp_path / "parts" / "b.parquet"))
    datasets.DatasetDict({"train": table, "test": table.select(range(4))}).save_to_disk(
        str(tmp_path / "saved")
    )
    table.save_to_disk(str(tmp_path / "one"))

    expected = _ids(load_dataset(_spec(jsonl), tokenizer, 2, 0))
    assert len(expected) == 24
    for source in ("d.json", "d.parquet", "parts", "saved", "one"):
        assert _ids(load_dataset(_spec(tmp_path / source), tokenizer, 2, 0)) == expected, source
    # the planner counts every kind with the same reader: the same tokens and examples
    from orchestrator.jobfile.spec import validate_job
    from orchestrator.sizing.throughput import workload

    def planned(source: Path) -> tuple:
        job = {
            "model": "m",
            "data": {"path": str(source), "format": "instruction"},
            "checkpoint": {"uri": "/r"},
        }
        work = workload(validate_job(job))
        return work.tokens_per_epoch, work.sequences_per_epoch

    assert planned(jsonl)[1] == 24
    assert {planned(tmp_path / s) for s in ("d.parquet", "parts", "saved", "one")} == {planned(jsonl)}

    test_split = load_dataset(_spec(tmp_path / "saved", split="test"), tokenizer, 2, 0)
    assert _ids(test_split) == expected[:4]
    # another split of the same saved data set as the held-out set
    held = load_dataset(_spec(tmp_path / "saved", eval_split="test"), tokenizer, 2, 0)
    assert _ids(held) == expected and [(e.input_ids, e.labels) for e in held.held_out] == expected[:4]

    # bad sources: one line naming the field
    table.remove_columns("output").to_parquet(str(tmp_path / "no-output.parquet"))
    (tmp_path / "mixed").mkdir()
    table.to_parquet(str(tmp_path / "mixed" / "a.parquet"))
    (tmp_path / "mixed" / "b.jsonl").write_text(jsonl.read_text())
    cases = {
        "data.path": (_spec(tmp_path / "no-output.parquet"), "has no column 'output'"),
        "data.split": (_spec(tmp_path / "saved", split="dev"), "'dev' is not a split of"),
        "data.eval_split": (_spec(tmp_path / "saved", eval_split="dev"), "its splits: train, test"),
        "data.subset": (_spec(jsonl, subset="en"), "a subset applies to hub data sets"),
    }
    for field, (spec, words) in cases.items():
        with pytest.raises(DataError, match=words) as caught:
            load_dataset(spec, tokenizer, 2, 0)
        assert caught.value.field == field and "\n" not in str(caught.value)
    with pytest.raises(DataError, match="mixes jsonl and parquet files"):
        load_dataset(_spec(tmp_path / "mixed"), tokenizer, 2, 0)
    with pytest.raises(DataError, match="files are one split") as caught:
        load_dataset(_spec(jsonl, split="test"), tokenizer, 2, 0)
    assert caught.value.field == "data.split"


def test_a_hub_id_is_loaded_through_load_dataset_with_its_split_and_subset(
    tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline, so only the boundary: the call made to `datasets.load_dataset` (not a download)."""
    from orchestrator.backends.skypilot_render import require_remote
    from orchestrator.jobfile.spec import validate_job

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, kwargs))
        return datasets.Dataset.from_dict(
            {"text": [f"alpha bravo {i}" for i in range(8)], "id": list(range(8))}
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = load_dataset(
        DataSpec(path="someone/corpus", subset="en", split="train[:80%]", eval_split="test"), tokenizer, 2, 0
    )
    assert calls == [("someone/corpus", "en", "train[:80%]", {}), ("someone/corpus", "en", "test", {})]
    assert len(dataset.train) == 8 and len(dataset.held_out) == 8

    job = {"model": "m", "data": {"path": "someone/corpus"}, "checkpoint": {"uri": "s3://b/runs"}}
    spec = validate_job(job, base=tmp_path)
    assert spec.data.path == "someone/corpus"  # not resolved against the job file's folder
    require_remote(spec)  # a cloud VM loads it from the Hub: no bucket needed


def write_job(tmp_path: Path, data: dict, train: dict | None = None) -> str:
    import json

    import yaml

    from orchestrator.sizing.shapes import bundled_configs

    model = tmp_path / "model"  # a model folder on this machine, as a local job's preflight needs
    model.mkdir(exist_ok=True)
    cfg = {k: v for k, v in bundled_configs()["smollm2-135m"].items() if k != "aliases"}
    (model / "config.json").write_text(json.dumps(cfg))
    job = {
        "model": str(model),
        "data": {"format": "chat", **data},
        "train": train or {},
        "checkpoint": {"uri": str(tmp_path / "runs")},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return str(tmp_path / "job.yaml")


def test_bad_data_settings_are_refused_at_validate_with_the_field(tmp_path: Path) -> None:
    from orchestrator.cli.jobfile import check_job
    from orchestrator.errors import SpecError

    data = write_data(tmp_path / "d.jsonl", "chat", 6)
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m.content }")
    cases = [
        (
            {"path": str(data), "eval_path": str(data), "eval_fraction": 0.1},
            None,
            "data.eval_path: give one held-out set, not both data.eval_fraction",
        ),
        ({"path": str(data), "eval_fraction": 1.5}, None, "data.eval_fraction: Input should be less than 1"),
        ({"path": str(data), "eval_fraction": 0.01}, None, "data.eval_fraction: 0.01 of 6 examples is 0"),
        ({"path": str(data), "eval_examples": 6}, None, "data.eval_examples: 6 leaves no training"),
        ({"path": str(data)}, {"eval_every": 5}, "train.eval_every: needs a held-out set"),
        ({"path": "missing.jsonl"}, None, "data.path: "),
        ({"path": str(data), "eval_path": "./nowhere"}, None, "data.eval_path: "),
        ({"path": str(data), "chat_template": "bad.jinja"}, None, "data.chat_template: not a valid Jinja"),
        ({"path": str(data), "chat_template": "none.jinja"}, None, "data.chat_template: "),
        ({"path": str(data), "split": "test"}, None, "data.split: 'test': files are one split"),
        ({"path": str(data), "eval_split": "train"}, None, "data.eval_split: the held-out set would be the"),
        ({"path": str(data), "eval_split": "test"}, None, "data.eval_split: 'test': files are one split"),
    ]
    for data_fields, train, expected in cases:
        with pytest.raises(SpecError) as caught:
            check_job(write_job(tmp_path, data_fields, train), [])
        assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), str(caught.value)
    ok = check_job(
        write_job(
            tmp_path,
            {"path": str(data), "eval_fraction": 0.5, "chat_template": "{{ 'x' }}"},
            {"eval_every": 2},
        ),
        [],
    )
    assert ok["notes"] == []
    hub = check_job(write_job(tmp_path, {"path": "someone/corpus", "split": "validation"}), [])
    assert "taken as a Hugging Face Hub data set" in hub["notes"][0]
    # the CLI: exit 2, one line
    out = ftorch(
        "validate", write_job(tmp_path, {"path": str(data), "eval_path": str(data), "eval_fraction": 0.1})
    )
    assert (
        out.returncode == 2
        and out.stderr.strip().count("\n") == 0
        and "data.eval_path: give one" in out.stderr
    )


def test_two_processes_and_the_cache_give_the_same_tokens(
    tmp_path: Path, tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.data import cache as data_cache
    from trainer.data import dataset as data
    from trainer.runstore.store import RunStore

    path = write_data(tmp_path / "d.jsonl", "text", 2 * data.ROWS_PER_PROC + 50)
    one = load_dataset(_spec(path, format="text", num_proc=1), tokenizer, 2, 0)
    assert data.tokenising_processes(_spec(path, num_proc=2), 2 * data.ROWS_PER_PROC + 50) == 2
    two = load_dataset(_spec(path, format="text", num_proc=2), tokenizer, 2, 0)
    assert _ids(two) == _ids(one)
    log = capsys.readouterr().out
    assert "tokenising: 1,050 examples" in log and "tokenising: done in" in log

    store = RunStore(str(tmp_path / "run"))
    spec = _spec(path, format="text", num_proc=2)
    fresh = load_dataset(spec, tokenizer, 2, 0, cache_store=store)
    cached = load_dataset(spec, tokenizer, 2, 0, cache_store=store)
    assert "tokenised data from the run store's cache" in capsys.readouterr().out
    assert _ids(cached) == _ids(fresh) == _ids(one)
    assert data_cache.cache_key(_spec(path, format="text", num_proc=1), tokenizer) == data_cache.cache_key(
        spec, tokenizer
    )
    assert data_cache.cache_key(
        _spec(path, format="text", train_on_inputs=True), tokenizer
    ) != data_cache.cache_key(spec, tokenizer)


def test_held_out_fraction_train_on_inputs_and_a_chat_template(
    tmp_path: Path, tokenizer, tiny_model: Path
) -> None:
    from trainer.model.load import load_tokenizer

    path = write_data(tmp_path / "d.jsonl", "instruction", 40)
    everything = _ids(load_dataset(_spec(path), tokenizer, 2, 0))
    split = load_dataset(_spec(path, eval_fraction=0.25), tokenizer, 2, 0)
    held = [(e.input_ids, e.labels) for e in split.held_out]
    assert len(held) == 10 and len(split.train) == 30
    assert sorted(held + _ids(split)) == sorted(everything)
    assert held == [
        (e.input_ids, e.labels)
        for e in load_dataset(_spec(path, eval_fraction=0.25), tokenizer, 2, 0).held_out
    ]

    masked = load_dataset(_spec(path), tokenizer, 2, 0).train[0]
    assert IGNORE in masked.labels
    learned = load_dataset(_spec(path, train_on_inputs=True), tokenizer, 2, 0).train[0]
    assert learned.input_ids == masked.input_ids and learned.labels == learned.input_ids

    chat = write_data(tmp_path / "c.jsonl", "chat", 4)
    template = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}"
    (tmp_path / "t.jinja").write_text(template)
    job = {"model": str(tiny_model), "data": {"path": str(chat), "format": "chat", "chat_template": str(tmp_path / "t.jinja")},
           "checkpoint": {"uri": str(tmp_path)}}  # fmt: skip
    custom = load_tokenizer(JobSpec.model_validate(job))
    assert custom.chat_template == template
    first = load_dataset(DataSpec(path=str(chat), format="chat"), custom, 2, 0).train[0]
    text = custom.decode(first.input_ids)
    assert text.startswith("<<system>> be brief") and "<<assistant>>" in text
    trained = custom.decode(
        [t for t, lab in zip(first.input_ids, first.labels, strict=True) if lab != IGNORE]
    )
    assert "be brief" not in trained


def test_remote_parquet_folders_and_saved_data_sets_through_storage_options(
    tmp_path: Path, tokenizer, s3
) -> None:
    """On a real S3 server: parquet files in a folder and a saved DatasetDict, read with the job's
    storage options; their cache key follows the objects' ETags."""
    from trainer.data import cache as data_cache
    from trainer.runstore.store import RunStore

    jsonl = write_data(tmp_path / "d.jsonl", "instruction", 12)
    expected = _ids(load_dataset(_spec(jsonl), tokenizer, 2, 0))
    table = datasets.Dataset.from_list(
        [{k: v for k, v in r.items() if k != "_line"} for r in read_jsonl(str(jsonl))]
    )
    bucket = RunStore(s3.uri, s3.options)
    for name, part in (("a", table.select(range(6))), ("b", table.select(range(6, 12)))):
        part.to_parquet(str(tmp_path / f"{name}.parquet"))
        bucket.write_bytes(f"parts/{name}.parquet", (tmp_path / f"{name}.parquet").read_bytes())
    datasets.DatasetDict({"train": table, "test": table.select(range(3))}).save_to_disk(
        f"{s3.uri}/saved", storage_options=s3.options
    )
    folder = _spec(f"{s3.uri}/parts")
    assert _ids(load_dataset(folder, tokenizer, 2, 0, s3.options)) == expected
    saved = load_dataset(_spec(f"{s3.uri}/saved", eval_split="test"), tokenizer, 2, 0, s3.options)
    assert _ids(saved) == expected and [(e.input_ids, e.labels) for e in saved.held_out] == expected[:3]
    key = data_cache.cache_key(folder, tokenizer, s3.options)
    assert key is not None and data_cache.cache_key(folder, tokenizer, s3.options) == key
    bucket.write_bytes("parts/b.parquet", (tmp_path / "a.parquet").read_bytes())
    assert data_cache.cache_key(folder, tokenizer, s3.options) != key
