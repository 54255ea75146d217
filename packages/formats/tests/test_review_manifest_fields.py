"""Review of issue 36's manifest reading from field tables (required / optional tables in read_manifest): a
manifest whose content checksum was made to match but whose fields are wrong is a named error, never a dataset
that reads garbage; a truncated or empty manifest in object storage is a named error too."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from formats_helpers import cached_remote

from tokenloom.formats import open_dataset, open_writer
from tokenloom.formats.errors import DataError, FormatError
from tokenloom.formats.io.manifest import content_checksum


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifest") / "base"
    with open_writer(root, format="native", dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for i in range(10):
            writer.add(np.append(np.arange(1, 10 + i), 0))
    return root


def _resealed(base: Path, target: Path, change: Callable[[dict[str, Any]], object]) -> Path:
    """A copy of ``base`` whose manifest is changed and given a matching checksum (in tokenloom's spelling)."""
    shutil.copytree(base, target)
    payload = orjson.loads((target / "manifest.json").read_bytes())
    change(payload)
    payload["checksum"] = content_checksum(payload)
    (target / "manifest.json").write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    return target


def _read_all(path: Path | str, **options: Any) -> None:
    ds = open_dataset(path, **options)
    for i in range(len(ds)):
        np.asarray(ds[i])


CHANGES: dict[str, tuple[Callable[[dict[str, Any]], object], str]] = {
    "num_tokens_negative": (lambda p: p.update(num_tokens=-1), "manifest records -1"),
    "num_tokens_str": (lambda p: p.update(num_tokens="135"), "num_tokens"),
    "num_documents_missing": (lambda p: p.pop("num_documents"), "num_documents"),
    "dtype_float": (lambda p: p.update(dtype="float64"), "cannot hold token ids"),
    "dtype_missing": (lambda p: p.pop("dtype"), "dtype"),
    "eos_bool": (lambda p: p.update(eos_id=True), "eos_id"),
    "eos_outside_vocab": (lambda p: p.update(eos_id=5000), "outside its vocab_size"),
    "vocab_float": (lambda p: p.update(vocab_size=1000.0), "vocab_size"),
    "tokenizer_fingerprint_int": (lambda p: p.update(tokenizer_fingerprint=7), "tokenizer_fingerprint"),
    "metadata_list": (lambda p: p.update(metadata=[]), "metadata"),
    "files_empty": (lambda p: p.update(files=[]), "manifest records"),
    "file_listed_twice": (lambda p: p["files"].append(p["files"][0]), "twice"),
    "file_bytes_bool": (lambda p: p["files"][0].update(bytes=True), "bytes"),
    "file_outside": (lambda p: p["files"][0].update(name="../x.bin"), "outside the dataset"),
    "version_future": (lambda p: p.update(manifest_version=99), "manifest version 99"),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_resealed_manifest_with_a_wrong_field_is_a_named_error(base: Path, tmp_path: Path, name: str) -> None:
    change, words = CHANGES[name]
    root = _resealed(base, tmp_path / name, change)
    with pytest.raises(DataError) as caught:
        _read_all(root)
    assert words in str(caught.value), str(caught.value)


def _twice_with_doubled_counts(payload: dict[str, Any]) -> None:
    payload["files"] += [dict(entry) for entry in payload["files"]]
    payload["num_tokens"] *= 2
    payload["num_documents"] *= 2


def test_a_manifest_listing_a_file_twice_is_refused(base: Path, tmp_path: Path) -> None:
    root = _resealed(base, tmp_path / "twice", _twice_with_doubled_counts)
    with pytest.raises(DataError, match="shard_00000"):
        _read_all(root)


def test_a_null_metadata_reads_as_no_metadata(base: Path, tmp_path: Path) -> None:
    root = _resealed(base, tmp_path / "null", lambda p: p.update(metadata=None))
    ds = open_dataset(root)
    assert ds.metadata == {} and len(ds) == 10


@pytest.mark.parametrize("cut", ["empty", "half", "one_byte_less"])
def test_a_damaged_manifest_in_object_storage_is_a_named_error(seaweed, base: Path, tmp_path: Path, cut: str) -> None:
    prefix = f"review-{uuid.uuid4().hex[:8]}"
    url = seaweed.upload_dir(base, prefix)
    data = (base / "manifest.json").read_bytes()
    damaged = {"empty": b"", "half": data[: len(data) // 2], "one_byte_less": data[:-1]}[cut]
    seaweed.put(f"{prefix}/manifest.json", damaged)
    with pytest.raises(DataError) as caught:
        _read_all(url, remote=cached_remote(seaweed.storage_options(), tmp_path / "c"))
    assert "manifest.json" in str(caught.value)


def test_a_resealed_remote_manifest_with_null_metadata_opens(seaweed, base: Path, tmp_path: Path) -> None:
    """The remote opener records the objects' identities in dataset.metadata: a null one must not break it."""
    root = _resealed(base, tmp_path / "null", lambda p: p.update(metadata=None))
    url = seaweed.upload_dir(root, f"review-{uuid.uuid4().hex[:8]}")
    try:
        ds = open_dataset(url, remote=cached_remote(seaweed.storage_options(), tmp_path / "c"))
    except DataError:
        return  # refused by name: fine too
    assert len(ds) == 10 and isinstance(ds.metadata, dict)


def test_format_error_is_a_data_error() -> None:
    assert issubclass(FormatError, DataError)
