"""Plumbing the formats share and sibling packages take from here (and only here).

- atomic writes: ``atomic_file``, ``atomic_write_bytes``, ``fsync_dir``, ``WRITING_MARKER``, and the unique
  per-writer temp names ``temp_path`` / ``temp_base`` (``NAME.<pid>-<hex>.tmp``) every streamed writer uses
- locks: ``output_lock``, ``lock_path``, ``LOCK_SUFFIX``; whether a lock's holder still runs: ``pid_alive``,
  ``holder_gone``, ``holder_record``
- path safety: ``safe_file``, ``real_path``, ``check_disjoint``, ``check_replaceable``
- storage errors: ``storage_error``, ``storage_errors`` (an OSError as a named StorageError)
- output directories: ``prepare_output_dir``, ``shard_cut``
- manifests: ``write_manifest``, ``describe_files``, ``file_checksum``, ``FileEntry``; block hashes:
  ``BlockHashes``, ``file_digests``, ``HASH_BLOCK_SIZE``
- token dtypes: ``smallest_dtype_for_vocab``; bounded scans of index arrays: ``iter_chunks``
- optional dependencies: ``require``
- object-store URLs: ``is_remote_url``, ``parse_url``, ``refuse_remote_output`` (a URL is never a local path)

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
from tokenloom.formats.io.dtypes import smallest_dtype_for_vocab
from tokenloom.formats.io.index_map import iter_chunks
from tokenloom.formats.io.lazy import lazy_exports
from tokenloom.formats.io.lock import (
    LOCK_SUFFIX,
    holder_gone,
    holder_record,
    lock_path,
    output_lock,
    pid_alive,
    remove_dead_temps,
)
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
    "TMP_SUFFIX",
    "WRITING_MARKER",
    "FileEntry",
    "atomic_file",
    "atomic_write_bytes",
    "check_disjoint",
    "check_replaceable",
    "describe_files",
    "file_checksum",
    "fsync_dir",
    "is_remote_url",
    "iter_chunks",
    "lock_path",
    "lazy_exports",
    "output_lock",
    "parse_url",
    "holder_gone",
    "holder_record",
    "remove_dead_temps",
    "pid_alive",
    "prepare_output_dir",
    "real_path",
    "refuse_remote_output",
    "require",
    "safe_file",
    "shard_cut",
    "smallest_dtype_for_vocab",
    "storage_error",
    "storage_errors",
    "temp_base",
    "temp_path",
    "write_manifest",
]
