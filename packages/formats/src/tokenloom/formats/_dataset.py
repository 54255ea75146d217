"""TokenDataset: the one read-side view every format opens into.

A dataset is a list of shards. A shard is a contiguous run of tokens in one file
(``tokens_path`` at ``tokens_offset`` bytes) plus its entry boundaries
(``offsets``, int64, starting at 0 and ending at the shard's token count) and a
per-entry overlap prefix (uint16). Every format reader (native, flat, Megatron,
packed) validates its own bytes and then builds shards; everything above this
module is format-blind.

Token data is memory-mapped lazily, once per process: pickling a dataset (for a
DataLoader worker) copies paths and the small index arrays, never tokens.
"""

from __future__ import annotations

import bisect
import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats.errors import ConfigError, FormatError, IndexCorruptError, TokenRangeError, TruncatedError
from tokenloom.formats.io.index_blocks import IndexBlocks
from tokenloom.formats.io.index_map import iter_chunks, release_pages, zeros_index
from tokenloom.formats.io.manifest import EOS_AT_DOCUMENT_END, EOS_PLACEMENT
from tokenloom.formats.io.paths import as_path
from tokenloom.formats.io.progress import Stage
from tokenloom.formats.io.sidecar import merge_sidecar, read_sidecar, sidecar_of
from tokenloom.formats.io.source import Source, current_source

__all__ = ["LazyShard", "Shard", "TokenDataset", "sidecar_values"]

_bisect_right = bisect.bisect_right


@dataclass(eq=False)
class Shard:
    """One file's tokens and entry boundaries (already validated by its reader)."""

    tokens_path: Path
    dtype: np.dtype
    num_tokens: int
    offsets: np.ndarray  # int64, len(entries) + 1, offsets[0] == 0, offsets[-1] == num_tokens
    overlap_prefix: np.ndarray  # uint16, one per entry
    tokens_offset: int = 0  # byte offset of the first token in tokens_path
    name: str = ""
    _tokens: np.ndarray | None = field(default=None, repr=False)
    #: where the token bytes come from (the reader's source: local files, or the remote block cache)
    source: Source = field(default_factory=current_source, repr=False)

    @classmethod
    def single_entry(cls, path: Path, dtype: np.dtype, count: int, *, tokens_offset: int = 0, name: str) -> Shard:
        """A shard holding one entry: ``count`` tokens of ``dtype`` from byte ``tokens_offset`` of ``path``."""
        offsets = np.array([0, count], dtype=np.int64)
        return cls(path, dtype, count, offsets, np.zeros(1, dtype=np.uint16), tokens_offset=tokens_offset, name=name)

    @property
    def num_entries(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> np.ndarray:
        """The shard's tokens as a read-only 1-D array over a memory map (opened on first use)."""
        tokens = self._tokens
        if tokens is None:
            tokens = self.source.tokens(self.tokens_path, self.dtype, self.tokens_offset, self.num_tokens)
            self._tokens = tokens
        return tokens

    def as_single_entry(self) -> Shard:
        """The same tokens (same reader, no copy) as one entry with no per-document index."""
        bare = copy.copy(self)
        bare.offsets = np.array([0, self.num_tokens], dtype=np.int64)
        bare.overlap_prefix = np.zeros(1, dtype=np.uint16)
        return bare

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tokens"] = None  # reopened lazily in the receiving process
        return state


#: entries checked together on first touch (their offsets fill half a 1 MiB hash block)
ENTRY_BLOCK_SHIFT = 16


class LazyShard(Shard):
    """A shard whose index is checked by blocks of entries on first use, not at open (10^9 entries open at once).

    The index is ``count + 1`` int64 offsets at byte ``offsets_at`` of ``index`` and ``count`` uint16 overlap
    prefixes at ``overlaps_at`` (None: the manifest records that all are 0). Touching entry ``i`` checks its
    block of 2^16 entries once per process: the index blocks' hashes (:class:`IndexBlocks`), then offsets that
    rise within ``[0, num_tokens]`` and overlap prefixes that fit their entries. Reading the whole
    ``offsets`` or ``overlap_prefix`` checks every block first.
    """

    def __init__(
        self,
        tokens_path: Path,
        dtype: np.dtype,
        num_tokens: int,
        index: IndexBlocks,
        *,
        count: int,
        offsets_at: int,
        overlaps_at: int | None,
        name: str,
    ) -> None:
        self.tokens_path, self.dtype, self.num_tokens, self.name = tokens_path, dtype, num_tokens, name
        self.tokens_offset = 0
        self._tokens = None
        self.source = current_source()
        self.index, self._count, self._offsets_at, self._overlaps_at = index, count, offsets_at, overlaps_at
        self.entry_checked = bytearray(max(1, -(-count >> ENTRY_BLOCK_SHIFT)))  # (no entries: block 0 checks [0])
        self._raw: tuple[np.ndarray, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_raw"] = None  # views of this process's map
        state["entry_checked"] = bytearray(len(self.entry_checked))  # checked again where it is used
        return state

    @property
    def num_entries(self) -> int:
        return self._count

    def raw_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, overlap prefixes) as stored, not checked: call :meth:`check_entries` before using a part."""
        if self._raw is None:
            buffer, count = self.index.buffer, self._count
            offsets = np.frombuffer(buffer, dtype="<i8", count=count + 1, offset=self._offsets_at)
            at = self._overlaps_at
            overlaps = zeros_index(count) if at is None else np.frombuffer(buffer, "<u2", count=count, offset=at)
            self._raw = (offsets, overlaps)
        return self._raw

    @property
    def offsets(self) -> np.ndarray:  # pyright: ignore[reportIncompatibleVariableOverride]
        self.check_entries(0, self._count)
        return self.raw_index()[0]

    @property
    def overlap_prefix(self) -> np.ndarray:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self._overlaps_at is not None:
            self.check_entries(0, self._count)
        return self.raw_index()[1]

    def as_single_entry(self) -> LazyShard:
        """The same tokens (same reader, no copy) as one entry: the index is not read."""
        bare = copy.copy(self)
        bare._count = 1
        bare.entry_checked = bytearray(b"\x01")
        bare._raw = (np.array([0, self.num_tokens], dtype=np.int64), np.zeros(1, dtype=np.uint16))
        return bare

    def check_entries(self, first: int, stop: int) -> None:
        """Check the blocks of entries ``[first, stop)`` not checked yet in this process (see the class)."""
        checked = self.entry_checked
        for block in range(first >> ENTRY_BLOCK_SHIFT, ((max(stop, first + 1) - 1) >> ENTRY_BLOCK_SHIFT) + 1):
            if not checked[block]:
                self._check_block(block)
                checked[block] = 1

    def _describe(self, start: int, stop: int) -> str:
        first, last = (start - self._offsets_at) // 8 - 1, (stop - self._offsets_at) // 8
        if self._overlaps_at is not None and start >= self._overlaps_at:
            first, last = (start - self._overlaps_at) // 2, (stop - self._overlaps_at) // 2
        first, last = max(first, 0), min(last, self._count)
        return f"entries {first}-{last} of shard {self.name!r}" if last > first else f"the header of {self.name!r}"

    def _check_block(self, block: int) -> None:
        first = block << ENTRY_BLOCK_SHIFT
        stop = min(self._count, first + (1 << ENTRY_BLOCK_SHIFT))
        index, where = self.index, self.index.where
        index.ensure(self._offsets_at + 8 * first, self._offsets_at + 8 * (stop + 1), self._describe)
        if self._overlaps_at is not None:
            index.ensure(self._overlaps_at + 2 * first, self._overlaps_at + 2 * stop, self._describe)
        offsets, overlaps = self.raw_index()
        part = np.array(offsets[first : stop + 1])
        release_pages(offsets, first, stop + 1)  # checked once: this process keeps none of the pages

        def corrupt(problem: str, field: str, at: int, i: int) -> IndexCorruptError:
            hint = "The index is damaged although its block hashes match (a writer's bug?): re-create the dataset"
            return IndexCorruptError(
                problem,
                path=where,
                offset=at + (first + i) * (8 if field == "offsets" else 2),
                record=first + i,
                field=field,
                hint=hint,
            )

        if first == 0 and part[0] != 0:
            raise IndexCorruptError(
                f"first offset is {int(part[0])}, expected 0", path=where, offset=self._offsets_at, field="offsets"
            )
        steps = np.diff(part)
        bad = np.flatnonzero((steps < 0) | (part[1:] > self.num_tokens))
        if part[0] < 0 or len(bad):
            i = int(bad[0]) + 1 if len(bad) else 0
            raise corrupt(
                f"offset {int(part[i])} after {int(part[i - 1]) if i else 'the start'}: offsets must rise within the "
                f"shard's {self.num_tokens} tokens",
                "offsets",
                self._offsets_at,
                i,
            )
        if stop == self._count and part[-1] != self.num_tokens:
            short = part[-1] > self.num_tokens
            raise (TruncatedError if short else IndexCorruptError)(
                f"final offset {int(part[-1])} differs from the data file's {self.num_tokens} tokens",
                path=self.tokens_path if short else where,
                field="offsets",
            )
        if self._overlaps_at is not None:
            wrong = np.flatnonzero(np.asarray(overlaps[first:stop], dtype=np.int64) > steps)
            release_pages(overlaps, first, stop)
            if len(wrong):
                i = int(wrong[0])
                problem = (
                    f"overlap prefix {int(overlaps[first + i])} is longer than its entry of {int(steps[i])} tokens"
                )
                raise corrupt(problem, "overlap_prefix", self._overlaps_at, i)


def sidecar_values(
    described: list[tuple[Path, Path]], root: Path, *, vocab_size: int | None, eos_id: int | None, what: str
) -> tuple[int | None, int | None, str | None]:
    """Vocab size, EOS id and tokenizer fingerprint of files that have no field for them (Megatron, packed):
    tokenloom's sidecars (``described``: (sidecar owner, the file it describes) pairs; every sidecar found must
    agree) merged with the values given (:func:`~tokenloom.formats.io.sidecar.merge_sidecar`)."""
    recorded: dict[str, Any] | None = None
    recorded_by: Path | None = None
    for owner, data in described:
        sidecar = sidecar_of(owner)
        found = read_sidecar(sidecar, data, root)
        if found is not None and recorded is not None and found != recorded:
            raise FormatError(
                f"the sidecars of {what} {recorded_by.name if recorded_by else '?'} and {sidecar.name} record "
                f"different values ({recorded} vs {found})",
                path=sidecar,
                hint=f"Open the {what} separately: they come from different tokenizers or settings",
            )
        if found is not None:
            recorded, recorded_by = found, sidecar
    return merge_sidecar(recorded, vocab_size=vocab_size, eos_id=eos_id, path=recorded_by or described[0][0])


#: ``ds[i]`` finds entry i's shard in a table of about this many blocks per shard (at most _MAX_BLOCKS)
_BLOCKS_PER_SHARD = 4
_MAX_BLOCKS = 1 << 16


def _shard_of_block(entry_starts: np.ndarray) -> tuple[int, list[int]]:
    """``(shift, table)``: ``table[b]`` is the shard holding entry ``b << shift`` (the last shard past the end).

    Entry ``i`` lies in a shard from ``table[i >> shift]`` to ``table[(i >> shift) + 1]``: with blocks
    smaller than most shards that is one shard, and otherwise a bisect over a few.
    """
    length = int(entry_starts[-1])
    num_shards = len(entry_starts) - 1
    blocks = min(_BLOCKS_PER_SHARD * num_shards, _MAX_BLOCKS)
    shift = max(0, (length - 1) // blocks).bit_length() if length else 0
    firsts = np.arange((length >> shift) + 2, dtype=np.int64) << shift
    table = np.searchsorted(entry_starts, np.minimum(firsts, max(length - 1, 0)), side="right") - 1
    return shift, np.minimum(table, num_shards - 1).tolist()


class TokenDataset:
    """Entries (documents or windows) over one or more shards, addressed globally.

    ``ds[i]`` is a zero-copy view of entry ``i``; ``ds.tokens(begin, end)`` a range
    of the global token stream (shards concatenated in order).
    """

    #: how data in object storage is reached and cached (a RemoteOptions, pickled with the dataset); None: local
    remote: Any = None

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        format: str,
        root: str | os.PathLike[str],
        eos_id: int | None = None,
        vocab_size: int | None = None,
        fingerprint: str | None = None,
        tokenizer_fingerprint: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if not shards:
            raise ConfigError("a dataset needs at least one shard", path=root)
        dtypes = {s.dtype for s in shards}
        if len(dtypes) != 1:
            raise ConfigError(
                f"shards have different dtypes {sorted(d.name for d in dtypes)}, expected one",
                path=root,
                hint="Convert the shards to one dtype",
            )
        self.shards = list(shards)
        self.format = format
        self.root = as_path(root)
        self.eos_id = eos_id
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metadata = dict(metadata or {})
        self.dtype: np.dtype = shards[0].dtype
        entry_counts = np.array([s.num_entries for s in self.shards], dtype=np.int64)
        token_counts = np.array([s.num_tokens for s in self.shards], dtype=np.int64)
        self.shard_num_tokens = token_counts
        entry_starts = np.concatenate([[0], np.cumsum(entry_counts)]).astype(np.int64)
        self._entry_starts = entry_starts.tolist()  # python ints: fast compares and bisect
        self._token_starts = np.concatenate([[0], np.cumsum(token_counts)]).astype(np.int64)
        self.num_tokens = int(self._token_starts[-1])
        self._length = int(entry_starts[-1])
        self._block_shift, self._block_shards = _shard_of_block(entry_starts)
        self._doc_lengths: np.ndarray | None = None
        self._overlap: np.ndarray | None = None
        self._entry_ends = self._entry_starts[1:]
        self._entry_views: list[tuple[Any, memoryview, memoryview, int, Any] | None] = [None] * len(self.shards)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_entry_views"]  # memoryviews do not pickle; rebuilt on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._entry_views = [None] * len(self.shards)

    # -- the reading contract -------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> np.ndarray:
        # The hot path of every random-access reader (benchmarked in tools/bench/bench_formats.py): local
        # names, no property calls, no numpy scalars, and the shard found from a table of blocks of entries
        # instead of a bisect over every shard's start.
        if not 0 <= index < self._length:
            index = self._checked_index(index)
        ends = self._entry_ends
        block = index >> self._block_shift
        k = self._block_shards[block]  # the shard holding the block's first entry
        if index >= ends[k]:  # a later shard of the same block: search only the block's shards
            k = _bisect_right(ends, index, k + 1, self._block_shards[block + 1])
        tokens, begins, stops, start, checked = self._entry_views[k] or self._entry_view(k)
        local = index - start
        if checked is not None and not checked[local >> ENTRY_BLOCK_SHIFT]:  # a LazyShard's block, first touched
            self.shards[k].check_entries(local, local + 1)  # pyright: ignore[reportAttributeAccessIssue]
        return tokens[begins[local] : stops[local]]

    def _checked_index(self, index: int) -> int:
        length = self._length
        if -length <= index < 0:
            return index + length
        raise IndexError(f"entry {index} out of range for a dataset of {length} entries")

    def _entry_view(self, k: int) -> tuple[Any, memoryview, memoryview, int, Any]:
        """Shard ``k``'s tokens, its entries' first and end offsets (memoryviews: they index to Python ints,
        faster than numpy scalars), its first entry's global index and, for a :class:`LazyShard`, which of its
        blocks of entries are checked; made on first use (a lazy index is read only where touched)."""
        shard = self.shards[k]
        if isinstance(shard, LazyShard):
            offsets, checked = shard.raw_index()[0].data, shard.entry_checked
        else:
            offsets, checked = np.ascontiguousarray(shard.offsets, np.int64).data, None
        view = self._entry_views[k] = (shard.tokens, offsets, offsets[1:], self._entry_starts[k], checked)
        return view

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def doc_lengths(self) -> np.ndarray:
        """Length of every entry, int64."""
        if self._doc_lengths is None:
            self._doc_lengths = np.concatenate([np.diff(s.offsets) for s in self.shards]).astype(np.int64)
        return self._doc_lengths

    @property
    def overlap_prefix(self) -> np.ndarray:
        """Overlap-prefix length of every entry, uint16 (zeros where the format has none)."""
        if self._overlap is None:
            self._overlap = np.concatenate([s.overlap_prefix for s in self.shards]).astype(np.uint16)
        return self._overlap

    def tokens(self, begin: int, end: int) -> np.ndarray:
        """Tokens ``[begin, end)`` of the global stream: a view inside one shard, a copy across shards."""
        if not 0 <= begin <= end <= self.num_tokens:
            raise IndexError(f"token range [{begin}, {end}) outside [0, {self.num_tokens}]")
        starts = self._token_starts
        first = int(np.searchsorted(starts, begin, side="right")) - 1
        first = min(first, len(self.shards) - 1)
        local_begin = begin - int(starts[first])
        if end - int(starts[first]) <= self.shards[first].num_tokens:
            return self.shards[first].tokens[local_begin : end - int(starts[first])]
        parts = []
        k = first
        while begin < end:
            shard_end = int(starts[k + 1])
            take_end = min(end, shard_end)
            parts.append(self.shards[k].tokens[begin - int(starts[k]) : take_end - int(starts[k])])
            begin = take_end
            k += 1
        return np.concatenate(parts)

    # -- validation shared by the readers --------------------------------------------
    def check_deep(self, validate: str) -> TokenDataset:
        """The reads of every token deep validation adds (ids in range, EOS placement), when ``validate`` is deep."""
        if validate == "deep":
            self.check_token_range()
            self.check_eos_placement()
        return self

    def check_token_range(self, *, chunk_tokens: int = 1 << 20) -> None:
        """Raise TokenRangeError at the first negative id, or id >= vocab_size when the vocab size is known."""
        if self.vocab_size is None and self.dtype.kind != "i":
            return
        stage = Stage("token ids", self.num_tokens)
        for shard in self.shards:
            tokens = shard.tokens
            for start, chunk in iter_chunks(tokens, chunk_tokens):  # pages released as it goes
                stage.advance(len(chunk))
                bad = chunk < 0 if chunk.dtype.kind == "i" else np.zeros(len(chunk), dtype=bool)
                if self.vocab_size is not None:
                    bad |= chunk >= self.vocab_size
                if bad.any():
                    position = start + int(np.argmax(bad))
                    expected = f"[0, {self.vocab_size})" if self.vocab_size is not None else "ids >= 0"
                    raise TokenRangeError(
                        f"token id {int(tokens[position])} outside {expected}",
                        path=shard.tokens_path,
                        offset=shard.tokens_offset + position * shard.dtype.itemsize,
                        record=int(np.searchsorted(shard.offsets, position, side="right")) - 1,
                        field="tokens",
                    )

    def check_eos_placement(self) -> None:
        """Raise FormatError at the first non-empty entry that does not end with ``eos_id``.

        Not checked where the metadata says ``eos_placement: document_end``: GPT-Simple's
        windowing ends only the windows that reach a document's end with EOD.
        """
        if self.eos_id is None or self.metadata.get(EOS_PLACEMENT) == EOS_AT_DOCUMENT_END:
            return
        stage = Stage("EOS placement", len(self))
        for shard in self.shards:
            stage.advance(shard.num_entries)
            tokens = shard.tokens
            previous: int | None = None
            for start, part in iter_chunks(shard.offsets):  # bounded chunks of a possibly huge index
                bounds = part if previous is None else np.concatenate([np.array([previous], np.int64), part])
                first = 0 if previous is None else start - 1
                previous = int(part[-1])
                ends = bounds[1:]
                non_empty = np.flatnonzero(ends > bounds[:-1])
                if len(non_empty) == 0:
                    continue
                last_tokens = tokens[ends[non_empty] - 1]
                release_pages(tokens, int(bounds[0]), int(bounds[-1]))
                wrong = np.flatnonzero(last_tokens != self.eos_id)
                if len(wrong):
                    entry = first + int(non_empty[wrong[0]])
                    raise FormatError(
                        f"entry ends with token {int(last_tokens[wrong[0]])}, expected the EOS id {self.eos_id}",
                        path=shard.tokens_path,
                        record=entry,
                        hint="The data was not written with this EOS id; check --eos-id or re-tokenize",
                    )

    def __repr__(self) -> str:
        return (
            f"TokenDataset(format={self.format!r}, root={str(self.root)!r}, shards={self.num_shards}, "
            f"entries={len(self)}, tokens={self.num_tokens}, dtype={self.dtype.name})"
        )
