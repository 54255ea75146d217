"""The one shape every token writer has: a context manager with ``add`` / ``add_batch``.

Subclasses implement ``_write_batch`` (validated tokens in), ``_commit`` (publish,
manifest last) and ``_abort`` (remove everything not yet published). Token ids
are checked against the vocab size and the dtype's range at write time, always.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Required, Self, TypedDict, Unpack

import numpy as np

from tokenloom.formats.errors import ConfigError, TokenRangeError
from tokenloom.formats.io.atomic import WRITING_MARKER, fsync_dir
from tokenloom.formats.io.dtypes import as_token_dtype
from tokenloom.formats.io.manifest import MANIFEST_VERSION, Manifest, describe_files, write_manifest
from tokenloom.formats.io.output import start_output_dir

__all__ = ["ShardedWriter", "TokenWriter", "WriterBasics", "check_shard_size", "check_tokens"]

MAX_OVERLAP_PREFIX = np.iinfo(np.uint16).max


def check_tokens(tokens: np.ndarray, dtype: np.dtype, vocab_size: int | None, *, path: Path, record: int) -> np.ndarray:
    """``tokens`` as a 1-D array of ``dtype``, or TokenRangeError naming the first bad id."""
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ConfigError(f"tokens have shape {array.shape}, expected 1-D", path=path, record=record)
    if array.size == 0:
        return array.astype(dtype)
    if array.dtype.kind not in "iu":
        raise ConfigError(
            f"tokens have dtype {array.dtype}, expected integers", path=path, record=record, field="tokens"
        )
    limit = int(np.iinfo(dtype).max) + 1
    if vocab_size is not None:
        limit = min(limit, vocab_size)
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        position = int(np.argmax(array == bad))
        narrow = bad > np.iinfo(dtype).max and (vocab_size is None or bad < vocab_size)
        raise TokenRangeError(
            f"token id {bad} at position {position} outside [0, {limit})"
            + ("" if vocab_size is None else f" (vocab_size {vocab_size}, dtype {dtype.name})"),
            path=path,
            record=record,
            # the id fits the vocabulary but not the chosen dtype: the dtype is what to change
            hint=f"dtype {dtype.name} holds ids up to {np.iinfo(dtype).max}; choose a wider one (--dtype uint16 or "
            "uint32), or leave --dtype out to keep the source's"
            if narrow
            else None,
        )
    return array.astype(dtype, copy=False)


def check_shard_size(shard_size_tokens: int | None) -> int | None:
    """``shard_size_tokens`` if None (one shard) or at least 1, else ConfigError."""
    if shard_size_tokens is not None and shard_size_tokens < 1:
        raise ConfigError(f"shard_size_tokens is {shard_size_tokens}, expected >= 1", field="shard_size_tokens")
    return shard_size_tokens


class WriterBasics(TypedDict, total=False):
    """What every writer takes besides its path and own options, passed on to :class:`TokenWriter`."""

    dtype: Required[Any]
    vocab_size: int | None
    eos_id: int | None


class TokenWriter:
    """Base of every writer: validates input, counts, and publishes on a clean exit."""

    format = ""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any,
        vocab_size: int | None = None,
        eos_id: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.dtype = as_token_dtype(dtype)
        if vocab_size is not None and vocab_size < 1:
            raise ConfigError(f"vocab_size is {vocab_size}, expected >= 1", field="vocab_size")
        if eos_id is not None and not 0 <= eos_id < (vocab_size or np.iinfo(self.dtype).max + 1):
            raise ConfigError(f"eos_id {eos_id} is outside the vocabulary", field="eos_id")
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.num_documents = 0
        self.num_tokens = 0
        self._closed = False

    def _refuse_overlaps(self, overlaps: np.ndarray, what: str, *, path: Path | None = None) -> None:
        """ConfigError at the first non-zero overlap prefix, for formats (``what``) that cannot store one."""
        if overlaps.any():
            i = int(np.argmax(overlaps > 0))
            raise ConfigError(
                f"overlap_prefix {int(overlaps[i])}: {what} cannot store overlap prefixes",
                path=path or self.path,
                record=self.num_documents + i,
                field="overlap_prefix",
                hint="Write the native format, or drop the overlap prefixes (convert --drop-overlap-prefix)",
            )

    @property
    def sidecar_values(self) -> dict[str, Any]:
        """What a format without fields for them keeps in its sidecar (:mod:`tokenloom.formats.io.sidecar`)."""
        fingerprint = getattr(self, "tokenizer_fingerprint", None)
        return {"vocab_size": self.vocab_size, "eos_id": self.eos_id, "tokenizer_fingerprint": fingerprint}

    # -- public API ------------------------------------------------------------------
    def add(self, tokens: Any, overlap_prefix: int = 0) -> None:
        """Append one entry; ``overlap_prefix`` tokens at its start repeat the previous entry's end."""
        array = check_tokens(tokens, self.dtype, self.vocab_size, path=self.path, record=self.num_documents)
        self._add_checked(array, np.array([len(array)], dtype=np.int64), np.array([overlap_prefix]))

    def add_batch(self, tokens: Any, lengths: Any, overlap_prefix: Any = None) -> None:
        """Append ``len(lengths)`` entries whose tokens are concatenated in ``tokens``."""
        lengths = np.asarray(lengths, dtype=np.int64)
        array = check_tokens(tokens, self.dtype, self.vocab_size, path=self.path, record=self.num_documents)
        if lengths.ndim != 1 or (lengths < 0).any() or int(lengths.sum()) != len(array):
            raise ConfigError(
                f"lengths sum to {int(lengths.sum())} but {len(array)} tokens were given",
                path=self.path,
                record=self.num_documents,
                field="lengths",
            )
        overlaps = np.zeros(len(lengths), np.int64) if overlap_prefix is None else np.asarray(overlap_prefix)
        self._add_checked(array, lengths, overlaps)

    def add_keyed(self, arrays: Any) -> None:
        """Append one segment of aligned arrays by key; only keyed-store writers (h5, bin-meta) accept it."""
        raise ConfigError(
            f"format {self.format!r} holds one token stream, not keyed arrays",
            path=self.path,
            hint="Use add(tokens), or write a keyed store with format='h5' or 'bin-meta'",
        )

    def close(self) -> None:
        """Publish the data (manifest last). Idempotent."""
        if not self._closed:
            self._closed = True
            self._commit()

    def abort(self) -> None:
        """Remove everything written that was not yet published."""
        if not self._closed:
            self._closed = True
            self._abort()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- for subclasses ----------------------------------------------------------------
    def _add_checked(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        if self._closed:
            raise ConfigError("the writer is closed", path=self.path)
        overlaps = np.asarray(overlaps, dtype=np.int64)
        if overlaps.shape != lengths.shape:
            raise ConfigError("one overlap_prefix per entry expected", path=self.path, field="overlap_prefix")
        bad = (overlaps < 0) | (overlaps > MAX_OVERLAP_PREFIX) | (overlaps > lengths)
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError(
                f"overlap_prefix {int(overlaps[i])} for an entry of {int(lengths[i])} tokens, "
                "expected 0 <= overlap_prefix <= entry length (and <= 65535)",
                path=self.path,
                record=self.num_documents + i,
                field="overlap_prefix",
            )
        self._write_batch(tokens, lengths, overlaps.astype(np.uint16))
        self.num_documents += len(lengths)
        self.num_tokens += len(tokens)

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        raise NotImplementedError

    def _remove_written(self, names: list[str]) -> None:
        """Abort of a dataset directory: delete ``names`` (files written there) and the writing marker."""
        for name in [*names, WRITING_MARKER]:
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()

    def _commit(self) -> None:
        raise NotImplementedError

    def _abort(self) -> None:
        raise NotImplementedError


class ShardedWriter(TokenWriter):
    """A dataset directory of numbered shards (native, flat): a shard is begun on first need
    (``_open_shard(number)``, its name added to ``_names``), closed by ``_finish_shard``, removed on abort.

    Args:
        path: the dataset directory (created; must be empty unless ``overwrite``).
        shard_size_tokens: start a new shard once a shard holds at least this many
            tokens (entries are never split across shards). None: one shard.
        tokenizer_fingerprint: recorded in the manifest, checked by resumes.
        metadata: settings that produced the data, recorded in the manifest.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shard_size_tokens: int | None = None,
        tokenizer_fingerprint: str | None = None,
        metadata: dict[str, Any] | None = None,
        overwrite: bool = False,
        **basics: Unpack[WriterBasics],
    ) -> None:
        super().__init__(path, **basics)
        self.shard_size_tokens = check_shard_size(shard_size_tokens)
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metadata = dict(metadata or {})
        start_output_dir(self.path, overwrite=overwrite)
        self._names: list[str] = []  # each shard's name (native: its stem), in order
        self._current: Any = None

    def _shard(self) -> Any:
        if self._current is None:
            self._current = self._open_shard(len(self._names))
        return self._current

    def _finish_shard(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None

    def _abort(self) -> None:
        if self._current is not None:
            self._current.abort()
            self._current = None
        self._remove_written(self._written())

    def _publish_manifest(
        self,
        names_and_roles: list[tuple[str, str]],
        *,
        metadata: dict[str, Any],
        version: int = MANIFEST_VERSION,
    ) -> Manifest:
        """Write the dataset directory's manifest (last; ``metadata`` added to the writer's), then drop the
        writing marker, durably."""
        manifest = Manifest(
            version=version,
            format=self.format,
            dtype=self.dtype.name,
            num_tokens=self.num_tokens,
            num_documents=self.num_documents,
            files=describe_files(self.path, names_and_roles),
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            metadata={**self.metadata, **metadata},
        )
        write_manifest(self.path, manifest)
        (self.path / WRITING_MARKER).unlink()
        fsync_dir(self.path)
        return manifest

    def _open_shard(self, number: int) -> Any:
        """Begin shard ``number`` (append its name to ``_names``)."""
        raise NotImplementedError

    def _written(self) -> list[str]:
        """The names of every file written so far (removed by an abort)."""
        raise NotImplementedError
