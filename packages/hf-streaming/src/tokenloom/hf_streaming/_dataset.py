"""StreamingHuggingFaceDataset: the seed's constructor, an exact and elastic stream underneath."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch
import xxhash
from torch.utils.data import IterableDataset, get_worker_info

from tokenloom.datasets import build_batch
from tokenloom.formats import ConfigError, RemoteOptions, ResumeMismatchError
from tokenloom.formats.io import require
from tokenloom.hf_streaming._blocks import DEFAULT_MAX_LINE_BYTES, Reading
from tokenloom.hf_streaming._encode import (
    EncodeFn,
    TokenizerSpec,
    engine_encoder,
    limit_worker_threads,
    resolve_tokenizer,
)
from tokenloom.hf_streaming._feed import Counters, Feed, compat_blocks, exact_blocks
from tokenloom.hf_streaming._order import Base, Item, remainder_after, slot_items
from tokenloom.hf_streaming._pack import Packer, Window
from tokenloom.hf_streaming._remote import is_remote_source
from tokenloom.hf_streaming._sources import check_objects, remote_access, remote_dataset_files
from tokenloom.hf_streaming._state import FORMAT, VERSION, check_fingerprint, check_state
from tokenloom.hf_streaming._units import (
    DEFAULT_UNIT_BYTES,
    Layout,
    Source,
    SourceKind,
    Unit,
    choose_layout,
    enumerate_units,
    file_sources,
    resolve_files,
    unit_sizes,
)

__all__ = ["Mode", "StreamingHuggingFaceDataset"]

log = logging.getLogger("tokenloom.hf_streaming")
_LOCAL_BUILDERS = ("json", "parquet")
_MAX_WORKERS = 256


class Mode(StrEnum):
    EXACT = "exact"
    """Counter-based order: exact resume on the same topology, exactly-once on any other."""
    COMPAT = "compat"
    """The seed's order (HF buffered shuffle, rank strides); resumes on the same topology only."""


@dataclass(slots=True)
class _SlotFeed:
    blocks: Feed
    counters: Counters
    pass_epoch: int
    finished_items: int
    """Items of the slot's list in ``pass_epoch``: the item cursor once the pass ends."""


def _distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} of world_size {world_size}, expected 0 <= rank < world_size", field="rank")
    return rank, world_size


class StreamingHuggingFaceDataset(IterableDataset):
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
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"seq_len is {seq_len!r}, expected an integer >= 1", field="seq_len")
        for name, value in (
            ("shuffle_buffer_size", shuffle_buffer_size),
            ("encode_batch_size", encode_batch_size),
            ("max_line_bytes", max_line_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} is {value!r}, expected an integer >= 1", field=name)
        if isinstance(prefetch_blocks, bool) or not isinstance(prefetch_blocks, int) or prefetch_blocks < 0:
            raise ConfigError(
                f"prefetch_blocks is {prefetch_blocks!r}, expected an integer >= 0", field="prefetch_blocks"
            )
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
        self.rank, self.world_size = _distributed_defaults(rank, world_size)
        self.dataset_name = dataset_name if isinstance(dataset_name, str) else type(dataset_name).__name__
        self.dataset_config = dataset_config
        self.split = split
        self.text_field = text_field
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle_buffer_size = shuffle_buffer_size
        self.pack_sequences = bool(pack_sequences)
        self.with_provenance = with_provenance
        self.infinite = infinite
        self.on_error = on_error
        self.drop_remainder = drop_remainder
        self.encode_batch_size = encode_batch_size
        self.unit_bytes = unit_bytes
        self.max_line_bytes = max_line_bytes
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
            self._sources = file_sources(files, dataset_name, self._access)
            data = [(os.path.basename(s.path), s.size, list(s.row_groups)) for s in self._sources]
            if all(s.size == 0 for s in self._sources) or (
                all(s.kind == SourceKind.PARQUET for s in self._sources)
                and not any(sum(s.row_groups) for s in self._sources)
            ):
                raise ConfigError("the dataset is empty: every data file is empty", field="data_files")
        else:
            self._hf = self._load_hf(dataset_name, dataset_config, split, load_kwargs)
            shards = int(getattr(self._hf, "num_shards", 1) or 1)
            self._sources = [
                Source(kind=SourceKind.HF, path=f"{self.dataset_name}[shard {i}]", size=0) for i in range(shards)
            ]
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
        self._next_epoch = torch.full((_MAX_WORKERS,), -1, dtype=torch.int64).share_memory_()
        self._loaded: dict[str, Any] | None = None
        self._base = Base()
        self._layout: Layout | None = None
        self._position: dict[str, Any] | None = None
        self._slot = (self.rank, 0, 1)  # rank, worker, num_workers

    # ---- construction helpers -------------------------------------------------------------
    def _load_hf(self, dataset_name: Any, config: str | None, split: str, load_kwargs: dict[str, Any]) -> Any:
        hf_datasets = require(
            "datasets", distribution="tokenloom-datasets", extra="hf", purpose="StreamingHuggingFaceDataset"
        )
        if isinstance(dataset_name, hf_datasets.IterableDataset):
            return dataset_name
        if isinstance(dataset_name, hf_datasets.Dataset):
            return dataset_name.to_iterable_dataset(num_shards=max(1, min(64, len(dataset_name))))
        if not isinstance(dataset_name, str):
            raise ConfigError(
                f"dataset_name is a {type(dataset_name).__name__}, expected a name or a datasets.IterableDataset",
                field="dataset_name",
            )
        try:
            return hf_datasets.load_dataset(dataset_name, config, split=split, streaming=True, **load_kwargs)
        except Exception as exc:
            offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
            raise ConfigError(
                f"load_dataset({dataset_name!r}, {config!r}, split={split!r}) failed: {type(exc).__name__}: {exc}",
                field="dataset_name",
                hint=(
                    "The hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): use local data_files= or unset it"
                    if offline
                    else "Check the name, config, split and data_files"
                ),
            ) from None

    def _hf_stream(self, epoch: int) -> Any:
        return self._hf.shuffle(seed=self.seed + epoch, buffer_size=self.shuffle_buffer_size)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_encode"] = None  # a tokenizer is loaded in the process that encodes
        return state

    # ---- epochs -----------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start the next fresh pass at ``epoch`` (passes then count up from it)."""
        if epoch < 0:
            raise ConfigError(f"epoch {epoch}, expected >= 0", field="epoch")
        self._epoch = epoch
        self._next_epoch.fill_(-1)

    @property
    def epoch(self) -> int:
        return self._epoch

    # ---- state ------------------------------------------------------------------------------
    def _common(self, world_size: int, num_workers: int, layout: Layout | None, base: Base) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "mode": self.mode.value,
            "fingerprint": dict(self.fingerprint),
            "world_size": world_size,
            "num_workers": num_workers,
            "layout": layout.to_json() if layout is not None else None,
            "base": base.to_json() if self.mode is Mode.EXACT else None,
            **({"objects": [list(o) for o in self._objects]} if self._objects else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        """This slot's position: plain JSON (``kind="slot"``); StatefulDataLoader calls it in each worker."""
        rank, worker, num_workers = self._current_slot()
        if self._position is None:
            self._position = self._start_position(rank, worker, num_workers)
        state = self._common(self.world_size, num_workers, self._layout, self._base)
        state.update(kind="slot", rank=rank, worker=worker, **self._position)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A slot state (same rank and worker) or a merged state (:func:`merge_rank_states`, any topology)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ResumeMismatchError(
                f"not a {FORMAT} state", field="state", hint="Pass a state from state_dict() or merge_rank_states()"
            )
        if state.get("version") != VERSION:
            raise ResumeMismatchError(f"state version {state.get('version')!r}, expected {VERSION}", field="version")
        kind = state.get("kind")
        if kind not in ("slot", "merged"):
            raise ResumeMismatchError(f"state kind {kind!r}, expected 'slot' or 'merged'", field="kind")
        check_state(state)
        check_objects(state.get("objects"), self._objects)  # first: a changed object names its URL
        check_fingerprint(state["fingerprint"], self.fingerprint)
        if self.mode is Mode.COMPAT and state["world_size"] != self.world_size:
            raise ResumeMismatchError(
                f"compat mode cannot change the topology: saved on {state['world_size']} ranks, now {self.world_size}",
                field="world_size",
                hint="Resume on the saved number of ranks and workers, or use mode='exact' (elastic)",
            )
        if kind == "slot" and (state["world_size"] != self.world_size or state["rank"] != self.rank):
            raise ResumeMismatchError(
                f"a slot state of rank {state['rank']} of {state['world_size']} loaded on rank {self.rank} of "
                f"{self.world_size}",
                field="rank",
                hint="Load each rank's own state, or merge_rank_states(all ranks' states) to change the topology",
            )
        self._loaded = state
        self._position = None
        self._next_epoch.fill_(-1)

    # ---- iteration --------------------------------------------------------------------------
    def _current_slot(self) -> tuple[int, int, int]:
        info = get_worker_info()
        if info is None:
            return self.rank, 0, 1
        if info.num_workers > _MAX_WORKERS:
            raise ConfigError(f"num_workers={info.num_workers}, at most {_MAX_WORKERS}", field="num_workers")
        return self.rank, info.id, info.num_workers

    def _units(self, layout: Layout):
        return enumerate_units(self._sources, layout)

    def _start_position(self, rank: int, worker: int, num_workers: int) -> dict[str, Any]:
        """Resolve what this slot starts from; sets layout and base."""
        loaded = self._loaded
        slots = self.world_size * num_workers
        if loaded is not None and loaded.get("layout") is not None:
            self._layout = _checked_layout(Layout.from_json(loaded["layout"]), self._sources)
        elif self.mode is Mode.EXACT:
            self._layout = choose_layout(self._sources, slots, self.unit_bytes)
        same_topology = loaded is not None and (loaded["world_size"], max(1, loaded["num_workers"])) == (
            self.world_size,
            num_workers,
        )
        if loaded is not None and self._loaded_once(worker):
            loaded = None  # a later pass of this process: continue from the shared epoch counter
        if loaded is not None and loaded["kind"] == "slot":
            if not same_topology or loaded["worker"] != worker:
                raise ResumeMismatchError(
                    f"a state of worker {loaded['worker']} of {loaded['num_workers']} loaded into worker {worker} "
                    f"of {num_workers}",
                    field="num_workers",
                    hint="Use the saved num_workers, or merge_rank_states(...) to change it",
                )
            self._base = self._checked_base(loaded["base"])
            self._check_position(loaded, self._base)
            return _position_fields(loaded)
        if loaded is not None and loaded["kind"] == "merged":
            if same_topology:
                mine = [s for s in loaded["slots"] if (s["rank"], s["worker"]) == (rank, worker)]
                self._base = self._checked_base(loaded["base"])
                self._check_position(mine[0], self._base)
                return _position_fields(mine[0])
            if self.mode is Mode.COMPAT:
                raise ResumeMismatchError(
                    f"compat mode cannot change the topology: saved on {loaded['world_size']} x "
                    f"{loaded['num_workers']} (ranks x workers), now {self.world_size} x {num_workers}",
                    field="num_workers",
                    hint="Resume on the saved topology, or use mode='exact' (elastic)",
                )
            self._base = self._remainder(loaded)
            return {"epoch": self._base.start, "item": 0, "current": None, "samples": 0, "skipped": 0}
        epoch = self._pass_epoch(num_workers)
        return {"epoch": epoch, "item": 0, "current": None, "samples": 0, "skipped": 0}

    def _checked_base(self, data: dict[str, Any] | None) -> Base:
        """The saved base, its unit ids inside this data's units (checked before any range is expanded)."""
        if self.mode is Mode.EXACT and data is not None:
            assert self._layout is not None  # noqa: S101 - set by _start_position
            count = len(self._units(self._layout))
            for entry in data["epochs"]:
                units = [end - 1 for _, end in entry["done"]] + [p[0] for p in entry["partial"]]
                if units and max(units) >= count:
                    raise ResumeMismatchError(
                        f"the saved state lists unit {max(units)} in epoch {entry['epoch']}, but the data has "
                        f"{count} units: the position is past the data",
                        field="base",
                        hint="Resume with the data files the state was saved with, or start afresh",
                    )
        return Base.from_json(data)

    def _check_position(self, state: dict[str, Any], base: Base) -> None:
        """A loaded slot position lies inside its slot's units (a unit cursor at most one past the last)."""
        item, current, epoch = state["item"], state["current"], state["epoch"]
        units: list[Unit] = []
        items: list[Item] = []
        if self.mode is Mode.COMPAT:
            count = 1  # one pass over the stream: 0 while reading, 1 once it ended
        else:
            assert self._layout is not None  # noqa: S101 - set by _start_position
            units = self._units(self._layout)
            slots = state["world_size"] * max(1, state["num_workers"])
            slot = state["worker"] * state["world_size"] + state["rank"]
            sizes = unit_sizes(units, self._sources)
            items = slot_items(base, len(units), self.seed, epoch, slot, slots, sizes)
            count = len(items)
        where = f"the saved position of rank {state['rank']} worker {state['worker']} is past the data"
        hint = "Resume with the data files the state was saved with, or start afresh"
        if item > count or (current is not None and item >= count):
            raise ResumeMismatchError(
                f"{where}: unit cursor {item}{' inside a unit' if current is not None else ''}, but the slot has "
                f"{count} unit(s) in epoch {epoch}",
                field="item",
                hint=hint,
            )
        if self.mode is Mode.COMPAT or current is None:
            return
        unit = units[items[item].unit]
        source = self._sources[unit.source]
        row, _, offset = current
        rows = None  # an upper bound on the unit's rows, where it is known without reading
        if source.kind == SourceKind.JSONL and unit.end >= 0:
            rows = (unit.end - unit.begin) // 2 + 1  # a record line holds at least 2 bytes with its newline
            if offset >= 0 and not unit.begin <= offset < unit.end:
                raise ResumeMismatchError(
                    f"{where}: block offset {offset} outside the unit's bytes [{unit.begin}, {unit.end}) of "
                    f"{source.path}",
                    field="current",
                    hint=hint,
                )
        elif source.kind == SourceKind.PARQUET:
            rows = source.row_groups[unit.begin]
        if rows is not None and row >= rows:
            raise ResumeMismatchError(
                f"{where}: row {row} of a unit of {source.path} that holds at most {rows} rows",
                field="current",
                hint=hint,
            )

    def _loaded_once(self, worker: int) -> bool:
        return bool(self._next_epoch[worker] >= 0)

    def _pass_epoch(self, num_workers: int) -> int:
        finished = self._next_epoch[:num_workers]
        if bool((finished >= 0).all()):
            return int(finished.min())
        if bool((finished >= 0).any()):
            return int(finished[finished >= 0].min())
        return max(self._epoch, self._base.start)

    def _remainder(self, merged: dict[str, Any]) -> Base:
        """Exactly what no slot of the saved topology consumed, as a base for the new topology."""
        assert self._layout is not None  # noqa: S101 - set by _start_position
        units = self._units(self._layout)
        sizes = unit_sizes(units, self._sources)
        base = self._checked_base(merged["base"])
        saved_slots = merged["world_size"] * max(1, merged["num_workers"])
        positions: dict[int, tuple[int, int, Item | None]] = {}
        for slot_state in merged["slots"]:
            self._check_position(slot_state, base)
            slot = slot_state["worker"] * merged["world_size"] + slot_state["rank"]
            current = slot_state["current"]
            item = None
            if current is not None:
                items = slot_items(base, len(units), self.seed, slot_state["epoch"], slot, saved_slots, sizes)
                item = Item(items[slot_state["item"]].unit, current[0], current[1], current[2])
            positions[slot] = (slot_state["epoch"], slot_state["item"], item)
        return remainder_after(base, len(units), self.seed, saved_slots, positions, sizes)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        rank, worker, num_workers = self._current_slot()
        self._position = self._start_position(rank, worker, num_workers)
        if self._at_end_of_pass(self._position, rank, worker, num_workers):
            # a state saved after its pass ended: StatefulDataLoader may discard this iterator and start
            # a fresh one from the main process's copy, which then reads the next epoch from here
            self._next_epoch[worker] = self._position["epoch"] + 1
        # never reuse a tokenizer across fork: the parent's Rust thread pool does not survive it
        load = self._encode is None or self._encode_pid != os.getpid()
        if load and worker_info_present():
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

    def _at_end_of_pass(self, position: dict[str, Any], rank: int, worker: int, num_workers: int) -> bool:
        if position["current"] is not None or self.infinite:
            return False
        if self.mode is Mode.COMPAT:
            return position["item"] >= 1
        assert self._layout is not None  # noqa: S101 - set by _start_position
        units = self._units(self._layout)
        slot, slots = worker * self.world_size + rank, self.world_size * num_workers
        items = slot_items(
            self._base, len(units), self.seed, position["epoch"], slot, slots, unit_sizes(units, self._sources)
        )
        return position["item"] >= len(items) > 0

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
                text_field=self.text_field,
                on_error=self.on_error,
                name=self.dataset_name,
                batch=self.encode_batch_size,
                counters=counters,
            )
            return _SlotFeed(Feed(blocks), counters, pass_epoch, 1)
        assert self._layout is not None  # noqa: S101
        units = self._units(self._layout)
        sizes = unit_sizes(units, self._sources)
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
            reading=Reading(self.shuffle_buffer_size, self.text_field, self.on_error, self.max_line_bytes),
            hf_dataset=self._hf,
            counters=counters,
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
        for block in _rebatch(blocks, self.encode_batch_size):
            packer.add(block)
            window = packer.windows()
            if window is None:
                continue
            for sample, pos in self._samples(window):
                samples += 1
                self._position = {
                    "epoch": int(pos[0]),
                    "item": int(pos[1]),
                    "current": [int(pos[2]), int(pos[3]), int(pos[4])],
                    "samples": samples,
                    "skipped": counters.skipped,
                }
                yield sample
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
        if self.mode is Mode.COMPAT or self.drop_remainder:
            if packer.buffered:
                log.info("dropping the last %d tokens of the pass (drop_remainder)", packer.buffered)
            packer.clear()
        tail = packer.tail()
        if tail is not None:
            for sample, _ in self._samples(tail):
                self._position = {**end, "samples": samples + 1}
                yield sample
        self._position = end if tail is None else {**end, "samples": samples + 1}
        self._next_epoch[worker] = pass_epoch + 1

    def _samples(self, window: Window) -> Iterator[tuple[dict[str, torch.Tensor], np.ndarray]]:
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
            batch["doc_index"] = window.provenance[:, :-1]
            batch["label_doc_index"] = window.provenance[:, 1:]
        for row in range(window.tokens.shape[0]):
            yield (
                {key: torch.from_numpy(np.ascontiguousarray(value[row])) for key, value in batch.items()},
                window.positions[row],
            )


_MAX_UNITS = 1 << 24


def _checked_layout(layout: Layout, sources: list[Source]) -> Layout:
    """A saved layout that cuts these sources into a sane number of units (counted, not built)."""
    count = 0
    for source in sources:
        if source.kind == SourceKind.JSONL:
            parts = max(1, math.ceil(source.size / layout.unit_bytes)) * layout.split
            count += max(1, min(parts, source.size))
        else:
            count += max(1, len(source.row_groups)) if source.kind == SourceKind.PARQUET else 1
    if count * layout.stride > _MAX_UNITS:
        raise ResumeMismatchError(
            f"the saved layout {layout.to_json()} cuts the data into {count * layout.stride} units, more than "
            f"{_MAX_UNITS}: it was not written for this data",
            field="layout",
            hint="Resume with the data files the state was saved with, or start afresh",
        )
    return layout


def worker_info_present() -> bool:
    return get_worker_info() is not None


def _position_fields(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "epoch": int(state["epoch"]),
        "item": int(state["item"]),
        "current": None if state["current"] is None else [int(v) for v in state["current"]],
        "samples": int(state.get("samples", 0)),
        "skipped": int(state.get("skipped", 0)),
    }


def _rebatch(blocks: Iterable[Any], size: int) -> Iterator[Any]:
    """Split large reader blocks so one tokenizer call holds at most ``size`` documents."""
    for block in blocks:
        count = len(block.texts)
        if count <= size:
            yield block
            continue
        for begin in range(0, count, size):
            end = min(begin + size, count)
            yield type(block)(
                texts=block.texts[begin:end],
                doc_ids=block.doc_ids[begin:end],
                epoch=block.epoch[begin:end],
                item=block.item[begin:end],
                row=block.row[begin:end],
                hint=block.hint[begin:end],
                first_token=block.first_token[begin:end],
            )
