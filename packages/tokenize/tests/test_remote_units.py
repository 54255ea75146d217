"""tokenize from an object-store prefix, and unit-planned runs (--num-nodes) into one (real S3 server)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenize_helpers import upload_prefix

from tokenloom.formats import RemoteOptions, open_dataset
from tokenloom.formats.errors import ConfigError, DataError, FormatError, MissingFileError, ResumeMismatchError
from tokenloom.tokenize import TokenizeConfig, tokenize

OPTIONS: dict[str, Any] = {"shard_size_tokens": 2000, "chunk_lines": 30, "seq_len": 64, "overlap_size": 0}


@pytest.fixture
def corpus(jsonl_dir, make_texts) -> Path:
    texts = make_texts(600, seed=11)
    return jsonl_dir({f"sub/part{i}.jsonl": [{"text": t} for t in texts[i * 100 : (i + 1) * 100]] for i in range(6)})


def _credentials(seaweed, monkeypatch) -> None:
    """The S3 server's endpoint and keys in the environment, as a user on a cluster sets them."""
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _config(input_dir: object, output_dir: object, tokenizer: Path, **extra: Any) -> TokenizeConfig:
    return TokenizeConfig(
        input_dir=input_dir,  # type: ignore[arg-type]
        output_dir=output_dir,  # type: ignore[arg-type]
        tokenizer=str(tokenizer),
        num_workers=0,
        **{**OPTIONS, **extra},
    )


def _tokens(dataset) -> list[bytes]:
    return [np.asarray(dataset[i]).tobytes() for i in range(len(dataset))]


def _shards(seaweed, url: str, *, everything: bool = False) -> dict[str, bytes]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    prefix = url.split(f"{seaweed.bucket}/", 1)[1] + "/"
    found = {}
    for chunk in obstore.list(store, prefix=prefix):
        for meta in chunk:
            name = meta["path"][len(prefix) :]
            if everything or name.endswith((".bin", ".idx")):
                found[name] = bytes(obstore.get(store, meta["path"]).bytes())
    return found


def test_input_prefix_on_s3_gives_the_same_tokens_as_the_local_directory(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    source = upload_prefix(seaweed, corpus, "raw")
    _credentials(seaweed, monkeypatch)
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache"))
    local = tokenize(_config(corpus, tmp_path / "local", tiny_tokenizer))
    remote = tokenize(_config(source, tmp_path / "from-s3", tiny_tokenizer))
    assert remote.documents == local.documents == 600
    assert _tokens(open_dataset(tmp_path / "from-s3")) == _tokens(open_dataset(tmp_path / "local"))
    for shard in (tmp_path / "local").glob("shard_*"):
        assert (tmp_path / "from-s3" / shard.name).read_bytes() == shard.read_bytes()
    # the run key holds each object's ETag, not a local mtime: a rerun is complete, not a mismatch
    again = tokenize(_config(source, tmp_path / "from-s3", tiny_tokenizer))
    assert again.already_complete


def test_three_nodes_from_s3_into_s3_equal_one_local_unit_planned_run(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    source = upload_prefix(seaweed, corpus, "raw")
    _credentials(seaweed, monkeypatch)
    target = f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"
    one = tmp_path / "one"
    tokenize(_config(corpus, one, tiny_tokenizer, num_nodes=1))
    summaries = []
    for rank in (1, 0, 2):  # any order; each node with a cache of its own, as on separate machines
        monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / f"cache-{rank}"))
        summaries.append(tokenize(_config(source, target, tiny_tokenizer, num_nodes=3, node_rank=rank)))
    assert [s.units_missing for s in summaries[:2]] == [4, 2]  # 6 units: 2 per node; the last one finalizes
    assert summaries[2].units_missing in (None, 0)
    shards = _shards(seaweed, target)
    assert shards == {p.name: p.read_bytes() for p in one.iterdir() if p.suffix in (".bin", ".idx")}
    remote = open_dataset(target, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "read"))
    assert _tokens(remote) == _tokens(open_dataset(one))
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache-new-machine"))
    assert tokenize(_config(source, target, tiny_tokenizer, num_nodes=3, node_rank=0)).already_complete


def test_a_node_that_did_not_run_is_named_and_a_rerun_on_a_new_machine_finishes(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    source = upload_prefix(seaweed, corpus, "raw")
    _credentials(seaweed, monkeypatch)
    target = f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache-a"))
    tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=0))
    with pytest.raises(MissingFileError):  # no manifest yet: a reader sees no dataset
        open_dataset(target, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "read"))
    with pytest.raises(DataError, match=r"3 of 6 units are not committed"):
        tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=0, finalize=True))
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache-b"))  # node 0 again, elsewhere: nothing redone
    rerun = tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=0))
    assert rerun.units_committed == 0
    tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=1))
    assert len(open_dataset(target, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "read2"))) > 0


def test_other_settings_or_a_changed_input_object_are_refused(seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch):
    source = upload_prefix(seaweed, corpus, "raw")
    _credentials(seaweed, monkeypatch)
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache"))
    target = f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"
    tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=0))
    with pytest.raises(ResumeMismatchError, match="max_length"):
        tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=1, seq_len=32))
    key = source.split(f"{seaweed.bucket}/", 1)[1]
    seaweed.put(f"{key}/sub/part1.jsonl", b'{"text": "replaced"}\n')
    with pytest.raises(ResumeMismatchError, match="part1.jsonl"):
        tokenize(_config(source, target, tiny_tokenizer, num_nodes=2, node_rank=1))


def test_remote_input_refusals_are_named(seaweed, tiny_tokenizer, tmp_path, monkeypatch):
    _credentials(seaweed, monkeypatch)
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="no input objects"):
        tokenize(_config(f"s3://{seaweed.bucket}/nothing-here", tmp_path / "out", tiny_tokenizer))
    with pytest.raises(MissingFileError, match="no-such-bucket"):
        tokenize(_config("s3://no-such-bucket/raw", tmp_path / "out", tiny_tokenizer))
    with pytest.raises(ConfigError, match="cannot be listed"):
        _config("https://example.invalid/raw", tmp_path / "out", tiny_tokenizer)
    bucket = f"s3://{seaweed.bucket}"
    with pytest.raises(ConfigError, match="--overwrite with --num-nodes / --executor ray") as info:
        _config(f"{bucket}/raw", f"{bucket}/out", tiny_tokenizer, executor="ray", overwrite=True)
    assert info.value.field == "overwrite"
    with pytest.raises(ConfigError, match="--layout tree and --val-fraction do not run with --executor ray") as info:
        _config(f"{bucket}/raw", f"{bucket}/out", tiny_tokenizer, executor="ray", val_fraction=0.1)
    assert info.value.field == "executor"


def test_hash_inputs_with_an_input_prefix_is_refused_not_ignored(tiny_tokenizer, tmp_path):
    # objects are identified by their ETag; --hash-inputs would silently do nothing
    with pytest.raises(ConfigError, match="hash.inputs") as info:
        _config(
            "s3://bucket/raw", tmp_path / "out", tiny_tokenizer, hash_inputs=True, plan_cache_dir=tmp_path / "cache"
        )
    assert info.value.field == "hash_inputs"


def test_a_short_staged_input_copy_is_fetched_again_not_read_as_whole(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    source = upload_prefix(seaweed, corpus, "raw")
    _credentials(seaweed, monkeypatch)
    cache = tmp_path / "cache"
    local = tokenize(_config(corpus, tmp_path / "local", tiny_tokenizer))
    config = _config(source, tmp_path / "from-s3", tiny_tokenizer, plan_cache_dir=cache)
    from tokenloom.tokenize._plan import RunInputs

    first = RunInputs.resolve(config).files[0]
    first.path.parent.mkdir(parents=True)  # what a crash after an unsynced rename leaves: a short copy
    first.path.write_bytes((corpus / first.relative).read_bytes()[: first.size // 2])
    remote = tokenize(config)
    assert remote.documents == local.documents == 600
    assert first.path.stat().st_size == first.size
    assert _tokens(open_dataset(tmp_path / "from-s3")) == _tokens(open_dataset(tmp_path / "local"))


def test_a_node_keeps_no_staged_shards_once_its_units_are_committed_at_the_url(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    _credentials(seaweed, monkeypatch)
    target = f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"
    cache = tmp_path / "cache-0"
    summary = tokenize(_config(corpus, target, tiny_tokenizer, num_nodes=2, node_rank=0, plan_cache_dir=cache))
    assert summary.units_missing == 3  # not the last node: its staging stays, but not a copy of its output
    assert sorted(p.name for p in cache.rglob("unit_*")) == []
    again = tokenize(_config(corpus, target, tiny_tokenizer, num_nodes=2, node_rank=0, plan_cache_dir=cache))
    assert again.units_committed == 0
    import obstore
    from obstore.store import S3Store

    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    obstore.delete(store, f"{target.split(f'{seaweed.bucket}/', 1)[1]}/.tokenloom-unit-000002.done")
    redone = tokenize(_config(corpus, target, tiny_tokenizer, num_nodes=2, node_rank=0, plan_cache_dir=cache))
    assert redone.units_committed == 1  # the marker the bucket lost: its unit encoded and committed again
    tokenize(_config(corpus, target, tiny_tokenizer, num_nodes=2, node_rank=1, plan_cache_dir=tmp_path / "cache-1"))
    one = tmp_path / "one"
    tokenize(_config(corpus, one, tiny_tokenizer, num_nodes=1))
    assert _shards(seaweed, target) == {p.name: p.read_bytes() for p in one.iterdir() if p.suffix in (".bin", ".idx")}


def test_a_node_staged_for_another_plan_is_refused_before_it_writes_into_the_prefix(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    import obstore
    from obstore.store import S3Store

    _credentials(seaweed, monkeypatch)
    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    target = f"s3://{seaweed.bucket}/tok-{uuid.uuid4().hex[:8]}"
    key = target.split(f"{seaweed.bucket}/", 1)[1]
    old = {"num_nodes": 2, "node_rank": 0, "plan_cache_dir": tmp_path / "cache-0"}
    tokenize(_config(corpus, target, tiny_tokenizer, **old))
    for chunk in obstore.list(store, prefix=f"{key}/"):  # the prefix emptied, then a run with other settings
        for meta in chunk:
            obstore.delete(store, meta["path"])
    with pytest.raises(DataError, match="not committed"):  # --finalize: the new plan created, nothing encoded
        tokenize(_config(corpus, target, tiny_tokenizer, **old, seq_len=32, finalize=True))
    before = sorted(_shards(seaweed, target, everything=True))
    with pytest.raises(ResumeMismatchError, match=r"unit plan.*max_length"):  # the old command again, same machine
        tokenize(_config(corpus, target, tiny_tokenizer, **old))
    assert sorted(_shards(seaweed, target, everything=True)) == before  # nothing of the old plan written there


def test_a_mislabelled_input_object_is_named_by_its_url_not_its_staged_copy(
    seaweed, tiny_tokenizer, tmp_path, monkeypatch
):
    _credentials(seaweed, monkeypatch)
    key = f"raw-{uuid.uuid4().hex[:8]}"
    seaweed.put(f"{key}/a.jsonl", b'{"text": "fine"}\n')
    seaweed.put(f"{key}/b.parquet", b'{"text": "not parquet"}\n')
    config = _config(
        f"s3://{seaweed.bucket}/{key}", tmp_path / "out", tiny_tokenizer, plan_cache_dir=tmp_path / "cache"
    )
    with pytest.raises(FormatError, match="named as parquet") as info:
        tokenize(config)
    assert info.value.path == f"s3://{seaweed.bucket}/{key}/b.parquet"


def test_an_input_object_replaced_after_the_listing_is_a_named_mismatch_not_other_data(
    seaweed, corpus, tiny_tokenizer, tmp_path, monkeypatch
):
    import tokenloom.tokenize._plan as plan_module

    source = upload_prefix(seaweed, corpus, "raw")
    _credentials(seaweed, monkeypatch)
    key = source.split(f"{seaweed.bucket}/", 1)[1]
    listed = plan_module.discover_remote_inputs  # pyright: ignore[reportPrivateImportUsage]

    def listed_then_replaced(*args: Any, **kwargs: Any) -> Any:
        files = listed(*args, **kwargs)
        seaweed.put(f"{key}/sub/part0.jsonl", b'{"text": "other data"}\n')
        return files

    monkeypatch.setattr(plan_module, "discover_remote_inputs", listed_then_replaced)
    with pytest.raises(ResumeMismatchError, match="replaced after this run listed it") as info:
        tokenize(_config(source, tmp_path / "out", tiny_tokenizer, plan_cache_dir=tmp_path / "cache"))
    assert info.value.path == f"{source}/sub/part0.jsonl" and "--output-dir" in info.value.hint
    assert not list((tmp_path / "cache").rglob("part0.jsonl*"))  # no copy of either version staged
