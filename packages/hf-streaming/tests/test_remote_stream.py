"""Streaming from object storage and the Hub against real local servers: SeaweedFS S3, a ranged HTTP server
in the Hub's resolve layout, and a fault-injecting proxy. No mocks, no network."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import pytest
import torch
from test_resume import dataset_kwargs

from tokenloom.formats import (
    ConfigError,
    MissingFileError,
    RemoteOptions,
    ResumeMismatchError,
    StorageError,
    TruncatedError,
)
from tokenloom.hf_streaming import StreamingHuggingFaceDataset

zstandard = pytest.importorskip("zstandard")


def kwargs(files, tokenizer_dir, **extra):
    """test_resume's dataset keywords, packed, without the three given by position here."""
    base = dataset_kwargs(files, tokenizer_dir, **{"pack_sequences": True, **extra})
    for positional in ("dataset_name", "split", "text_field"):
        del base[positional]
    return base


def stream(files, tokenizer_dir, **extra) -> list[dict[str, list[int]]]:
    ds = StreamingHuggingFaceDataset("json", "train", "text", **kwargs(files, tokenizer_dir, **extra))
    return [{k: v.tolist() for k, v in sample.items()} for sample in ds]


def add_zst(corpus: list[str], docs: int = 30) -> list[str]:
    """A .jsonl.zst copy of the first jsonl file, written as two zstd frames."""
    data = Path(corpus[0]).read_bytes()
    half = data.index(b"\n", len(data) // 2) + 1
    path = Path(corpus[0]).with_name("part_zst.jsonl.zst")
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(compressor.compress(data[:half]) + compressor.compress(data[half:]))
    return [*corpus, str(path)]


def upload(seaweed, files: list[str]) -> list[str]:
    prefix = f"corpus-{uuid.uuid4().hex[:8]}"
    for path in files:
        seaweed.put(f"{prefix}/{Path(path).name}", Path(path).read_bytes())
    return [f"s3://{seaweed.bucket}/{prefix}/{Path(p).name}" for p in files]


def test_s3_stream_equals_local_with_faults_injected(seaweed, fault_proxy, corpus, tokenizer_dir, caplog):
    files = add_zst(corpus)
    urls = upload(seaweed, files)
    expected = stream(files, tokenizer_dir)
    fault_proxy.faults = ["503", "503", "reset", "truncate", "503", "reset", "truncate", "stall", "503", "truncate"]
    options = seaweed.storage_options(endpoint=fault_proxy.url)
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats.remote"):
        got = stream(urls, tokenizer_dir, storage_options=options, retries=8)
    assert got == expected
    assert not fault_proxy.faults and sum(fault_proxy.injected.values()) == 10
    retried = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert 2 <= len(retried) < 10  # every 503, reset and short read was waited out, one line per distinct wait
    assert all(seaweed.env["AWS_SECRET_ACCESS_KEY"] not in m for m in retried)


def test_s3_glob_and_prefix_expand_by_listing(seaweed, corpus, tokenizer_dir):
    urls = upload(seaweed, corpus)
    prefix = urls[0].rsplit("/", 1)[0]
    options = seaweed.storage_options()
    expected = stream(corpus, tokenizer_dir)
    assert stream([f"{prefix}/*"], tokenizer_dir, storage_options=options) == expected
    remote = RemoteOptions.from_keywords(storage_options=options)  # one value, as a tokenloom dataset carries it
    assert stream([f"{prefix}/*"], tokenizer_dir, remote=remote) == expected
    # a dataset path that is a prefix: every data file under it, in key order
    ds = StreamingHuggingFaceDataset(prefix, "train", "text", **kwargs(None, tokenizer_dir, storage_options=options))
    assert [s.path for s in ds._sources] == urls
    only_jsonl = StreamingHuggingFaceDataset(
        "json", "train", "text", **kwargs([f"{prefix}/part?.jsonl"], tokenizer_dir, storage_options=options)
    )
    assert [s.path for s in only_jsonl._sources] == urls[:3]
    with pytest.raises(MissingFileError, match=r"matches no object"):
        stream([f"{prefix}/*.nothing"], tokenizer_dir, storage_options=options)


def _serve_hub(range_server, files: list[str], revision: str = "main") -> list[str]:
    root = range_server.root / "datasets" / "org" / "corpus" / "resolve" / revision / "data"
    root.mkdir(parents=True)
    for path in files:
        shutil.copy(path, root / Path(path).name)
    suffix = "" if revision == "main" else f"@{revision}"
    return [f"hf://datasets/org/corpus{suffix}/data/{Path(p).name}" for p in files]


def test_hf_urls_read_the_hub_layout(range_server, corpus, tokenizer_dir, monkeypatch):
    files = add_zst(corpus)
    urls = _serve_hub(range_server, files, revision="v1.0")
    monkeypatch.setenv("HF_ENDPOINT", range_server.url)
    assert stream(urls, tokenizer_dir) == stream(files, tokenizer_dir)
    assert any("/datasets/org/corpus/resolve/v1.0/data/part_pq.parquet" in p for p in range_server.gets)
    with pytest.raises(ConfigError, match="cannot be listed"):
        stream(["hf://datasets/org/corpus@v1.0/data/*.jsonl"], tokenizer_dir)
    with pytest.raises(MissingFileError, match=r"resolve/v1.0/data/nope.jsonl does not exist"):
        stream(["hf://datasets/org/corpus@v1.0/data/nope.jsonl"], tokenizer_dir)
    with pytest.raises(ConfigError, match="not a Hub dataset file URL"):
        stream(["hf://models/org/x"], tokenizer_dir)


def _big_jsonl(path: Path, docs: int) -> Path:
    import random

    from conftest import make_text

    rng = random.Random(3)
    with open(path, "w") as f:
        for i in range(docs):
            f.write(json.dumps({"text": make_text(rng, i)}) + "\n")
    return path


def _gets_to_resume(ds_kwargs, tokenizer_dir, fraction: float, counter, name: str) -> tuple[int, list, list]:
    """GETs of ``name`` to resume at ``fraction`` of the pass, and the resumed vs uninterrupted samples."""
    full = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    samples = list(full)
    cut = int(len(samples) * fraction)
    first = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    iterator = iter(first)
    for _ in range(cut):
        next(iterator)
    state = first.state_dict()
    del iterator
    before = counter(name)
    resumed = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    iterator = iter(resumed)
    head = next(iterator)
    gets = counter(name) - before
    rest = [head, *iterator]
    return gets, [s["input_ids"].tolist() for s in rest], [s["input_ids"].tolist() for s in samples[cut:]]


def test_resume_is_a_ranged_read_at_the_offset_not_a_replay(range_server, tmp_path, tokenizer_dir, monkeypatch):
    from tokenloom.hf_streaming import _blocks

    monkeypatch.setattr(_blocks, "READ_BYTES", 4096)  # many GETs per unit, so a replay would show
    local = _big_jsonl(tmp_path / "big.jsonl", 3000)
    shutil.copy(local, range_server.root / "big.jsonl")
    url = f"{range_server.url}/big.jsonl"
    ds_kwargs = kwargs([url], tokenizer_dir, shuffle_buffer_size=64, unit_bytes=1 << 30, prefetch_blocks=0)
    total = local.stat().st_size // 4096

    def count(name: str) -> int:
        return sum(n for p, n in range_server.gets.items() if name in p)

    late, resumed, expected = _gets_to_resume(ds_kwargs, tokenizer_dir, 0.9, count, "big.jsonl")
    assert resumed == expected
    early, resumed, expected = _gets_to_resume(ds_kwargs, tokenizer_dir, 0.1, count, "big.jsonl")
    assert resumed == expected
    assert total > 60
    assert late <= 6 and early <= 6  # one block's bytes from the saved offset, wherever it is


def test_parquet_row_groups_are_read_by_range(range_server, tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import make_text

    path = range_server.root / "groups.parquet"
    rng = __import__("random").Random(5)
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        for g in range(12):
            writer.write_table(pa.table({"text": [make_text(rng, g * 200 + i) for i in range(200)]}))
    url = f"{range_server.url}/groups.parquet"
    ds_kwargs = kwargs([url], tokenizer_dir, shuffle_buffer_size=16, prefetch_blocks=0)

    def count(name: str) -> int:
        return sum(n for p, n in range_server.gets.items() if name in p)

    gets, resumed, expected = _gets_to_resume(ds_kwargs, tokenizer_dir, 0.9, count, "groups.parquet")
    assert resumed == expected
    full_pass = count("groups.parquet")
    assert gets <= 4 < full_pass  # the footer, then the row group's column chunk: never the groups before it
    assert stream([url], tokenizer_dir) == stream([str(path)], tokenizer_dir)


def test_changed_object_is_a_resume_mismatch_naming_the_url(seaweed, corpus, tokenizer_dir):
    urls = upload(seaweed, corpus[:2])
    options = seaweed.storage_options()
    ds_kwargs = kwargs(urls, tokenizer_dir, storage_options=options, prefetch_blocks=0)
    ds = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    iterator = iter(ds)
    next(iterator)  # the first unit is fetched (one GET), the second not yet
    state = json.loads(json.dumps(ds.state_dict()))
    assert [o[1] for o in state["objects"]] == urls and all(o[2] for o in state["objects"])
    assert seaweed.storage_options()["secret_access_key"] not in json.dumps(state)
    for url, path in zip(urls, corpus, strict=False):
        key = url.split(f"{seaweed.bucket}/", 1)[1]
        seaweed.put(key, Path(path).read_bytes() + b'{"text": "appended"}\n')
    # under a running reader: the next ranged GET carries If-Match and gets 412
    with pytest.raises(ResumeMismatchError, match=rf"({urls[0]}|{urls[1]}) changed since it was opened"):
        list(iterator)
    # a saved state whose object changed since
    again = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    with pytest.raises(ResumeMismatchError, match=rf"{urls[0]} changed since the state was saved"):
        again.load_state_dict(state)


def test_permanent_errors_are_named(seaweed, corpus, tokenizer_dir):
    urls = upload(seaweed, corpus[:1])
    with pytest.raises(MissingFileError, match=r"s3://tokenloom-test/no-such/part0.jsonl does not exist"):
        stream(["s3://tokenloom-test/no-such/part0.jsonl"], tokenizer_dir, storage_options=seaweed.storage_options())
    bad = seaweed.storage_options(secret_access_key="WRONG-secret-value-123")
    with pytest.raises(StorageError, match="access to .* was refused") as caught:
        stream(urls, tokenizer_dir, storage_options=bad, retries=0)
    assert "WRONG-secret-value-123" not in str(caught.value)


def test_retries_are_bounded(seaweed, fault_proxy, corpus, tokenizer_dir):
    urls = upload(seaweed, corpus[:1])
    fault_proxy.faults = ["503"] * 40
    from tokenloom.formats.remote import RetryPolicy

    with pytest.raises(StorageError, match=r"part0.jsonl failed 3 times"):
        stream(
            urls,
            tokenizer_dir,
            storage_options=seaweed.storage_options(endpoint=fault_proxy.url),
            retries=RetryPolicy(max_retries=2, backoff=0.01),
        )


def test_local_zst_reads_like_the_jsonl_and_a_cut_one_is_named(corpus, tokenizer_dir, tmp_path):
    files = add_zst(corpus)
    plain = stream([corpus[0]], tokenizer_dir, with_provenance=False)
    assert stream([files[-1]], tokenizer_dir, with_provenance=False) == plain
    cut = tmp_path / "cut.jsonl.zst"
    data = Path(files[-1]).read_bytes()
    cut.write_bytes(data[: len(data) - 7])
    with pytest.raises(TruncatedError, match="ends inside a zstd frame"):
        stream([str(cut)], tokenizer_dir)


def test_zst_resume_reads_the_unit_from_its_start(corpus, tokenizer_dir):
    files = add_zst(corpus)
    ds_kwargs = kwargs([files[-1]], tokenizer_dir)
    full = [s["input_ids"].tolist() for s in StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)]
    first = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    iterator = iter(first)
    for _ in range(len(full) // 2):
        next(iterator)
    resumed = StreamingHuggingFaceDataset("json", "train", "text", **ds_kwargs)
    resumed.load_state_dict(first.state_dict())
    assert [s["input_ids"].tolist() for s in resumed] == full[len(full) // 2 :]


def test_read_ahead_does_not_change_the_stream_or_the_state(corpus, tokenizer_dir):
    files = add_zst(corpus)
    plain = StreamingHuggingFaceDataset("json", "train", "text", **kwargs(files, tokenizer_dir, prefetch_blocks=0))
    ahead = StreamingHuggingFaceDataset("json", "train", "text", **kwargs(files, tokenizer_dir, prefetch_blocks=3))
    a, b = iter(plain), iter(ahead)
    for _ in range(7):
        assert torch.equal(next(a)["input_ids"], next(b)["input_ids"])
    assert plain.state_dict() == ahead.state_dict()
    assert [s["input_ids"].tolist() for s in a] == [s["input_ids"].tolist() for s in b]


def test_hand_over_files_of_dead_processes_are_swept(range_server, corpus, tokenizer_dir):
    import subprocess
    import sys

    from tokenloom.hf_streaming import _remote

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = Path(_remote._SCRATCH) / f"{_remote._PREFIX}{int(dead.stdout)}-abc"
    leftover.write_bytes(b"x" * 4096)  # what a SIGKILL between the helper's write and the read leaves
    mine = Path(_remote._SCRATCH) / f"{_remote._PREFIX}{os.getpid()}-live"
    mine.write_bytes(b"y")
    _remote._SWEPT.discard(os.getpid())
    shutil.copy(corpus[0], range_server.root / "a.jsonl")
    try:
        assert stream([f"{range_server.url}/a.jsonl"], tokenizer_dir) == stream([corpus[0]], tokenizer_dir)
        assert not leftover.exists() and mine.exists()  # a live process's file is never touched
    finally:
        mine.unlink()


def _read_ahead_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "tokenloom-read-ahead" and t.is_alive()]


def _waiting_encoder(gets, seen: list[int], wait: float):
    """An encoder factory that waits (inside iter()) until the server has answered a GET, and records how many."""
    import time

    from tokenloom.hf_streaming import hf_encoder

    def factory(spec):
        deadline = time.monotonic() + wait
        while not gets and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(sum(gets.values()))
        return hf_encoder(spec)

    return factory


def test_first_reads_start_while_the_tokenizer_loads(range_server, corpus, tokenizer_dir):
    """With read-ahead, iter() starts the slot's first GETs before it loads the encoder (fastokens: ~0.3 s), so
    the first block's network wait overlaps the load instead of following it; the stream is the same."""
    shutil.copy(corpus[0], range_server.root / "a.jsonl")
    url = f"{range_server.url}/a.jsonl"
    expected = stream([corpus[0]], tokenizer_dir)
    seen: list[int] = []
    assert stream([url], tokenizer_dir, encoder=_waiting_encoder(range_server.gets, seen, 30)) == expected
    assert seen[0] >= 1
    range_server.gets.clear()
    seen.clear()  # without read-ahead no data is read before the first next(): only the kind's sniff (first and
    # last bytes, two ranged GETs)
    got = stream([url], tokenizer_dir, prefetch_blocks=0, encoder=_waiting_encoder(range_server.gets, seen, 0.3))
    assert got == expected
    assert seen == [2]


def test_read_ahead_of_an_unused_iterator_stops(corpus, tokenizer_dir):
    """Readers start in iter(): an iterator dropped before its first sample, or an encoder that fails to load,
    stops them (no thread keeps polling)."""
    import gc
    import time

    def settled(count: int) -> bool:
        deadline = time.monotonic() + 10
        while len(_read_ahead_threads()) > count and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(_read_ahead_threads()) == count

    before = len(_read_ahead_threads())
    ds = StreamingHuggingFaceDataset("json", "train", "text", **kwargs(corpus, tokenizer_dir, prefetch_blocks=1))
    iterator = iter(ds)
    assert len(_read_ahead_threads()) > before  # the first unit and the next one are being read
    del iterator
    gc.collect()
    assert settled(before)

    def broken(spec):
        raise RuntimeError("no tokenizer today")

    failing = StreamingHuggingFaceDataset(
        "json", "train", "text", **kwargs(corpus, tokenizer_dir, prefetch_blocks=1, encoder=broken)
    )
    with pytest.raises(RuntimeError, match="no tokenizer today"):
        iter(failing)
    assert settled(before)


def test_read_ahead_started_in_iter_stops_when_a_later_reader_fails_to_start(corpus, tokenizer_dir, monkeypatch):
    """iter() starts the first unit's reader, then the next one's: when the second cannot start (no thread left),
    the first one's thread must not keep polling for a consumer that never comes."""
    import time

    from tokenloom.hf_streaming import _feed

    real = _feed._reader
    calls = []

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("can't start new thread")
        return real(*args, **kwargs)

    before = len(_read_ahead_threads())
    monkeypatch.setattr(_feed, "_reader", second_fails)
    ds = StreamingHuggingFaceDataset("json", "train", "text", **kwargs(corpus, tokenizer_dir, prefetch_blocks=1))
    with pytest.raises(RuntimeError, match="can't start new thread"):
        iter(ds)
    deadline = time.monotonic() + 5
    while len(_read_ahead_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_read_ahead_threads()) == before
