"""Record stores: ``<key>.bin`` + ``meta.json`` whose keys are cut into records by their own ``offsets``.

AstrAI's record-mode layout, as its code writes and reads it (ViperEkura/AstrAI
at 75304d0: ``astrai/serialization/dataset.py`` ``save_bin(path, tensors,
record_keys=...)``, ``astrai/dataset/storage.py`` ``MmapStore``): per key the
records concatenated in ``<key>.bin`` and ``{"shape": [n], "dtype": <torch dtype
name>, "offsets": [0, ..., n]}`` in meta.json, ``offsets`` only for the keys
named in ``record_keys``. Keys may differ in length (a DPO pair's chosen and
rejected sides are as long as they are), so the keys are not aligned element by
element as in a keyed store; they are aligned record by record::

    meta.json  {"chosen":        {"shape": [C], "dtype": "int32", "offsets": [0, c0, ..., C]},
                "chosen_mask":   {"shape": [C], "dtype": "bool",  "offsets": [0, c0, ..., C]},
                "rejected":      {"shape": [R], "dtype": "int32", "offsets": [0, r0, ..., R]},
                "rejected_mask": {"shape": [R], "dtype": "bool",  "offsets": [0, r0, ..., R]}}

Only keys with offsets are record keys; keys without (streams) are listed in
``RecordStore.stream_keys`` and not served, as AstrAI's record datasets never
read them. Where AstrAI is lax tokenloom refuses or goes further, on purpose:
record keys with different record counts are a ShapeMismatchError (AstrAI
silently serves the smallest count); a directory with several meta.json is one
store (sub-directories in sorted path order, records concatenated), where
AstrAI's MmapStore turns record mode off (a warning, then no records).

GRPO: AstrAI's save_bin refuses nested keys (GRPO's ``responses`` / ``masks``,
G per prompt), so AstrAI keeps GRPO in JSONL and has no bin layout for it; this
one is tokenloom's: ``prompts`` and ``rewards`` have one record per prompt
(``rewards`` record i holds the G_i rewards of prompt i), and ``responses`` /
``masks`` have one record per response, G_0 + G_1 + ... of them, in prompt order.
AstrAI removed its HDF5 backend (commit 115192c); its earlier H5 layout (a dataset per record) is read and
written too (:mod:`.records_h5`, ``tokenize --format h5``), with the same keys, dtypes and records.

A store tokenloom writes carries the ``manifest.json`` native datasets carry (format ``bin-meta``, metadata
``layout: records``; :func:`write_record_manifest`, written last): sizes and the index files' checksums are
checked at every open, data checksums under ``validate="deep"``, and a reader from a bucket verifies every
block it fetches against its block hashes. A store without one (AstrAI's, an older tokenloom's) still opens;
read from a bucket, its bytes are unverified (one warning); ``tokenloom validate STORE --write-manifest``
writes one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokenloom.formats._contract import Validate, as_validate
from tokenloom.formats.errors import ConfigError, FormatError, MissingFileError, MissingKeyError, ShapeMismatchError
from tokenloom.formats.io.manifest import MANIFEST_NAME, Manifest, describe_files, read_manifest, write_manifest
from tokenloom.formats.io.output import refuse_unfinished
from tokenloom.formats.io.paths import as_path
from tokenloom.formats.io.urls import StoredPath
from tokenloom.formats.keyed.bin_meta import META_NAME, BinStore, Part, find_meta_files
from tokenloom.formats.keyed.records_h5 import h5_record_parts, is_h5_record_path
from tokenloom.formats.keyed.store import TOKEN_KEYS, check_finite, read_store

if TYPE_CHECKING:
    from tokenloom.formats.remote.options import RemoteOptions

__all__ = [
    "GROUPED_KEYS",
    "POST_TRAINING_SIDECAR",
    "RECORDS_LAYOUT",
    "RecordStore",
    "is_record_store",
    "open_records",
    "write_record_manifest",
]

#: The settings and counts a post-training run writes beside its record store (tokenize's chat writer).
POST_TRAINING_SIDECAR = "post_training.json"
#: tokenize's unit plan: a prefix holding it is a tokenize run's output, complete once its manifest is there
RUN_PLAN_NAME = ".tokenloom-plan.json"
#: The manifest's ``metadata["layout"]`` of a record store (its format is bin-meta's).
RECORDS_LAYOUT = "records"
#: GRPO keys with one record per response (grouped by the record lengths of ``rewards``).
GROUPED_KEYS = frozenset({"responses", "masks"})


class RecordStore:
    """Records of variable length per key; ``record(i)`` returns zero-copy arrays (lists for GRPO groups)."""

    def __init__(self, path: Path, parts: Sequence[Part]) -> None:
        self.path = path
        self.parts = parts
        #: how a store in object storage is read (set by :func:`open_records` for a URL; None: a local store)
        self.remote: RemoteOptions | None = None
        self.keys = sorted(parts[0].files)
        #: keys without offsets (streams), not served as records, as AstrAI's record datasets ignore them
        self.stream_keys = sorted({key for part in parts for key in part.stream_keys})
        counts = [_record_count(part, path) for part in parts]
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def record(self, index: int, keys: list[str] | tuple[str, ...] | None = None) -> dict[str, object]:
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range for {len(self)} records")
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        part, local = self.parts[k], index - int(self._starts[k])
        out: dict[str, object] = {}
        for key in keys or self.keys:
            if key not in part.files:
                raise MissingKeyError(f"key {key!r} is absent, the store has {self.keys}", path=self.path)
            offsets, data = part.offsets[key], part.array(key)
            # plain ints: a bucket's block reader sends the bounds to its object-store helper as JSON
            if key in GROUPED_KEYS and part.groups is not None:
                first, last = int(part.groups[local]), int(part.groups[local + 1])
                out[key] = [data[int(offsets[j]) : int(offsets[j + 1])] for j in range(first, last)]
            else:
                out[key] = data[int(offsets[local]) : int(offsets[local + 1])]
        return out


def _record_count(part: Part, path: Path) -> int:
    """Records of a directory; every key agrees (GRPO: response records add up to the rewards)."""
    meta = getattr(part, "path", None) or part.directory / META_NAME  # an H5 part: its .h5 file (no meta.json)
    counts = {key: len(offsets) - 1 for key, offsets in part.offsets.items()}
    plain = {key: n for key, n in counts.items() if not (key in GROUPED_KEYS and "rewards" in counts)}
    if len(set(plain.values())) > 1:
        raise ShapeMismatchError(f"keys have different record counts {plain}, expected one count", path=meta)
    records = next(iter(plain.values()))
    if "rewards" in counts and GROUPED_KEYS & set(counts):
        group_sizes = np.diff(part.offsets["rewards"])
        part.groups = np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int64)
        for key in sorted(GROUPED_KEYS & set(counts)):
            if counts[key] != int(part.groups[-1]):
                raise ShapeMismatchError(
                    f"{key} has {counts[key]} records, the rewards announce {int(part.groups[-1])} responses",
                    path=meta,
                    field=key,
                )
    for side, mask in (("responses", "masks"), ("chosen", "chosen_mask"), ("rejected", "rejected_mask")):
        if side not in counts or mask not in counts:
            continue
        lengths, mask_lengths = np.diff(part.offsets[side]), np.diff(part.offsets[mask])
        if not np.array_equal(lengths, mask_lengths):
            bad = int(np.argmax(lengths != mask_lengths))
            if side in GROUPED_KEYS and part.groups is not None:  # a response: its record is the group holding it
                bad = int(np.searchsorted(part.groups, bad, side="right")) - 1
            raise ShapeMismatchError(
                f"the {mask} key differs in length from the {side} key", path=meta, record=bad, field=mask
            )
    return records


def open_records(
    path: str | os.PathLike[str], *, validate: Validate | str = Validate.FAST, remote: RemoteOptions | None = None
) -> RecordStore:
    """Open a record-mode ``.bin`` + ``meta.json`` store (see the module docstring); every key needs offsets.

    ``path`` may be a URL (``s3://...``): the store is then read through the remote layer
    (:func:`tokenloom.formats.remote.opener.read_remote`) with ``remote`` (a RemoteOptions: endpoint,
    credentials, block cache; None: the environment's settings), its data files by blocks through the node's
    block cache, each block checked against the manifest's hashes. The store keeps ``remote`` as
    ``store.remote`` and its URL as ``store.path``, and pickles with its block cache's settings (DataLoader
    workers read the same objects the same way). ``remote`` for a local path is a ConfigError.
    An ``.h5`` file, or a directory of them without meta.json, opens as an HDF5 record store (:mod:`.records_h5`).
    """
    validate = as_validate(validate)
    return read_store(path, remote, lambda root: _open_records(root, validate))


def _open_records(path: str | os.PathLike[str], validate: Validate) -> RecordStore:
    """The record store at a local path, or at the :class:`RemotePath` :func:`read_store` hands in."""
    root = as_path(path)
    if root.is_file() and root.suffix in (".h5", ".hdf5"):
        return _h5_records(root, validate)
    if not root.is_dir():
        raise FormatError(
            "a record store is a directory holding meta.json and <key>.bin files (or .h5 files)", path=root
        )
    refuse_unfinished(root, what="record store")  # as open_store: a writer's marker (a killed tokenize run)
    if (root / MANIFEST_NAME).is_file():  # sizes and index checksums; every data checksum when deep
        read_manifest(root).verify(root, deep=validate == Validate.DEEP)
    elif isinstance(root, StoredPath) and (root / RUN_PLAN_NAME).is_file():
        raise MissingFileError(  # in object storage the manifest is the commit marker, uploaded last
            f"a tokenize run's record store without its {MANIFEST_NAME}: still being uploaded, or its run was killed",
            path=root / MANIFEST_NAME,
            hint="Wait for the run to finish, or rerun the tokenize command (it completes the upload)",
        )
    return _read_records(root, validate)


def _read_records(root: Path, validate: Validate) -> RecordStore:
    """The record store at ``root`` (no marker or manifest check: :func:`write_record_manifest` runs before
    the writer's marker is removed)."""
    metas = find_meta_files(root)
    if not metas:
        if is_h5_record_path(root):  # AstrAI's H5 layout: a dataset per record (records_h5)
            return _h5_records(root, validate)
        raise MissingFileError(f"no {META_NAME} (nor .h5 records) under the directory", path=root)
    reader = BinStore(validate=validate)
    parts = []
    for meta in metas:
        part = reader._read_part(root, meta)  # same package: the one meta.json validator
        if not part.offsets:
            raise FormatError(
                f"no key of {sorted(part.files)} has offsets: not a record store",
                path=meta,
                hint="Stream stores open with open_store(); a record store is written by AstrAI's "
                "save_bin(path, tensors, record_keys=[...]), which gives those keys offsets",
            )
        # as AstrAI's MmapStore: only keys with offsets are record keys; the others are streams
        record_keys = sorted(part.offsets)
        part.stream_keys = sorted(set(part.files) - set(part.offsets))
        for key in part.stream_keys:
            del part.files[key], part.dtypes[key], part.lengths[key]
        if record_keys != sorted(parts[0].files if parts else part.files):
            raise MissingKeyError(
                f"record keys (keys with offsets) {record_keys} differ from {sorted(parts[0].files)}", path=meta
            )
        parts.append(part)
    return _checked_floats(RecordStore(root, parts), validate)


def _checked_floats(store: RecordStore, validate: Validate) -> RecordStore:
    """``store``, its float keys (GRPO's rewards) checked for NaN and infinity unless ``validate`` is none."""
    if validate != Validate.NONE:
        for part in store.parts:
            for key, dtype in part.dtypes.items():
                if dtype.kind == "f":
                    check_finite(part.array(key), key=key, path=part.files[key], record=None)
    return store


def _h5_records(root: Path, validate: Validate) -> RecordStore:
    """An HDF5 record store (:mod:`.records_h5`), its float keys checked as a bin-meta store's."""
    return _checked_floats(RecordStore(root, h5_record_parts(root)), validate)


def is_record_store(path: str | os.PathLike[str]) -> bool:
    """A directory whose meta.json gives some key record offsets, or one holding tokenize's sidecar and .h5
    records (``tokenize --format h5``): a quick look; opening names any problem."""
    root = as_path(path)
    meta = root / META_NAME
    try:
        if meta.is_file():
            return b'"offsets"' in meta.read_bytes()
        return (root / POST_TRAINING_SIDECAR).is_file() and is_h5_record_path(root)
    except OSError:
        return False


def write_record_manifest(
    path: str | os.PathLike[str],
    *,
    validate: Validate | str = Validate.FAST,
    vocab_size: int | None = None,
    eos_id: int | None = None,
) -> Manifest:
    """Write the record store's ``manifest.json`` (crash-safely; call it last): meta.json, the sidecar and
    each ``<key>.bin`` with its checksum, data files with block hashes (:func:`describe_files`, as native's).
    An HDF5 record store (one .h5 file beside the sidecar, ``tokenize --format h5``): that file is its data file.

    The store is read first (``validate``: ``deep`` also checks every float), so a manifest never blesses a
    store its reader refuses. Only a store of one meta.json or one .h5 file (tokenloom's) can have one.
    """
    root = as_path(path)
    if root.is_file():
        raise ConfigError(
            f"{root.name} is a file; a manifest.json lists the files of a directory and is written beside them",
            path=root,
            field="path",
            hint=f"Pass the directory that holds it (tokenloom validate {root.parent} --write-manifest): a record "
            "store written by tokenize --format h5 is such a directory (data.h5 and post_training.json); a lone "
            ".h5 file opens without a manifest",
        )
    store = _read_records(root, as_validate(validate))
    if len(store.parts) != 1 or store.parts[0].directory != root:
        raise FormatError(
            f"a record store in {len(store.parts)} meta.json directories or .h5 files cannot have one manifest.json "
            "(it lists the files of one directory)",
            path=root,
            hint="Merge the parts into one store (tokenloom.formats.RecordStoreWriter), then write its manifest",
        )
    part = store.parts[0]
    keys = sorted(set(part.files) | set(part.stream_keys))
    h5 = getattr(part, "path", None)  # an HDF5 part: its one file holds every key
    names = [(h5.name, "data")] if h5 else [(META_NAME, "index"), *((f"{key}.bin", "data") for key in keys)]
    if (root / POST_TRAINING_SIDECAR).is_file():
        names.append((POST_TRAINING_SIDECAR, "index"))
    tokens = [key for key in part.files if key in TOKEN_KEYS]
    manifest = Manifest(
        format="h5" if h5 else "bin-meta",
        dtype=part.dtypes[tokens[0] if tokens else store.keys[0]].name,
        num_tokens=sum(part.lengths[key] for key in tokens),
        num_documents=len(store),
        files=describe_files(root, names),
        vocab_size=vocab_size,
        eos_id=eos_id,
        metadata={"layout": RECORDS_LAYOUT, "keys": keys},
    )
    return write_manifest(root, manifest)
