"""Where a slot starts, and the state that says it: saved, loaded, checked, merged over another topology.

A state is a position, never a buffer (see the package's README): per slot the epoch, the unit cursor and the
row and token offset inside the current unit. This mixin of :class:`StreamingHuggingFaceDataset` turns a loaded
state (a slot's own, or one merged from every rank with :func:`merge_rank_states`) into this slot's start,
and checks that every saved number lies inside the data before any of it is used.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import torch
from torch.utils.data import get_worker_info

from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.hf_streaming._order import Base, Item, remainder_after, slot_items
from tokenloom.hf_streaming._sources import check_objects
from tokenloom.hf_streaming._state import FORMAT, VERSION, check_fingerprint, check_state
from tokenloom.hf_streaming._units import Layout, Source, Unit, choose_layout, enumerate_units, unit_count, unit_sizes
from tokenloom.tokenize.inputs import Cut

__all__ = ["MAX_WORKERS", "Mode", "Resumable", "distributed_defaults"]

MAX_WORKERS = 256


class Mode(StrEnum):
    EXACT = "exact"
    """Counter-based order: exact resume on the same topology, exactly-once on any other."""
    COMPAT = "compat"
    """The seed's order (HF buffered shuffle, rank strides); resumes on the same topology only."""


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} of world_size {world_size}, expected 0 <= rank < world_size", field="rank")
    return rank, world_size


class Resumable:
    """The position half of the dataset: what its ``__init__`` sets (sources, mode, fingerprint, ...) is used here."""

    # what the ``__init__`` of the class that mixes this in (StreamingHuggingFaceDataset) sets, declared for the checker
    mode: Mode
    rank: int
    world_size: int
    seed: int
    infinite: bool
    unit_bytes: int
    fingerprint: dict[str, Any]
    _sources: list[Source]
    _objects: list[list[Any]]
    """Each remote source's index, path and ETag as opened."""
    _epoch: int
    _next_epoch: torch.Tensor
    """Per worker, the epoch its next fresh pass starts at (-1: none yet); in shared memory."""
    _loaded: dict[str, Any] | None
    _base: Base
    _layout: Layout | None
    _position: dict[str, Any] | None

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
        check_state(state)
        check_objects(state.get("objects"), self._objects)  # first: a changed object names its URL
        check_fingerprint(state["fingerprint"], self.fingerprint)
        if self.mode is Mode.COMPAT and state["world_size"] != self.world_size:
            raise ResumeMismatchError(
                f"compat mode cannot change the topology: saved on {state['world_size']} ranks, now {self.world_size}",
                field="world_size",
                hint="Resume on the saved number of ranks and workers, or use mode='exact' (elastic)",
            )
        if state["kind"] == "slot" and (state["world_size"] != self.world_size or state["rank"] != self.rank):
            raise ResumeMismatchError(
                f"a slot state of rank {state['rank']} of {state['world_size']} loaded on rank {self.rank} of "
                f"{self.world_size}",
                field="rank",
                hint="Load each rank's own state, or merge_rank_states(all ranks' states) to change the topology",
            )
        self._loaded = state
        self._position = None
        self._next_epoch.fill_(-1)

    def _current_slot(self) -> tuple[int, int, int]:
        info = get_worker_info()
        if info is None:
            return self.rank, 0, 1
        if info.num_workers > MAX_WORKERS:
            raise ConfigError(f"num_workers={info.num_workers}, at most {MAX_WORKERS}", field="num_workers")
        return self.rank, info.id, info.num_workers

    def _unit_plan(self) -> tuple[list[Unit], list[int]]:
        """The units of the layout ``_start_position`` set, and their sizes."""
        assert self._layout is not None  # noqa: S101 - set by _start_position
        units = enumerate_units(self._sources, self._layout)
        return units, unit_sizes(units, self._sources)

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
            count = len(self._unit_plan()[0])
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
            units, sizes = self._unit_plan()
            slots = state["world_size"] * max(1, state["num_workers"])
            slot = state["worker"] * state["world_size"] + state["rank"]
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
        if source.cut is Cut.BYTES:
            rows = (unit.end - unit.begin) // 2 + 1  # a record line holds at least 2 bytes with its newline
            if offset >= 0 and not unit.begin <= offset < unit.end:
                raise ResumeMismatchError(
                    f"{where}: block offset {offset} outside the unit's bytes [{unit.begin}, {unit.end}) of "
                    f"{source.path}",
                    field="current",
                    hint=hint,
                )
        elif source.rows:
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
        units, sizes = self._unit_plan()
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

    def _at_end_of_pass(self, position: dict[str, Any], rank: int, worker: int, num_workers: int) -> bool:
        if position["current"] is not None or self.infinite:
            return False
        if self.mode is Mode.COMPAT:
            return position["item"] >= 1
        units, sizes = self._unit_plan()
        slot, slots = worker * self.world_size + rank, self.world_size * num_workers
        items = slot_items(self._base, len(units), self.seed, position["epoch"], slot, slots, sizes)
        return position["item"] >= len(items) > 0


_MAX_UNITS = 1 << 24


def _checked_layout(layout: Layout, sources: list[Source]) -> Layout:
    """A saved layout that cuts these sources into a sane number of units (counted, not built)."""
    count = unit_count(sources, layout)
    if count > _MAX_UNITS:
        raise ResumeMismatchError(
            f"the saved layout {layout.to_json()} cuts the data into {count} units, more than "
            f"{_MAX_UNITS}: it was not written for this data",
            field="layout",
            hint="Resume with the data files the state was saved with, or start afresh",
        )
    return layout


def _position_fields(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "epoch": int(state["epoch"]),
        "item": int(state["item"]),
        "current": None if state["current"] is None else [int(v) for v in state["current"]],
        "samples": int(state.get("samples", 0)),
        "skipped": int(state.get("skipped", 0)),
    }
