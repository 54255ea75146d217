"""Opening is O(1) in memory for every format: index arrays are mapped, checked in bounded chunks, derived once.

Each dataset below has 10^7 entries (a .pbin 10^5: its pickled index is parsed once), built sparsely
(every entry empty but the last, the data a hole). A fresh process opens it and reads its first and
last entries; RSS growth and peak are read from /proc/self/status. The index cache lives in tmp_path.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import IndexCorruptError, open_dataset
from tokenloom.formats.flat.npy import NPY_HEADER_SIZE, npy_header
from tokenloom.formats.io import index_map
from tokenloom.formats.io.manifest import Manifest, describe_files, write_manifest
from tokenloom.formats.native.layout import HEADER, idx_size, pack_header
from tokenloom.formats.packed.pickle_safe import dump_int_tuples

N = 10**7
TOKENS = 4096
LIMIT = 50 << 20


def _sparse(path: Path, size: int, writes: list[tuple[int, bytes]]) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)
        for offset, data in writes:
            handle.seek(offset)
            handle.write(data)


def _i64(value: int) -> bytes:
    return np.array([value], dtype="<i8").tobytes()


def native(root: Path, n: int = N, *, manifest: bool = False) -> Path:
    root.mkdir()
    header = pack_header(np.dtype("uint16"), n)
    _sparse(root / "shard.idx", idx_size(n), [(0, header), (HEADER.size + 8 * n, _i64(TOKENS))])
    _sparse(root / "shard.bin", 2 * TOKENS, [])
    if manifest:
        files = describe_files(root, [("shard.idx", "index"), ("shard.bin", "data")])
        write_manifest(root, Manifest("native", "uint16", TOKENS, n, files))
    return root


def megatron(root: Path, n: int = N) -> Path:
    root.mkdir()
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 8, n, 2)
    last_size = (len(header) + 4 * (n - 1), np.array([TOKENS], "<i4").tobytes())
    _sparse(root / "data.idx", len(header) + 12 * n + 16, [(0, header), last_size, (len(header) + 12 * n + 8, _i64(n))])
    _sparse(root / "data.bin", 2 * TOKENS, [])
    return root


def flat_lengths(root: Path, n: int = N) -> Path:
    root.mkdir()
    _sparse(root / "shard.npy", NPY_HEADER_SIZE + 2 * TOKENS, [(0, npy_header(np.dtype("uint16"), TOKENS))])
    _sparse(root / "document_lengths.i64", 8 * n, [(8 * (n - 1), _i64(TOKENS))])
    files = describe_files(root, [("shard.npy", "data"), ("document_lengths.i64", "index")])
    flat = {"document_boundaries": "lengths", "file_pattern": "*.npy", "shard_entries": [n]}
    write_manifest(root, Manifest("flat", "uint16", TOKENS, n, files, metadata={"flat": flat}))
    return root


def packed(root: Path, n: int = 10**5) -> Path:
    root.mkdir()
    index = dump_int_tuples([(0, 0)] * (n - 1) + [(0, 2 * TOKENS)])
    path = root / "data.pbin"
    _sparse(path, 12 + 2 * TOKENS + len(index), [(0, struct.pack("<QI", 2 * TOKENS, 2)), (12 + 2 * TOKENS, index)])
    return path


def bin_store(root: Path, n: int = N) -> Path:
    root.mkdir()
    (root / "meta.json").write_text(json.dumps({"sequence": {"shape": [n], "dtype": "int32"}}))
    _sparse(root / "sequence.bin", 4 * n, [])
    return root


_CHILD = r"""
import json, sys
import numpy as np
from tokenloom.formats import open_dataset, open_store
from tokenloom.formats.io import index_map

index_map._SETTLE_NS = 0  # files made a moment ago may be cached here (the test changes none of them)

def status():
    with open("/proc/self/status") as handle:
        return {k: int(v.split()[0]) << 10 for k, _, v in (line.partition(":") for line in handle)
                if k in ("VmRSS", "VmHWM")}

def first_and_last(path, store):
    if store:
        opened = open_store(path)
        opened.fetch(0, 1, opened.keys[0])
        return opened
    opened = open_dataset(path)
    int(np.asarray(opened[0][:8]).sum()) + int(np.asarray(opened[len(opened) - 1][:8]).sum())
    return opened

path, small, store = sys.argv[1], sys.argv[2], sys.argv[3] == "store"
first_and_last(small, store)  # imports warm
results = []
for _ in range(2):  # first open (checks, derivations), then the cached reopen
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # VmHWM restarts from VmRSS
    before = status()
    opened = first_and_last(path, store)
    after = status()
    results.append({"rss": after["VmRSS"] - before["VmRSS"], "peak": after["VmHWM"] - before["VmRSS"],
                    "entries": len(opened)})
    del opened
print(json.dumps(results))
"""

BUILDERS = {
    "native-manifest": lambda root: native(root, manifest=True),
    "native-no-manifest": native,
    "megatron": megatron,
    "flat-lengths": flat_lengths,
    "packed": packed,
    "keyed-bin": bin_store,
}


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_opening_a_huge_dataset_grows_rss_by_less_than_50_mb(name: str, tmp_path: Path, cache_dir: Path) -> None:
    builder = BUILDERS[name]
    big = builder(tmp_path / "big")
    small = builder(tmp_path / "small", 1000) if name != "native-manifest" else native(tmp_path / "small", 1000)
    env = {**os.environ, "TOKENLOOM_CACHE_DIR": str(cache_dir)}
    kind = "store" if name.startswith("keyed") else "dataset"
    ran = subprocess.run(
        [sys.executable, "-c", _CHILD, str(big), str(small), kind], capture_output=True, text=True, timeout=300, env=env
    )
    assert ran.returncode == 0, ran.stderr
    first, again = json.loads(ran.stdout.strip().splitlines()[-1])
    for result in (first, again):
        assert result["entries"] == (10**5 if name == "packed" else N)
        assert result["rss"] < LIMIT, (name, result)
        assert result["peak"] < LIMIT, (name, result)
    assert again["peak"] < 4 << 20, (name, again)  # a reopen maps what the first open checked or derived


def _settled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_map, "_SETTLE_NS", 0)


def _edit(path: Path, offset: int, data: bytes) -> None:
    time.sleep(0.05)  # a later timestamp than the cached open saw, as any real edit has
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def test_a_native_offset_that_decreases_deep_in_a_huge_index_is_caught_after_a_cached_open(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    root = native(tmp_path / "ds")
    assert len(open_dataset(root)) == N  # checked once, remembered
    assert len(open_dataset(root)) == N  # remembered: no scan
    record = N - 12_345
    _edit(root / "shard.idx", HEADER.size + 8 * record, _i64(7))
    with pytest.raises(IndexCorruptError) as caught:
        open_dataset(root)
    assert caught.value.record == record and "decrease" in str(caught.value)


def test_a_wrong_megatron_pointer_deep_in_a_huge_index_is_caught_after_a_cached_open(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    root = megatron(tmp_path / "ds")
    ds = open_dataset(root)
    assert len(ds) == N and len(ds[N - 1]) == TOKENS
    assert list(cache_dir.glob("index-v1/*.i64")), "the derived offsets are cached"
    record = 3 * (1 << 18) + 5  # inside the fourth chunk of the streamed pass
    _edit(root / "data.idx", 34 + 4 * N + 8 * record, _i64(2))
    with pytest.raises(IndexCorruptError) as caught:
        open_dataset(root)
    assert caught.value.record == record and caught.value.field == "pointers"


def test_a_negative_flat_document_length_is_caught_after_a_cached_open(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    root = flat_lengths(tmp_path / "ds")
    assert len(open_dataset(root, validate="none")) == N
    record = N // 2 + 1
    _edit(root / "document_lengths.i64", 8 * record, _i64(-1))
    with pytest.raises(IndexCorruptError) as caught:
        open_dataset(root, validate="none")  # the derivation itself checks, whatever validate says
    assert caught.value.record == record


def test_a_pbin_changed_after_a_cached_open_is_parsed_again(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    path = packed(tmp_path / "ds", 1000)
    assert len(open_dataset(path)) == 1000
    index_at = 12 + 2 * TOKENS
    index = dump_int_tuples([(0, 0)] * 998 + [(0, 2), (4, 2 * TOKENS - 4)])  # a 2-byte gap after entry 998
    _edit(path, index_at, index)
    with pytest.raises(IndexCorruptError, match="in no entry"):
        open_dataset(path)


def test_derived_offsets_pickle_as_their_location(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    _settled(monkeypatch)
    ds = open_dataset(megatron(tmp_path / "ds"))
    blob = pickle.dumps(ds)
    assert len(blob) < 64 << 10  # not the 80 MB of offsets
    again = pickle.loads(blob)
    assert len(again) == N and np.array_equal(again[N - 1], ds[N - 1])


def test_an_unwritable_index_cache_still_opens_in_bounded_memory(tmp_path: Path, monkeypatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(blocked))
    _settled(monkeypatch)
    ds = open_dataset(megatron(tmp_path / "ds", 1000))
    assert len(ds) == 1000 and len(ds[999]) == TOKENS
