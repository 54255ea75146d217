"""``tokenloom pack``: one jsonl file -> one Modalities packed data file (.pbin).

Modalities' ``create_packed_data``: every document's tokens followed by the EOD
token, in file order, in a single ``.pbin`` written by the formats packed writer
(nothing is visible under the final name until it is complete). The same
workers, chunking and bad-record handling as ``tokenize``; no windowing (a
``.pbin`` has no overlap-prefix field) and no resume (one file, written at once).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenloom.formats import ConfigError, RecordError, open_writer
from tokenloom.formats.io import check_disjoint
from tokenloom.tokenize._config import OnError, default_num_workers
from tokenloom.tokenize._executor import start_encoding
from tokenloom.tokenize._plan import check_tokenizer_files
from tokenloom.tokenize._summary import EXAMPLES_PER_KIND, RunCounts, report_progress
from tokenloom.tokenize._tokenizer import default_tokenizer_path
from tokenloom.tokenize._worker import EncodeOptions
from tokenloom.tokenize.engine import DEFAULT_VERIFY_FRACTION, Engine
from tokenloom.tokenize.inputs import InputFile, input_suffixes, read_chunks

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
    on_progress: Callable[[int, int, int], None] | None = None,
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
    on_error = OnError(on_error)
    workers = default_num_workers() if num_workers is None else num_workers
    if workers < 0:
        raise ConfigError(f"num_workers is {workers}, expected >= 0", field="num_workers")
    target = Path(output) if output is not None else default_pack_path(source)
    name = tokenizer or str(default_tokenizer_path())
    check_disjoint([target], [source, *([Path(name)] if Path(name).exists() else [])], target_name="--output")
    if Path(name).is_dir():
        check_tokenizer_files(Path(name))  # a corrupt tokenizer.json: a ConfigError naming it, not a parser traceback
    stat = source.stat()
    files = [InputFile(path=source, relative=source.name, size=stat.st_size, mtime_ns=stat.st_mtime_ns)]
    summary = PackSummary(output=target)
    options = EncodeOptions(
        num_workers=workers,
        eos_id=eos_id,
        text_field=text_field,
        engine=str(engine),
        verify_fraction=verify_fraction,
        max_line_bytes=max_line_bytes,
    )
    with start_encoding(name, files, options) as encoding:
        summary.engine, summary.engine_reason = encoding.engine.name, encoding.engine.reason
        chunks = read_chunks(
            files,
            chunk_lines=chunk_lines,
            chunk_bytes=chunk_bytes,
            max_line_bytes=max_line_bytes,
            text_field=text_field,
        )
        with open_writer(
            target,
            format="packed",
            dtype=encoding.dtype,
            vocab_size=encoding.info.vocab_size,
            eos_id=encoding.eos_id,
            legacy=legacy,
            overwrite=overwrite,
        ) as writer:
            for result in encoding.results(chunks):
                for issue in result.issues:
                    if on_error is OnError.RAISE:
                        raise RecordError(issue.message, path=source, record=issue.line, field=issue.kind.value)
                    count = summary.skipped.get(issue.kind.value, 0) + 1
                    summary.skipped[issue.kind.value] = count
                    if count <= EXAMPLES_PER_KIND:
                        summary.examples.append(f"{source}:{issue.line}: {issue.kind.value}: {issue.message}")
                writer.add_batch(result.tokens, result.lengths)
                summary.documents += result.documents
                summary.tokens += len(result.tokens)
                summary.bytes_read += result.source_bytes
                summary.text_bytes += result.num_bytes
                report_progress(
                    on_progress, result.documents, len(result.tokens), result.source_bytes, result.num_bytes
                )
    summary.seconds = time.perf_counter() - started
    summary.dtype = encoding.dtype.name
    summary.eos_id = encoding.eos_id
    return summary
