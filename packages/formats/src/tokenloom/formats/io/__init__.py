"""Plumbing the formats share and sibling packages take from here (and only here).

- atomic writes: ``atomic_file``, ``atomic_write_bytes``, ``fsync_dir``, ``WRITING_MARKER``, and the unique
  per-writer temp names ``temp_path`` / ``temp_base`` (``NAME.<pid>-<hex>.tmp``) every streamed writer uses
- locks: ``output_lock``, ``lock_path``, ``LOCK_SUFFIX``
- path safety: ``safe_file``, ``real_path``, ``check_disjoint``, ``check_replaceable``
- storage errors: ``storage_error``, ``storage_errors`` (an OSError as a named StorageError)
- output directories: ``prepare_output_dir``, ``shard_cut``
- manifests: ``write_manifest``, ``describe_files``, ``file_checksum``, ``FileEntry``; block hashes:
  ``BlockHashes``, ``file_digests``, ``HASH_BLOCK_SIZE``
- token dtypes and scans: ``smallest_dtype_for_vocab``, ``as_token_dtype``, ``eos_offsets``
- index arrays at O(1) memory: ``map_array``, ``iter_chunks`` (bounded scans), ``derived_index`` (index cache)
- optional dependencies: ``require``
- object-store URLs: ``is_remote_url``, ``parse_url``, ``refuse_remote_output`` (a URL is never a local path)
- the megatron/packed sidecar (EOS id, vocab size, tokenizer): ``sidecar_of``, ``SIDECAR_SUFFIX``

Everything here imports only from ``io`` itself and ``tokenloom.formats.errors``.
"""

from tokenloom.formats.io.atomic import (
    TMP_SUFFIX,
    WRITING_MARKER,
    atomic_file,
    atomic_write_bytes,
    fsync_dir,
    temp_base,
    temp_path,
)
from tokenloom.formats.io.blockhash import HASH_BLOCK_SIZE, BlockHashes, file_digests
from tokenloom.formats.io.dtypes import TOKEN_DTYPES, as_token_dtype, smallest_dtype_for_vocab
from tokenloom.formats.io.index_map import derived_index, iter_chunks, map_array
from tokenloom.formats.io.lazy import lazy_exports
from tokenloom.formats.io.lock import LOCK_SUFFIX, holder_gone, lock_path, output_lock, pid_alive
from tokenloom.formats.io.manifest import (
    EOS_AT_DOCUMENT_END,
    EOS_PLACEMENT,
    MANIFEST_NAME,
    FileEntry,
    describe_files,
    file_checksum,
    write_manifest,
)
from tokenloom.formats.io.optional import require
from tokenloom.formats.io.output import prepare_output_dir, shard_cut
from tokenloom.formats.io.paths import safe_file
from tokenloom.formats.io.safety import check_disjoint, check_replaceable, real_path
from tokenloom.formats.io.scan import eos_offsets
from tokenloom.formats.io.sidecar import SIDECAR_SUFFIX, sidecar_of
from tokenloom.formats.io.storage import storage_error, storage_errors
from tokenloom.formats.io.urls import is_remote_url, parse_url, refuse_remote_output

__all__ = [
    "HASH_BLOCK_SIZE",
    "BlockHashes",
    "file_digests",
    "EOS_AT_DOCUMENT_END",
    "EOS_PLACEMENT",
    "LOCK_SUFFIX",
    "MANIFEST_NAME",
    "SIDECAR_SUFFIX",
    "TMP_SUFFIX",
    "TOKEN_DTYPES",
    "WRITING_MARKER",
    "FileEntry",
    "as_token_dtype",
    "atomic_file",
    "atomic_write_bytes",
    "check_disjoint",
    "check_replaceable",
    "derived_index",
    "describe_files",
    "eos_offsets",
    "file_checksum",
    "fsync_dir",
    "is_remote_url",
    "iter_chunks",
    "lock_path",
    "map_array",
    "lazy_exports",
    "output_lock",
    "parse_url",
    "holder_gone",
    "pid_alive",
    "prepare_output_dir",
    "real_path",
    "refuse_remote_output",
    "require",
    "safe_file",
    "shard_cut",
    "sidecar_of",
    "smallest_dtype_for_vocab",
    "storage_error",
    "storage_errors",
    "temp_base",
    "temp_path",
    "write_manifest",
]
