"""The one executor of tokenize: every run (native, staged, pack, a tree, a unit task's driver) encodes through it.

    start_encoding: tokenizer facts (EOS id, vocabulary, serialized backend), EOS id, dtype, then
        fast engine possible (a Rust backend, --engine auto/fast, --num-workers <= THREAD_WORKERS_MAX):
            the engine probe in this process -> fast: threads of this process share its one encoder
                                             -> hf (auto fell back): worker processes, as below
        otherwise: worker processes (forked from a fork server with tokenloom imported; spawn where
            there is none; the backend handed over through a private file), the engine probe in a
            worker (which keeps the encoder it chose)
        --num-workers 0: everything in this process, the engine probed here
    run_ordered(chunks): encode_chunk on the threads or workers, results in chunk order,
        at most ``2 * num_workers + 2`` chunks in flight; a dead worker is a WorkerDiedError
        (the text transform, _transform.TextTransform, calls it)

Results are consumed strictly in chunk order, so the bytes never depend on the
worker count, the kind of worker or timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tokenloom.formats import ConfigError, DataError
from tokenloom.formats.io import pid_alive, smallest_dtype_for_vocab
from tokenloom.tokenize._config import default_num_workers
from tokenloom.tokenize._gpt_simple import check_gpt_simple_eod, gpt_simple_dtype, gpt_simple_pad_is_added
from tokenloom.tokenize._tokenizer import TokenizerInfo, describe, local_info, plain_backend
from tokenloom.tokenize._worker import (
    ChunkResult,
    EncodeOptions,
    EncodeSettings,
    EngineChoice,
    SerializedHandoff,
    choose_engine,
    encode_chunk,
    init_worker,
    probe_in_worker,
    sample_texts,
    tokenizer_backend,
    warm_up,
)
from tokenloom.tokenize.engine import (
    MAX_FAST_ADDED_TOKENS,
    Encoder,
    Engine,
    announce_engine,
    build_fast,
    load_encoder,
)
from tokenloom.tokenize.inputs import Chunk, InputFile, read_chunks
from tokenloom.tokenize.windowing import Windowing

__all__ = [
    "HANDOFF_PREFIX",
    "THREAD_WORKERS_MAX",
    "Encoding",
    "WorkerDiedError",
    "executor_for",
    "remove_stale_handoffs",
    "run_ordered",
    "spawn_pool",
    "start_encoding",
]

log = logging.getLogger("tokenloom.tokenize")
_T = TypeVar("_T")

#: The engine probe takes at most this many of the input's first documents ...
PROBE_INPUT_TEXTS = 256
#: ... and at most this many characters of them.
PROBE_INPUT_CHARS = 128 << 10
#: With the fast engine, up to this many --num-workers are threads of this process: one tokenizer
#: build, no process start, no lines or ids pickled between processes. fastokens encodes a batch on
#: its own threads without the GIL; what holds the GIL (reading lines, orjson, handing texts to
#: fastokens, windowing) is most of a run's wall time on 2 cores (py-spy, docs/benchmarks.md #24), so
#: one process keeps about 2-3 cores busy; more workers than this run as processes. An estimate from
#: a 2-core machine, not measured on more cores.
THREAD_WORKERS_MAX = 4
#: With more than one encoding thread, each encodes its own chunk on its own thread: fastokens' own
#: worker threads (one more per encode by default) would only contend for the same cores, and each keeps
#: per-thread memory that grows with the input before it levels off (110 -> 660 MB of input here: peak RSS
#: 245 -> 291 MiB with them, 211 -> 236 MiB without, at the same speed; docs/benchmarks.md #24).
FASTOKENS_THREADS_ENV = "FASTOKENS_BPE_THREADS"


@dataclass(frozen=True, slots=True)
class Encoding:
    """A started encoder: the tokenizer's facts, the chosen engine, and the workers (None: this process)."""

    settings: EncodeSettings
    info: TokenizerInfo
    dtype: np.dtype
    chosen: EngineChoice
    executor: Executor | None
    window: int
    """Chunks in flight at most: ``2 * num_workers + 2``, so memory does not grow with the input."""
    encoder: Encoder | None = None
    """The encoder, when chunks are encoded in this process (threads, or ``num_workers=0``)."""

    @property
    def eos_id(self) -> int:
        return self.settings.eod_id

    @property
    def engine(self) -> EngineChoice:
        """The engine of this run (hf or fast), chosen by the probe when the encoder started."""
        return self.chosen


@contextlib.contextmanager
def start_encoding(tokenizer: str, files: list[InputFile], options: EncodeOptions) -> Iterator[Encoding]:
    """Start the encoder of one run (native, staged or pack): facts, workers, EOS, dtype, engine.

    Worker processes start first, so that they import and build the tokenizer while this
    process resolves the EOS id and probes the engines; threads start with fastokens'
    build. Closing the context stops them.
    """
    num_workers, engine, verify_fraction = options.num_workers, options.engine, options.verify_fraction
    gpt_simple = options.windowing is Windowing.GPT_SIMPLE
    with contextlib.ExitStack() as stack:
        info, serialized, backend = _tokenizer_info_here(tokenizer, in_process=num_workers == 0)  # ConfigError
        # the fast engine needs a Rust backend; on it, threads of this process replace worker processes
        threads = 0 < num_workers <= THREAD_WORKERS_MAX and serialized is not None and engine != Engine.HF
        executor: Executor | None = None
        fast = None
        if threads and serialized is not None and wants_fast(backend, engine):
            # fastokens builds on a thread of the pool (without the GIL) while this one reads the probe's sample
            remove_stale_handoffs(Path(tempfile.gettempdir()))  # as a run on worker processes does
            if num_workers > 1 and FASTOKENS_THREADS_ENV not in os.environ:  # (unless the user chose)
                os.environ[FASTOKENS_THREADS_ENV] = "1"  # read when fastokens starts a thread: before the first encode
                stack.callback(os.environ.pop, FASTOKENS_THREADS_ENV, None)  # the run's own setting, not the process's
            executor = stack.enter_context(thread_pool(num_workers))
            fast = executor.submit(build_fast, serialized).result
        elif num_workers > 0 and not threads:
            executor = stack.enter_context(executor_for(num_workers, tokenizer, serialized))
        eod_id = resolve_eos(options.eos_id, info, tokenizer)
        if gpt_simple:
            check_gpt_simple_eod(tokenizer, eod_id, eos_id_given=options.eos_id is not None)
            dtype = gpt_simple_dtype(info.vocab_size)
        else:
            dtype = smallest_dtype_for_vocab(info.vocab_size)
        settings = EncodeSettings(
            tokenizer=tokenizer,
            text_field=tuple(options.text_field.split(".")),
            eod_id=eod_id,
            vocab_size=info.vocab_size,
            seq_len=options.seq_len,
            overlap_size=options.overlap_size,
            dtype=dtype.name,
            windowing=options.windowing.value,
            min_text_length=options.min_text_length,
            refuse_pad=gpt_simple and not gpt_simple_pad_is_added(tokenizer),
        )
        window = 2 * max(num_workers, 1) + 2
        sample = probe_sample(files, settings, options.max_line_bytes)  # the same first documents on every resume
        if num_workers == 0 or threads:  # the probe here, and the encoder it chose kept for the run
            source = backend if backend is not None else local_source(tokenizer, serialized)
            built = load_encoder(source, engine, sample, verify_fraction=verify_fraction, fast_engine=fast)
            choice = EngineChoice(built.name, built.reason, built.record())
            encoder: Encoder | None = built
            announce_engine(log, choice.name, choice.reason, tokenizer=tokenizer)
            if threads and choice.name != Engine.FAST:  # auto fell back to hf: its Python lists want processes
                executor = stack.enter_context(executor_for(num_workers, tokenizer, serialized))
                encoder = None
            settings = dataclasses.replace(settings, engine=choice.name, verify_fraction=verify_fraction)
            yield Encoding(settings, info, dtype, choice, executor, window, encoder=encoder)
            return
        if executor is not None and serialized is not None:  # a worker probes (and keeps the encoder it chose)
            probing = executor.submit(probe_in_worker, settings.tokenizer, engine, sample, verify_fraction)
            try:
                choice = _result(probing, executor)
            except BrokenProcessPool:
                raise _worker_died(None, dict(getattr(executor, "_processes", None) or {})) from None
        else:  # worker processes for a tokenizer without a Rust backend (described by a child): no fast engine
            choice = choose_engine(settings.tokenizer, engine, sample, verify_fraction)
        announce_engine(log, choice.name, choice.reason, tokenizer=settings.tokenizer)
        settings = dataclasses.replace(settings, engine=choice.name, verify_fraction=verify_fraction)
        yield Encoding(settings, info, dtype, choice, executor, window)


def local_source(tokenizer: str, serialized: str | None) -> object:
    """The tokenizer to encode with in this process: its serialized backend rebuilt, else loaded here."""
    if serialized is not None:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(serialized)
    return tokenizer_backend(tokenizer)  # num_workers=0, a tokenizer only transformers describes: loaded here


def wants_fast(source: object, engine: str) -> bool:
    """Whether load_encoder will build fastokens for ``source`` (so that building it early is not wasted)."""
    if engine == Engine.HF or not hasattr(source, "get_added_tokens_decoder"):
        return False
    return engine == Engine.FAST or len(source.get_added_tokens_decoder()) <= MAX_FAST_ADDED_TOKENS  # type: ignore[attr-defined]


@contextlib.contextmanager
def thread_pool(num_workers: int) -> Iterator[ThreadPoolExecutor]:
    """Encoding threads of this process; closing waits for the chunks they hold (queued ones are dropped)."""
    executor = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="tokenloom-encode")
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _tokenizer_info_here(name: str, *, in_process: bool) -> tuple[TokenizerInfo, str | None, Any]:
    """EOS id, vocab size and serialized backend, from a short-lived child (or this process), and the
    ``tokenizers.Tokenizer`` read from a plain tokenizer.json (else None); an unreadable tokenizer is a ConfigError."""
    try:
        plain = plain_backend(name)  # no transformers import when that is exact
        if in_process and plain is None:
            return local_info(name), None, None
        if plain is not None:
            log.info("tokenizer %s: read tokenizer.json directly (a plain PreTrainedTokenizerFast; fast start)", name)
            return plain[0], plain[1].to_str(), plain[1]
        log.info(
            "tokenizer %s: loading it with transformers.AutoTokenizer in a child process (about 1 s more start-up): "
            "it is not a directory with tokenizer.json and a tokenizer_config.json naming PreTrainedTokenizerFast "
            "with plain settings",
            name,
        )
        with spawn_pool(1) as child:
            return (*child.submit(describe, name).result(), None)  # the tokenizer loaded in the child
    except (DataError, OSError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the tokenizers/transformers loaders raise plain exceptions on bad files
        raise ConfigError(
            f"tokenizer {name!r} could not be loaded ({type(exc).__name__}: {exc})",
            field="tokenizer",
            hint="Check that --tokenizer names a directory written by save_pretrained (tokenizer.json)",
        ) from exc


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


def probe_sample(files: list[InputFile], settings: EncodeSettings, max_line_bytes: int) -> list[str]:
    """The engine probe's texts: the input's first documents, the same on every resume.

    At most PROBE_INPUT_TEXTS documents and PROBE_INPUT_CHARS characters (the last one cut to fit: both
    engines must agree on a prefix as on any text): measured here, the probe's hf encode of a 1 MiB sample
    alone took 0.5-2 s, as long as a whole 100 MB run on the fast engine; --verify-fraction keeps comparing
    documents after it.
    """
    sample: list[str] = []
    chars = 0
    reader = read_chunks(
        files, chunk_lines=256, chunk_bytes=1 << 20, max_line_bytes=max_line_bytes, text_field=settings.text_field
    )
    try:
        with contextlib.suppress(DataError):  # the run itself reports bad input
            for chunk in itertools.islice(reader, 8):
                for text in sample_texts(chunk, settings.text_field, limit=PROBE_INPUT_TEXTS - len(sample)):
                    text = text[: PROBE_INPUT_CHARS - chars]  # a prefix is as good a probe: both engines get it
                    sample.append(text)
                    chars += len(text)
                    if chars >= PROBE_INPUT_CHARS:
                        break
                if len(sample) >= PROBE_INPUT_TEXTS or chars >= PROBE_INPUT_CHARS:
                    break
    finally:
        getattr(reader, "close", lambda: None)()  # close the file the generator holds open
    return sample


#: What the fork server imports once, so that each worker forked from it starts with them loaded.
FORKSERVER_PRELOAD = ["tokenloom.tokenize._worker"]
#: Environment variables a worker takes from the pool owner when the pool starts (see :func:`worker_environ`).
WORKER_ENV_PREFIXES = ("TOKENLOOM_", "HF_", "TOKENIZERS_", "TRANSFORMERS_", "RAYON_", "MALLOC_")


def spawn_pool(
    max_workers: int, *, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """Every process pool of tokenize (encoding workers, the tokenizer-describing child) is made here.

    forkserver (spawn where there is none): a tokenizer (or its thread pool) must never cross
    a fork, and the server never builds one: it only imports numpy and tokenloom's worker
    modules (FORKSERVER_PRELOAD), once per process, so a worker forked from it skips the
    0.3 CPU-s of imports that each spawned worker paid (measured here; the server is started
    once and serves every later pool of this process). A worker's parent is the server, which
    exits when this process dies (its end of the server's pipe closes); the workers' watchdog
    (:func:`init_worker`) then sees its parent change.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context: Any = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(FORKSERVER_PRELOAD)  # takes effect when the server first starts
    else:
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        max_workers=max_workers,
        mp_context=context,
        initializer=initializer,
        initargs=initargs,
    )


def worker_environ() -> dict[str, str]:
    """The variables (WORKER_ENV_PREFIXES) that tokenize's workers read, as this process has them now.

    Why: a worker forked from the fork server has the server's environment, taken when the
    server started (maybe many runs earlier in a long-lived process); init_worker applies these.
    """
    return {key: value for key, value in os.environ.items() if key.startswith(WORKER_ENV_PREFIXES)}


HANDOFF_PREFIX = "tokenloom-tokenizer-"


_HANDOFF_DIR = re.compile(re.escape(HANDOFF_PREFIX) + r"(\d+)-([0-9a-f]{8})-[^/]+")


def _pid_space() -> str:
    """Where this process's pids mean something: its host and pid namespace, as 8 hex digits.

    A temp dir may be shared by machines (TMPDIR on a cluster file system, one Slurm array
    on many nodes) or by containers (a bind-mounted /tmp, another pid namespace): a pid is
    only evidence about a directory made in the same pid space.
    """
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.blake2b(f"{socket.gethostname()}\0{namespace}".encode(), digest_size=4).hexdigest()


def remove_stale_handoffs(parent: Path) -> list[Path]:
    """Remove this user's tokenizer hand-off directories in ``parent`` whose owner process is gone.

    Why: a tokenize killed with SIGKILL cannot remove its own (about 1 MB per run for a 16k
    vocabulary, more for large ones). The owner's pid and pid space (host, pid namespace) are
    in the name; a live pid (even a reused one) keeps its directory, and so does a directory made
    on another host or in another pid namespace, whose pid says nothing here.
    """
    removed = []
    here = _pid_space()
    names: list[str] = []
    with contextlib.suppress(OSError):  # a shared /tmp holds thousands of entries: names only, prefix first
        names = [name for name in os.listdir(parent) if name.startswith(HANDOFF_PREFIX)]
    for name in names:
        match = _HANDOFF_DIR.fullmatch(name)
        if match is None or match[2] != here or pid_alive(int(match[1])):
            continue
        entry = parent / name
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
    root = Path(tempfile.mkdtemp(prefix=f"{HANDOFF_PREFIX}{os.getpid()}-{_pid_space()}-", dir=parent))
    stack.callback(shutil.rmtree, root, ignore_errors=True)
    return root


@contextlib.contextmanager
def executor_for(num_workers: int, tokenizer: str, serialized: str | None) -> Iterator[ProcessPoolExecutor]:
    """Worker processes that rebuild ``tokenizer`` from its ``serialized`` backend on first use."""
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
        initargs = (threads, tokenizer, handoff, os.getpid(), worker_environ(), WORKER_ENV_PREFIXES)
        executor = spawn_pool(num_workers, initializer=init_worker, initargs=initargs)
        stack.callback(_shutdown, executor)
        # start the workers now (one task each), so that they import and build the tokenizer while
        # the parent runs the engine probe, instead of after it
        for _ in range(num_workers):
            executor.submit(warm_up, tokenizer)
        yield executor


def run_ordered(
    executor: Executor | None,
    chunks: Iterator[Chunk],
    settings: EncodeSettings,
    window: int,
    *,
    encoder: Encoder | None = None,
) -> Iterator[ChunkResult]:
    """encode_chunk over ``chunks``, results in input order, at most ``window`` in flight.

    ``encoder``: the run's encoder for threads of this process (never sent to a worker process).
    """
    if executor is None:
        for chunk in chunks:
            yield encode_chunk(chunk, settings, encoder)
        return
    extra = () if encoder is None else (encoder,)
    pending: deque[tuple[Chunk, Future[ChunkResult]]] = deque()
    workers: dict[int, Any] = {}  # pid -> multiprocessing.Process, to name how a dead one ended
    chunk: Chunk | None = None
    try:
        for chunk in chunks:
            pending.append((chunk, executor.submit(encode_chunk, chunk, settings, *extra)))
            workers.update(getattr(executor, "_processes", None) or {})
            if len(pending) >= window:
                yield _result(pending.popleft()[1], executor)
        while pending:
            yield _result(pending.popleft()[1], executor)
    except BrokenProcessPool:
        waited = pending[0][0] if pending else chunk  # the chunk whose result the run was waiting for
        raise _worker_died(waited, workers) from None
    finally:
        for _chunk, future in pending:
            future.cancel()


def _dead_worker(executor: Executor) -> bool:
    processes = (getattr(executor, "_processes", None) or {}).values()
    return any(getattr(process, "exitcode", None) is not None for process in processes)


def _result(future: Future[_T], executor: Executor) -> _T:
    """The future's result; a pool worker that has died ends the wait as BrokenProcessPool.

    Why not only the pool's own detection: a worker SIGKILLed at the wrong moment (observed here
    under load, once in many runs) left the parent waiting forever on a pool that never broke.
    Pool workers end only at shutdown, so any exit code while a result is awaited is a death.
    """
    while True:
        try:
            return future.result(timeout=_POLL_S)
        except TimeoutError:
            if _dead_worker(executor):
                raise BrokenProcessPool("an encoding worker process ended while its pool was in use") from None


def _shutdown(executor: ProcessPoolExecutor) -> None:
    """Shut the pool down; after a worker died, kill the rest instead of waiting on a broken pool."""
    if not _dead_worker(executor):
        executor.shutdown(wait=True)
        return
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        if process.exitcode is None:
            process.kill()
    executor.shutdown(wait=False, cancel_futures=True)


_POLL_S = 0.5


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
    lines = f"lines {chunk.first_line}-{chunk.first_line + max(chunk.num_records, 1) - 1}"
    return WorkerDiedError(
        f"an encoding worker process died while the run waited for chunk {chunk.index} ({lines}): {what}",
        path=chunk.path,
        record=chunk.first_line,
        field="num_workers",
    )
