"""megatron / flat / packed (any format but native): the unit pipeline into a native staging dataset, converted.

    OUT.native-staging/   the unit-planned native run (_units: one process, --num-nodes or Ray), resumable
                          unit by unit exactly as for --format native
        -> whoever finalizes it (its manifest), under OUT's output lock:
           convert_dataset (tokenloom.formats) -> OUT/   megatron: data.bin + data.idx
                                                        packed:   data.pbin
                                                        flat:     shard_NNNNN.npy, document_lengths.i64, manifest.json
        -> the run record, written last (a directory format: its manifest's "tokenize" metadata; else OUT/tokenize.json)
        -> the staging directory is removed (unless keep_staging)

While the conversion runs, OUT holds ``.tokenloom-writing``, so readers refuse
it. A rerun looks at OUT first: a complete output with the same run key is
done (a leftover staging directory is removed); otherwise the staging run
resumes (or confirms itself complete) and the conversion is redone from the
start. A node of several that finds OUT's lock held leaves the conversion to its
holder. Conversion is deterministic, so a kill at any moment followed by a rerun
gives the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenloom.formats import (
    ConfigError,
    FormatSpec,
    OutputLockedError,
    available_formats,
    convert_dataset,
    open_dataset,
    read_manifest,
)
from tokenloom.formats.io import (
    EOS_PLACEMENT,
    LOCK_SUFFIX,
    MANIFEST_NAME,
    WRITING_MARKER,
    atomic_write_bytes,
    fsync_dir,
    output_lock,
    prepare_output_dir,
    temp_base,
)
from tokenloom.tokenize._config import UNIT_FORMAT, TokenizeConfig
from tokenloom.tokenize._diff import check_run_key
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary, summary_of_record
from tokenloom.tokenize._units import replaceable, run_units

__all__ = ["RECORD_NAME", "STAGING_SUFFIX", "output_path", "staging_dir", "tokenize_via_staging"]

#: The run record beside output that has no manifest of its own (a Megatron prefix, a .pbin file).
RECORD_NAME = "tokenize.json"


#: The native staging dataset is a sibling of OUT with this suffix.
STAGING_SUFFIX = ".native-staging"


def staging_dir(output_dir: Path) -> Path:
    """Where the native staging dataset of ``output_dir`` lives: the sibling ``OUT.native-staging``."""
    out = Path(output_dir).absolute()
    return out.with_name(out.name + STAGING_SUFFIX)


def output_path(config: TokenizeConfig) -> Path:
    """What ``open_dataset`` should be given for the final output (OUT itself works too)."""
    return _spec(config).output_path(config.output_dir)


def _spec(config: TokenizeConfig) -> FormatSpec:
    return available_formats()[config.format]


def tokenize_via_staging(
    config: TokenizeConfig, inputs: RunInputs, *, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """Run (or resume, or confirm) a megatron / flat / packed tokenize job; see the module docstring."""
    started = time.perf_counter()
    run_key = inputs.run_key(config)
    staging = staging_dir(config.output_dir)
    done = _check_output(config, run_key)
    if done is not None:
        if not config.keep_staging:
            _remove_staging(staging)
        summary = _summary(config, done, time.perf_counter() - started)
        summary.already_complete = True
        return summary
    staging_config = dataclasses.replace(
        config, format=UNIT_FORMAT, output_dir=staging, drop_overlap_prefix=False, keep_staging=False
    )
    native = run_units(staging_config, inputs, on_progress=on_progress)
    if native.units_missing:  # another node finalizes (and converts)
        native.output_dir, native.format = config.output_dir, config.format
        return native
    try:
        with output_lock(config.output_dir, what="--output-dir"):
            record = _check_output(config, run_key)
            if record is None:  # not converted by another node meanwhile
                staged = read_manifest(staging).metadata["tokenize"]
                record = _convert(config, staging, {**staged, **run_key})
    except OutputLockedError:
        if config.finalize:
            raise
        native.output_dir, native.format = config.output_dir, config.format
        return native  # another node holds OUT: it converts
    if not config.keep_staging:
        _remove_staging(staging)
    summary = _summary(config, record, time.perf_counter() - started)
    summary.examples = native.examples
    summary.resumed_units, summary.units_committed = native.resumed_units, native.units_committed
    summary.run_tokens, summary.bytes_read = native.run_tokens, native.bytes_read
    summary.text_bytes = native.text_bytes
    return summary


def _ours(config: TokenizeConfig, name: str) -> bool:
    base = temp_base(name)  # a crashed writer's NAME.<pid>-<hex>.tmp stands for NAME
    return name == WRITING_MARKER or name.endswith(LOCK_SUFFIX) or base == RECORD_NAME or _spec(config).owns_file(base)


def _read_record(config: TokenizeConfig) -> dict[str, Any] | None:
    """The run record of a complete output in OUT, or None if OUT holds no complete output of this format.

    A format with a directory of its own keeps it in its manifest's metadata, any other in OUT/tokenize.json."""
    out = config.output_dir
    if not out.is_dir() or (out / WRITING_MARKER).exists():
        return None
    if _spec(config).owns_directory:
        if not (out / MANIFEST_NAME).is_file():
            return None
        manifest = read_manifest(out)
        return manifest.metadata.get("tokenize") if manifest.format == config.format else None
    path = out / RECORD_NAME
    if not path.is_file():
        return None
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{RECORD_NAME} is not valid JSON: {exc}", path=path, hint="Pass --overwrite") from None


def _check_output(config: TokenizeConfig, run_key: dict[str, Any]) -> dict[str, Any] | None:
    """The record of OUT if it is complete with this run key; raises if OUT holds something else."""
    out = config.output_dir
    if out.exists() and not out.is_dir():
        raise ConfigError("the output path exists and is not a directory", path=out, field="output_dir")
    if config.overwrite or not out.exists():
        return None
    record = _read_record(config)
    if record is not None:
        check_run_key(record, run_key, out)
        return record
    foreign = sorted(p.name for p in out.iterdir() if not _ours(config, p.name))
    if foreign:
        raise ConfigError(
            f"the output directory is not empty ({foreign[0]!r}) and holds no {config.format} tokenize output",
            path=out,
            field="output_dir",
            hint="Pass --overwrite to replace its files, or choose an empty --output-dir",
        )
    return None


def _remove_staging(staging: Path) -> None:
    if staging.is_dir():
        shutil.rmtree(staging)
        fsync_dir(staging.parent)


def _output_files(config: TokenizeConfig) -> int:
    """The data files of the output (a flat directory's shards; one for a Megatron prefix or a .pbin)."""
    spec = _spec(config)
    return sum(1 for p in config.output_dir.iterdir() if p.suffix in spec.suffixes and spec.owns_file(p.name))


def _summary(config: TokenizeConfig, record: dict[str, Any], seconds: float) -> TokenizeSummary:
    return summary_of_record(
        config.output_dir, record, shards=_output_files(config), seconds=seconds, format=config.format
    )


def _convert(config: TokenizeConfig, staging: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Convert the staging dataset into OUT and publish it with ``record``; returns the full record."""
    out = config.output_dir
    # OUT holds only files of an unfinished run of ours here, or --overwrite was given. Cleared with
    # the marker written first (prepare_output_dir's order), so the old record is never trusted again.
    prepare_output_dir(out, overwrite=True, ours=replaceable(out))
    (out / WRITING_MARKER).touch()
    fsync_dir(out)
    source = open_dataset(staging, format=UNIT_FORMAT)
    spec = _spec(config)
    dtype = source.dtype
    if spec.dtypes and dtype.name not in spec.dtypes:  # Megatron has no uint32: every id < vocab size < 2**31
        dtype = np.dtype(dtype.name.removeprefix("u"))
    options: dict[str, Any] = {"overwrite": True}
    if "shard_size_tokens" in inspect.signature(spec.writer).parameters:  # pyright: ignore[reportArgumentType]
        options["shard_size_tokens"] = config.shard_size_tokens
    record = {
        **record,
        "dtype": dtype.name,
        "eos_id": source.eos_id,
        "vocab_size": source.vocab_size,
        "num_tokens": source.num_tokens,
        "num_entries": len(source),
    }
    if spec.owns_directory:  # the record goes into its manifest, which its writer publishes (removing the marker)
        placement = source.metadata.get(EOS_PLACEMENT)
        options["metadata"] = {"tokenize": record, **({EOS_PLACEMENT: placement} if placement else {})}
    convert_dataset(
        source,
        output_path(config),
        to=config.format,
        dtype=dtype,
        drop_overlap_prefix=config.drop_overlap_prefix,
        writer_options=options,
    )
    if spec.owns_directory:
        return record
    atomic_write_bytes(out / RECORD_NAME, orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    (out / WRITING_MARKER).unlink()
    fsync_dir(out)
    return record
