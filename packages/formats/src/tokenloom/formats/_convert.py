"""Convert any readable token dataset into any writable format, streaming.

Entries are copied shard by shard in batches of about ``chunk_tokens`` tokens
through ``TokenWriter.add_batch`` (token views straight from the memory map), so
memory stays bounded by the batch size, or by the largest single entry when one
entry is bigger (the writer API takes whole entries). Overlap prefixes, EOS id,
vocab size and the tokenizer fingerprint are carried over where the target can
store them; a target that cannot store a non-zero overlap prefix refuses it
unless ``drop_overlap_prefix`` is set.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._registry import available_formats, open_dataset, open_writer, writer_spec
from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.lock import output_lock
from tokenloom.formats.io.safety import check_disjoint, dataset_inputs, remove_on_failure
from tokenloom.formats.io.sidecar import settle
from tokenloom.formats.io.storage import storage_errors
from tokenloom.formats.io.urls import is_remote_url

if TYPE_CHECKING:
    from tokenloom.formats.remote.options import RemoteOptions

__all__ = ["ConvertResult", "convert_dataset", "iter_batches"]

DEFAULT_CHUNK_TOKENS = 1 << 24


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What a conversion copied, and how long it took."""

    source_format: str
    target_format: str
    entries: int
    tokens: int
    seconds: float


def iter_batches(dataset: TokenDataset, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
    """(tokens, lengths, overlap_prefix) batches of whole entries, about ``chunk_tokens`` tokens each."""
    if chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens is {chunk_tokens}, expected >= 1", field="chunk_tokens")
    for shard in dataset.shards:
        offsets = shard.offsets
        overlaps = shard.overlap_prefix
        tokens = shard.tokens
        entry = 0
        while entry < shard.num_entries:
            stop = int(np.searchsorted(offsets, offsets[entry] + chunk_tokens, side="right")) - 1
            stop = min(max(stop, entry + 1), shard.num_entries)
            begin, end = int(offsets[entry]), int(offsets[stop])
            yield tokens[begin:end], np.diff(offsets[entry : stop + 1]), overlaps[entry:stop]
            entry = stop


def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def convert_dataset(
    source: str | os.PathLike[str] | TokenDataset,
    target: str | os.PathLike[str],
    *,
    to: str,
    source_format: str | None = None,
    dtype: Any = None,
    validate: str = "fast",
    drop_overlap_prefix: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    writer_options: dict[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    eos_id: int | None = None,
    vocab_size: int | None = None,
    target_remote: RemoteOptions | None = None,
    target_plan_cache_dir: str | os.PathLike[str] | None = None,
) -> ConvertResult:
    """Copy every entry of ``source`` into a new ``to`` dataset at ``target``; ``on_progress(tokens)`` per batch.

    ``eos_id`` / ``vocab_size`` set what a source does not record (a Megatron or .pbin file from another
    tool); one that contradicts the source's recorded value is a ConfigError. An ``s3://``, ``gs://`` or
    ``az://`` target is converted into a staging directory under ``target_plan_cache_dir`` and uploaded, the
    manifest last (:mod:`tokenloom.formats.remote.convert_output`; store and credentials: ``target_remote``, a
    :class:`~tokenloom.formats.RemoteOptions`, else the AWS_/GOOGLE_/AZURE_ variables).
    """
    remote_target = is_remote_url(target)
    if remote_target:  # before the source is opened: a bad or overlapping target costs no read
        from tokenloom.formats.remote.publish import check_apart, writable_url

        check_apart(writable_url(target, "conversion target"), [source], "the conversion target")
    source_path = None if isinstance(source, TokenDataset) else source
    with storage_errors(source_path, "reading the source"):
        dataset = (
            source
            if isinstance(source, TokenDataset)
            else open_dataset(source, format=source_format, validate=validate)
        )
    spec = writer_spec(to, field="to")
    if remote_target:
        from tokenloom.formats.remote.convert_output import convert_to_url

        options = {"dtype": dtype, "drop_overlap_prefix": drop_overlap_prefix, "chunk_tokens": chunk_tokens}
        options.update(writer_options=writer_options, on_progress=on_progress, eos_id=eos_id, vocab_size=vocab_size)
        return convert_to_url(
            dataset,
            source_path,
            target,
            spec=spec,
            remote=target_remote,
            plan_cache_dir=target_plan_cache_dir,
            options=options,
            convert=convert_dataset,
            resumed=ConvertResult(dataset.format, to, len(dataset), dataset.num_tokens, 0.0),
        )
    factory = spec.writer
    source_spec = available_formats().get(dataset.format)
    targets = spec.write_targets(target)
    check_disjoint(
        targets,
        dataset_inputs(dataset, source_path, owns_root=source_spec is None or source_spec.owns_directory),
        target_name="the target",
    )
    eos_id, vocab_size = (
        settle(name, getattr(dataset, name), given, where="the source", path=dataset.root,
               hint=f"Leave --{name.replace('_', '-')} out to keep the source's value")
        for name, given in (("eos_id", eos_id), ("vocab_size", vocab_size))
    )  # fmt: skip
    options = dict(writer_options or {})
    fingerprint, key = dataset.tokenizer_fingerprint, "tokenizer_fingerprint"
    if fingerprint is not None and key not in options and _accepts(factory, key):  # type: ignore[arg-type]
        options[key] = fingerprint
    start = time.perf_counter()
    created = [p for p in targets if not p.exists()]
    with (
        output_lock(targets[0], what="conversion target"),
        remove_on_failure(created),
        storage_errors(target, f"converting to {to}"),
        open_writer(
            target,
            format=to,
            dtype=dtype if dtype is not None else dataset.dtype,
            vocab_size=vocab_size,
            eos_id=eos_id,
            **options,
        ) as writer,
    ):
        for tokens, lengths, overlaps in iter_batches(dataset, chunk_tokens):
            writer.add_batch(tokens, lengths, None if drop_overlap_prefix else overlaps)
            if on_progress is not None:
                on_progress(len(tokens))
    return ConvertResult(
        source_format=dataset.format,
        target_format=to,
        entries=len(dataset),
        tokens=dataset.num_tokens,
        seconds=time.perf_counter() - start,
    )
