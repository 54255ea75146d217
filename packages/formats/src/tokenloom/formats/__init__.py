"""tokenloom.formats: token data on disk, read and written safely.

    raw shards (native .bin/.idx, flat .npy/.bin, Megatron, Modalities .pbin, keyed stores)
        -> open_dataset(path) -> TokenDataset (zero-copy views over memory maps)

This package also owns what every tokenloom package shares: the error hierarchy
(:mod:`tokenloom.formats.errors`) and the ``tokenloom`` command.
"""

from tokenloom.formats import _flat, _megatron, _native
from tokenloom.formats._atomic import atomic_file, atomic_write_bytes, fsync_dir, temp_base, temp_path
from tokenloom.formats._buckets import bucket_dirs, open_buckets
from tokenloom.formats._cli import cli_errors
from tokenloom.formats._cli import main as cli
from tokenloom.formats._convert import ConvertResult, convert_dataset
from tokenloom.formats._dataset import EOS_AT_DOCUMENT_END, EOS_PLACEMENT, Shard, TokenDataset
from tokenloom.formats._dtypes import TOKEN_DTYPES, as_token_dtype, smallest_dtype_for_vocab
from tokenloom.formats._flat import DOCUMENT_LENGTHS_NAME, FlatWriter, open_flat
from tokenloom.formats._lock import LOCK_SUFFIX, lock_path, output_lock
from tokenloom.formats._manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    describe_files,
    file_checksum,
    read_manifest,
    write_manifest,
)
from tokenloom.formats._megatron import MegatronWriter, open_megatron
from tokenloom.formats._native import (
    WRITING_MARKER,
    NativeShardWriter,
    NativeWriter,
    adopt_native,
    open_native,
    prepare_output_dir,
    read_native_shard,
    shard_cut,
)
from tokenloom.formats._native_legacy import open_native_v0
from tokenloom.formats._optional import require
from tokenloom.formats._packed import PackedWriter, is_packed, open_packed, read_packed_file
from tokenloom.formats._paths import safe_file
from tokenloom.formats._progress import ProgressCallback
from tokenloom.formats._records import GROUPED_KEYS, RecordStore, open_records
from tokenloom.formats._registry import (
    FormatSpec,
    Validate,
    available_formats,
    detect_format,
    open_dataset,
    open_writer,
    register_format,
)
from tokenloom.formats._safety import check_disjoint, check_replaceable, real_path
from tokenloom.formats._storage import storage_error, storage_errors
from tokenloom.formats._store_bin import BinStore, is_bin_store, open_bin_meta_dataset
from tokenloom.formats._store_h5 import H5Store, is_h5_store, open_h5_dataset
from tokenloom.formats._store_open import detect_store_type, open_store
from tokenloom.formats._store_writers import BinMetaStoreWriter, H5StoreWriter, StoreWriter
from tokenloom.formats._stores import OPTIONAL_TRAINING_TYPE_KEYS, TRAINING_TYPE_KEYS, KeyedStore, StoreFactory
from tokenloom.formats._writer import TokenWriter, check_tokens
from tokenloom.formats.errors import (
    ChecksumError,
    ConfigError,
    DataError,
    FormatError,
    IndexCorruptError,
    MissingFileError,
    MissingKeyError,
    OutputLockedError,
    RecordError,
    ResourceLimitError,
    ResumeMismatchError,
    ShapeMismatchError,
    StorageError,
    TokenRangeError,
    TruncatedError,
    UnsafeFormatError,
    UnsafePathError,
)

register_format(
    FormatSpec(
        name="native",
        description="GPT-Simple .bin + .idx shards (tokenloom adds manifest.json; GPT-Simple's own open without)",
        detect=_native.is_native,
        open=open_native,
        writer=NativeWriter,
    )
)
register_format(
    FormatSpec(
        name="native-v0",
        description="read-only: tokenloom's pre-release native layout, to convert (never detected)",
        detect=lambda path: False,
        open=open_native_v0,
        detectable=False,
    )
)
register_format(
    FormatSpec(
        name="flat",
        description="a directory of 1-D .npy or raw .bin token shards (KempnerForge, tatm)",
        detect=_flat.is_flat,
        open=open_flat,
        writer=FlatWriter,
    )
)
register_format(
    FormatSpec(
        name="megatron",
        description="Megatron-LM MMIDIDX .idx + .bin indexed datasets",
        detect=_megatron.is_megatron,
        open=open_megatron,
        writer=MegatronWriter,
    )
)

register_format(
    FormatSpec(
        name="packed",
        description="Modalities .pbin packed files (current and legacy layouts)",
        detect=is_packed,
        open=open_packed,
        writer=PackedWriter,
    )
)

register_format(
    FormatSpec(
        name="h5",
        description="HDF5 keyed store (AstrAI): a group per key; its 'sequence' key as tokens",
        detect=is_h5_store,
        open=open_h5_dataset,
        writer=H5StoreWriter,
    )
)
register_format(
    FormatSpec(
        name="bin-meta",
        description="<key>.bin + meta.json keyed store (AstrAI); its 'sequence' key as tokens",
        detect=is_bin_store,
        open=open_bin_meta_dataset,
        writer=BinMetaStoreWriter,
    )
)

__all__ = [
    "DOCUMENT_LENGTHS_NAME",
    "EOS_AT_DOCUMENT_END",
    "EOS_PLACEMENT",
    "LOCK_SUFFIX",
    "MANIFEST_NAME",
    "TOKEN_DTYPES",
    "OPTIONAL_TRAINING_TYPE_KEYS",
    "TRAINING_TYPE_KEYS",
    "WRITING_MARKER",
    "BinMetaStoreWriter",
    "BinStore",
    "FileEntry",
    "FlatWriter",
    "MegatronWriter",
    "FormatSpec",
    "H5Store",
    "H5StoreWriter",
    "KeyedStore",
    "Manifest",
    "NativeShardWriter",
    "NativeWriter",
    "PackedWriter",
    "ProgressCallback",
    "Shard",
    "StoreFactory",
    "StoreWriter",
    "TokenDataset",
    "TokenWriter",
    "Validate",
    "ConvertResult",
    "GROUPED_KEYS",
    "RecordStore",
    "open_records",
    "adopt_native",
    "bucket_dirs",
    "open_buckets",
    "open_native_v0",
    "as_token_dtype",
    "convert_dataset",
    "atomic_file",
    "atomic_write_bytes",
    "available_formats",
    "check_disjoint",
    "cli",
    "cli_errors",
    "check_replaceable",
    "check_tokens",
    "real_path",
    "describe_files",
    "detect_format",
    "detect_store_type",
    "file_checksum",
    "fsync_dir",
    "lock_path",
    "output_lock",
    "open_dataset",
    "open_flat",
    "open_megatron",
    "open_native",
    "open_packed",
    "open_store",
    "open_writer",
    "prepare_output_dir",
    "read_manifest",
    "read_native_shard",
    "read_packed_file",
    "register_format",
    "safe_file",
    "shard_cut",
    "smallest_dtype_for_vocab",
    "storage_error",
    "storage_errors",
    "temp_base",
    "temp_path",
    "write_manifest",
    "ChecksumError",
    "ConfigError",
    "DataError",
    "FormatError",
    "IndexCorruptError",
    "MissingFileError",
    "MissingKeyError",
    "OutputLockedError",
    "RecordError",
    "ResourceLimitError",
    "ResumeMismatchError",
    "ShapeMismatchError",
    "StorageError",
    "TokenRangeError",
    "TruncatedError",
    "UnsafeFormatError",
    "UnsafePathError",
    "require",
]
