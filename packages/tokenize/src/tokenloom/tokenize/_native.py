"""A native run: encoded chunks -> ordered shards -> resume journal -> manifest.

    Encoding.results (in chunk order) --> _Run: issues, counts --> ShardCutter --> shard_NNNNN.bin/.idx
        --after each shard--> resume journal;  at the end --> manifest.json

A rerun with the same run key resumes after the last journaled shard, or
confirms a complete dataset; another run key is a ResumeMismatchError.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats import ConfigError, DataError, Manifest, RecordError, ResumeMismatchError, read_manifest
from tokenloom.formats.io import (
    EOS_AT_DOCUMENT_END,
    EOS_PLACEMENT,
    MANIFEST_NAME,
    WRITING_MARKER,
    FileEntry,
    fsync_dir,
    prepare_output_dir,
    temp_base,
    write_manifest,
)
from tokenloom.tokenize._config import OnError, TokenizeConfig
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._executor import Encoding, WorkerDiedError, encoding_for
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._shards import ShardCutter, ShardRecord, shard_stem
from tokenloom.tokenize._state import STATE_NAME, RunState, read_state, write_state
from tokenloom.tokenize._summary import EXAMPLES_PER_KIND, ProgressCallback, TokenizeSummary, report_progress
from tokenloom.tokenize._unit_files import is_unit_file
from tokenloom.tokenize._worker import ChunkResult, EngineChoice
from tokenloom.tokenize.engine import EngineMismatchError
from tokenloom.tokenize.inputs import InputFile, Issue, read_chunks
from tokenloom.tokenize.windowing import Windowing

__all__ = ["replaceable", "summary_of", "tokenize_native"]

log = logging.getLogger("tokenloom.tokenize")


_SHARD_FILE = re.compile(r"shard_(\d+)\.(bin|idx)")


def tokenize_native(
    config: TokenizeConfig, inputs: RunInputs, *, on_progress: ProgressCallback | None = None
) -> TokenizeSummary:
    """Run (or resume, or confirm) one tokenize job into a native dataset; see the module docstring."""
    started = time.perf_counter()
    tokenizer = inputs.tokenizer
    run_key = inputs.run_key(config)
    created = not config.output_dir.exists()
    prepared = _prepare(config, run_key)
    out = config.output_dir
    if isinstance(prepared, Manifest):
        summary = summary_of(prepared, out, time.perf_counter() - started)
        summary.already_complete = True
        return summary
    state = prepared
    resumed_shards = len(state.shards)
    try:
        write_state(out, state)  # journal first: from here on a rerun resumes
        (out / WRITING_MARKER).touch()
        _check_published(out, state)
        fsync_dir(out)
        run, encoding = _encode_all(config, state, inputs, on_progress)
    except BaseException:
        if not state.shards:  # nothing completed: leave no journal, marker or directory behind
            _leave_nothing(out, created=created)
        raise
    manifest = _publish(config, run, run_key, tokenizer, encoding)
    summary = summary_of(manifest, out, time.perf_counter() - started)
    summary.examples = run.examples
    summary.resumed_shards = resumed_shards
    summary.run_tokens = sum(record.num_tokens for record in run.state.shards[resumed_shards:])
    summary.bytes_read = run.bytes_read
    summary.text_bytes = run.text_bytes
    return summary


def _leave_nothing(out: Path, *, created: bool) -> None:
    """Remove what a run that completed no shard wrote (and OUT itself if this run created it)."""
    with contextlib.suppress(OSError):
        for path in out.iterdir():
            if _ours(path.name) or path.name == STATE_NAME:
                path.unlink()
        if created:
            out.rmdir()
        else:
            fsync_dir(out)


def _encode_all(
    config: TokenizeConfig, state: RunState, inputs: RunInputs, on_progress: ProgressCallback | None
) -> tuple[_Run, Encoding]:
    """Encode every chunk after the journal's position into shards; the finished run and its encoder."""
    with encoding_for(config, inputs.tokenizer, inputs.files) as encoding:
        run = _Run(config, state, inputs.files, encoding.dtype)
        chunks = read_chunks(
            inputs.files,
            chunk_lines=config.chunk_lines,
            chunk_bytes=config.chunk_bytes,
            max_line_bytes=config.max_line_bytes,
            text_field=config.text_field,
            start_chunk=state.next_chunk,
            first_file=state.file_index,
            first_file_chunk=state.file_first_chunk,
        )
        try:
            for result in encoding.results(chunks):
                run.consume(result)
                report_progress(
                    on_progress, result.documents, len(result.tokens), result.source_bytes, result.num_bytes
                )
            run.finish()
        except (EngineMismatchError, WorkerDiedError):
            run.cutter.abort()  # the journaled shards stay: the same command (with --engine hf) resumes
            raise
        except DataError:
            _discard(config.output_dir, run)
            raise
        except BaseException:
            run.cutter.abort()
            raise
    return run, encoding


def _chunking(config: TokenizeConfig) -> dict[str, int]:
    return {"chunk_lines": config.chunk_lines, "chunk_bytes": config.chunk_bytes}


def _mismatch(out: Path, what: str, recorded: dict[str, Any], wanted: dict[str, Any]) -> ResumeMismatchError:
    differences = run_key_differences(recorded, wanted)
    return ResumeMismatchError(
        f"the output directory holds {what} written with other settings, tokenizer or inputs: "
        + "; ".join(differences),
        path=out,
        hint="Pass --overwrite to replace it, or choose another --output-dir",
    )


def _prepare(config: TokenizeConfig, run_key: dict[str, Any]) -> RunState | Manifest:
    """A fresh or resumed journal, or the manifest of a run already complete with these settings."""
    out = config.output_dir
    if out.exists() and not out.is_dir():
        raise ConfigError("the output path exists and is not a directory", path=out, field="output_dir")
    if config.overwrite or not out.exists():
        prepare_output_dir(out, overwrite=config.overwrite, ours=replaceable(out))
        return RunState(run_key={**run_key, "chunking": _chunking(config)})
    state = read_state(out)
    if state is not None:
        if state.run_key != {**run_key, "chunking": _chunking(config)}:
            if not state.shards:  # no shard completed: a corrected rerun simply starts afresh
                return RunState(run_key={**run_key, "chunking": _chunking(config)})
            raise _mismatch(
                out, "an unfinished tokenize run", state.run_key, {**run_key, "chunking": _chunking(config)}
            )
        return state
    if (out / MANIFEST_NAME).exists() and not (out / WRITING_MARKER).exists():
        manifest = read_manifest(out)
        recorded = manifest.metadata.get("tokenize", {})
        if {k: recorded.get(k) for k in run_key} != run_key:
            raise _mismatch(out, "a dataset", recorded, run_key)
        return manifest
    if any(not _ours(path.name) for path in out.iterdir()):
        raise ConfigError(
            "the output directory is not empty and holds no tokenize run to resume",
            path=out,
            field="output_dir",
            hint="Pass --overwrite to replace its files, or choose an empty --output-dir",
        )
    return RunState(run_key={**run_key, "chunking": _chunking(config)})


def _ours(name: str) -> bool:
    """Files a run killed before its first journal write can leave behind."""
    return name == WRITING_MARKER or name.endswith(".tmp") or _SHARD_FILE.fullmatch(name) is not None


_TOKENIZE_OUTPUT = re.compile(
    r"data\.(bin|idx|pbin|tokenloom\.json|pbin\.tokenloom\.json)|shard_\d+\.npy|document_lengths\.i64"
)


_RUN_RECORD = "tokenize.json"


def replaceable(out: Path) -> Callable[[str], bool]:
    """Names in ``out`` that --overwrite may delete: files of a tokenize run of any format."""
    has_record = (out / _RUN_RECORD).is_file()

    def ours(name: str) -> bool:
        base = temp_base(name)  # a crashed writer's NAME.<pid>-<hex>.tmp stands for NAME
        if _ours(name) or is_unit_file(name) or name in (STATE_NAME, _RUN_RECORD, MANIFEST_NAME):
            return True
        return has_record and _TOKENIZE_OUTPUT.fullmatch(base) is not None

    return ours


def _check_published(out: Path, state: RunState) -> None:
    """Published shards must be as journaled; anything after them is stale and removed."""
    for record in state.shards:
        for suffix, size in ((".bin", record.bin_bytes), (".idx", record.idx_bytes)):
            path = out / f"{shard_stem(record.index)}{suffix}"
            if not path.is_file() or path.stat().st_size != size:
                raise ResumeMismatchError(
                    f"{path.name} is missing or has changed since it was written ({size} bytes journaled)",
                    path=path,
                    hint="Pass --overwrite to start the run afresh",
                )
    for path in out.iterdir():
        match = _SHARD_FILE.fullmatch(path.name)
        if path.name.endswith(".tmp") or (match is not None and int(match[1]) >= len(state.shards)):
            path.unlink()


class _Run:
    """Consumes chunk results in order: reports issues, feeds shards, journals progress."""

    def __init__(self, config: TokenizeConfig, state: RunState, files: list[InputFile], dtype: np.dtype) -> None:
        self.config = config
        self.state = state
        self.files = files
        self.counts = state.counts.copy()
        self.examples: list[str] = []
        self.cutter = ShardCutter(
            config.output_dir,
            dtype=dtype,
            shard_size_tokens=config.shard_size_tokens,
            first_shard=len(state.shards),
            on_shard=self._on_shard,
        )
        self._chunk_index = state.next_chunk
        self._chunk_counts = state.counts.copy()  # counts of the chunks before the current one
        self._file_index = state.file_index
        self._file_first_chunk = state.file_first_chunk
        self.bytes_read = 0
        """Input bytes (as stored) consumed by this session."""
        self.text_bytes = 0
        """Bytes of text (decompressed) this session encoded, for its rate."""

    def _on_shard(self, record: ShardRecord, entries_consumed: int) -> None:
        self.state.shards.append(record)
        self.state.next_chunk = self._chunk_index
        self.state.skip_entries = entries_consumed
        self.state.counts = self._chunk_counts.copy()
        self.state.file_index = self._file_index
        self.state.file_first_chunk = self._file_first_chunk
        write_state(self.config.output_dir, self.state)

    def _issue(self, result: ChunkResult, issue: Issue) -> None:
        path = self.files[result.file_index].shown
        if self.config.on_error is OnError.RAISE:
            raise RecordError(issue.message, path=path, offset=issue.offset, record=issue.line, field=issue.kind.value)
        kind = issue.kind.value
        self.counts.skipped[kind] = self.counts.skipped.get(kind, 0) + 1
        if self.counts.skipped[kind] <= EXAMPLES_PER_KIND:
            self.examples.append(f"{path}:{issue.line}: {kind}: {issue.message}")

    def consume(self, result: ChunkResult) -> None:
        self._chunk_index = result.index
        if result.file_index != self._file_index:
            self._file_index, self._file_first_chunk = result.file_index, result.index
        for issue in result.issues:
            self._issue(result, issue)
        skip = self.state.skip_entries if result.index == self.state.next_chunk else 0
        self.cutter.feed(result.tokens, result.lengths, result.overlap_prefix, skip_entries=skip)
        self.counts.documents += result.documents
        for kind, count in (result.dropped or {}).items():
            self.counts.dropped[kind] = self.counts.dropped.get(kind, 0) + count
        if result.dropped and result.dropped.get("truncated"):
            log.warning(
                "%s: %d document(s) need more than 10,001 windows; as GPT-Simple does, only the first 10,001 are "
                "written and the rest of each such document is dropped",
                self.files[result.file_index].shown,
                result.dropped["truncated"],
            )
        self.counts.input_bytes += result.num_bytes
        self.bytes_read += result.source_bytes
        self.text_bytes += result.num_bytes
        self._chunk_counts = self.counts.copy()
        self._chunk_index = result.index + 1

    def finish(self) -> None:
        self.cutter.finish(0, ensure_one=not self.state.shards)


def _manifest_metadata(run: _Run, run_key: dict[str, Any], tokenizer: str, engine: EngineChoice) -> dict[str, Any]:
    placement = {EOS_PLACEMENT: EOS_AT_DOCUMENT_END} if run.config.windowing is Windowing.GPT_SIMPLE else {}
    return {
        **placement,
        "tokenize": {
            **run_key,
            "tokenizer": tokenizer,
            "engine": engine.record,
            "documents": run.counts.documents,
            "input_bytes": run.counts.input_bytes,
            "skipped": dict(sorted(run.counts.skipped.items())),
            **({"dropped": dict(sorted(run.counts.dropped.items()))} if run.counts.dropped else {}),
        },
    }


def _publish(
    config: TokenizeConfig,
    run: _Run,
    run_key: dict[str, Any],
    tokenizer: str,
    encoding: Encoding,
) -> Manifest:
    files = []
    for record in run.state.shards:
        stem = shard_stem(record.index)
        files.append(FileEntry(f"{stem}.idx", record.idx_bytes, record.idx_xxh3_128, "index"))
        files.append(record.bin_entry(stem))
    manifest = Manifest(
        format="native",
        dtype=encoding.dtype.name,
        num_tokens=sum(r.num_tokens for r in run.state.shards),
        num_documents=sum(r.num_entries for r in run.state.shards),
        files=tuple(files),
        vocab_size=encoding.info.vocab_size,
        eos_id=encoding.eos_id,
        tokenizer_fingerprint=run_key["tokenizer_fingerprint"],
        metadata=_manifest_metadata(run, run_key, tokenizer, encoding.engine),
    )
    out = config.output_dir
    manifest = write_manifest(out, manifest)
    # marker before journal: a crash in between leaves a journal, and a rerun republishes
    (out / WRITING_MARKER).unlink(missing_ok=True)
    fsync_dir(out)
    (out / STATE_NAME).unlink(missing_ok=True)
    fsync_dir(out)
    return manifest


def _discard(out: Path, run: _Run) -> None:
    """After a data error in raise mode: remove every file of this run, publish nothing."""
    run.cutter.abort()
    for path in out.iterdir():
        if path.name.startswith("shard_") or path.name in (STATE_NAME, WRITING_MARKER):
            path.unlink()
    fsync_dir(out)


def summary_of(manifest: Manifest, out: Path, seconds: float) -> TokenizeSummary:
    recorded = manifest.metadata.get("tokenize", {})
    return TokenizeSummary(
        output_dir=out,
        documents=int(recorded.get("documents", 0)),
        entries=manifest.num_documents,
        tokens=manifest.num_tokens,
        input_bytes=int(recorded.get("input_bytes", 0)),
        shards=sum(1 for f in manifest.files if f.name.endswith(".idx")),
        seconds=seconds,
        skipped=dict(recorded.get("skipped", {})),
        dropped=dict(recorded.get("dropped", {})),
        dtype=manifest.dtype,
        eos_id=manifest.eos_id if manifest.eos_id is not None else -1,
        vocab_size=manifest.vocab_size or 0,
        engine=str(recorded.get("engine", {}).get("name", "")),
        engine_reason=str(recorded.get("engine", {}).get("reason", "")),
    )
