"""``tokenloom pack``: one jsonl file -> one Modalities packed data file (.pbin).

Modalities' ``create_packed_data``: every document's tokens followed by the EOD
token, in file order, in a single ``.pbin``. A front end of the one pipeline,
as ``tokenize --format packed`` is (:mod:`._staged`):

    FILE -> a plan of one input (_plan.RunInputs) -> run_units into OUTPUT.native-staging
         (resumable unit by unit, the same executor, bad-record handling and progress as tokenize)
         -> convert_dataset into OUTPUT (the formats packed writer: nothing under the final name
            until it is complete) -> the staging directory removed

No windowing (a ``.pbin`` has no overlap-prefix field). A rerun after a kill resumes
after the staging run's committed units.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, fields
from pathlib import Path

from tokenloom.formats import ConfigError, DataError, ResumeMismatchError, convert_dataset, open_dataset
from tokenloom.formats.io import check_disjoint, output_lock, remove_dead_temps
from tokenloom.tokenize._config import UNIT_FORMAT, OnError, TokenizeConfig, default_num_workers
from tokenloom.tokenize._plan import RunInputs, check_tokenizer_files
from tokenloom.tokenize._staged import STAGING_SUFFIX
from tokenloom.tokenize._summary import ProgressCallback, RunCounts
from tokenloom.tokenize._tokenizer import default_tokenizer_path, fingerprint
from tokenloom.tokenize._units import run_units
from tokenloom.tokenize.engine import DEFAULT_VERIFY_FRACTION, Engine
from tokenloom.tokenize.inputs import InputFile, input_suffixes

__all__ = ["PackSummary", "default_pack_path", "pack"]


@dataclass(slots=True, kw_only=True)
class PackSummary(RunCounts):
    output: Path


def default_pack_path(input_file: str | os.PathLike[str]) -> Path:
    """``data.jsonl`` / ``data.jsonl.gz`` -> ``data.pbin`` beside it."""
    path = Path(input_file)
    name = path.name
    suffix = max((s for s in input_suffixes() if name.endswith(s)), key=len, default="")
    name = name[: len(name) - len(suffix)]
    return path.with_name(name + ".pbin")


def pack(
    input_file: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    tokenizer: str | None = None,
    text_field: str = "text",
    num_workers: int | None = None,
    on_error: OnError | str = OnError.RAISE,
    eos_id: int | None = None,
    legacy: bool = False,
    overwrite: bool = False,
    max_line_bytes: int = 64 << 20,
    chunk_lines: int = 1024,
    chunk_bytes: int = 4 << 20,
    engine: Engine | str = Engine.AUTO,
    verify_fraction: float = DEFAULT_VERIFY_FRACTION,
    on_progress: ProgressCallback | None = None,
) -> PackSummary:
    """Tokenize ``input_file`` into the packed file ``output`` (default: beside it, ``.pbin``)."""
    started = time.perf_counter()
    source = Path(input_file)
    if not source.is_file() or not source.name.endswith(input_suffixes()):
        raise ConfigError(
            "expected an existing input file (.jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .parquet or .arrow)",
            path=source,
            hint="Pass the file to pack",
        )
    workers = default_num_workers() if num_workers is None else num_workers
    if workers < 0:
        raise ConfigError(f"num_workers is {workers}, expected >= 0", field="num_workers")
    target = Path(output) if output is not None else default_pack_path(source)
    staging = target.with_name(target.name + STAGING_SUFFIX)
    name = tokenizer or str(default_tokenizer_path())
    check_disjoint([target, staging], [source, *([Path(name)] if Path(name).exists() else [])], target_name="--output")
    if Path(name).is_dir():
        check_tokenizer_files(Path(name))  # a corrupt tokenizer.json: a ConfigError naming it, not a parser traceback
    if (target.exists() or target.is_symlink()) and not overwrite:  # the packed writer's refusal, before encoding
        raise ConfigError(
            f"{target.name} exists",
            path=target,
            hint="Choose a new path or pass --overwrite (overwrite=True in Python)",
        )
    stat = source.stat()
    inputs = RunInputs(name, fingerprint(name), [InputFile(source, source.name, stat.st_size, stat.st_mtime_ns)])
    config = TokenizeConfig(
        input_dir=source.parent,
        output_dir=staging,
        tokenizer=name,
        num_workers=workers,
        text_field=text_field,
        on_error=OnError(on_error),
        eos_id=eos_id,
        max_line_bytes=max_line_bytes,
        chunk_lines=chunk_lines,
        chunk_bytes=chunk_bytes,
        engine=str(engine),
        verify_fraction=verify_fraction,
        overwrite=overwrite,  # a leftover staging run of other settings is replaced, not resumed
    )
    with output_lock(staging, what="--output"):
        try:
            native = run_units(config, inputs, on_progress=on_progress)
        except ResumeMismatchError as exc:  # the staging run's own hint speaks of nodes and --output-dir
            raise ResumeMismatchError(
                exc.problem,
                path=exc.path,
                offset=exc.offset,
                record=exc.record,
                field=exc.field,
                hint=f"Pass --overwrite (overwrite=True in Python) to start afresh, or delete {staging.name}",
            ) from None
    remove_dead_temps(target)  # a pack killed while converting left its temp beside the target
    try:
        convert_dataset(
            open_dataset(staging, format=UNIT_FORMAT),
            target,
            to="packed",
            writer_options={"overwrite": overwrite, "legacy": legacy},
        )
    except DataError:  # the target refused (not a *.pbin, not a file): leave nothing, as the old pack did
        shutil.rmtree(staging)
        raise
    shutil.rmtree(staging)
    summary = PackSummary(output=target, **{f.name: getattr(native, f.name) for f in fields(RunCounts)})
    summary.seconds = time.perf_counter() - started
    return summary
