"""Writing Megatron-LM indexed datasets: ``MegatronWriter`` (the layout: ``reader.py``'s docstring)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Unpack

import numpy as np

from tokenloom.formats._writer import TokenWriter, WriterBasics
from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.atomic import TempFile, atomic_write_bytes, fsync_dir, make_parents, remove_empty
from tokenloom.formats.io.paths import starts_with
from tokenloom.formats.io.sidecar import remove_sidecar, sidecar_of, write_sidecar
from tokenloom.formats.megatron.reader import (
    _HEADER,
    CODE_OF_DTYPE,
    MAX_SEQUENCE_TOKENS,
    MEGATRON_MAGIC,
    MEGATRON_VERSION,
)

__all__ = ["MegatronWriter", "megatron_targets", "prefix_of"]


def prefix_of(path: Path) -> Path:
    """The dataset prefix a path names (``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx``)."""
    return path.with_name(path.name[:-4]) if path.suffix in (".idx", ".bin") else path


def megatron_targets(target: Path) -> list[Path]:
    """The prefix (locked), the path given, ``.bin``, ``.idx`` and the sidecar (uploaded last)."""
    prefix = prefix_of(target)
    paths = [prefix, target, prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")]
    return [*dict.fromkeys(paths), sidecar_of(prefix)]


class MegatronWriter(TokenWriter):
    """Writes ``PREFIX.bin`` then ``PREFIX.idx`` (one sequence per document), like megatron-core's builder.

    ``path`` is the prefix (a trailing ``.idx``/``.bin`` is dropped); the .idx is
    published last, so a prefix with an .idx is complete. Megatron stores no
    overlap prefix, vocab size or EOS id: a non-zero overlap prefix is a
    ConfigError; vocab size, EOS id and ``tokenizer_fingerprint`` go to the
    sidecar ``PREFIX.tokenloom.json`` (written just before the .idx; none when
    all three are unknown).
    """

    format = "megatron"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        tokenizer_fingerprint: str | None = None,
        overwrite: bool = False,
        **basics: Unpack[WriterBasics],
    ) -> None:
        super().__init__(path, **basics)
        self.tokenizer_fingerprint = tokenizer_fingerprint
        if self.dtype.name not in CODE_OF_DTYPE:
            raise ConfigError(
                f"Megatron has no dtype code for {self.dtype.name}, expected one of {sorted(CODE_OF_DTYPE)}",
                field="dtype",
                hint="Use int32 for vocabularies up to 2**31 (uint16 up to 65,536)",
            )
        prefix = prefix_of(self.path)
        if prefix.is_dir():
            raise ConfigError(
                f"{prefix} is a directory; the megatron writer takes a prefix such as {prefix / 'data'}",
                path=prefix,
            )
        self._created = make_parents(prefix)  # removed again if the writer fails
        self.prefix = prefix
        self.bin_path = prefix.with_name(prefix.name + ".bin")
        self.idx_path = prefix.with_name(prefix.name + ".idx")
        existing = [p for p in (self.bin_path, self.idx_path) if p.exists() or p.is_symlink()]
        if existing and not overwrite:
            raise ConfigError(
                f"{existing[0].name} already exists",
                path=existing[0],
                hint="Choose another prefix or pass --overwrite (overwrite=True in Python)",
            )
        if existing and not (self.idx_path.is_file() and starts_with(self.idx_path, MEGATRON_MAGIC)):
            # a .bin alone, or beside an .idx without the magic, is not a Megatron dataset: not ours to delete
            what = self.idx_path if self.idx_path.exists() or self.idx_path.is_symlink() else existing[0]
            reason = "it is not a Megatron index (no MMIDIDX magic)" if what == self.idx_path else "it has no .idx"
            raise ConfigError(
                f"refusing to overwrite {what.name}: {reason}",
                path=what,
                hint="--overwrite only replaces a Megatron dataset; choose another prefix",
            )
        for stale in existing:
            stale.unlink()
        self.sidecar = sidecar_of(prefix)
        if existing:
            remove_sidecar(self.sidecar)  # it described the data just removed
        self._bin = TempFile(self.bin_path)
        self._lengths: list[np.ndarray] = []

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        self._refuse_overlaps(overlaps, "Megatron indexed datasets", path=self.prefix)
        if len(lengths) and lengths.max() > MAX_SEQUENCE_TOKENS:
            i = int(np.argmax(lengths > MAX_SEQUENCE_TOKENS))
            raise ConfigError(
                f"entry of {int(lengths[i])} tokens does not fit Megatron's int32 size field",
                path=self.prefix,
                record=self.num_documents + i,
            )
        self._bin.handle.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        self._lengths.append(lengths.astype("<i4"))

    def _commit(self) -> None:
        try:
            self._bin.finish()
            sizes = np.concatenate(self._lengths) if self._lengths else np.empty(0, "<i4")
            offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(sizes, dtype=np.int64, out=offsets[1:])
            pointers = (offsets[:-1] * self.dtype.itemsize).astype("<i8")
            documents = np.arange(len(sizes) + 1, dtype="<i8")
            code = CODE_OF_DTYPE[self.dtype.name]
            header = _HEADER.pack(MEGATRON_MAGIC, MEGATRON_VERSION, code, len(sizes), len(documents))
            index = header + sizes.tobytes() + pointers.tobytes() + documents.tobytes()
            self._bin.publish(sync_dir=False)  # the directory is fsynced after the .idx
        except BaseException:  # nothing published yet (a full disk failing the last flush): the temp .bin goes
            self._abort()
            raise
        write_sidecar(self.sidecar, index, name=self.idx_path.name, values=self.sidecar_values)
        atomic_write_bytes(self.idx_path, index)
        fsync_dir(self.idx_path.parent)

    def _abort(self) -> None:
        self._bin.abort()
        remove_empty(self._created)
