"""Worker side: one chunk of raw lines -> windowed, EOD-terminated token entries.

Runs in worker processes (or in the parent with ``num_workers=0``). Everything
it receives and returns is plain data, so it pickles cheaply; the tokenizer is
loaded lazily, once per process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson
import xxhash

import tokenloom.tokenize._profile as _profile
from tokenloom.formats import TokenRangeError
from tokenloom.tokenize._gpt_simple import Dropped, check_gpt_simple_pad, gpt_simple_text_of
from tokenloom.tokenize._tokenizer import is_loaded, register_serialized
from tokenloom.tokenize._tokenizer import load as load_tokenizer
from tokenloom.tokenize.engine import (
    DEFAULT_VERIFY_FRACTION,
    HF_REQUESTED,
    SLOW_TOKENIZER,
    Encoder,
    Engine,
    EngineMismatchError,
    load_encoder,
    refuse_fast,
)
from tokenloom.tokenize.inputs import Chunk, Issue, IssueKind
from tokenloom.tokenize.windowing import Windowing, window_documents

__all__ = [
    "ChunkResult",
    "EncodeOptions",
    "EncodeSettings",
    "EngineChoice",
    "choose_engine",
    "encode_chunk",
    "SerializedHandoff",
    "init_worker",
    "probe_in_worker",
    "sample_texts",
    "warm_up",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodeOptions:
    """How a run asks to be encoded, made once where the run is planned (``TokenizeConfig.encode_options``, pack):
    all the executor takes besides the tokenizer and the input files."""

    num_workers: int
    """Threads of this process (the fast engine, up to THREAD_WORKERS_MAX) or worker processes; 0: this thread."""
    eos_id: int | None = None
    """The end-of-document id; None: the tokenizer's EOS."""
    text_field: str = "text"
    engine: str = Engine.AUTO.value
    verify_fraction: float = DEFAULT_VERIFY_FRACTION
    max_line_bytes: int = 64 << 20
    seq_len: int | None = None
    overlap_size: int = 0
    windowing: Windowing = Windowing.TOKENLOOM
    min_text_length: int = 0


@dataclass(frozen=True, slots=True)
class EncodeSettings:
    """What a worker needs to turn lines into entries."""

    tokenizer: str
    text_field: tuple[str, ...]
    eod_id: int
    vocab_size: int
    seq_len: int | None
    overlap_size: int
    dtype: str
    engine: str = Engine.HF.value
    """The engine chosen before the run (hf or fast)."""
    verify_fraction: float = DEFAULT_VERIFY_FRACTION
    """fast: the fraction of documents re-encoded with hf and compared."""
    windowing: str = Windowing.TOKENLOOM.value
    min_text_length: int = 0
    """gpt-simple: documents of fewer characters are dropped (counted as short_text)."""
    refuse_pad: bool = False
    """gpt-simple: refuse documents holding ``<|pad|>`` (GPT-Simple's wrapper adds it; this tokenizer lacks it)."""
    val_fraction: float = 0.0
    """--val-fraction: documents whose seeded hash falls below this fraction go to the validation split."""
    val_seed: int = 0
    """The seed of that hash (--seed)."""


@dataclass(slots=True)
class ChunkResult:
    """The entries of one chunk, in line order, and the chunk's bad records."""

    index: int
    file_index: int
    tokens: npt.NDArray[np.integer]
    lengths: npt.NDArray[np.int64]
    overlap_prefix: npt.NDArray[np.uint16]
    documents: int
    issues: list[Issue]
    num_bytes: int
    source_bytes: int
    dropped: dict[str, int] | None = None
    """gpt-simple rule: documents dropped (short_text, no_tokens) or cut at 10,001 windows (truncated)."""
    val: ChunkResult | None = None
    """--val-fraction: the chunk's documents drawn for validation (the fields above hold the others)."""


def is_validation(texts: list[str], fraction: float, seed: int) -> npt.NDArray[np.bool_]:
    """Which documents belong to the validation split: xxh3-64 of the UTF-8 text, seeded, below ``fraction``.

    A pure function of the text and the seed, so a document lands in the same split on any
    machine, worker count or unit plan (and identical documents land together).
    """
    threshold = int(fraction * (1 << 64))
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter(
        (digest(text.encode("utf-8", "surrogatepass"), seed) < threshold for text in texts), np.bool_, len(texts)
    )


def _text_of(line: bytes, text_field: tuple[str, ...], line_number: int) -> str | Issue:
    issue = functools.partial(Issue, line_number)
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as utf8_exc:
            reason = f"byte {utf8_exc.start}: {utf8_exc.reason}"
            return issue(IssueKind.INVALID_UTF8, f"the line is not valid UTF-8 ({reason})")
        if not line.strip():
            return issue(IssueKind.MALFORMED_JSON, "the line is blank, expected a JSON object")
        return issue(IssueKind.MALFORMED_JSON, f"the line is not valid JSON ({exc})")
    if not isinstance(record, dict):
        return issue(IssueKind.NOT_AN_OBJECT, f"the line is a JSON {type(record).__name__}, expected an object")
    value: object = record
    for depth, key in enumerate(text_field):
        if not isinstance(value, dict) or key not in value:
            path = ".".join(text_field[: depth + 1])
            wanted = ".".join(text_field)
            return issue(
                IssueKind.MISSING_FIELD, f"the record has no field {path!r} (looking for --text-field {wanted!r})"
            )
        value = value[key]
    if not isinstance(value, str):
        kind = type(value).__name__
        return issue(IssueKind.NON_STRING_FIELD, f"field {'.'.join(text_field)!r} is a JSON {kind}, expected a string")
    return value


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """The engine a run uses and why, decided once in the parent before any worker encodes."""

    name: str
    reason: str
    record: dict[str, object]


def sample_texts(chunk: Chunk, text_field: tuple[str, ...], *, limit: int = 256, max_chars: int = 1 << 20) -> list[str]:
    """Up to ``limit`` texts (``max_chars`` in all) of the chunk's good records, for the engine probe."""
    if chunk.texts is not None:  # parquet / Arrow: the reader took the texts out already
        good = (text for text in chunk.texts if text is not None)
    else:
        parsed = (_text_of(line, text_field, chunk.first_line + i) for i, line in enumerate(chunk.lines) if line)
        good = (text for text in parsed if isinstance(text, str))
    texts: list[str] = []
    chars = 0
    for text in good:
        if len(texts) >= limit or chars + len(text) > max_chars:
            break
        texts.append(text)
        chars += len(text)
    return texts


def tokenizer_backend(tokenizer: str) -> object:
    """The loaded tokenizer's Rust backend (else its transformers object): what load_encoder encodes with."""
    loaded = load_tokenizer(tokenizer)
    backend = getattr(loaded, "backend", None)
    return backend if backend is not None else getattr(loaded, "transformers", loaded)


def choose_engine(tokenizer: str, engine: str, sample: list[str], verify_fraction: float) -> EngineChoice:
    """Run the identity probe on a tokenizer without a serialized backend (described by a child) in this process
    when it is loaded here already, else refuse the fast engine (it needs a Rust backend)."""
    if is_loaded(tokenizer):
        source = tokenizer_backend(tokenizer)
    else:  # a slow tokenizer, described by a child: no Rust backend, so no fast engine (never load it here)
        chosen = Engine(engine)
        encoder = refuse_fast(chosen, HF_REQUESTED if chosen is Engine.HF else SLOW_TOKENIZER)
        return EngineChoice(encoder.name, encoder.reason, encoder.record())
    encoder = load_encoder(source, engine, sample, verify_fraction=verify_fraction)
    return EngineChoice(encoder.name, encoder.reason, encoder.record())


_ENCODERS: dict[tuple[str, str, float], Encoder] = {}


def probe_in_worker(tokenizer: str, engine: str, sample: list[str], verify_fraction: float) -> EngineChoice:
    """The identity probe, run in a pool worker that builds the encoder anyway (it keeps the one it chose).

    Why not in the parent: there it builds the hf and fastokens tokenizers a third time while the
    workers build theirs, on the same cores (measured here: 1-3 s of a 5 s run on 110 MB).
    """
    encoder = _cached_encoder(tokenizer, engine, verify_fraction, tuple(sample))
    return EngineChoice(encoder.name, encoder.reason, encoder.record())


def _cached_encoder(tokenizer: str, engine: str, verify_fraction: float, probe: tuple[str, ...] | None) -> Encoder:
    """This worker's encoder: built once per tokenizer and engine, or per probe sample (probe_in_worker; the
    encoder it chose is kept for the engine's chunks)."""
    engine_key = engine if probe is None else f"probe:{engine}:{len(probe)}:{hash(probe)}"
    encoder = _ENCODERS.get((tokenizer, engine_key, verify_fraction))
    if encoder is None:
        source = tokenizer_backend(tokenizer)
        encoder = load_encoder(source, engine, probe or (), verify_fraction=verify_fraction)
        _ENCODERS[tokenizer, engine_key, verify_fraction] = encoder
        if probe is not None:
            _ENCODERS.setdefault((tokenizer, encoder.name, verify_fraction), encoder)
    return encoder


def _texts_of_clean_chunk(lines: list[bytes | None], text_field: tuple[str, ...]) -> list[str] | None:
    """The texts of a chunk in which every line is good, in one pass; None if any line needs a closer look.

    Why: the per-line checks of :func:`_text_of` cost as much as encoding with the fast engine.
    A chunk with any problem is parsed again line by line, so its issues are reported exactly.
    """
    loads = orjson.loads
    try:
        if len(text_field) == 1:
            key = text_field[0]
            texts = [loads(line)[key] for line in lines]  # type: ignore[arg-type]
        else:
            texts = []
            for line in lines:
                value = loads(line)  # type: ignore[arg-type]
                for key in text_field:
                    value = value[key]
                texts.append(value)
    except (orjson.JSONDecodeError, TypeError, KeyError, IndexError):
        return None
    str_type = str
    for text in texts:
        if type(text) is not str_type:  # also catches a list indexed by a key that parsed as an int
            return None
    return texts


def encode_chunk(chunk: Chunk, settings: EncodeSettings, encoder: Encoder | None = None) -> ChunkResult:
    """Parse, encode and window one chunk; bad records become Issues, in line order.

    ``encoder``: the run's encoder when it runs in this process (threads or ``num_workers=0``);
    None in a pool worker, which builds its own once.
    """
    started = time.perf_counter()
    issues = list(chunk.issues)
    gpt_simple = settings.windowing == Windowing.GPT_SIMPLE
    line_drops: dict[str, int] = {}
    text_lines: list[int] | range
    if chunk.texts is not None:  # parquet / Arrow: the reader took the texts out, its bad rows are in issues
        text_lines = [chunk.first_line + i for i, text in enumerate(chunk.texts) if text is not None]
        texts = [text for text in chunk.texts if text is not None]
    else:
        texts = _texts_of_clean_chunk(chunk.lines, settings.text_field)
        if texts is not None and gpt_simple and any(b"\r" in line for line in chunk.lines if line is not None):
            texts = None  # a \r inside a line: GPT-Simple's text mode reads it otherwise; the slow path decides
        if texts is not None:  # every line a JSON object with a string at text_field: no per-line checks needed
            text_lines = range(chunk.first_line, chunk.first_line + len(texts))
        else:
            texts, text_lines = [], []
            for offset, line in enumerate(chunk.lines):
                if line is None:
                    continue
                if gpt_simple:
                    text = gpt_simple_text_of(line, settings.text_field, chunk.first_line + offset, chunk.path)
                else:
                    text = _text_of(line, settings.text_field, chunk.first_line + offset)
                if isinstance(text, Issue):
                    issues.append(text)
                elif isinstance(text, Dropped):
                    line_drops[text.kind] = line_drops.get(text.kind, 0) + 1
                else:
                    texts.append(text)
                    text_lines.append(chunk.first_line + offset)
    issues.sort(key=lambda issue: issue.line)
    if gpt_simple and settings.refuse_pad:
        check_gpt_simple_pad(texts, text_lines, chunk.path)
    dtype = np.dtype(settings.dtype)
    short_texts = 0
    if settings.min_text_length:
        kept = [i for i, text in enumerate(texts) if len(text) >= settings.min_text_length]
        short_texts = len(texts) - len(kept)
        if short_texts:
            texts = [texts[i] for i in kept]
            text_lines = [text_lines[i] for i in kept]
    profiling = _profile.enabled()  # TOKENLOOM_PROFILE=DIR: where this worker's time goes
    parsed, parsed_cpu = time.perf_counter(), time.process_time() if profiling else 0.0
    if texts:
        try:
            if encoder is None:  # a pool worker builds its own once
                encoder = _cached_encoder(settings.tokenizer, settings.engine, settings.verify_fraction, None)
            flat, offsets = encoder.encode_flat(texts)
        except EngineMismatchError as exc:
            record = text_lines[exc.record] if exc.record is not None and exc.record < len(text_lines) else None
            raise EngineMismatchError(
                exc.problem.replace(f"document {exc.record} ", "the document ", 1),
                path=chunk.path,
                record=record,
                field="engine",
                hint="The fast engine cannot be trusted with this tokenizer and input. This run stopped and "
                "can be resumed: rerun the same command with --engine hf (the shards already written were "
                "encoded by the fast engine; add --overwrite to re-encode everything with hf)",
            ) from None
        doc_lengths = np.diff(offsets)
    else:
        doc_lengths = np.zeros(0, dtype=np.int64)
        flat = np.zeros(0, dtype=np.uint32)
    encoded, encoded_cpu = time.perf_counter(), time.process_time() if profiling else 0.0
    max_token_id = int(flat.max()) if len(flat) else -1
    if max_token_id >= settings.vocab_size:
        first_bad = int(np.argmax(flat >= settings.vocab_size))
        doc = int(np.searchsorted(np.cumsum(doc_lengths), first_bad, side="right"))
        raise TokenRangeError(
            f"the tokenizer produced id {int(flat[first_bad])}, outside [0, {settings.vocab_size})",
            path=chunk.path,
            record=text_lines[doc],
            hint="The tokenizer's vocabulary size is inconsistent with its ids; check the tokenizer files",
        )
    window = functools.partial(
        window_documents,
        eod_id=settings.eod_id,
        seq_len=settings.seq_len,
        overlap_size=settings.overlap_size,
        dtype=dtype,
        windowing=settings.windowing,
    )
    val: ChunkResult | None = None
    val_no_tokens = val_truncated = 0
    if settings.val_fraction > 0:
        chosen = is_validation(texts, settings.val_fraction, settings.val_seed)
        token_chosen = np.repeat(chosen, doc_lengths)
        val_entries = window(flat[token_chosen], doc_lengths[chosen])
        val = ChunkResult(
            chunk.index, chunk.file_index, val_entries.tokens, val_entries.lengths, val_entries.overlap_prefix,
            documents=int(chosen.sum()), issues=[], num_bytes=0, source_bytes=0,
        )  # fmt: skip
        flat, doc_lengths = flat[~token_chosen], doc_lengths[~chosen]
        val_no_tokens, val_truncated = val_entries.documents_without_entries, val_entries.truncated_documents
    entries = window(flat, doc_lengths)
    dropped = None
    if settings.windowing == Windowing.GPT_SIMPLE:
        counts = {
            **line_drops,
            "short_text": short_texts,
            "no_tokens": entries.documents_without_entries + val_no_tokens,
            "truncated": entries.truncated_documents + val_truncated,
        }
        dropped = {kind: count for kind, count in counts.items() if count}
    if profiling:
        _profile.add("parse", parsed - started)
        _profile.add("encode", encoded - parsed)
        _profile.add("encode_cpu", encoded_cpu - parsed_cpu)
        _profile.add("window", time.perf_counter() - encoded)
        _profile.add("chunks", 1)
        _profile.flush()
    return ChunkResult(
        index=chunk.index,
        file_index=chunk.file_index,
        tokens=entries.tokens,
        lengths=entries.lengths,
        overlap_prefix=entries.overlap_prefix,
        documents=len(texts) + short_texts - (val.documents if val is not None else 0),
        issues=issues,
        num_bytes=chunk.num_bytes,
        source_bytes=chunk.source_bytes,
        dropped=dropped,
        val=val,
    )


def warm_up(tokenizer: str) -> None:
    """Build the hf tokenizer and import fastokens ahead of the first chunk (errors surface there)."""
    with contextlib.suppress(Exception):
        load_tokenizer(tokenizer)
        import fastokens  # noqa: F401


@dataclass(frozen=True)
class SerializedHandoff:
    """A tokenizer backend's JSON, handed to spawned workers through a private file.

    Passing it as an initializer argument instead would stall the parent: spawn writes the
    arguments to a pipe that each worker drains only after its imports (see executor_for).
    """

    path: str
    digest: str

    @classmethod
    def write(cls, path: Path, serialized: str) -> SerializedHandoff:
        data = serialized.encode("utf-8")
        path.write_bytes(data)
        return cls(str(path), hashlib.blake2b(data, digest_size=16).hexdigest())

    def read(self) -> str:
        data = Path(self.path).read_bytes()
        if hashlib.blake2b(data, digest_size=16).hexdigest() != self.digest:
            raise RuntimeError(
                f"the tokenizer handed to this worker through {self.path} changed after the parent wrote it; "
                "something else writes into tokenloom's private temporary directory"
            )
        return data.decode("utf-8")


def init_worker(
    rayon_threads: int,
    tokenizer: str | None = None,
    serialized: SerializedHandoff | None = None,
    parent_pid: int | None = None,
    environ: dict[str, str] | None = None,
    environ_prefixes: tuple[str, ...] = (),
) -> None:
    """Worker initializer: the owner's environment, the tokenizer's thread pool; exit if the owner dies.

    Runs before any tokenizer is loaded in this process, so the environment
    variables take effect. ``environ`` holds the owner's variables under ``environ_prefixes``
    (a worker forked from the fork server has the server's older environment): they are
    set here, and others under those prefixes removed. A parent killed with SIGKILL cannot
    stop its workers; the watchdog makes them exit within a second instead of lingering:
    when this process's parent changes (a spawned worker's parent is the owner, a forked
    one's the fork server, which exits with the owner) or ``parent_pid`` (the pool owner's
    pid) is gone, so that a worker that starts only after its owner died (already
    re-parented) does not run on.
    ``serialized`` is read here, so the parent may remove its file once the workers run.
    """
    _profile.restart()
    if environ is not None:
        for key in [key for key in os.environ if key.startswith(environ_prefixes) and key not in environ]:
            del os.environ[key]
        os.environ.update(environ)
    os.environ["RAYON_NUM_THREADS"] = str(rayon_threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if rayon_threads > 1 else "false"
    if tokenizer is not None:
        register_serialized(tokenizer, None if serialized is None else serialized.read())
    parent = os.getppid()

    def owner_gone() -> bool:
        if os.getppid() != parent:
            return True
        if parent_pid is None or parent_pid == parent:
            return False
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    if parent == 1 or owner_gone():  # re-parented to init already: the owner (and any fork server) is gone
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if owner_gone():
                os._exit(1)

    threading.Thread(target=watch, name="tokenloom-parent-watchdog", daemon=True).start()
