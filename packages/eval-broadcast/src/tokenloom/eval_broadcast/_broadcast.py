"""broadcast_eval_set: the source rank builds (or reads from its cache) the eval set, every rank receives it.

    all ranks   all_reduce(max) of the call's settings and their negation -> disagreement = ConfigError everywhere
    src         build() in a helper thread; a BUILDING header every timeout / 4 while it runs (heartbeat)
    src -> all  header: OK | FAILED (+ message) | MAPPED (+ cache entry name)
    src -> all  rows in chunks of <= chunk_bytes, received in place into the result (xxh3 streamed)
    all ranks   all_reduce(min) of "my checksum verified" -> any mismatch = EvalTransferError everywhere

Every collective is asynchronous and waited on with ``timeout``: a killed peer is
an error as soon as the transport notices (gloo: at once), a stalled one after
``timeout``; a slow build is not a stalled one, thanks to the heartbeat.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import xxhash

from tokenloom.eval_broadcast._cache import (
    cache_entry,
    cache_settings,
    open_cache,
    read_cache,
    remove_stale_scratch,
    write_cache,
)
from tokenloom.eval_broadcast._protocol import VERSION, Header, Status, encode_message
from tokenloom.eval_broadcast._rows import CODE_DTYPES, DTYPE_CODES, EvalSet, to_rows
from tokenloom.eval_broadcast.errors import EvalBuildError, EvalTransferError
from tokenloom.formats import ConfigError

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_TIMEOUT", "broadcast_eval_set"]

log = logging.getLogger("tokenloom.eval_broadcast")
DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_TIMEOUT = timedelta(minutes=5)


def broadcast_eval_set(
    build: Callable[[], Any],
    *,
    src: int = 0,
    group: Any = None,
    timeout: timedelta | float = DEFAULT_TIMEOUT,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    seq_len: int | None = None,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    drop_remainder: bool = False,
    cache_dir: str | Path | None = None,
    cache_key: str | None = None,
    shared_filesystem: bool = False,
) -> EvalSet:
    """Run ``build()`` on rank ``src`` of ``group`` only; every rank returns the same :class:`EvalSet`.

    Args:
        build: called on ``src`` only (in a helper thread); returns 2-D rows, a 1-D token stream, a
            TokenDataset or EvalTokens. A source object (HFEvalSource, PathEvalSource) also gives the
            ``fingerprint()`` that keys the cache.
        src: the building rank, as a rank *within* ``group``.
        group: the process group (None: the default group). gloo sends CPU tensors; NCCL goes through
            one CUDA chunk buffer at a time.
        timeout: the longest any step may wait for a peer (a timedelta or seconds).
        chunk_bytes: the largest message of rows; a receiving rank holds nothing beyond the result.
        seq_len: rows hold seq_len + 1 tokens; needed to cut a stream, checked against 2-D rows.
        vocab_size, eos_id: override what the source reports; ids >= vocab_size are an error.
        drop_remainder: drop a last partial row instead of padding it (the padding is masked).
        cache_dir: where ``src`` caches built sets (content-addressed); None: no cache.
        cache_key: the fingerprint of a plain callable's output (sources supply their own).
        shared_filesystem: every rank memory-maps the cache entry instead of receiving the rows.

    Raises:
        EvalBuildError: on every rank, when ``build`` (or validating its output) fails on ``src``.
        EvalTransferError: on the ranks that see a peer die, stall past ``timeout`` or a checksum fail.
        ConfigError: bad arguments, ``src`` outside the group, or ranks that called with different settings.
            (Without torch.distributed, a ``cache_dir`` whose key is missing is a ConfigError; on ``src`` of a
            group it reaches every rank as the EvalBuildError that wraps it.)
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not seconds > 0:
        raise ConfigError(f"timeout is {timeout!r}, expected > 0 seconds", field="timeout")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ConfigError(f"chunk_bytes is {chunk_bytes!r}, expected an int >= 1", field="chunk_bytes")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ConfigError(f"seq_len is {seq_len!r}, expected an int >= 1", field="seq_len")
    if shared_filesystem and cache_dir is None:
        raise ConfigError("shared_filesystem=True needs cache_dir", field="cache_dir")
    settings = cache_settings(seq_len=seq_len, vocab_size=vocab_size, eos_id=eos_id, drop_remainder=drop_remainder)

    def produce() -> EvalSet:
        return _produce(build, settings, cache_dir, cache_key)

    if not (dist.is_available() and dist.is_initialized()):
        if src != 0:
            raise ConfigError(f"src={src} without torch.distributed: only rank 0 exists", field="src")
        if cache_dir is not None and cache_key is None and not callable(getattr(build, "fingerprint", None)):
            _fingerprint(build, cache_key)  # a missing key is the caller's mistake, not a failed build
        try:
            return produce()
        except Exception as exc:
            raise EvalBuildError(f"building the eval set failed: {_describe(exc)}") from exc

    rank = dist.get_rank(group)
    if rank < 0:
        raise ConfigError("this rank is not a member of the group", field="group", hint="Call it on the group's ranks")
    world = dist.get_world_size(group)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world:
        raise ConfigError(f"src={src!r} is outside the group of {world} ranks", field="src")
    channel = _Channel(group, src, rank, seconds)
    channel.agree(
        [VERSION, src, chunk_bytes, -1 if seq_len is None else seq_len, int(drop_remainder), int(shared_filesystem)],
        ["protocol version", "src", "chunk_bytes", "seq_len", "drop_remainder", "shared_filesystem"],
    )
    if rank == src:
        return _send(channel, produce, chunk_bytes, shared_filesystem)
    return _receive(channel, cache_dir)


def _produce(build: Any, settings: dict[str, Any], cache_dir: Any, cache_key: str | None) -> EvalSet:
    if not callable(build):
        raise ConfigError(f"build is {type(build).__name__}, expected a callable or a source", field="build")
    entry = None
    if cache_dir is not None:
        entry = cache_entry(cache_dir, _fingerprint(build, cache_key), **settings)
        remove_stale_scratch(Path(cache_dir))  # what killed builds left behind
        cached = read_cache(entry)
        if cached is not None:
            log.info("eval set read from the cache %s", entry)
            return cached
    rows, tail_padding, eos_id, vocab_size = to_rows(build(), **settings)
    if not rows.flags.writeable:  # a read-only memory map must not become a writable tensor
        rows = np.array(rows)
    evalset = EvalSet(rows=torch.from_numpy(rows), tail_padding=tail_padding, eos_id=eos_id, vocab_size=vocab_size)
    if entry is not None:
        write_cache(entry, evalset, settings)
        evalset = replace(evalset, cache_path=str(entry))
    return evalset


def _fingerprint(build: Any, cache_key: str | None) -> str:
    """The cache key: ``cache_key``, else the source's ``fingerprint()``."""
    if cache_key is not None:
        return cache_key
    method = getattr(build, "fingerprint", None)
    fingerprint = method() if callable(method) else None
    if fingerprint is None:
        raise ConfigError(
            f"cache_dir is set but build ({type(build).__name__}) has no fingerprint() to key the cache",
            field="cache_key",
            hint="Pass cache_key='<a string that changes whenever the eval set does>', or drop cache_dir",
        )
    return str(fingerprint)


def _describe(exc: BaseException) -> str:
    """The error, and the innermost cause when a library wrapped it (DatasetGenerationError hides the parse error)."""
    text = f"{type(exc).__name__}: {exc}"
    root, seen = exc, {id(exc)}
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        root = inner
        seen.add(id(inner))
    if root is not exc:
        text += f" (cause: {type(root).__name__}: {root})"
    return text


class _Channel:
    """Asynchronous collectives on one group, each waited on with the timeout."""

    def __init__(self, group: Any, src: int, rank: int, seconds: float) -> None:
        self.group = group
        self.rank = rank
        self.is_src = rank == src
        self.src_global = dist.get_global_rank(group, src) if group is not None else src
        self.seconds = seconds
        self.nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")

    def _wait(self, work: Any, what: str) -> None:
        try:
            done = work.wait(timeout=timedelta(seconds=self.seconds))
        except Exception as exc:  # gloo: "Connection closed by peer", "Operation timed out!"
            raise EvalTransferError(
                f"rank {self.rank}: {what} failed (timeout {self.seconds:g} s): {str(exc).rstrip('.!')}"
            ) from exc
        if done is False:
            raise EvalTransferError(f"rank {self.rank}: {what} did not complete within {self.seconds:g} s")

    def broadcast(self, tensor: torch.Tensor, what: str) -> None:
        """In place: ``tensor`` (CPU) is sent by src and overwritten on the others."""
        if not self.nccl:
            staged = tensor
        elif self.is_src:
            staged = tensor.to(self.device)
        else:  # one CUDA buffer per message; the caching allocator hands back the same block each chunk
            staged = torch.empty_like(tensor, device=self.device)
        work = dist.broadcast(staged, src=self.src_global, group=self.group, async_op=True)
        self._wait(work, what)
        if self.nccl:
            tensor.copy_(staged)

    def all_reduce(self, values: list[int], op: Any, what: str) -> list[int]:
        tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
        self._wait(dist.all_reduce(tensor, op=op, group=self.group, async_op=True), what)
        return [int(x) for x in tensor.cpu()]

    def agree(self, values: list[int], names: list[str]) -> None:
        """ConfigError on every rank unless every rank passed the same values."""
        reduced = self.all_reduce([*values, *(-v for v in values)], dist.ReduceOp.MAX, "the settings check")
        highest, lowest = reduced[: len(values)], [-v for v in reduced[len(values) :]]
        differ = [f"{n} ({lo} .. {hi})" for n, lo, hi in zip(names, lowest, highest, strict=True) if lo != hi]
        if differ:
            raise ConfigError(
                f"ranks called broadcast_eval_set with different settings: {', '.join(differ)}",
                field="group",
                hint="Every rank of the group must pass the same src, chunk_bytes, seq_len and options",
            )

    def send_header(self, header: Header) -> None:
        self.broadcast(torch.from_numpy(header.encode()), f"header ({header.status.name})")

    def receive_header(self) -> Header:
        buffer = torch.zeros(12, dtype=torch.int64)
        self.broadcast(buffer, "waiting for the source's header")
        try:
            return Header.decode(buffer.numpy())
        except ValueError as exc:
            raise EvalTransferError(f"rank {self.rank}: unreadable header from the source: {exc}") from exc

    def send_bytes(self, data: bytes, what: str) -> None:
        if data:
            self.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), what)

    def receive_bytes(self, count: int, what: str) -> bytes:
        buffer = torch.zeros(count, dtype=torch.uint8)
        if count:
            self.broadcast(buffer, what)
        return buffer.numpy().tobytes()

    def all_ok(self, ok: bool) -> int:
        """How many ranks reported a failure (0: all verified)."""
        return -self.all_reduce([0 if ok else -1], dist.ReduceOp.SUM, "the checksum agreement")[0]


def _build_with_heartbeat(channel: _Channel, produce: Callable[[], EvalSet]) -> EvalSet | BaseException:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = produce()
        except BaseException as exc:  # handed to the main thread, which tells every rank
            box["error"] = exc

    thread = threading.Thread(target=target, name="tokenloom-eval-build", daemon=True)
    thread.start()
    period = min(max(channel.seconds / 4, 0.05), 30.0)
    while True:
        thread.join(period)
        if not thread.is_alive():
            break
        channel.send_header(Header(status=Status.BUILDING))
    return box["error"] if "error" in box else box["value"]


def _send(channel: _Channel, produce: Callable[[], EvalSet], chunk_bytes: int, shared: bool) -> EvalSet:
    outcome = _build_with_heartbeat(channel, produce)
    if isinstance(outcome, BaseException):
        message = encode_message(f"rank {channel.src_global} failed to build the eval set: {_describe(outcome)}")
        channel.send_header(Header(status=Status.FAILED, message_len=len(message)))
        channel.send_bytes(message, "the failure message")
        raise EvalBuildError(message.decode("utf-8", errors="replace")) from outcome
    evalset = outcome
    rows = evalset.numpy()
    header = Header(
        status=Status.MAPPED if shared else Status.OK,
        rows=len(evalset),
        row_len=evalset.row_len,
        dtype_code=DTYPE_CODES[rows.dtype.name],
        checksum=evalset.checksum(),
        tail_padding=evalset.tail_padding,
        eos_id=evalset.eos_id,
        vocab_size=evalset.vocab_size,
        chunk_bytes=chunk_bytes,
    )
    if shared:
        name = Path(evalset.cache_path or "").name.encode()
        channel.send_header(replace(header, message_len=len(name)))
        channel.send_bytes(name, "the cache entry name")
    else:
        channel.send_header(header)
        flat = rows.reshape(-1).view(np.uint8)
        with warnings.catch_warnings():  # rows from a read-only map are only read here
            warnings.simplefilter("ignore", UserWarning)
            payload = torch.from_numpy(flat)
        for begin in range(0, flat.size, chunk_bytes):
            channel.broadcast(payload[begin : begin + chunk_bytes], f"rows bytes [{begin}, +{chunk_bytes})")
    failures = channel.all_ok(True)
    if failures:
        raise EvalTransferError(f"{failures} rank(s) received rows that fail the checksum {header.checksum:016x}")
    return evalset


def _receive(channel: _Channel, cache_dir: Any) -> EvalSet:
    header = channel.receive_header()
    while header.status is Status.BUILDING:
        header = channel.receive_header()
    if header.status is Status.FAILED:
        message = channel.receive_bytes(header.message_len, "the failure message").decode("utf-8", errors="replace")
        raise EvalBuildError(message)
    if header.rows == 0:
        log.warning("rank %d: the eval set has 0 rows", channel.rank)
    dtype = CODE_DTYPES.get(header.dtype_code)
    if dtype is None:
        raise EvalTransferError(f"rank {channel.rank}: unknown dtype code {header.dtype_code} in the header")
    problem: Exception | None = None
    evalset: EvalSet | None = None
    if header.status is Status.MAPPED:
        name = channel.receive_bytes(header.message_len, "the cache entry name").decode()
        try:
            evalset = _map(Path(cache_dir) / name, header)
        except Exception as exc:  # reported to every rank below, then raised here
            problem = exc
    else:
        rows = np.empty((header.rows, header.row_len), dtype=dtype)
        flat = rows.reshape(-1).view(np.uint8)
        payload = torch.from_numpy(flat)
        digest = xxhash.xxh3_64()
        for begin in range(0, flat.size, header.chunk_bytes):
            piece = payload[begin : begin + header.chunk_bytes]
            channel.broadcast(piece, f"rows bytes [{begin}, +{header.chunk_bytes})")
            digest.update(flat[begin : begin + header.chunk_bytes].data)
        if digest.intdigest() != header.checksum:
            problem = EvalTransferError(
                f"rank {channel.rank}: received rows hash to {digest.intdigest():016x}, "
                f"the source sent {header.checksum:016x}"
            )
        evalset = EvalSet(
            rows=torch.from_numpy(rows),
            tail_padding=header.tail_padding,
            eos_id=header.eos_id,
            vocab_size=header.vocab_size,
            origin="received",
        )
    failures = channel.all_ok(problem is None)
    if problem is not None or evalset is None:
        raise problem or EvalTransferError(f"rank {channel.rank}: no eval set")
    if failures:
        raise EvalTransferError(f"{failures} rank(s) could not verify the eval set; see their errors")
    return evalset


def _map(path: Path, header: Header) -> EvalSet:
    try:
        evalset = open_cache(path)
    except (OSError, ValueError, KeyError) as exc:  # never deleted here: the source owns the entry
        raise EvalTransferError(
            f"rank cannot map the source's cache entry {path}: {exc}", hint="Is cache_dir one shared directory?"
        ) from exc
    if evalset.checksum() != header.checksum or len(evalset) != header.rows:
        raise EvalTransferError(f"cache entry {path} differs from what the source announced")
    return replace(evalset, origin="mapped", cache_path=str(path))
