"""Writing Modalities packed files: ``PackedWriter`` (the layouts: ``reader.py``'s docstring)."""

from __future__ import annotations

import os
import struct
from typing import Unpack

import numpy as np

from tokenloom.formats._contract import Validate
from tokenloom.formats._writer import TokenWriter, WriterBasics
from tokenloom.formats.errors import ConfigError, DataError
from tokenloom.formats.io.atomic import TempFile, make_parents, remove_empty
from tokenloom.formats.io.dtypes import TOKEN_DTYPES
from tokenloom.formats.io.sidecar import remove_sidecar, sidecar_of, write_sidecar
from tokenloom.formats.packed.pickle_safe import dump_int_tuples
from tokenloom.formats.packed.reader import PACKED_SUFFIX, open_packed

__all__ = ["PackedWriter"]


class PackedWriter(TokenWriter):
    """Writes one ``.pbin`` file crash-safely (a unique ``name.pbin.<pid>-<hex>.tmp``, fsync, rename, directory fsync).

    Args:
        path: the ``.pbin`` file to create.
        dtype: uint8, uint16 or uint32 (the token size field) for the current
            layout. The legacy layout always stores 4-byte tokens; any unsigned
            dtype of up to 4 bytes is accepted and widened losslessly.
        legacy: write the seed's 8-byte-header layout instead of the current one.
        tokenizer_fingerprint: kept, with vocab_size and eos_id, in the sidecar
            ``NAME.pbin.tokenloom.json`` (written just before the .pbin is published).
        overwrite: replace an existing file.
    """

    format = "packed"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        legacy: bool = False,
        tokenizer_fingerprint: str | None = None,
        overwrite: bool = False,
        **basics: Unpack[WriterBasics],
    ) -> None:
        super().__init__(path, **basics)
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.sidecar = sidecar_of(self.path)
        if self.path.suffix != PACKED_SUFFIX:
            raise ConfigError(
                f"{self.path.name} does not end in {PACKED_SUFFIX}",
                path=self.path,
                hint=f"Name the output *{PACKED_SUFFIX} so that readers recognise it",
            )
        if self.dtype.kind != "u" or self.dtype.itemsize > 4:
            raise ConfigError(
                f"dtype {self.dtype.name} cannot be stored in a .pbin, expected uint8, uint16 or uint32",
                path=self.path,
                field="dtype",
            )
        if self.path.is_dir():
            raise ConfigError(f"{self.path} is a directory, expected a file path", path=self.path)
        if (self.path.exists() or self.path.is_symlink()) and not overwrite:
            raise ConfigError(
                f"{self.path.name} exists",
                path=self.path,
                hint="Choose a new path or pass --overwrite (overwrite=True in Python)",
            )
        if self.path.exists() or self.path.is_symlink():
            try:  # --overwrite replaces a .pbin, never a file of another kind that happens to sit there
                open_packed(self.path, validate=Validate.FAST)
            except DataError as exc:
                raise ConfigError(
                    f"refusing to overwrite {self.path.name}: it is not a readable .pbin ({type(exc).__name__})",
                    path=self.path,
                    hint="--overwrite only replaces a .pbin file; choose another path",
                ) from None
        self.legacy = legacy
        self.layout = "legacy" if legacy else "current"
        self.store_dtype = TOKEN_DTYPES["uint32"] if legacy else self.dtype
        self._created = make_parents(self.path)  # removed again if the writer fails
        self._out = TempFile(self.path)
        self._out.handle.write(b"\0" * 8)
        if not legacy:
            self._out.handle.write(struct.pack("<I", self.store_dtype.itemsize))
        self._lengths: list[np.ndarray] = []

    def _write_batch(self, tokens: np.ndarray, lengths: np.ndarray, overlaps: np.ndarray) -> None:
        self._refuse_overlaps(overlaps, "a .pbin (it has no overlap-prefix field)")
        self._out.handle.write(np.ascontiguousarray(tokens, dtype=self.store_dtype).tobytes())
        self._lengths.append(lengths.astype(np.int64))

    def _commit(self) -> None:
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, np.int64)
        byte_lengths = lengths * self.store_dtype.itemsize
        starts = np.zeros(len(byte_lengths), dtype=np.int64)
        np.cumsum(byte_lengths[:-1], out=starts[1:])
        data_len = int(byte_lengths.sum())
        wrote = False
        try:
            self._out.handle.write(dump_int_tuples(zip(starts.tolist(), byte_lengths.tolist(), strict=True)))
            self._out.handle.seek(0)
            self._out.handle.write(struct.pack("<Q", data_len))
            self._out.finish()
            remove_sidecar(self.sidecar)  # an overwritten file's sidecar must not outlive it
            wrote = write_sidecar(self.sidecar, self._out.tmp, name=self.path.name, values=self.sidecar_values)
            self._out.publish()
        except BaseException:
            if wrote:
                remove_sidecar(self.sidecar)
            self._abort()
            raise

    def _abort(self) -> None:
        self._out.abort()
        remove_empty(self._created)
