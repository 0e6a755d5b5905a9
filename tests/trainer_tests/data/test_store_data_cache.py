"""The tokenised data set is cached in the run store: a restart skips tokenisation, and data given as an
s3:// URL is read once through fsspec (later attempts only ask for its ETag)."""

from __future__ import annotations

from pathlib import Path

from helpers import assert_bitwise_equal, write_data
from s3runs import job_for, local_reference, object_keys, prepare_s3_run, run, s3_final_weights

from trainer.runstore.store import RunStore


def test_s3_data_is_read_once_and_tokenised_once(tiny_model: Path, tmp_path: Path, s3, fault_proxy) -> None:
    data = write_data(tmp_path / "d.jsonl", "instruction", 64)
    expected = local_reference(job_for(tiny_model, data, "unused"), tmp_path)
    bucket = RunStore(s3.uri, {"endpoint_url": s3.endpoint})
    bucket.write_bytes("data/train.jsonl", data.read_bytes())
    job = job_for(tiny_model, data, f"{s3.uri}/runs")
    job["data"] = {**job["data"], "path": f"{s3.uri}/data/train.jsonl"}
    store = prepare_s3_run(job, "cached", s3.endpoint)

    first = run(store, fault_proxy.endpoint, 1, FTORCH_FAULTS="crash@12")
    assert first.returncode == 1, first.stdout
    assert "tokenised data from the run store's cache" not in first.stdout
    assert [k for k in object_keys(store, "cache") if k.endswith(".safetensors")]
    second = run(store, fault_proxy.endpoint, 2)
    assert second.returncode == 0, second.stdout
    assert "tokenised data from the run store's cache" in second.stdout
    assert fault_proxy.count("GET", "/data/train.jsonl") == 1  # read by the first attempt only
    assert_bitwise_equal(s3_final_weights(store), expected)


def test_a_changed_data_file_or_setting_misses_the_cache(tiny_model: Path, tmp_path: Path) -> None:
    from trainer.config import DataSpec, JobSpec
    from trainer.data import cache as data_cache
    from trainer.model.load import load_tokenizer

    data = write_data(tmp_path / "d.jsonl", "instruction", 16)
    spec = JobSpec.model_validate(
        {"model": str(tiny_model), "data": {"path": str(data)}, "checkpoint": {"uri": str(tmp_path)}}
    )
    tok = load_tokenizer(spec)
    key = data_cache.cache_key(spec.data, tok)
    assert data_cache.cache_key(spec.data, tok) == key
    assert data_cache.cache_key(DataSpec(path=str(data), max_seq_len=64), tok) != key
    write_data(data, "instruction", 17)
    assert data_cache.cache_key(spec.data, tok) != key
