"""Record stores in HDF5: AstrAI's H5 layout, where every dataset of a key's group is one record.

::

    data.h5  /sequence/data_000000000000, /sequence/data_000000000001, ...   record n of "sequence"
             /loss_mask/data_000000000000, ...                              record n of "loss_mask"

As AstrAI's H5Store read them (ViperEkura/AstrAI before 115192c, ``segments_are_records``): a key's
datasets are its records, in number order. The keys, dtypes and records are those of the bin-meta
record store (:mod:`.records`); GRPO's ``responses`` / ``masks`` have one dataset per response, as they
have one record per response there. ``RecordH5Writer`` (:mod:`.writers`) writes one file (a temp file renamed);
:func:`h5_record_parts` reads each file of a store as one part of :class:`~.records.RecordStore`, whose
key arrays are read into memory once per process (AstrAI's H5Store held them in memory too; a bin-meta
record store is memory-mapped instead). h5py is the extra ``tokenloom-formats[h5]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenloom.formats.errors import FormatError, MissingFileError, MissingKeyError
from tokenloom.formats.io.paths import safe_file
from tokenloom.formats.io.source import current_source
from tokenloom.formats.keyed.bin_meta import Part
from tokenloom.formats.keyed.h5 import H5_SUFFIXES, _h5_errors, _h5_file, find_h5_files, key_segments

__all__ = ["h5_record_parts", "is_h5_record_path", "segment_name"]


def segment_name(number: int) -> str:
    """Zero-padded, so that name order (what h5py's ``keys()`` gives) is number order."""
    return f"data_{number:012d}"


def is_h5_record_path(path: Path) -> bool:
    """An .h5/.hdf5 file, or a directory holding such files (searched below it)."""
    if path.is_file():
        return path.suffix in H5_SUFFIXES
    return path.is_dir() and bool(find_h5_files(path))


class _H5RecordPart(Part):
    """One HDF5 file of a record store: per key its records' lengths (as offsets); arrays read on first use."""

    def __init__(self, path: Path, dtypes: dict[str, np.dtype], names: dict[str, list[str]], offsets: dict) -> None:
        super().__init__(path.parent)
        self.path = path
        self.files = {key: path for key in dtypes}
        self.dtypes = dtypes
        self.names = names
        self.offsets = offsets
        self.lengths = {key: int(o[-1]) for key, o in offsets.items()}

    def array(self, key: str) -> np.ndarray:
        """The key's records concatenated (read once per process, as AstrAI's H5Store did)."""
        if key not in self.maps:
            data = np.empty(self.lengths[key], dtype=self.dtypes[key])
            offsets = self.offsets[key]
            with _h5_errors(self.path), _h5_file(self.source, self.path) as handle:
                group = handle[key]
                for j, name in enumerate(self.names[key]):
                    group[name].read_direct(data, dest_sel=np.s_[offsets[j] : offsets[j + 1]])
            self.maps[key] = data
        return self.maps[key]


def h5_record_parts(root: Path) -> list[_H5RecordPart]:
    """The parts of an HDF5 record store at ``root`` (a file, or a directory of files in sorted path order)."""
    paths = [root] if root.is_file() else find_h5_files(root)
    if not paths:
        raise MissingFileError("no .h5 / .hdf5 files in the directory", path=root)
    parts = []
    for path in paths:
        if path is not root:
            safe_file(root, path)
        parts.append(_read_h5_part(path))
        if sorted(parts[-1].dtypes) != sorted(parts[0].dtypes):
            raise MissingKeyError(
                f"keys {sorted(parts[-1].dtypes)} differ from {sorted(parts[0].dtypes)} in {paths[0].name}", path=path
            )
    return parts


def _read_h5_part(path: Path) -> _H5RecordPart:
    """The part of one file, read by name locally or through the source (a bucket's blocks, each verified)."""
    dtypes: dict[str, np.dtype] = {}
    with _h5_errors(path), _h5_file(current_source(), path) as handle:
        found = key_segments(handle, path, dtypes)
    if not found:
        raise FormatError("the HDF5 file holds no key groups", path=path)
    names = {key: [name for name, _ in segments] for key, segments in found.items()}
    offsets = {
        key: np.concatenate([[0], np.cumsum([n for _, n in segments], dtype=np.int64)]).astype(np.int64)
        for key, segments in found.items()
    }
    dtypes = {key: dtypes.get(key, np.dtype("int64")) for key in found}
    return _H5RecordPart(path, dtypes, names, offsets)  # read through the same source
