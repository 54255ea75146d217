"""Documents in a slot's order, as DocBlocks: the exact (counter) order and the seed's (compat) order."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.formats import ResumeMismatchError
from tokenloom.hf_streaming._blocks import Block, Reading, read_blocks, text_of
from tokenloom.hf_streaming._order import Base, Item, block_order, slot_items
from tokenloom.hf_streaming._pack import DocBlock
from tokenloom.hf_streaming._prefetch import ReadAhead
from tokenloom.hf_streaming._units import HF, Source, Unit

__all__ = ["Counters", "Feed", "compat_blocks", "exact_blocks"]

log = logging.getLogger("tokenloom.hf_streaming")


@dataclass(slots=True)
class Counters:
    skipped: int = 0
    records: int = 0


def _doc_block(texts, doc_ids, epoch, item, rows, hint, first_token) -> DocBlock:
    n = len(texts)
    return DocBlock(
        texts=texts,
        doc_ids=np.asarray(doc_ids, dtype=np.int64),
        epoch=np.full(n, epoch, dtype=np.int64),
        item=np.full(n, item, dtype=np.int64),
        row=np.asarray(rows, dtype=np.int64),
        hint=np.full(n, hint, dtype=np.int64),
        first_token=np.asarray(first_token, dtype=np.int64),
    )


def _reader(item: Item, unit: Unit, source: Source, reading: Reading, hf_dataset: Any, depth: int) -> ReadAhead[Block]:
    """The unit's raw blocks from the item's position on, read ahead in a thread (HF shards: in the caller)."""

    def make() -> Iterator[Block]:
        hint = item.hint if item.hint >= 0 and item.row > 0 else -1
        first = item.row // reading.block_size
        return read_blocks(unit, source, unit.source, reading, start_block=first, hint=hint, hf_dataset=hf_dataset)

    return ReadAhead(make, depth if source.kind != HF else 0)


def _unit_blocks(
    item: Item,
    source: Source,
    blocks: ReadAhead[Block],
    *,
    epoch: int,
    index: int,
    seed: int,
    block_size: int,
    counters: Counters,
) -> Iterator[DocBlock]:
    """A unit's documents in the slot's order: each block permuted by its key, from the item's row on."""
    first_block = item.row // block_size
    reached = item.fresh
    for block in blocks:
        size = len(block.texts)
        order = block_order(size, seed, epoch, item.unit, block.index)
        begin = item.row - block.index * block_size if block.index == first_block else 0
        reached = reached or (block.index == first_block and begin < size)
        if begin >= size:
            continue
        picked = order[begin:]
        texts = list(map(block.texts.__getitem__, picked.tolist()))
        rows = np.arange(begin, size, dtype=np.int64) + block.index * block_size
        counters.records += size - begin
        if None in texts:  # records skipped by on_error="skip"
            keep = np.fromiter((text is not None for text in texts), dtype=bool, count=len(texts))
            counters.skipped += len(texts) - int(keep.sum())
            texts = [text for text in texts if text is not None]
            picked, rows = picked[keep], rows[keep]
        if texts:
            first = np.where(rows == item.row, item.token, 0)
            yield _doc_block(texts, block.doc_ids[picked], epoch, index, rows, block.hint, first)
    if not reached:
        raise _past_the_data(f"unit {item.unit} ({source.path}) has no row {item.row}")


def _past_the_data(what: str) -> ResumeMismatchError:
    return ResumeMismatchError(
        f"the saved position is past the data: {what}",
        field="current",
        hint="Resume with the data files the state was saved with, or start afresh",
    )


def exact_blocks(
    *,
    units: list[Unit],
    sizes: list[int],
    sources: list[Source],
    base: Base,
    slot: int,
    slots: int,
    epoch: int,
    item_index: int,
    current: Item | None,
    infinite: bool,
    seed: int,
    reading: Reading,
    hf_dataset: Any,
    counters: Counters,
    prefetch_blocks: int = 0,
) -> Feed:
    """Documents of this slot from (epoch, item_index, current) on; one pass unless ``infinite``.

    With ``prefetch_blocks``, the readers of the first unit (and of the one after it) start here, before
    the first ``next()``: the slot's first reads and GETs run while the caller loads its tokenizer.
    """
    readers: dict[int, ReadAhead[Block]] = {}

    def reader(index: int, item: Item) -> ReadAhead[Block]:
        if index not in readers:
            unit = units[item.unit]
            readers[index] = _reader(item, unit, sources[unit.source], reading, hf_dataset, prefetch_blocks)
        return readers[index]

    def first_item(items: list[Item], index: int) -> Item:
        item = items[index]
        if index == item_index and current is not None:
            item = Item(item.unit, current.row, current.token, current.hint)
        return item

    def documents() -> Iterator[DocBlock]:
        nonlocal epoch
        first_epoch = True
        try:
            while True:
                items = slot_items(base, len(units), seed, epoch, slot, slots, sizes)
                records_before = counters.records
                start = item_index if first_epoch else 0
                for index in range(start, len(items)):
                    item = first_item(items, index) if first_epoch else items[index]
                    blocks = reader(index, item)
                    if index + 1 < len(items) and prefetch_blocks:
                        reader(index + 1, items[index + 1])  # the next unit's first blocks arrive meanwhile
                    source = sources[units[item.unit].source]
                    yield from _unit_blocks(
                        item,
                        source,
                        blocks,
                        epoch=epoch,
                        index=index,
                        seed=seed,
                        block_size=reading.block_size,
                        counters=counters,
                    )
                    del readers[index]
                readers.clear()
                if not infinite:
                    return
                if epoch not in base.epochs and counters.records == records_before:
                    log.warning(
                        "slot %d of %d read no record in epoch %d: it stops (too few source shards)", slot, slots, epoch
                    )
                    return
                first_epoch = False
                epoch += 1
        finally:
            _close_all(readers)

    if prefetch_blocks:
        items = slot_items(base, len(units), seed, epoch, slot, slots, sizes)
        try:
            for index in range(item_index, min(item_index + 2, len(items))):
                reader(index, first_item(items, index))
        except BaseException:
            _close_all(readers)  # the second one failed to start: no Feed will ever stop the first
            raise
    feed = documents()
    # a generator dropped (or closed) before its first next() never runs its finally: stop the threads then
    return Feed(feed, weakref.finalize(feed, _close_all, readers))


def _close_all(readers: dict[int, ReadAhead[Block]]) -> None:
    for pending in list(readers.values()):
        pending.close()


class Feed:
    """A slot's DocBlocks, whose readers may already be reading: iterate it once; ``close()`` stops them."""

    __slots__ = ("_documents", "_stop")

    def __init__(self, documents: Iterator[DocBlock], stop: Callable[[], Any] | None = None) -> None:
        self._documents = documents
        self._stop = stop

    def __iter__(self) -> Iterator[DocBlock]:
        return self._documents

    def close(self) -> None:
        close = getattr(self._documents, "close", None)
        if close is not None:
            close()
        if self._stop is not None:
            self._stop()


def compat_blocks(
    stream_for_epoch: Any,
    *,
    rank: int,
    world_size: int,
    epoch: int,
    row: int,
    token: int,
    infinite: bool,
    reading: Reading,
    name: str,
    batch: int,
    counters: Counters,
) -> Iterator[DocBlock]:
    """The seed's order: HF buffered shuffle (seed + epoch), rank takes every world_size-th document;
    resume replays the stream to document ``row``.

    No worker split here: inside a DataLoader worker, ``datasets`` already gives each worker its
    share of the source shards (every num_workers-th shard, its shuffle keyed by the worker id), and
    the seed's rank stride applies to that worker's stream. Splitting again dropped documents."""
    reached = row == 0 and token == 0
    while True:
        texts, ids, rows, first = [], [], [], []
        slot_doc = 0
        for doc_index, example in enumerate(stream_for_epoch(epoch)):
            if doc_index % world_size != rank:
                continue
            current = slot_doc
            reached = reached or current == row
            slot_doc += 1
            if current < row:
                continue
            counters.records += 1
            text = text_of(example, reading.text_field, reading.on_error, path=name, offset=None, row=doc_index)
            if text is None:
                counters.skipped += 1
                continue
            texts.append(text)
            ids.append(doc_index)
            rows.append(current)
            first.append(token if current == row else 0)
            if len(texts) == batch:
                yield _doc_block(texts, ids, epoch, 0, rows, -1, first)
                texts, ids, rows, first = [], [], [], []
        if texts:
            yield _doc_block(texts, ids, epoch, 0, rows, -1, first)
        if not reached:
            raise _past_the_data(f"this slot's stream has {slot_doc} documents, the state resumes at document {row}")
        if not infinite:
            return
        epoch, row, token = epoch + 1, 0, 0
