"""Megatron-LM indexed datasets (``MMIDIDX``, version 1): ``PREFIX.idx`` + ``PREFIX.bin``.

``.bin``: the tokens of every sequence, concatenated. ``.idx`` (little-endian)::

    offset      size           field
    0           9              magic b"MMIDIDX\\x00\\x00"
    9           8   uint64     version (1)
    17          1   uint8      dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                                           6 float64, 7 float32, 8 uint16)
    18          8   uint64     sequence count s
    26          8   uint64     document count d (document boundaries + 1)
    34          4*s int32      sizes: tokens per sequence
    34+4s       8*s int64      pointers: byte offset of each sequence in .bin
    34+12s      8*d int64      document indices: 0, ..., s (sequence index where each document ends)
    34+12s+8d   s   int8       modes, one per sequence (multimodal datasets only)

An entry of the TokenDataset is a Megatron *sequence* (``len(ds)`` and ``ds[i]``
agree with megatron-core's ``IndexedDataset``); the document indices are kept in
``ds.metadata``. Readers check that the .idx size matches its counts exactly
(the multimodal modes are recognised by that size), that pointers are the
running byte offsets of the sizes, that the document indices run from 0 to the
sequence count without decreasing, and that the .bin holds exactly the bytes
the sizes announce. Token dtypes are uint8, uint16, int32 and int64 (Megatron
has no uint32; int8/int16/float data cannot hold token ids and is refused).
The format has no overlap prefix (zeros), and no place for vocab size, EOS id or
tokenizer: tokenloom keeps them in ``PREFIX.tokenloom.json`` beside the ``.idx``
(see :mod:`tokenloom.formats.io.sidecar`), which other tools ignore.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats._contract import Validate
from tokenloom.formats._dataset import Shard, TokenDataset, sidecar_values
from tokenloom.formats.errors import (
    FormatError,
    IndexCorruptError,
    MissingFileError,
    TruncatedError,
)
from tokenloom.formats.io.dtypes import TOKEN_DTYPES, check_asked_dtype
from tokenloom.formats.io.index_map import derived_index, iter_chunks, map_array, release_pages, zeros_index
from tokenloom.formats.io.paths import as_path, first_index, pair_stats, starts_with
from tokenloom.formats.io.scan import check_rising_from_zero

__all__ = ["MEGATRON_MAGIC", "is_megatron", "megatron_prefixes", "open_megatron"]

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # 34 bytes
DTYPE_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
CODE_OF_DTYPE = {name: code for code, name in DTYPE_CODES.items() if name in TOKEN_DTYPES}
MAX_SEQUENCE_TOKENS = np.iinfo(np.int32).max


def megatron_prefixes(path: Path) -> tuple[Path, list[str]]:
    """(directory, prefix names) for a prefix, an ``.idx``/``.bin`` file, or a directory of prefixes."""
    if path.is_dir():
        stems = sorted(p.name[:-4] for p in path.glob("*.idx"))
        orphans = sorted(p.name for p in path.glob("*.bin") if not (path / (p.name[:-4] + ".idx")).exists())
        if orphans:
            raise MissingFileError(f"{orphans[0]} has no .idx", path=path / orphans[0])
        if not stems:
            raise FormatError("no .idx files in the directory", path=path)
        return path, stems
    if path.suffix in (".idx", ".bin"):
        return path.parent, [path.name[:-4]]
    return path.parent, [path.name]


def is_megatron(path: Path) -> bool:
    """An .idx (or a directory's first .idx) that starts with the MMIDIDX magic."""
    if path.is_dir():
        index = first_index(path)
    else:
        index = path.with_name((path.name[:-4] if path.suffix in (".idx", ".bin") else path.name) + ".idx")
    return index is not None and starts_with(index, MEGATRON_MAGIC)


def read_megatron_shard(root: Path, stem: str, *, rederive: bool = False) -> tuple[Shard, np.ndarray, bool]:
    """Validate ``stem.idx`` / ``stem.bin``; returns the shard, its document indices and whether it is multimodal.

    The token offsets readers need are derived from the sizes once per version of the ``.idx``
    (checking sizes, pointers and document indices in one streamed pass) and memory-mapped from the
    index cache afterwards (:func:`~tokenloom.formats.io.index_map.derived_index`); ``rederive``
    checks again even when a cached derivation exists.
    """
    idx_path = root / f"{stem}.idx"
    bin_path = root / f"{stem}.bin"
    idx_info, bin_info = pair_stats(root, stem)
    idx_size, bin_size = idx_info.st_size, bin_info.st_size
    if idx_size < _HEADER.size:
        raise TruncatedError(
            f"index has {idx_size} bytes, shorter than its {_HEADER.size}-byte header", path=idx_path, offset=0
        )
    with idx_path.open("rb") as handle:
        magic, version, code, seq_count, doc_count = _HEADER.unpack(handle.read(_HEADER.size))
    if magic != MEGATRON_MAGIC:
        raise FormatError(f"magic {magic!r}, expected {MEGATRON_MAGIC!r}", path=idx_path, offset=0, field="magic")
    if version != MEGATRON_VERSION:
        raise FormatError(f"version {version}, expected {MEGATRON_VERSION}", path=idx_path, offset=9, field="version")
    if code not in DTYPE_CODES:
        raise FormatError(f"dtype code {code}, expected one of {DTYPE_CODES}", path=idx_path, offset=17, field="dtype")
    if DTYPE_CODES[code] not in TOKEN_DTYPES:
        raise FormatError(
            f"dtype code {code} ({DTYPE_CODES[code]}) cannot hold token ids, expected one of {CODE_OF_DTYPE}",
            path=idx_path,
            offset=17,
            field="dtype",
        )
    dtype = TOKEN_DTYPES[DTYPE_CODES[code]]
    expected = _HEADER.size + 12 * seq_count + 8 * doc_count
    multimodal = seq_count > 0 and idx_size == expected + seq_count
    if idx_size != expected and not multimodal:
        cls = TruncatedError if idx_size < expected else IndexCorruptError
        raise cls(
            f"{seq_count} sequences and {doc_count} document indices imply an index of {expected} bytes "
            f"({expected + seq_count} with modes), the file has {idx_size}",
            path=idx_path,
            offset=18,
            field="sequence_count",
        )
    if doc_count == 0:
        raise IndexCorruptError("document count is 0, expected at least 1 (the leading 0)", path=idx_path, offset=26)
    sizes = map_array(idx_path, "<i4", _HEADER.size, seq_count)
    pointers_at = _HEADER.size + 4 * seq_count
    pointers = map_array(idx_path, "<i8", pointers_at, seq_count)
    documents_at = pointers_at + 8 * seq_count
    documents = map_array(idx_path, "<i8", documents_at, doc_count)
    offsets = derived_index(
        [idx_path],
        "megatron token offsets",
        seq_count + 1,
        lambda: _checked_offsets(sizes, pointers, documents, dtype, idx_path=idx_path, bin_size=bin_size),
        rebuild=rederive,
    )
    _check_data_size(int(offsets[-1]), dtype, bin_size, bin_path=bin_path)
    shard = Shard(
        tokens_path=bin_path,
        dtype=dtype,
        num_tokens=int(offsets[-1]),
        offsets=offsets,
        overlap_prefix=zeros_index(seq_count),
        name=stem,
    )
    return shard, documents, multimodal


def _checked_offsets(
    sizes: np.ndarray,
    pointers: np.ndarray,
    documents: np.ndarray,
    dtype: np.dtype,
    *,
    idx_path: Path,
    bin_size: int,
) -> Iterator[np.ndarray]:
    """Token offsets (int64, 0 .. total) in chunks, checking sizes, pointers and document indices on the way."""
    seq_count = len(sizes)
    yield np.zeros(1, dtype=np.int64)
    total = 0
    for start, part in iter_chunks(sizes):
        if part.min() < 0:
            i = start + int(np.argmax(part < 0))
            raise IndexCorruptError(
                f"sequence size {int(sizes[i])} is negative",
                path=idx_path,
                offset=_HEADER.size + 4 * i,
                record=i,
                field="sizes",
            )
        ends = np.cumsum(part, dtype=np.int64)
        ends += total
        begins = np.concatenate([np.array([total], dtype=np.int64), ends[:-1]])
        found = pointers[start : start + len(part)]
        wrong = np.flatnonzero(found != begins * dtype.itemsize)
        release_pages(pointers, start, start + len(part))  # after the last read of them
        if len(wrong):
            i = int(wrong[0])
            value = int(found[i])
            where = f", past the end of the {bin_size}-byte data file" if value > bin_size else ""
            raise IndexCorruptError(
                f"pointer {value}{where}, expected {int(begins[i]) * dtype.itemsize} "
                "(the bytes of the sizes before it)",
                path=idx_path,
                offset=_HEADER.size + 4 * seq_count + 8 * (start + i),
                record=start + i,
                field="pointers",
            )
        total = int(ends[-1])
        yield ends
    documents_at = _HEADER.size + 12 * seq_count
    check_rising_from_zero(
        documents,
        what="document indices",
        one="document index",
        path=idx_path,
        at=documents_at,
        field="document_indices",
        record_shift=1,
    )
    if documents[-1] != seq_count:
        raise IndexCorruptError(
            f"last document index is {int(documents[-1])}, expected the sequence count {seq_count}",
            path=idx_path,
            offset=documents_at + 8 * (len(documents) - 1),
            field="document_indices",
        )


def _check_data_size(num_tokens: int, dtype: np.dtype, bin_size: int, *, bin_path: Path) -> None:
    data_bytes = num_tokens * dtype.itemsize
    if data_bytes != bin_size:
        cls = TruncatedError if bin_size < data_bytes else IndexCorruptError
        raise cls(
            f"the index announces {data_bytes} data bytes ({num_tokens} {dtype.name} tokens), "
            f"the data file has {bin_size}",
            path=bin_path,
            field="sizes",
        )


def open_megatron(
    path: str | os.PathLike[str],
    *,
    validate: Validate = Validate.FAST,
    dtype: Any = None,
    vocab_size: int | None = None,
    eos_id: int | None = None,
) -> TokenDataset:
    """Open one prefix, an ``.idx``/``.bin`` file of one, or a directory of prefixes (one shard each).

    Megatron records no vocab size or EOS id: they come from tokenloom's sidecar
    ``PREFIX.tokenloom.json`` when a tokenloom writer left one, or from these
    arguments (which must agree with a sidecar); ``validate="deep"`` then checks
    token ids and EOS placement (negative ids are refused either way).
    """
    root, stems = megatron_prefixes(as_path(path))
    shards, documents, modes = [], [], []
    for stem in stems:
        shard, document_indices, multimodal = read_megatron_shard(root, stem, rederive=validate == Validate.DEEP)
        shards.append(shard)
        documents.append(document_indices)
        modes.append(multimodal)
    described = [(root / stem, root / f"{stem}.idx") for stem in stems]
    vocab_size, eos_id, tokenizer_fingerprint = sidecar_values(
        described, root, vocab_size=vocab_size, eos_id=eos_id, what="prefixes"
    )
    asked = None if isinstance(dtype, str) and dtype == "infer" else dtype
    check_asked_dtype(asked, shards[0].dtype, recorded="the index records", path=root / f"{stems[0]}.idx")
    for shard in shards[1:]:
        if shard.dtype != shards[0].dtype:
            raise FormatError(
                f"prefix {shard.name} holds {shard.dtype.name}, prefix {shards[0].name} holds {shards[0].dtype.name}",
                path=root / f"{shard.name}.idx",
                field="dtype",
                hint="Open the prefixes separately, or convert them to one dtype",
            )
    dataset = TokenDataset(
        shards,
        format="megatron",
        root=root,
        eos_id=eos_id,
        vocab_size=vocab_size,
        tokenizer_fingerprint=tokenizer_fingerprint,
        metadata={
            "prefixes": stems,
            "document_indices": documents,
            "multimodal": any(modes),
        },
    )
    return dataset.check_deep(validate)
