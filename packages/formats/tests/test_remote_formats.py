"""Every format read from a real S3 server (SeaweedFS) and a ranged HTTP server: identical bytes, integrity, faults."""

from __future__ import annotations

import logging
import pickle
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from formats_helpers import cached_remote, open_cached

from tokenloom.formats import MissingFileError, RemoteOptions, open_dataset, open_writer
from tokenloom.formats._registry import detect_format
from tokenloom.formats.errors import ChecksumError, ConfigError, DataError, ResumeMismatchError

BLOCK = 4096  # small blocks so that a small dataset spans many


def _docs(seed: int = 0, count: int = 120) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        doc = rng.integers(1, 999, size=int(rng.integers(3, 300)), dtype=np.int64)
        docs.append(np.append(doc, 0))
    return docs


def _write(root: Path, fmt: str, seed: int = 0, **options: object) -> None:
    with open_writer(root, format=fmt, dtype="uint16", vocab_size=1000, eos_id=0, **options) as writer:
        for doc in _docs(seed):
            writer.add(doc)


def native(root: Path, seed: int = 0) -> str:
    _write(root, "native", seed, shard_size_tokens=4000)
    return ""


def native_without_manifest(root: Path, seed: int = 0) -> str:
    native(root, seed)
    (root / "manifest.json").unlink()  # GPT-Simple's own shards: detected from the .idx magic
    return ""


def flat(root: Path, seed: int = 0) -> str:
    _write(root, "flat", seed)
    return ""


def flat_tatm(root: Path, seed: int = 0) -> str:
    root.mkdir(parents=True)
    tokens = np.concatenate(_docs(seed)).astype(np.uint32)
    for i, part in enumerate(np.array_split(tokens, 3)):
        part.tofile(root / f"tokenized_{i:03d}.bin")
    (root / "metadata.yaml").write_text(
        "name: demo\ntokenized_info:\n  file_prefix: tokenized\n  file_extension: bin\n  dtype: uint32\n"
        "  vocab_size: 1000\n"
    )
    return ""


def _parts(root: Path, seed: int, fmt: str, *names: str) -> None:
    """A folder of one dataset of ``fmt`` per name, of seeds seed, seed + 1, ..."""
    root.mkdir(parents=True)
    for i, name in enumerate(names):
        _write(root / name, fmt, seed + i)


def megatron(root: Path, seed: int = 0) -> str:
    _parts(root, seed, "megatron", "part_a", "part_b")
    return ""


def megatron_prefix(root: Path, seed: int = 0) -> str:
    # a neighbour sharing the name's start
    _parts(root, seed, "megatron", "corpus_text_document", "corpus_text_document2")
    return "corpus_text_document"


def packed(root: Path, seed: int = 0) -> str:
    _parts(root, seed, "packed", "a.pbin", "b.pbin")
    return ""


def packed_file(root: Path, seed: int = 0) -> str:
    _parts(root, seed, "packed", "train.pbin")
    return "train.pbin"


def h5(root: Path, seed: int = 0) -> str:
    pytest.importorskip("h5py")
    root.mkdir(parents=True)
    _write(root / "train.h5", "h5", seed)
    return ""


def bin_meta(root: Path, seed: int = 0) -> str:
    _write(root, "bin-meta", seed)
    return ""


LAYOUTS: dict[str, Callable[..., str]] = {
    "native": native,
    "flat": flat,
    "flat-tatm": flat_tatm,
    "megatron": megatron,
    "megatron-prefix": megatron_prefix,
    "packed": packed,
    "packed-file": packed_file,
    "h5": h5,
    "bin-meta": bin_meta,
}


def _entries(ds) -> list[bytes]:
    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


def _upload(seaweed, local: Path) -> str:
    return seaweed.upload_dir(local, f"fmt-{uuid.uuid4().hex[:8]}")


def _setup(seaweed, tmp_path: Path, layout: str) -> tuple[Path, str]:
    local = tmp_path / "local"
    name = LAYOUTS[layout](local)
    url = _upload(seaweed, local)
    return (local / name if name else local), (f"{url}/{name}" if name else url)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_format_reads_identical_bytes_from_s3(seaweed, tmp_path, layout):
    local_path, url = _setup(seaweed, tmp_path, layout)
    local = open_dataset(local_path)
    options = seaweed.storage_options()
    assert detect_format(local_path) == local.format
    remote = open_cached(url, options, tmp_path / "c", BLOCK)
    assert remote.format == local.format
    assert str(remote.root) == url
    assert len(remote) == len(local) and remote.num_tokens == local.num_tokens
    assert (remote.eos_id, remote.vocab_size, remote.dtype) == (local.eos_id, local.vocab_size, local.dtype)
    assert _entries(remote) == _entries(local)
    assert np.array_equal(remote.tokens(0, remote.num_tokens), local.tokens(0, local.num_tokens))
    assert remote.fingerprint and remote.fingerprint != local.fingerprint  # every object's size and ETag count
    reopened = open_cached(url, options, tmp_path / "c2", BLOCK)
    assert reopened.fingerprint == remote.fingerprint  # a pure function of the objects, not of the cache
    # token data was read by blocks into the cache, never fetched whole
    blocks = list((tmp_path / "c").rglob(f"b{BLOCK}-*"))
    assert blocks and all(p.stat().st_size <= BLOCK for p in blocks)


@pytest.mark.parametrize("layout", ["flat", "megatron", "packed", "h5", "bin-meta"])
def test_deep_validation_on_a_url_reads_every_block(seaweed, tmp_path, layout):
    local_path, url = _setup(seaweed, tmp_path, layout)
    stages: dict[str, int] = {}
    reader: dict[str, Any] = {"vocab_size": 1000} if layout in ("h5", "bin-meta") else {}  # a keyed store records none
    ds = open_dataset(
        url,
        remote=cached_remote(seaweed.storage_options(), tmp_path / "c", BLOCK),
        validate="deep",
        on_progress=lambda stage, done, total: stages.__setitem__(stage, done),
        **reader,
    )
    assert _entries(ds) == _entries(open_dataset(local_path, **reader))
    assert stages.get("token ids") == ds.num_tokens
    if layout == "flat":
        assert stages["checksums"] > 0  # the manifest's per-file checksums, over every block


def test_native_deep_validation_checks_every_object_against_the_manifest(seaweed, tmp_path):
    local_path, url = _setup(seaweed, tmp_path, "native")
    stages: dict[str, int] = {}
    ds = open_dataset(
        url,
        remote=cached_remote(seaweed.storage_options(), tmp_path / "c", BLOCK),
        validate="deep",
        on_progress=lambda stage, done, total: stages.__setitem__(stage, done),
    )
    total = sum(p.stat().st_size for p in local_path.iterdir() if p.name != "manifest.json")
    assert stages["checksums"] == total and stages["token ids"] == ds.num_tokens
    # a byte flipped in a .bin keeps its size: only deep validation can see it
    damaged = tmp_path / "damaged"
    shutil.copytree(local_path, damaged)
    data = bytearray((damaged / "shard_00000.bin").read_bytes())
    data[100] ^= 0xFF
    (damaged / "shard_00000.bin").write_bytes(bytes(data))
    bad_url = _upload(seaweed, damaged)
    open_dataset(
        bad_url,
        remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c"),
    )  # fast: opens
    # (its blocks fit the default 8 MiB cache block: the block hashes catch it as it is fetched)
    with pytest.raises(ChecksumError, match=r"never matched the manifest") as caught:
        open_dataset(
            bad_url,
            remote=RemoteOptions.from_keywords(
                storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "c"
            ),
            validate="deep",
        )
    assert bad_url in str(caught.value)


@pytest.mark.parametrize("layout", ["native", "flat", "megatron", "packed", "h5", "bin-meta"])
def test_a_changed_object_is_a_resume_mismatch_naming_it(seaweed, tmp_path, layout):
    local_path, url = _setup(seaweed, tmp_path, layout)
    options = seaweed.storage_options()
    ds = open_cached(url, options, tmp_path / "c", BLOCK)
    first = ds.fingerprint
    data_name = sorted(p.name for p in local_path.iterdir() if p.suffix in (".bin", ".npy", ".pbin", ".h5"))[0]
    key = url.split(f"s3://{seaweed.bucket}/", 1)[1] + "/" + data_name
    time.sleep(1.1)  # a new Last-Modified as well as new bytes: every server gives a new ETag
    seaweed.put(key, (local_path / data_name).read_bytes()[::-1])  # same size, other bytes
    # the open dataset pinned every ETag: a worker on a node with a cold cache (a pickled copy, the cache
    # wiped) sends If-Match with each GET, and the server refuses the new bytes
    clone = pickle.loads(pickle.dumps(ds))
    shutil.rmtree(tmp_path / "c")
    with pytest.raises(ResumeMismatchError) as caught:
        _entries(clone)
    assert data_name in str(caught.value)
    try:
        again = open_cached(url, options, tmp_path / "c", BLOCK)
    except DataError:
        return  # a reader whose fast checks see the change refuses at open: never other data silently
    assert again.fingerprint != first  # a saved state of the first open does not load on this one


@pytest.mark.parametrize("layout", ["native", "flat", "packed", "h5", "bin-meta", "megatron"])
def test_faults_are_retried_and_every_format_reads_identical_bytes(seaweed, fault_proxy, tmp_path, layout, caplog):
    local_path, url = _setup(seaweed, tmp_path, layout)
    expected = _entries(open_dataset(local_path))
    fault_proxy.faults = ["503", "truncate", "reset", "503", "truncate", "stall", "503", "truncate"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.remote"):
        ds = open_dataset(
            url,
            remote=RemoteOptions.from_keywords(
                storage_options=options, block_cache_dir=tmp_path / "c", block_size=BLOCK, retries=10
            ),
        )
        assert _entries(ds) == expected
    assert not fault_proxy.faults
    waits = [r for r in caplog.records if "waiting for" in r.getMessage()]
    assert 2 <= len(waits) < 8  # one line per distinct wait (endpoint, reason), not one per retry


@pytest.mark.parametrize("layout", ["flat", "packed-file", "h5"])
def test_https_reads_formats_with_a_manifest_or_a_named_file(range_server, tmp_path, layout):
    root: Path = range_server.root  # type: ignore[attr-defined]
    name = LAYOUTS[layout](root / "ds") or ("train.h5" if layout == "h5" else "")
    local_path = root / "ds" / name if name else root / "ds"
    url = f"{range_server.url}/ds/{name}" if name else f"{range_server.url}/ds"
    ds = open_dataset(url, remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c", block_size=BLOCK))
    assert _entries(ds) == _entries(open_dataset(local_path))


def test_https_without_a_manifest_cannot_list(range_server, tmp_path):
    root: Path = range_server.root  # type: ignore[attr-defined]
    megatron(root / "ds")
    with pytest.raises(DataError, match="cannot list"):
        open_dataset(
            f"{range_server.url}/ds", remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c", retries=0)
        )


def test_a_key_leaving_the_prefix_is_refused(seaweed, tmp_path):
    prefix = f"evil-{uuid.uuid4().hex[:8]}"
    seaweed.put(f"{prefix}/a.pbin", b"x" * 16)
    from tokenloom.formats.remote.client import ObjectInfo
    from tokenloom.formats.remote.source import relative_name

    with pytest.raises(DataError, match="does not name a file inside"):
        relative_name(ObjectInfo(url="s3://b/p/../x", key="p/../x", size=1, etag=""), "p")
    assert relative_name(ObjectInfo(url="s3://b/p/d/x", key="p/d/x", size=1, etag=""), "p") == "d/x"


def test_reader_options_reach_the_reader_and_wrong_ones_are_named(seaweed, tmp_path):
    local_path, url = _setup(seaweed, tmp_path, "flat")
    options = seaweed.storage_options()
    ds = open_dataset(
        url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"), split="eos"
    )
    assert _entries(ds) == _entries(open_dataset(local_path, split="eos"))
    with pytest.raises(ConfigError, match="do not apply to format 'flat'"):
        open_dataset(
            url,
            remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"),
            layout="current",
        )


@pytest.mark.slow
def test_thousands_of_shards_open_with_the_manifest_alone(seaweed, fault_proxy, tmp_path):
    """Opening fetches only the manifest (and lists); the first sample fetches one .idx and one block.

    3,000 shards (6,000 objects: several listing pages of 1,000 keys) show that no GET grows with the
    shard count; the time of a first batch on 10,000 shards is measured by tools/bench/bench_remote_peers.py.
    """
    shards = 3_000
    local = tmp_path / "many"
    with open_writer(local, format="native", dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=1) as w:
        tokens = np.arange(1, shards + 1, dtype=np.int64) % 999 + 1
        for i in range(shards):
            w.add(np.array([tokens[i], 0], dtype=np.int64))
    assert len(list(local.glob("*.idx"))) == shards
    url = _upload_parallel(seaweed, local)
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    started = time.perf_counter()
    ds = open_dataset(url, remote=RemoteOptions.from_keywords(storage_options=options, block_cache_dir=tmp_path / "c"))
    opened = time.perf_counter() - started
    first = np.asarray(ds[0]).tolist()
    first_sample = time.perf_counter() - started
    assert first == [2, 0] and len(ds) == shards
    object_gets = {path: n for path, n in fault_proxy.gets.items() if path.count("/") > 1}
    assert sum(n for p, n in object_gets.items() if p.endswith(".idx")) == 1
    assert sum(n for p, n in object_gets.items() if p.endswith(".bin")) == 1
    assert sum(n for p, n in object_gets.items() if p.endswith("manifest.json")) == 1
    assert sum(object_gets.values()) == 3
    np.asarray(ds[shards - 1])
    assert sum(n for p, n in fault_proxy.gets.items() if p.endswith(".idx")) == 2
    print(f"\n{shards:,} shards: open {opened:.2f}s, first sample {first_sample:.2f}s")


def _upload_parallel(seaweed, local: Path) -> str:
    """Upload many small files with a few threads (the plain upload_dir makes one request at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from obstore.store import S3Store

    prefix = f"many-{uuid.uuid4().hex[:8]}"
    store = S3Store(seaweed.bucket, **seaweed.storage_options())  # pyright: ignore[reportArgumentType]
    files = sorted(p for p in local.iterdir() if p.is_file())
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: obstore.put(store, f"{prefix}/{p.name}", p.read_bytes()), files))
    return f"s3://{seaweed.bucket}/{prefix}"


# -- the command line ------------------------------------------------------------------------------


def _cli(args: list[str], env: dict[str, str] | None = None):
    from click.testing import CliRunner

    from tokenloom.formats.cli.group import main

    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def test_cli_validate_and_inspect_a_url_with_credentials_from_the_environment(seaweed, tmp_path):
    from tokenloom.testing.servers import S3_SECRET

    local_path, url = _setup(seaweed, tmp_path, "megatron")
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    result = _cli(["validate", url, "--block-cache-dir", str(tmp_path / "c")], env=env)
    assert result.exit_code == 0, result.output
    assert f"path       {url}" in result.output and "problems   none (fast validation)" in result.output
    result = _cli(["inspect", url, "--json", "--block-cache-dir", str(tmp_path / "c")], env=env)
    assert result.exit_code == 0, result.output
    facts = orjson.loads(result.output)
    assert facts["path"] == url and facts["entries"] == len(open_dataset(local_path))
    assert S3_SECRET not in result.output


def test_cli_deep_validate_with_storage_options_never_prints_them(seaweed, tmp_path):
    from tokenloom.testing.servers import S3_ACCESS_KEY, S3_SECRET

    _, url = _setup(seaweed, tmp_path, "native")
    options = [
        f"endpoint={seaweed.endpoint}",
        f"access_key_id={S3_ACCESS_KEY}",
        f"secret_access_key={S3_SECRET}",
        "region=us-east-1",
        "allow_http=true",
    ]
    args = ["validate", url, "--deep", "--block-cache-dir", str(tmp_path / "c")]
    for option in options:
        args += ["--storage-option", option]
    result = _cli(args)
    assert result.exit_code == 0, result.output
    assert "problems   none (deep validation)" in result.output
    assert "token range: every id < 1,000" in result.output
    assert S3_SECRET not in result.output
    wrong = [a.replace(S3_SECRET, "not-the-SECRET-0000") for a in args]
    result = _cli([*wrong[:4], str(tmp_path / "c2"), *wrong[5:]])
    assert result.exit_code == 1 and "not-the-SECRET-0000" not in result.output
    assert "refused" in result.output or "StorageError" in result.output


def test_cli_convert_reads_a_url_and_refuses_an_https_target(seaweed, tmp_path, monkeypatch):
    local_path, url = _setup(seaweed, tmp_path, "packed")
    monkeypatch.chdir(tmp_path)
    env = {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    target = tmp_path / "out" / "train"
    (tmp_path / "out").mkdir()
    result = _cli(["convert", url, str(target), "--to", "megatron", "--no-progress"], env=env)
    assert result.exit_code == 0, result.output
    assert _entries(open_dataset(target)) == _entries(open_dataset(local_path))
    result = _cli(["convert", url, "https://127.0.0.1:9/out", "--to", "native"], env=env)
    assert result.exit_code != 0 and "ConfigError" in result.output and "https:// is read-only" in result.output
    assert not (tmp_path / "https:").exists()


def test_cli_remote_options_on_a_local_path_or_malformed_are_named(tmp_path):
    native(tmp_path / "ds")
    result = _cli(["inspect", str(tmp_path / "ds"), "--storage-option", "region=x"])
    assert result.exit_code != 0 and "applies to s3://" in result.output
    result = _cli(["validate", "s3://bucket/ds", "--storage-option", "no-equals-sign"])
    assert result.exit_code == 1 and "is not KEY=VALUE" in result.output
    result = _cli(["validate", "s3://bucket/ds", "--write-manifest"])
    assert result.exit_code == 1 and "not supported yet" in result.output


def test_a_shard_copied_without_its_source_reads_the_same_bytes(seaweed, tmp_path):
    """A remote shard's tokens_path is a RemotePath that serves its own blocks: code that rebuilds a Shard without
    source= reads the object's bytes (there is no local placeholder of holes to read zeros from)."""
    from tokenloom.formats import Shard

    _, url = _setup(seaweed, tmp_path, "flat")
    ds = open_cached(url, seaweed.storage_options(), tmp_path / "c", BLOCK)
    shard = ds.shards[0]
    fields = {"tokens_path": shard.tokens_path, "dtype": shard.dtype, "num_tokens": shard.num_tokens}
    fields |= {"offsets": shard.offsets, "overlap_prefix": shard.overlap_prefix, "tokens_offset": shard.tokens_offset}
    assert np.array_equal(np.asarray(Shard(**fields).tokens[:10]), np.asarray(shard.tokens[:10]))
    assert np.array_equal(np.asarray(Shard(**fields, source=shard.source).tokens[:10]), np.asarray(shard.tokens[:10]))


def test_native_shards_without_their_manifest_are_not_a_dataset_yet(seaweed, tmp_path):
    """In object storage the manifest is the commit marker (uploaded last): shards alone are never read as whole."""
    local = tmp_path / "local"
    native_without_manifest(local)
    url = _upload(seaweed, local)
    with pytest.raises(MissingFileError, match="no native dataset at .*still being uploaded"):
        open_cached(url, seaweed.storage_options(), tmp_path / "c", BLOCK)
