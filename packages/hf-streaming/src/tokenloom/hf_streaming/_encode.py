"""The encoding seam: texts -> (flat ids, lengths), loaded lazily inside the worker.

Why a seam: one function is all the stream needs from a tokenizer, so a faster
engine (tokenloom-tokenize's engine selection) can replace Hugging Face
``tokenizers`` here without touching the stream. Loading happens on first use in
the process that encodes (a DataLoader worker), never in the parent before a
fork: a Rust tokenizer used before ``fork`` can deadlock the children.

The EOS id is read from the tokenizer directory's JSON files (no tokenizer is
loaded for it), so a tokenizer without EOS fails at construction, in the main
process, with a ConfigError, unless ``eos_id`` is given.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from tokenloom.formats import ConfigError, FormatError, MissingFileError
from tokenloom.tokenize.engine import (  # imported once, before the workers fork
    DEFAULT_VERIFY_FRACTION,
    MAX_FAST_ADDED_TOKENS,
    announce_engine,
    build_fast,
    load_encoder,
)

__all__ = [
    "EncodeFn",
    "TokenizerSpec",
    "engine_encoder",
    "hf_encoder",
    "limit_worker_threads",
    "prebuild",
    "resolve_tokenizer",
]

FASTOKENS_THREADS_ENV = "FASTOKENS_BPE_THREADS"

EncodeFn = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]
"""texts -> (int64 ids of every text concatenated, int64 length of each text); no special tokens added."""


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Where the tokenizer is, its EOS id and its fingerprint: plain data, safe to pickle into workers."""

    json_path: str
    eos_id: int
    fingerprint: str


def _read_json(path: Path) -> dict:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise FormatError(f"cannot read tokenizer file: {exc}", path=path, hint="Re-save the tokenizer") from None
    if not isinstance(data, dict):
        raise FormatError("tokenizer file is not a JSON object", path=path, hint="Re-save the tokenizer")
    return data


def _vocab_size(tokenizer: dict) -> int | None:
    """Ids the tokenizer.json defines: its model's vocabulary and its added tokens (None: unknown layout)."""
    vocab = tokenizer.get("model", {}).get("vocab") if isinstance(tokenizer.get("model"), dict) else None
    sizes = []
    if isinstance(vocab, dict):
        ids = list(vocab.values())
        if not set(map(type, ids)) <= {int}:  # (the common case is checked in C, not a Python frame per token)
            ids = [v for v in ids if isinstance(v, int)]
        sizes.append(max(ids, default=-1) + 1)
    elif isinstance(vocab, list):
        sizes.append(len(vocab))
    else:
        return None
    added = [t.get("id") for t in tokenizer.get("added_tokens", []) if isinstance(t, dict)]
    sizes.append(max((i for i in added if isinstance(i, int)), default=-1) + 1)
    return max(sizes)


def resolve_tokenizer(tokenizer_path: str | os.PathLike[str], eos_id: int | None) -> TokenizerSpec:
    """A tokenizer directory (with tokenizer.json) or a tokenizer.json file -> its spec."""
    path = Path(tokenizer_path)
    json_path = path / "tokenizer.json" if path.is_dir() else path
    if not json_path.is_file():
        raise MissingFileError(
            "no tokenizer.json here (the streaming dataset encodes with Hugging Face tokenizers' fast tokenizer)",
            path=path,
            field="tokenizer_path",
            hint="Point tokenizer_path at a saved fast tokenizer directory; "
            "a hub name needs to be downloaded first (the stream never reaches the network)",
        )
    blob = json_path.read_bytes()
    tokenizer = _read_json(json_path)
    if eos_id is None:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            candidate = json_path.parent / name
            value = _read_json(candidate).get("eos_token") if candidate.is_file() else None
            eos_token = value.get("content") if isinstance(value, dict) else value  # a string, or {"content": ...}
            if isinstance(eos_token, str):
                break
        else:
            raise ConfigError(
                "the tokenizer defines no EOS token (tokenizer_config.json / special_tokens_map.json name none)",
                path=json_path.parent,
                field="eos_token",
                hint="Pass eos_id=N explicitly: documents are joined with EOS, and id 0 is never assumed",
            )
        ids = {t.get("content"): t.get("id") for t in tokenizer.get("added_tokens", []) if isinstance(t, dict)}
        vocab = tokenizer.get("model", {}).get("vocab", {})
        found = ids.get(eos_token, vocab.get(eos_token) if isinstance(vocab, dict) else None)
        if not isinstance(found, int):
            raise ConfigError(
                f"the EOS token {eos_token!r} is not in the tokenizer's vocabulary",
                path=json_path,
                field="eos_token",
                hint="Pass eos_id=N explicitly",
            )
        eos_id = found
    if isinstance(eos_id, bool) or not isinstance(eos_id, int | np.integer):
        raise ConfigError(f"eos_id is {eos_id!r}, expected an int", field="eos_id", hint="Pass the EOS token's id")
    if eos_id < 0:
        raise ConfigError(f"eos_id is {eos_id}, expected >= 0", field="eos_id")
    vocab_size = _vocab_size(tokenizer)
    if vocab_size is not None and eos_id >= vocab_size:
        raise ConfigError(
            f"eos_id is {eos_id}, but the tokenizer has {vocab_size} ids (0..{vocab_size - 1})",
            path=json_path,
            field="eos_id",
            hint="Pass an id inside the tokenizer's vocabulary (its EOS token's id)",
        )
    fingerprint = xxhash.xxh64_hexdigest(blob + f"|eos={eos_id}".encode())
    return TokenizerSpec(os.fspath(json_path), int(eos_id), fingerprint)


def limit_worker_threads(num_workers: int) -> None:
    """In a DataLoader worker: the tokenizers' own threads stay within this worker's share of the cores.

    The workers are the parallelism. Hugging Face tokenizers' thread pool is switched off (it can also
    deadlock when inherited through fork); fastokens encodes each batch on ``cores // num_workers``
    threads (at least 1; divided again by the ranks sharing the node, see :func:`_threads_per_worker`)
    instead of its default of one per core, unless ``FASTOKENS_BPE_THREADS`` is set
    already (tokenize does the same for its encoding threads). 2 workers on 2 cores with the default ran
    4 encode threads; bench_hf_streaming's stream, 8 interleaved runs on a busy 2-core machine: median pass
    3.43 -> 2.52 s (7 of 8 pairs faster), CPU 2.4 -> 2.1 s. fastokens reads the variable when it starts its
    threads (the first encode); call this before the worker starts any thread of its own: setenv is not
    thread-safe. The ids do not depend on the thread count.
    """
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if FASTOKENS_THREADS_ENV not in os.environ:
        os.environ[FASTOKENS_THREADS_ENV] = str(_threads_per_worker(num_workers))


def _threads_per_worker(num_workers: int) -> int:
    """``cores // (num_workers x ranks on this node)``, at least 1, where cores is this process's affinity mask.

    The ranks torchrun started on this node (``LOCAL_WORLD_SIZE``; unset, 0, negative or not a number: 1) share
    its cores unless each is pinned: a mask narrower than the CPUs the process's cgroup allows (a container's or a
    Slurm job's cpuset, all the ranks' together; without one, ``os.cpu_count()``) is taken as this rank's own share
    already. A cgroup CPU quota (``cpu.max``) is not read: the mask's cores are divided as if all were there."""
    machine = _cgroup_cpus() or os.cpu_count() or 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    ranks = 1
    if cores >= machine:
        try:
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            ranks = 1  # not ours to validate: torch.distributed names a bad value when it starts
    return max(1, cores // (max(1, num_workers) * ranks))


def _cgroup_cpus(root: Path = Path("/")) -> int | None:
    """How many CPUs this process's cpuset cgroup allows (v2 ``cpuset.cpus.effective`` or v1
    ``cpuset.effective_cpus`` of its cgroup or the nearest ancestor that has it), None when there is none to read.

    The ranks torchrun starts inside a container or a Slurm job all have that cpuset as their affinity mask: it is
    the node's cores they share, not one rank's pinned share."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        if controllers == "":  # cgroup v2
            base, name = root / "sys/fs/cgroup", "cpuset.cpus.effective"
        elif "cpuset" in controllers.split(","):
            base, name = root / "sys/fs/cgroup/cpuset", "cpuset.effective_cpus"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            try:
                text = (base.joinpath(*parts[:depth]) / name).read_text().strip()
            except OSError:
                continue
            count = 0
            try:
                for span in filter(None, text.split(",")):
                    first, _, last = span.partition("-")
                    count += int(last or first) - int(first) + 1
            except ValueError:
                break
            if count > 0:
                return count
            break
    return None


_BUILT: dict[str, tuple[Any, Any]] = {}
"""The tokenizers (hf, fastokens or None) :func:`prebuild` made in this process or in the parent it was forked
from, by spec fingerprint."""


def _load_hf(spec: TokenizerSpec) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(spec.json_path)
    except Exception as exc:
        raise FormatError(f"tokenizers cannot load this file: {exc}", path=spec.json_path) from None


def prebuild(spec: TokenizerSpec) -> None:
    """Where DataLoader workers fork (the default start method): build the tokenizers once, here, for all of them.

    fastokens builds a 16k vocabulary in about 0.15-0.2 CPU-s; each worker built its own. Built here (never used to
    encode here), a forked worker inherits them and only probes them (:func:`engine_encoder`). Not encoding here
    matters: after a process encodes with fastokens, the children it forks encode on one thread whatever
    ``FASTOKENS_BPE_THREADS`` says (measured with fastokens 0.3), so the workers' probe stays in the workers. A
    tokenizer that fails to load is left to the worker (it names the error as before); one with more added tokens
    than the fast engine is tried with gets no fastokens build.
    """
    start = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if spec.fingerprint in _BUILT or start != "fork":
        return
    try:
        tokenizer = _load_hf(spec)
    except FormatError:
        return
    fast = None
    if len(tokenizer.get_added_tokens_decoder()) <= MAX_FAST_ADDED_TOKENS:
        with contextlib.suppress(Exception):  # load_encoder names the reason when it builds it again
            fast = build_fast(tokenizer.to_str())
    _BUILT[spec.fingerprint] = (tokenizer, fast)


def hf_encoder(spec: TokenizerSpec) -> EncodeFn:
    """Hugging Face ``tokenizers``' batched encode, without special tokens (the engine selection forced to hf)."""
    return engine_encoder(spec, engine="hf")


def engine_encoder(
    spec: TokenizerSpec, engine: str = "auto", verify_fraction: float = DEFAULT_VERIFY_FRACTION
) -> EncodeFn:
    """tokenloom-tokenize's engine selection (the default): the same ids as ``tokenloom tokenize``.

    ``auto`` uses fastokens only after it encodes tokenloom-tokenize's probe set exactly as Hugging Face
    ``tokenizers`` does, and re-checks a deterministic ``verify_fraction`` of the stream's texts against
    it (a difference raises EngineMismatchError); otherwise ``tokenizers``. Called once per worker.
    Pass ``functools.partial(engine_encoder, engine="hf")`` as ``encoder=`` to force an engine.
    """
    import logging

    from torch.utils.data import get_worker_info

    tokenizer, fast = _BUILT.get(spec.fingerprint) or (_load_hf(spec), None)
    built = None if fast is None else lambda: fast
    encoder = load_encoder(tokenizer, engine, verify_fraction=verify_fraction, fast_engine=built)
    log = logging.getLogger("tokenloom.hf_streaming")
    worker = get_worker_info()
    if worker is not None and worker.id > 0:  # worker 0 says it; the others would only repeat it
        log.debug("encoding engine: %s (%s)", encoder.name, encoder.reason)
    else:
        announce_engine(log, encoder.name, encoder.reason, tokenizer=spec.json_path)

    def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = encoder.encode_flat(texts)
        return np.asarray(ids, dtype=np.int64), np.diff(np.asarray(offsets, dtype=np.int64))

    return encode
