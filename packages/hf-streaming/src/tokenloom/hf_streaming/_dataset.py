"""StreamingHuggingFaceDataset: the seed's constructor, an exact and elastic stream underneath."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash
from torch.utils.data import IterableDataset, get_worker_info

from tokenloom.datasets import build_batch
from tokenloom.formats import ConfigError, RemoteOptions
from tokenloom.hf_streaming._blocks import DEFAULT_MAX_LINE_BYTES, Reading
from tokenloom.hf_streaming._collate import StreamSample, window_batch
from tokenloom.hf_streaming._encode import (
    EncodeFn,
    TokenizerSpec,
    engine_encoder,
    limit_worker_threads,
    prebuild,
    resolve_tokenizer,
)
from tokenloom.hf_streaming._feed import Counters, Feed, compat_blocks, exact_blocks
from tokenloom.hf_streaming._order import Base, Item, slot_items
from tokenloom.hf_streaming._pack import Packer, Window, joined, rebatch
from tokenloom.hf_streaming._remote import is_remote_source
from tokenloom.hf_streaming._resume import MAX_WORKERS, Mode, Resumable, distributed_defaults
from tokenloom.hf_streaming._sources import load_hf_dataset, remote_access, remote_dataset_files
from tokenloom.hf_streaming._units import (
    DEFAULT_UNIT_BYTES,
    HF,
    Layout,
    Source,
    file_sources,
    resolve_files,
)

__all__ = ["Mode", "StreamingHuggingFaceDataset"]

log = logging.getLogger("tokenloom.hf_streaming")
_LOCAL_BUILDERS = ("json", "parquet")


@dataclass(slots=True)
class _SlotFeed:
    blocks: Feed
    counters: Counters
    pass_epoch: int
    finished_items: int
    """Items of the slot's list in ``pass_epoch``: the item cursor once the pass ends."""


class StreamingHuggingFaceDataset(Resumable, IterableDataset):
    """Text documents streamed from local files or a Hugging Face IterableDataset, as seq_len windows.

    Args:
        dataset_name: a ``load_dataset`` builder or path ("json", "parquet", ...), or a built
            ``datasets.IterableDataset``.
        split: the split to read (also picks ``data_files[split]`` when data_files is a dict).
        text_field: the column with the text.
        seq_len: tokens per sample; each sample is cut from seq_len + 1 stream tokens.
        tokenizer_path: a saved fast tokenizer directory (tokenizer.json) or the file itself.
        dataset_config: the ``load_dataset`` configuration name.
        rank, world_size: this process's place; default from torch.distributed (else 0 of 1).
        seed: keys every shuffle.
        shuffle_buffer_size: exact mode: records per shuffled block inside a source shard;
            compat mode: the HF shuffle buffer.
        pack_sequences: add ``doc_ids`` and set labels that cross documents to -100.
        mode: "exact" (default) or "compat" (the seed's order and semantics).
        with_provenance: add ``doc_index`` / ``label_doc_index``: the source document of every
            input / label token (-1 on padding).
        infinite: re-loop with the next epoch's order instead of ending after one pass.
        eos_id: the document separator; default the tokenizer's EOS (none: ConfigError).
        on_error: "raise" (a RecordError naming the file and offset or row) or "skip" (counted).
        drop_remainder: drop the last partial window of a finite pass instead of padding it
            (padding labels are -100; the seed drops it).
        encode_batch_size: documents per batched tokenizer call.
        unit_bytes: target bytes per byte range of plain jsonl files.
        position_ids, cu_seqlens: with pack_sequences, add per-document positions / boundaries
            (as tokenloom.datasets' sample builder makes them).
        encoder: ``spec -> EncodeFn``, a picklable factory called once in each worker; default
            tokenloom-tokenize's engine selection (:func:`engine_encoder`, auto: fastokens where it
            is proven identical to Hugging Face tokenizers, else tokenizers); :func:`hf_encoder` forces
            plain tokenizers.
        max_line_bytes: a local jsonl line longer than this is a bad record (a RecordError, or
            skipped and counted with ``on_error="skip"``), never read whole; default 64 MiB, the cap
            tokenize and pack use.
        storage_options: for ``s3://``, ``gs://``, ``az://``, ``https://`` and ``hf://`` data files (or a
            remote dataset path): obstore's config keys (``endpoint``, ``access_key_id``, ...); default from
            the environment (AWS_*, GOOGLE_*, AZURE_*; ``HF_ENDPOINT`` for hf://). Never saved in a state.
        retries: transient faults (429, 5xx, resets, short reads) retried this many times per request
            (with backoff and jitter), or a ``tokenloom.formats.remote.RetryPolicy``.
        remote: the store options as one ``tokenloom.formats.RemoteOptions`` (endpoint, credentials, retry
            budget), as a tokenloom dataset carries them; ``storage_options`` and ``retries`` win over it.
        prefetch_blocks: blocks each slot reads ahead in a background thread (0: none), so that the
            network (or the disk) waits while the slot tokenizes.
        **load_kwargs: passed to ``load_dataset`` (``data_files=...``, ...).
    """

    def __init__(
        self,
        dataset_name: Any,
        split: str,
        text_field: str,
        seq_len: int,
        tokenizer_path: str | os.PathLike[str],
        dataset_config: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 42,
        shuffle_buffer_size: int = 10000,
        pack_sequences: bool = False,
        *,
        mode: Mode | str = Mode.EXACT,
        with_provenance: bool = False,
        infinite: bool = False,
        eos_id: int | None = None,
        on_error: str = "raise",
        drop_remainder: bool = False,
        encode_batch_size: int = 256,
        unit_bytes: int = DEFAULT_UNIT_BYTES,
        position_ids: bool = False,
        cu_seqlens: bool = False,
        encoder: Callable[[TokenizerSpec], EncodeFn] = engine_encoder,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        storage_options: dict[str, Any] | None = None,
        retries: Any = None,
        remote: RemoteOptions | None = None,
        prefetch_blocks: int = 2,
        **load_kwargs: Any,
    ) -> None:
        super().__init__()
        for name, value, low in (
            ("seq_len", seq_len, 1),
            ("shuffle_buffer_size", shuffle_buffer_size, 1),
            ("encode_batch_size", encode_batch_size, 1),
            ("max_line_bytes", max_line_bytes, 1),
            ("prefetch_blocks", prefetch_blocks, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} is {value!r}, expected an integer >= {low}", field=name)
        self.prefetch_blocks = prefetch_blocks
        self._access = remote_access(storage_options, retries, remote)
        if is_remote_source(dataset_name) and load_kwargs.get("data_files") is None:
            # a remote dataset path: the files under it (a prefix is listed, a glob expanded, a file taken as is)
            load_kwargs["data_files"] = remote_dataset_files(dataset_name, self._access)
            dataset_name = "json"  # each file is read by its suffix: jsonl(.gz/.zst) or parquet
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={on_error!r}, expected 'raise' or 'skip'", field="on_error")
        try:
            self.mode = Mode(mode)
        except ValueError:
            raise ConfigError(f"mode={mode!r}, expected one of {[m.value for m in Mode]}", field="mode") from None
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self.dataset_name = dataset_name if isinstance(dataset_name, str) else type(dataset_name).__name__
        self.dataset_config = dataset_config
        self.split = split
        self.seq_len = seq_len
        self.seed = seed
        self.pack_sequences = bool(pack_sequences)
        self.with_provenance = with_provenance
        self.infinite = infinite
        self.drop_remainder = drop_remainder
        self.encode_batch_size = encode_batch_size
        self.unit_bytes = unit_bytes
        self.reading = Reading(shuffle_buffer_size, text_field, on_error, max_line_bytes)
        if (position_ids or cu_seqlens) and not pack_sequences:
            raise ConfigError(
                "position_ids / cu_seqlens need document boundaries",
                field="pack_sequences",
                hint="Set pack_sequences=True",
            )
        self.position_ids = position_ids
        self.cu_seqlens = cu_seqlens
        self.encoder = encoder
        self.tokenizer: TokenizerSpec = resolve_tokenizer(tokenizer_path, eos_id)
        self.eos_id = self.tokenizer.eos_id
        if encoder is engine_encoder:
            prebuild(self.tokenizer)  # once in this process: forked workers inherit it instead of building their own
        self._encode: EncodeFn | None = None
        self._encode_pid = -1
        self._hf: Any = None
        self._sources: list[Source]
        local = (
            isinstance(dataset_name, str)
            and dataset_name in _LOCAL_BUILDERS
            and set(load_kwargs) <= {"data_files"}
            and load_kwargs.get("data_files") is not None
            and self.mode is Mode.EXACT
        )
        if local:
            files = resolve_files(load_kwargs["data_files"], split, self._access)
            self._sources = file_sources(files, self._access)
            data = [(os.path.basename(s.path), s.size, list(s.row_groups)) for s in self._sources]
            if all(s.size == 0 for s in self._sources) or (
                all(s.rows for s in self._sources) and not any(sum(s.row_groups) for s in self._sources)
            ):
                raise ConfigError("the dataset is empty: every data file is empty", field="data_files")
        else:
            self._hf = load_hf_dataset(dataset_name, dataset_config, split, load_kwargs)
            shards = int(getattr(self._hf, "num_shards", 1) or 1)
            self._sources = [Source(kind=HF, path=f"{self.dataset_name}[shard {i}]", size=0) for i in range(shards)]
            data = [self.dataset_name, dataset_config, split, shards, repr(sorted(load_kwargs.items()))[:2000]]
        self._objects = [[i, s.path, s.remote.etag] for i, s in enumerate(self._sources) if s.remote is not None]
        """Each remote source's ETag as opened: saved in every state, checked on load."""
        self.fingerprint = {
            "mode": self.mode.value,
            "data": xxhash.xxh64_hexdigest(repr(data).encode()),
            "tokenizer": self.tokenizer.fingerprint,
            "text_field": text_field,
            "seq_len": seq_len,
            "seed": seed,
            "block": shuffle_buffer_size,
            "eos_id": self.eos_id,
        }
        self._epoch = 0
        self._next_epoch = torch.full((MAX_WORKERS,), -1, dtype=torch.int64).share_memory_()
        self._loaded: dict[str, Any] | None = None
        self._base = Base()
        self._layout: Layout | None = None
        self._position: dict[str, Any] | None = None
        self._batch_rows: int | None = None
        """Set by :func:`stream_loader`: yield batches of this many windows instead of samples."""

    def _hf_stream(self, epoch: int) -> Any:
        return self._hf.shuffle(seed=self.seed + epoch, buffer_size=self.reading.block_size)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_encode"] = None  # a tokenizer is loaded in the process that encodes
        return state

    # ---- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        rank, worker, num_workers = self._current_slot()
        self._position = self._start_position(rank, worker, num_workers)
        if self._at_end_of_pass(self._position, rank, worker, num_workers):
            # a state saved after its pass ended: StatefulDataLoader may discard this iterator and start
            # a fresh one from the main process's copy, which then reads the next epoch from here
            self._next_epoch[worker] = self._position["epoch"] + 1
        # never reuse a tokenizer across fork: the parent's Rust thread pool does not survive it
        load = self._encode is None or self._encode_pid != os.getpid()
        if load and get_worker_info() is not None:
            limit_worker_threads(num_workers)  # before the read-ahead threads start: setenv is not thread-safe
        feed = self._feed(rank, worker, num_workers)  # with read-ahead, the first reads start here ...
        if load:
            try:
                self._encode = self.encoder(self.tokenizer)  # ... while the tokenizer loads (fastokens: ~0.3 s)
            except BaseException:
                feed.blocks.close()
                raise
            self._encode_pid = os.getpid()
        return self._generate(feed, rank, worker, num_workers)

    def _feed(self, rank: int, worker: int, num_workers: int) -> _SlotFeed:
        """This slot's documents from its position on (exact mode with read-ahead: already being read)."""
        position = self._position
        assert position is not None  # noqa: S101 - set by __iter__
        counters = Counters(skipped=position.get("skipped", 0))
        current = position["current"]
        pass_epoch = position["epoch"]
        if self.mode is Mode.COMPAT:
            blocks = compat_blocks(
                self._hf_stream,
                rank=rank,
                world_size=self.world_size,
                epoch=position["epoch"],
                row=current[0] if current is not None else 0,
                token=current[1] if current is not None else 0,
                infinite=self.infinite,
                reading=self.reading,
                name=self.dataset_name,
                batch=self.encode_batch_size,
                counters=counters,
            )
            return _SlotFeed(Feed(blocks), counters, pass_epoch, 1)
        units, sizes = self._unit_plan()
        slots = self.world_size * num_workers
        slot = worker * self.world_size + rank
        feed = exact_blocks(
            units=units,
            sizes=sizes,
            sources=self._sources,
            base=self._base,
            slot=slot,
            slots=slots,
            epoch=position["epoch"],
            item_index=position["item"],
            current=None if current is None else Item(-1, current[0], current[1], current[2]),
            infinite=self.infinite,
            seed=self.seed,
            counters=counters,
            reading=self.reading,
            hf_dataset=self._hf,
            prefetch_blocks=self.prefetch_blocks,
        )
        finished_items = len(slot_items(self._base, len(units), self.seed, pass_epoch, slot, slots, sizes))
        return _SlotFeed(feed, counters, pass_epoch, finished_items)

    def _generate(self, feed: _SlotFeed, rank: int, worker: int, num_workers: int) -> Iterator[dict[str, torch.Tensor]]:
        position = self._position
        assert position is not None  # noqa: S101 - set by __iter__
        blocks, counters, pass_epoch, finished_items = feed.blocks, feed.counters, feed.pass_epoch, feed.finished_items
        current = position["current"]
        assert self._encode is not None  # noqa: S101 - loaded by __iter__
        exact = self.mode is Mode.EXACT
        packer = Packer(
            self._encode,
            eos_id=self.eos_id,
            seq_len=self.seq_len,
            skip_empty=not exact,
            ordinals=exact and self.pack_sequences,
            provenance=self.with_provenance,
        )
        samples = position.get("samples", 0)
        rows = self._batch_rows or 1
        for block in rebatch(blocks, self.encode_batch_size):
            packer.add(block)
            window = packer.windows(rows)
            if window is None:
                continue
            for item, pos, count in self._items(window):
                samples += count
                self._position = {
                    "epoch": int(pos[0]),
                    "item": int(pos[1]),
                    "current": [int(pos[2]), int(pos[3]), int(pos[4])],
                    "samples": samples,
                    "skipped": counters.skipped,
                }
                yield item
        fresh_start = position["item"] == 0 and current is None and position.get("samples", 0) == 0
        if self.world_size * num_workers == 1 and fresh_start and counters.records == 0:
            raise ConfigError(
                f"the dataset is empty: a whole pass over {len(self._sources)} source(s) found no record",
                field="data_files",
                hint="Check the data files (blank lines are not records) and the split",
            )
        end = {
            "epoch": pass_epoch,
            "item": finished_items,
            "current": None,
            "samples": samples,
            "skipped": counters.skipped,
        }
        if counters.skipped:
            log.warning("slot (rank %d, worker %d) skipped %d bad records", rank, worker, counters.skipped)
        rest = packer.windows()  # batches: the whole windows short of a batch, in the pass's last batch
        if self.mode is Mode.COMPAT or self.drop_remainder:
            if packer.buffered:
                log.info("dropping the last %d tokens of the pass (drop_remainder)", packer.buffered)
            packer.clear()
        last = joined(rest, packer.tail())
        if last is not None:
            for item, _, count in self._items(last):
                samples += count
                self._position = {**end, "samples": samples}
                yield item
        self._position = {**end, "samples": samples}
        self._next_epoch[worker] = pass_epoch + 1

    def _items(self, window: Window) -> Iterator[tuple[dict[str, torch.Tensor], np.ndarray, int]]:
        """(sample or batch, position after it, windows in it): a batch of ``_batch_rows`` windows when set."""
        plain = window.padding is None and not self.pack_sequences and not self.with_provenance
        rows, count = self._batch_rows, window.tokens.shape[0]
        if rows and plain:  # the common case: the windows themselves, no per-key arrays
            for begin in range(0, count, rows):
                end = min(count, begin + rows)
                yield window_batch(window.tokens[begin:end]), window.positions[end - 1], end - begin
            return
        by_eos = self.mode is Mode.COMPAT  # the seed finds documents by EOS; exact mode knows them
        batch = build_batch(
            window.tokens,
            packing=self.pack_sequences,
            eos_id=self.eos_id,
            doc_ids=window.ordinals if self.pack_sequences and not by_eos else None,
            label_ignore=window.padding,
            position_ids=self.position_ids,
            cu_seqlens=self.cu_seqlens,
        )
        if self.with_provenance:
            assert window.provenance is not None  # noqa: S101 - the packer keeps it with provenance=True
            batch["doc_index"] = window.provenance[:, :-1]
            batch["label_doc_index"] = window.provenance[:, 1:]
        for begin in range(0, count, rows or 1):
            end = min(count, begin + (rows or 1))
            part = slice(begin, end) if rows else begin
            tensors = {key: torch.from_numpy(np.ascontiguousarray(value[part])) for key, value in batch.items()}
            item = tensors if rows else StreamSample(tensors, window.tokens[begin] if plain else None)
            yield item, window.positions[end - 1], end - begin
