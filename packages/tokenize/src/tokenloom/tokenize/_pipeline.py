"""The tokenize run: inputs -> chunks -> worker processes -> ordered shards -> manifest.

    read_chunks (parent) --bounded window of futures--> encode_chunk (workers)
        --results in chunk order--> ShardCutter (parent) --> shard_NNNNN.bin/.idx
        --after each shard--> resume journal;  at the end --> manifest.json

Results are consumed strictly in chunk order, so the bytes never depend on the
worker count or timing. At most ``2 * num_workers + 2`` chunks are in flight,
so memory does not grow with the input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats import (
    EOS_AT_DOCUMENT_END,
    EOS_PLACEMENT,
    MANIFEST_NAME,
    WRITING_MARKER,
    ConfigError,
    DataError,
    FileEntry,
    Manifest,
    RecordError,
    ResumeMismatchError,
    fsync_dir,
    prepare_output_dir,
    read_manifest,
    smallest_dtype_for_vocab,
    temp_base,
    write_manifest,
)
from tokenloom.tokenize import _tokenizer
from tokenloom.tokenize._config import OnError, TokenizeConfig, default_num_workers
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._gpt_simple import (
    check_gpt_simple_eod,
    check_gpt_simple_inputs,
    gpt_simple_dtype,
    gpt_simple_pad_is_added,
)
from tokenloom.tokenize._inputs import Chunk, InputFile, Issue, discover_inputs, read_chunks
from tokenloom.tokenize._shards import ShardCutter, ShardRecord, shard_stem
from tokenloom.tokenize._state import STATE_NAME, RunState, read_state, write_state
from tokenloom.tokenize._tokenizer import TokenizerInfo
from tokenloom.tokenize._worker import (
    ChunkResult,
    EncodeSettings,
    EngineChoice,
    SerializedHandoff,
    choose_engine,
    describe_tokenizer,
    encode_chunk,
    init_worker,
    sample_texts,
    warm_up,
)
from tokenloom.tokenize.engine import EngineMismatchError, announce_engine
from tokenloom.tokenize.windowing import Windowing

__all__ = ["RunInputs", "TokenizeSummary", "WorkerDiedError", "choose_run_engine", "tokenize_native"]

log = logging.getLogger("tokenloom.tokenize")
EXAMPLES_PER_KIND = 3
_SHARD_FILE = re.compile(r"shard_(\d+)\.(bin|idx)")


@dataclass(slots=True)
class TokenizeSummary:
    """What a run did (the CLI prints it)."""

    output_dir: Path
    documents: int = 0
    entries: int = 0
    tokens: int = 0
    input_bytes: int = 0
    shards: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    """--windowing gpt-simple: documents dropped by its rule (short_text, no_tokens) or cut (truncated)."""
    examples: list[str] = field(default_factory=list)
    resumed_shards: int = 0
    already_complete: bool = False
    dtype: str = ""
    eos_id: int = -1
    vocab_size: int = 0
    format: str = "native"
    engine: str = ""
    """The encoding engine (hf or fast) of the last session that wrote this output."""
    engine_reason: str = ""
    run_tokens: int = 0
    """Tokens written by this run (a resumed run: not those of the shards it resumed after)."""
    bytes_read: int = 0
    """Bytes of the input files (as stored: compressed for .gz) this run read; the bar counts the same."""

    @property
    def tokens_per_second(self) -> float:
        """This run's tokens over this run's wall time (``seconds``)."""
        return self.run_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_second(self) -> float:
        """This run's input bytes read over this run's wall time, as the progress bar shows it."""
        return self.bytes_read / self.seconds if self.seconds > 0 else 0.0


ProgressCallback = Callable[[int, int, int], None]  # (documents, tokens, bytes on disk) since last call


def _run_key(config: TokenizeConfig, tokenizer_fingerprint: str, files: list[InputFile]) -> dict[str, Any]:
    return {
        "settings": config.output_settings(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "inputs": [f.to_json() for f in files],
    }


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
        base = temp_base(name)
        if _ours(name) or name in (STATE_NAME, _RUN_RECORD, MANIFEST_NAME):
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
        """Input bytes (as stored) consumed by this session, for its rate."""

    def _on_shard(self, record: ShardRecord, entries_consumed: int) -> None:
        self.state.shards.append(record)
        self.state.next_chunk = self._chunk_index
        self.state.skip_entries = entries_consumed
        self.state.counts = self._chunk_counts.copy()
        self.state.file_index = self._file_index
        self.state.file_first_chunk = self._file_first_chunk
        write_state(self.config.output_dir, self.state)

    def _issue(self, result: ChunkResult, issue: Issue) -> None:
        path = self.files[result.file_index].path
        if self.config.on_error is OnError.RAISE:
            raise RecordError(issue.message, path=path, record=issue.line, field=issue.kind.value)
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
                self.files[result.file_index].path,
                result.dropped["truncated"],
            )
        self.counts.input_bytes += result.num_bytes
        self.bytes_read += result.source_bytes
        self._chunk_counts = self.counts.copy()
        self._chunk_index = result.index + 1

    def finish(self) -> None:
        self.cutter.finish(0, ensure_one=not self.state.shards)


HANDOFF_PREFIX = "tokenloom-tokenizer-"
_HANDOFF_DIR = re.compile(re.escape(HANDOFF_PREFIX) + r"(\d+)-[^/]+")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_handoffs(parent: Path) -> list[Path]:
    """Remove this user's tokenizer hand-off directories in ``parent`` whose owner process is gone.

    Why: a tokenize killed with SIGKILL cannot remove its own (about 1 MB per run for a 16k
    vocabulary, more for large ones). The owner's pid is in the name; a live pid (even a reused
    one) keeps its directory.
    """
    removed = []
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            match = _HANDOFF_DIR.fullmatch(entry.name)
            if match is None or _pid_alive(int(match[1])):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                    shutil.rmtree(entry)
                    removed.append(entry)
    if removed:
        log.info(
            "removed %d tokenizer hand-off director%s left by killed runs",
            len(removed),
            "y" if len(removed) == 1 else "ies",
        )
    return removed


def handoff_dir(stack: contextlib.ExitStack) -> Path:
    """A private temporary directory named after this process, removed when ``stack`` closes."""
    parent = Path(tempfile.gettempdir())
    remove_stale_handoffs(parent)
    root = Path(tempfile.mkdtemp(prefix=f"{HANDOFF_PREFIX}{os.getpid()}-", dir=parent))
    stack.callback(shutil.rmtree, root, ignore_errors=True)
    return root


@contextlib.contextmanager
def executor_for(num_workers: int, tokenizer: str, serialized: str | None) -> Iterator[ProcessPoolExecutor]:
    """Worker processes that rebuild ``tokenizer`` from its ``serialized`` backend on first use."""
    # spawn, not fork: a tokenizer (or its thread pool) must never cross a fork. Not
    # forkserver either: its workers' parent is the server, which outlives a killed
    # parent, so the workers' watchdog would never fire.
    threads = max(1, default_num_workers() // num_workers)
    with contextlib.ExitStack() as stack:
        # the backend (about 1 MB of JSON for a 16k vocabulary) goes through a private file, not
        # the initializer's arguments: spawn writes those to a 64 KB pipe that the worker drains
        # only after its imports, so a large argument stalls the parent on each worker in turn
        # (about 0.5 s per worker measured here) instead of letting them start side by side
        handoff = None
        if serialized is not None:
            root = handoff_dir(stack)
            handoff = SerializedHandoff.write(root / "tokenizer.json", serialized)
        executor = stack.enter_context(
            ProcessPoolExecutor(
                max_workers=num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker,
                initargs=(threads, tokenizer, handoff, os.getpid()),
            )
        )
        # start the workers now (one task each), so that they import and build the tokenizer while
        # the parent runs the engine probe, instead of after it
        for _ in range(num_workers):
            executor.submit(warm_up, tokenizer)
        yield executor


def run_ordered(
    executor: Executor | None, chunks: Iterator[Chunk], settings: EncodeSettings, window: int
) -> Iterator[ChunkResult]:
    """encode_chunk over ``chunks``, results in input order, at most ``window`` in flight."""
    if executor is None:
        for chunk in chunks:
            yield encode_chunk(chunk, settings)
        return
    pending: deque[tuple[Chunk, Future[ChunkResult]]] = deque()
    workers: dict[int, Any] = {}  # pid -> multiprocessing.Process, to name how a dead one ended
    chunk: Chunk | None = None
    try:
        for chunk in chunks:
            pending.append((chunk, executor.submit(encode_chunk, chunk, settings)))
            workers.update(getattr(executor, "_processes", None) or {})
            if len(pending) >= window:
                yield pending.popleft()[1].result()
        while pending:
            yield pending.popleft()[1].result()
    except BrokenProcessPool:
        waited = pending[0][0] if pending else chunk  # the chunk whose result the run was waiting for
        raise _worker_died(waited, workers) from None
    finally:
        for _chunk, future in pending:
            future.cancel()


class WorkerDiedError(DataError):
    """An encoding worker process ended abruptly (killed by a signal, most often the kernel's OOM killer)."""

    default_hint = (
        "Rerun with fewer --num-workers (each holds a tokenizer and a few chunks in memory) or with more memory; "
        "the same tokenize command resumes from its completed shards"
    )


def _worker_died(chunk: Chunk | None, workers: dict[int, Any]) -> WorkerDiedError:
    how = []
    for pid, process in sorted(workers.items()):
        code = getattr(process, "exitcode", None)
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            likely = " (likely out of memory: the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            how.append(f"worker pid {pid} was killed by {name}{likely}")
        elif code is not None:
            how.append(f"worker pid {pid} exited with status {code}")
    what = "; ".join(how) if how else "it ended abruptly (likely killed: out of memory?)"
    if chunk is None:
        return WorkerDiedError(f"an encoding worker process died before the first chunk: {what}", field="num_workers")
    lines = f"lines {chunk.first_line}-{chunk.first_line + max(len(chunk.lines), 1) - 1}"
    return WorkerDiedError(
        f"an encoding worker process died while the run waited for chunk {chunk.index} ({lines}): {what}",
        path=chunk.path,
        record=chunk.first_line,
        field="num_workers",
    )


def tokenizer_info(name: str, *, in_process: bool) -> tuple[TokenizerInfo, str | None]:
    """EOS id, vocab size and serialized backend, from a short-lived child (or this process).

    A tokenizer the loaders cannot read (a corrupt tokenizer.json: JSONDecodeError, ...) is a ConfigError.
    """
    try:
        return _tokenizer_info(name, in_process=in_process)
    except (DataError, OSError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the tokenizers/transformers loaders raise plain exceptions on bad files
        raise ConfigError(
            f"tokenizer {name!r} could not be loaded ({type(exc).__name__}: {exc})",
            field="tokenizer",
            hint="Check that --tokenizer names a directory written by save_pretrained (tokenizer.json)",
        ) from exc


def _tokenizer_info(name: str, *, in_process: bool) -> tuple[TokenizerInfo, str | None]:
    if in_process:
        return _tokenizer.local_info(name), None
    plain = _tokenizer.describe_plain(name)  # no transformers import when that is exact
    if plain is not None:
        log.info("tokenizer %s: read tokenizer.json directly (a plain PreTrainedTokenizerFast; fast start)", name)
        return plain
    log.info(
        "tokenizer %s: loading it with transformers.AutoTokenizer in a child process (about 1 s more start-up): "
        "it is not a directory with tokenizer.json and a tokenizer_config.json naming PreTrainedTokenizerFast "
        "with plain settings",
        name,
    )
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(describe_tokenizer, name).result()


def resolve_eos(requested: int | None, info: TokenizerInfo, tokenizer: str) -> int:
    """The end-of-document id: ``requested`` (--eos-id) or the tokenizer's EOS; never a silent default."""
    eos_id = requested if requested is not None else info.eos_id
    if eos_id is None:
        raise ConfigError(
            f"tokenizer {tokenizer!r} has no EOS token, so the end-of-document id is unknown",
            field="eos_id",
            hint="Pass --eos-id N with the id that ends a document in this vocabulary",
        )
    if not 0 <= eos_id < info.vocab_size:
        raise ConfigError(
            f"eos_id {eos_id} is outside the tokenizer's vocabulary of {info.vocab_size}",
            field="eos_id",
        )
    return eos_id


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
    dtype: np.dtype,
    info: TokenizerInfo,
    eos_id: int,
    engine: EngineChoice,
) -> Manifest:
    files = []
    for record in run.state.shards:
        stem = shard_stem(record.index)
        files.append(FileEntry(f"{stem}.idx", record.idx_bytes, record.idx_xxh3_128, "index"))
        files.append(FileEntry(f"{stem}.bin", record.bin_bytes, record.bin_xxh3_128, "data"))
    manifest = Manifest(
        format="native",
        dtype=dtype.name,
        num_tokens=sum(r.num_tokens for r in run.state.shards),
        num_documents=sum(r.num_entries for r in run.state.shards),
        files=tuple(files),
        vocab_size=info.vocab_size,
        eos_id=eos_id,
        tokenizer_fingerprint=run_key["tokenizer_fingerprint"],
        metadata=_manifest_metadata(run, run_key, tokenizer, engine),
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


def _summary_of(manifest: Manifest, out: Path, seconds: float) -> TokenizeSummary:
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


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What a run reads, resolved once: the tokenizer, its fingerprint and the input files."""

    tokenizer: str
    tokenizer_fingerprint: str
    files: list[InputFile]

    @classmethod
    def resolve(cls, config: TokenizeConfig) -> RunInputs:
        tokenizer = config.tokenizer or str(_tokenizer.default_tokenizer_path())
        files = discover_inputs(config.input_dir, hash_contents=config.hash_inputs)
        if config.windowing is Windowing.GPT_SIMPLE:
            check_gpt_simple_inputs(files)
        return cls(tokenizer, _tokenizer.fingerprint(tokenizer), files)

    def run_key(self, config: TokenizeConfig) -> dict[str, Any]:
        return _run_key(config, self.tokenizer_fingerprint, self.files)


def choose_run_engine(
    files: list[InputFile],
    settings: EncodeSettings,
    serialized: str | None,
    engine: str,
    verify_fraction: float,
    max_line_bytes: int,
) -> EngineChoice:
    """Probe the engines on the fixed set plus the input's first documents (the same on every resume)."""
    sample: list[str] = []
    reader = read_chunks(files, chunk_lines=256, chunk_bytes=1 << 20, max_line_bytes=max_line_bytes)
    try:
        with contextlib.suppress(DataError):  # the run itself reports bad input
            for chunk in itertools.islice(reader, 8):
                sample += sample_texts(chunk, settings.text_field, limit=256 - len(sample))
                if len(sample) >= 256:
                    break
    finally:
        getattr(reader, "close", lambda: None)()  # close the file the generator holds open
    choice = choose_engine(settings.tokenizer, serialized, engine, sample, verify_fraction)
    announce_engine(log, choice.name, choice.reason, tokenizer=settings.tokenizer)
    return choice


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
        summary = _summary_of(prepared, out, time.perf_counter() - started)
        summary.already_complete = True
        return summary
    state = prepared
    resumed_shards = len(state.shards)
    try:
        write_state(out, state)  # journal first: from here on a rerun resumes
        (out / WRITING_MARKER).touch()
        _check_published(out, state)
        fsync_dir(out)
        run, dtype, info, eos_id, engine = _encode_all(config, state, inputs, on_progress)
    except BaseException:
        if not state.shards:  # nothing completed: leave no journal, marker or directory behind
            _leave_nothing(out, created=created)
        raise
    manifest = _publish(config, run, run_key, tokenizer, dtype, info, eos_id, engine)
    summary = _summary_of(manifest, out, time.perf_counter() - started)
    summary.examples = run.examples
    summary.resumed_shards = resumed_shards
    summary.run_tokens = sum(record.num_tokens for record in run.state.shards[resumed_shards:])
    summary.bytes_read = run.bytes_read
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
) -> tuple[_Run, np.dtype, TokenizerInfo, int, EngineChoice]:
    """Encode every chunk after the journal's position into shards; the finished run and its facts."""
    out = config.output_dir
    tokenizer, files = inputs.tokenizer, inputs.files
    with contextlib.ExitStack() as stack:
        info, serialized = tokenizer_info(tokenizer, in_process=config.num_workers == 0)  # bad files: ConfigError
        executor = None
        if config.num_workers > 0:
            executor = stack.enter_context(executor_for(config.num_workers, tokenizer, serialized))
        eos_id = resolve_eos(config.eos_id, info, tokenizer)
        if config.windowing is Windowing.GPT_SIMPLE:
            check_gpt_simple_eod(tokenizer, eos_id, eos_id_given=config.eos_id is not None)
            dtype = gpt_simple_dtype(info.vocab_size)
        else:
            dtype = smallest_dtype_for_vocab(info.vocab_size)
        settings = EncodeSettings(
            tokenizer=tokenizer,
            text_field=tuple(config.text_field.split(".")),
            eod_id=eos_id,
            vocab_size=info.vocab_size,
            max_length=config.max_length,
            overlap_size=config.overlap_size,
            dtype=dtype.name,
            windowing=config.windowing.value,
            min_text_length=config.min_text_length,
            refuse_pad=config.windowing is Windowing.GPT_SIMPLE and not gpt_simple_pad_is_added(tokenizer),
        )
        run = _Run(config, state, files, dtype)
        chunks = read_chunks(
            files,
            chunk_lines=config.chunk_lines,
            chunk_bytes=config.chunk_bytes,
            max_line_bytes=config.max_line_bytes,
            start_chunk=state.next_chunk,
            first_file=state.file_index,
            first_file_chunk=state.file_first_chunk,
        )
        engine = choose_run_engine(
            files, settings, serialized, config.engine, config.verify_fraction, config.max_line_bytes
        )
        settings = dataclasses.replace(settings, engine=engine.name, verify_fraction=config.verify_fraction)
        window = 2 * max(config.num_workers, 1) + 2
        try:
            for result in run_ordered(executor, chunks, settings, window):
                run.consume(result)
                if on_progress is not None:
                    on_progress(result.documents, len(result.tokens), result.source_bytes)
            run.finish()
        except (EngineMismatchError, WorkerDiedError):
            run.cutter.abort()  # the journaled shards stay: the same command (with --engine hf) resumes
            raise
        except DataError:
            _discard(out, run)
            raise
        except BaseException:
            run.cutter.abort()
            raise
    return run, dtype, info, eos_id, engine
