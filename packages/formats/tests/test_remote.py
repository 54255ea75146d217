"""The remote layer against real servers (SeaweedFS S3, a ranged HTTP server, a fault proxy): no mocks."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import open_cached

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.errors import ConfigError, MissingFileError, ResumeMismatchError, StorageError
from tokenloom.formats.io import is_remote_url, parse_url, refuse_remote_output

BLOCK = 4096  # small blocks so that a small dataset spans many


def _write_native(root: Path, *, seed: int = 0, docs: int = 300, shard_size_tokens: int = 20_000) -> Path:
    rng = np.random.default_rng(seed)
    with open_writer(
        root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0, shard_size_tokens=shard_size_tokens
    ) as writer:
        for _ in range(docs):
            doc = rng.integers(1, 50_000, size=int(rng.integers(5, 400)), dtype=np.uint16)
            writer.add(np.append(doc, np.uint16(0)))
    return root


def _entries(ds) -> list[bytes]:
    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


@pytest.fixture
def local_ds(tmp_path: Path) -> Path:
    return _write_native(tmp_path / "local")


def _upload(seaweed, local: Path) -> str:
    return seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")


# -- URLs are never local paths -----------------------------------------------------------------


@pytest.mark.parametrize("url", ["s3://b/ds", "gs://b/ds", "az://c/ds", "https://host/ds", "s3:/b/ds"])
def test_urls_are_recognised(url):
    assert is_remote_url(url) and is_remote_url(Path(url))
    assert parse_url(url).bucket in ("b", "c", "host")


def test_local_paths_are_not_urls(tmp_path):
    for path in [tmp_path / "ds", "ds", "c:/data", "file.bin", "s3bucket/ds"]:
        assert not is_remote_url(path)


def test_remote_output_is_refused_never_a_local_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for target in ["s3://bucket/tok", Path("s3://bucket/tok")]:
        with pytest.raises(ConfigError, match=r"remote output is not supported yet: 's3://bucket/tok'"):
            refuse_remote_output(target)
        with pytest.raises(ConfigError, match="not supported yet"):
            open_writer(target, format="native", dtype="uint16", vocab_size=10, eos_id=0)
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "https:").exists()


def test_convert_to_a_read_only_url_is_refused(local_ds, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tokenloom.formats.cli.group import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["convert", str(local_ds), "https://host/out", "--to", "native"])
    assert result.exit_code != 0
    assert "https:// is read-only" in result.output  # writes to s3/gs/az: test_remote_writes.py
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "https:").exists()


def test_open_dataset_url_is_not_a_local_path(tmp_path, monkeypatch):
    pytest.importorskip("obstore")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "bucket" / "ds").mkdir(parents=True)  # a decoy: a URL must never read it
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: no network
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-never-shown")
    with pytest.raises(StorageError) as caught:
        open_dataset(
            "s3://bucket/ds", remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "cache", retries=0)
        )
    assert "s3://bucket/ds/manifest.json" in str(caught.value)
    assert "s3cr3t-never-shown" not in str(caught.value)


def test_missing_extra_is_the_named_install_error(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["obstore"] = None  # as if the extra were not installed
        from tokenloom.formats import RemoteOptions, open_dataset
        try:
            open_dataset("s3://bucket/ds", remote=RemoteOptions(block_cache_dir=sys.argv[1]))
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert 'pip install "tokenloom-formats[remote]"' in out.stdout


# -- reads from a real S3 server ----------------------------------------------------------------


def test_remote_native_reads_identical_bytes(seaweed, local_ds, tmp_path):
    url = _upload(seaweed, local_ds)
    local = open_dataset(local_ds)
    remote = open_cached(url, seaweed.storage_options(), tmp_path / "c", BLOCK)
    assert len(remote) == len(local) and remote.num_tokens == local.num_tokens
    assert remote.eos_id == 0 and remote.vocab_size == 50_000
    assert _entries(remote) == _entries(local)
    assert np.array_equal(remote.tokens(0, remote.num_tokens), local.tokens(0, local.num_tokens))
    assert remote.fingerprint != local.fingerprint  # ETags are part of it
    blocks = list((tmp_path / "c").rglob("b4096-*"))
    assert blocks and all(p.stat().st_size <= BLOCK for p in blocks)


def test_fingerprint_holds_no_secret_and_no_endpoint(seaweed, local_ds, tmp_path):
    url = _upload(seaweed, local_ds)
    options = seaweed.storage_options()
    ds = open_dataset(url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"))
    shown = f"{ds.fingerprint} {ds.metadata}"
    assert str(options["secret_access_key"]) not in shown and seaweed.endpoint not in shown
    from tokenloom.formats.remote import StoreConfig

    config = StoreConfig(parse_url(url), options)
    assert str(options["secret_access_key"]) not in repr(config)


def test_faults_are_retried_and_reads_stay_identical(seaweed, fault_proxy, local_ds, tmp_path, caplog):
    url = _upload(seaweed, local_ds)
    expected = _entries(open_dataset(local_ds))
    fault_proxy.faults = ["503", "503", "reset", "truncate", "stall", "503", "reset", "truncate"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.remote"):
        ds = open_cached(url, options, tmp_path / "c", BLOCK)
        assert _entries(ds) == expected
    assert not fault_proxy.faults and sum(fault_proxy.injected.values()) == 8
    waits = [r for r in caplog.records if "waiting for" in r.getMessage()]
    assert 2 <= len(waits) < 8  # 503s, resets and short reads were waited out, one line per distinct wait
    assert all(seaweed.env["AWS_SECRET_ACCESS_KEY"] not in r.getMessage() for r in caplog.records)


def test_retries_are_bounded(seaweed, fault_proxy, local_ds, tmp_path):
    url = _upload(seaweed, local_ds)
    fault_proxy.faults = ["503"] * 50
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    from tokenloom.formats.remote import RetryPolicy

    with pytest.raises(StorageError, match=r"failed 3 times while reading bytes") as caught:
        open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=options,
                block_cache_dir=tmp_path / "c",
                retries=RetryPolicy(max_retries=2, backoff=0.01),
            ),
        )
    assert "manifest.json" in str(caught.value)


_READER = textwrap.dedent(
    """
    import sys, json, numpy as np
    from tokenloom.formats import RemoteOptions, open_dataset
    url, cache, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=cache, block_size=4096)
    ds = open_dataset(url, remote=remote)
    print(sum(int(np.asarray(ds[i]).astype(np.int64).sum()) for i in range(len(ds))))
    """
)


def test_one_get_per_block_per_node_with_concurrent_processes(seaweed, fault_proxy, local_ds, tmp_path):
    import json

    url = _upload(seaweed, local_ds)
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    cache = tmp_path / "node-cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, url, str(cache), json.dumps(options)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    sums = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    local = open_dataset(local_ds)
    assert sums == {str(sum(int(local[i].astype(np.int64).sum()) for i in range(len(local))))}
    prefix = parse_url(url).prefix
    for name in sorted(p.name for p in local_ds.glob("*.bin")):
        size = (local_ds / name).stat().st_size
        assert fault_proxy.gets_of(f"{prefix}/{name}") == -(-size // BLOCK), name
    for name in ["manifest.json", *sorted(p.name for p in local_ds.glob("*.idx"))]:
        assert fault_proxy.gets_of(f"{prefix}/{name}") == 1, name


def test_object_changed_under_a_reader_is_resume_mismatch(seaweed, local_ds, tmp_path):
    url = _upload(seaweed, local_ds)
    ds = open_cached(url, seaweed.storage_options(), tmp_path / "c", BLOCK)
    first = np.asarray(ds[0]).copy()
    prefix = parse_url(url).prefix
    shard = ds.shards[-1]
    data = bytearray((local_ds / f"{shard.name}.bin").read_bytes())
    data[-2:] = b"\x01\x00"
    seaweed.put(f"{prefix}/{shard.name}.bin", bytes(data))  # same size, other bytes, new ETag
    with pytest.raises(ResumeMismatchError, match=rf"{shard.name}\.bin changed since it was opened"):
        np.asarray(ds[len(ds) - 1])
    assert np.array_equal(np.asarray(ds[0]), first)  # an already cached block is the opened version
    reopened = open_cached(url, seaweed.storage_options(), tmp_path / "c", BLOCK)
    assert reopened.fingerprint != ds.fingerprint
    assert int(np.asarray(reopened[len(reopened) - 1])[-1]) == 1


def test_missing_object_bucket_and_bad_secret_are_named(seaweed, local_ds, tmp_path):
    url = _upload(seaweed, local_ds)
    options = seaweed.storage_options()
    with pytest.raises(MissingFileError, match=r"nothing at s3://tokenloom-test/nope: no object"):
        open_dataset(
            "s3://tokenloom-test/nope",
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"),
        )
    with pytest.raises(MissingFileError, match=r"the bucket 'no-such-bucket-x' of s3://no-such-bucket-x/ds does not"):
        open_dataset(
            "s3://no-such-bucket-x/ds",
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"),
        )
    bad = seaweed.storage_options(secret_access_key="WRONG-secret-value-123")
    with pytest.raises(StorageError, match="access to .* was refused") as caught:
        open_dataset(
            url, remote=RemoteOptions.from_keywords(storage_options=bad, block_cache_dir=tmp_path / "c", retries=0)
        )
    message = str(caught.value)
    assert "WRONG-secret-value-123" not in message and "AWS_SECRET_ACCESS_KEY" in message


def test_https_style_reads_from_a_range_server(range_server, local_ds, tmp_path):
    served = range_server.root / "ds"
    served.mkdir()
    for path in local_ds.iterdir():
        (served / path.name).write_bytes(path.read_bytes())
    url = f"{range_server.url}/ds"
    ds = open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c", block_size=BLOCK))
    assert _entries(ds) == _entries(open_dataset(local_ds))
    again = open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c", block_size=BLOCK))
    before = sum(range_server.gets.values())
    assert _entries(again) == _entries(ds)
    assert sum(range_server.gets.values()) == before  # the warm cache serves everything


def test_an_https_dataset_heads_its_listed_files_at_once_not_one_by_one(range_server, tmp_path):
    """An http(s) server cannot list: the files the manifest names are HEADed at open, several at a time (one at a
    time, 1,000 shards at 20 ms were 40 s before the first batch)."""
    from tokenloom.testing import FaultProxy

    local = tmp_path / "many"
    with open_writer(local, format="native", dtype="uint16", vocab_size=1 << 16, eos_id=0, shard_size_tokens=64) as w:
        for i in range(12):
            w.add(np.arange(i * 64, (i + 1) * 64, dtype=np.uint16))
    served = range_server.root / "many"
    served.mkdir()
    for path in local.iterdir():
        (served / path.name).write_bytes(path.read_bytes())
    proxy = FaultProxy(range_server.url)
    try:
        proxy.latency_seconds = 0.2
        ds = open_dataset(f"{proxy.url}/many", remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c"))
        assert len(ds.shards) == 12
        assert proxy.max_in_flight >= 4  # 25 listed files (12 pairs and the manifest): one at a time this is 1
        assert _entries(ds) == _entries(open_dataset(local))
    finally:
        proxy.close()


def test_bad_block_size_is_a_config_error(tmp_path):
    pytest.importorskip("obstore")
    with pytest.raises(ConfigError, match="block_size 1000"):
        open_dataset("s3://bucket/ds", remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path, block_size=1000))


def _read_last_in_child(ds, queue) -> None:
    queue.put(np.asarray(ds[len(ds) - 1]).tobytes())


def test_store_is_rebuilt_after_fork_and_the_dataset_pickles(seaweed, local_ds, tmp_path):
    import multiprocessing
    import pickle

    url = _upload(seaweed, local_ds)
    options = seaweed.storage_options()
    ds = open_cached(url, options, tmp_path / "c", BLOCK)
    first = np.asarray(ds[0]).tobytes()  # the parent has a live store and open maps
    expected = np.asarray(open_dataset(local_ds)[len(ds) - 1]).tobytes()
    # a DataLoader forks its workers after the parent read: obstore's runtime would hang in the child
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_last_in_child, args=(ds, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and got == expected
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned worker receives: no maps, no helper
    assert np.asarray(copy[0]).tobytes() == first
