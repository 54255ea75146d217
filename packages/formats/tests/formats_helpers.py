"""Helpers the formats test modules share (imported by name: conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tokenloom.formats import DataError, RemoteOptions, UnsafePathError, open_dataset, open_writer
from tokenloom.formats.native import NativeWriter

MIB = 1 << 20


def entry_bytes(ds) -> list[bytes]:
    """Each entry of a dataset as its raw bytes."""
    return [np.asarray(ds[i]).tobytes() for i in range(len(ds))]


def refuses_link_and_fifo(
    link: Path, outside: Path, open_link, open_fifo=None, *, outside_match: str = "outside the dataset root"
) -> pytest.ExceptionInfo[UnsafePathError]:
    """``link`` as a symlink to ``outside`` (``open_link()`` refuses it), then as a FIFO (``open_fifo()``, by
    default ``open_link()``, refuses it too); the first refusal's info, to check where it points."""
    link.symlink_to(outside)
    with pytest.raises(UnsafePathError, match=outside_match) as info:
        open_link()
    link.unlink()
    os.mkfifo(link)
    with pytest.raises(UnsafePathError, match="FIFO"):
        (open_fifo or open_link)()
    return info


def fuzz(max_examples: int):
    """The corruption fuzzers' hypothesis settings: no deadline, the temp-dir fixture shared by the examples."""
    return settings(
        max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )


def write_docs(path: Path, fmt: str, docs, *, dtype: str = "uint16", **options: Any) -> Path:
    """A dataset of ``fmt`` holding ``docs`` (lists of ids), vocabulary 100 and EOS 0 unless told."""
    options = {"vocab_size": 100, "eos_id": 0, **options}
    with open_writer(path, format=fmt, dtype=dtype, **options) as writer:
        for doc in docs:
            writer.add(np.array(doc, dtype=np.int64))
    return path


def entries(ds) -> list[list[int]]:
    """Each entry of a dataset as a list of ids."""
    return [ds[i].tolist() for i in range(len(ds))]


def write_random_native(root: Path, *, seed: int, docs: int) -> Path:
    """A native dataset of ``docs`` random documents of 5..300 uint16 tokens and EOS 0."""
    rng = np.random.default_rng(seed)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(docs):
            doc = rng.integers(1, 50_000, size=int(rng.integers(5, 300)), dtype=np.uint16)
            writer.add(np.append(doc, np.uint16(0)))
    return root


def cached_remote(storage_options: dict[str, Any], cache: Path, block_size: int = MIB) -> RemoteOptions:
    """Remote options with a block cache under ``cache``, of 1 MiB blocks (the hash block) unless told."""
    return RemoteOptions.from_keywords(storage_options=storage_options, block_cache_dir=cache, block_size=block_size)


def open_cached(url: str, storage_options: dict[str, Any], cache: Path, block_size: int = MIB, **options: Any):
    """``open_dataset(url)`` through :func:`cached_remote`."""
    return open_dataset(url, remote=cached_remote(storage_options, cache, block_size), **options)


def warnings_with(caplog, text: str) -> list[str]:
    """The messages of the captured warnings (and worse) that contain ``text``."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def mounted_tmpfs(mount: Path, options: str) -> Iterator[Path]:
    """A fixture body: a tmpfs mounted at ``mount`` with ``options`` ("size=32k,ro"), unmounted after; skips the
    test where mounting fails."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30, check=False)


tmpfs = contextlib.contextmanager(mounted_tmpfs)


def write_counting_native(path: Path, docs: int) -> Path:
    """A native dataset of documents 1..n (n = 1..docs-1, ids modulo 999 plus one), vocabulary 1000, EOS 0."""
    with NativeWriter(path, dtype="uint16", vocab_size=1000, eos_id=0) as writer:
        for n in range(1, docs):
            writer.add(np.arange(n) % 999 + 1)
    return path


def refuse_opening(monkeypatch, suffix: str, *modules) -> None:
    """``open`` (of builtins and each of ``modules``) raises EACCES for a path ending in ``suffix``."""
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file).endswith(suffix):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    for module in (builtins, *modules):
        monkeypatch.setattr(module, "open", guarded)


def truncate_drawn(data, target: Path) -> None:
    """Cut ``target`` to a length drawn by hypothesis (shorter than it is)."""
    raw = target.read_bytes()
    target.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])


def flip_drawn_bit(data, target: Path) -> None:
    """Flip one bit of ``target``: its byte, then its bit, drawn by hypothesis."""
    raw = bytearray(target.read_bytes())
    raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    target.write_bytes(bytes(raw))


def refused_after(damage, data, target: Path, open_it) -> None:
    """``target`` damaged by ``damage`` (:func:`truncate_drawn`, :func:`flip_drawn_bit`): ``open_it()`` raises."""
    damage(data, target)
    with pytest.raises(DataError):
        open_it()


def byte_changes(raw: bytes, positions, masks) -> Iterator[bytes]:
    """``raw`` with one byte changed: each position (outer loop) xor each mask (inner loop)."""
    for position in positions:
        for mask in masks:
            changed = bytearray(raw)
            changed[position] ^= mask
            yield bytes(changed)


def opened_after_each(target: Path, changes, dataset: Path | None = None) -> Iterator:
    """Write each of ``changes`` to ``target`` in turn: the dataset (at ``dataset``, else ``target``) each time it
    opens; a change it refuses with a DataError is passed over."""
    from tokenloom.formats import DataError

    for changed in changes:
        target.write_bytes(changed)
        try:
            yield open_dataset(dataset or target)
        except DataError:
            continue
