"""A restricted reader (and a tiny writer) for pickled lists of integer tuples.

Modalities stores a ``.pbin`` index as ``pickle.dumps([(start, length), ...])``.
``pickle.loads`` on file contents would run whatever the file asks for, so this
module reads the opcode stream itself and accepts only what Python's pickler
emits for a list of tuples of ints under protocols 1 to 5::

    PROTO FRAME EMPTY_LIST MARK APPEND APPENDS EMPTY_TUPLE TUPLE TUPLE1 TUPLE2
    TUPLE3 BININT BININT1 BININT2 LONG1 MEMOIZE BINPUT LONG_BINPUT BINGET
    LONG_BINGET STOP

Any other opcode (GLOBAL, REDUCE, BUILD, ...) raises UnsafeFormatError naming it
and its offset; a stream that is well-formed pickle but not a list of int tuples
raises IndexCorruptError. Nothing is imported, called or constructed except
ints, tuples of ints and one list, and every length is bounded by the input.
"""

from __future__ import annotations

import pickletools
import struct
from collections.abc import Iterable
from pathlib import Path

from tokenloom.formats.errors import (
    FormatError,
    IndexCorruptError,
    ResourceLimitError,
    TruncatedError,
    UnsafeFormatError,
)

__all__ = ["dump_int_tuples", "load_int_tuples"]

#: LONG1 integers longer than this many bytes are refused (9 bytes hold any uint64).
MAX_LONG_BYTES = 9
_ALLOWED_PROTOCOLS = range(2, 6)
_OPCODE_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}


#: the fixed-width int opcodes: opcode -> argument bytes
_BININTS = {0x4B: 1, 0x4D: 2, 0x4A: 4}


def _opcode_name(code: int) -> str:
    return f"{_OPCODE_NAMES.get(code, 'unknown opcode')} (0x{code:02x})"


def load_int_tuples(
    data: bytes | memoryview,
    *,
    path: str | Path | None = None,
    base_offset: int = 0,
    max_items: int | None = None,
) -> list[tuple[int, ...]]:
    """Parse a pickled ``list`` of tuples of ints without executing anything.

    ``base_offset`` is where ``data`` starts in ``path`` (for error messages). The
    whole of ``data`` must be one pickle: bytes after STOP are an error.
    ``max_items`` caps the list length (ResourceLimitError beyond it).
    """
    buf = bytes(data)
    size = len(buf)
    pos = 0
    stack: list[object] = []
    marks: list[int] = []  # stack heights at each MARK
    memo: dict[int, object] = {}
    result_list: list[tuple[int, ...]] | None = None
    items = 0

    def where(at: int) -> int:
        return base_offset + at

    def corrupt(problem: str, at: int) -> IndexCorruptError:
        return IndexCorruptError(problem, path=path, offset=where(at), field="index")

    def need(count: int, at: int) -> None:
        if pos + count > size:
            raise TruncatedError(
                f"pickle opcode {_opcode_name(buf[at])} needs {count} argument bytes, {size - pos} remain",
                path=path,
                offset=where(at),
                field="index",
            )

    def above_mark() -> bool:
        return len(stack) > (marks[-1] if marks else 0)

    def read_memo_index(width: int, at: int) -> int:
        nonlocal pos
        need(width, at)
        index = int.from_bytes(buf[pos : pos + width], "little")
        pos += width
        return index

    def pop_items(at: int) -> list[object]:
        if not marks:
            raise corrupt(f"{_opcode_name(buf[at])} without a preceding MARK", at)
        height = marks.pop()
        popped = stack[height:]
        del stack[height:]
        return popped

    def pop_one(at: int) -> object:
        if not above_mark():
            raise corrupt(f"{_opcode_name(buf[at])} on an empty stack", at)
        return stack.pop()

    def make_tuple(values: list[object], at: int) -> tuple[int, ...]:
        for value in values:
            if type(value) is not int:
                raise corrupt("a tuple holds something other than an int, expected (int, int) pairs", at)
        return tuple(values)  # type: ignore[arg-type]

    def append_to_list(values: list[object], at: int) -> None:
        nonlocal items
        target = stack[-1] if above_mark() else None
        if type(target) is not list:
            raise corrupt(f"{_opcode_name(buf[at])} onto something that is not a list", at)
        for value in values:
            if type(value) is not tuple:
                raise corrupt("a list item is not a tuple, expected (int, int) pairs", at)
        items += len(values)
        if max_items is not None and items > max_items:
            raise ResourceLimitError(
                f"the index lists more than {max_items} entries", path=path, offset=where(at), field="index"
            )
        target.extend(values)  # type: ignore[arg-type]

    if size == 0:
        raise TruncatedError("the pickled index is empty", path=path, offset=where(0), field="index")
    if buf[0] not in (0x80, ord("]")):
        raise corrupt(f"index starts with {_opcode_name(buf[0])}, expected a pickle PROTO or EMPTY_LIST opcode", 0)

    while pos < size:
        at = pos
        code = buf[pos]
        pos += 1
        if code == 0x80:  # PROTO
            need(1, at)
            protocol = buf[pos]
            pos += 1
            if at != 0:
                raise corrupt("PROTO opcode after the start of the pickle", at)
            if protocol not in _ALLOWED_PROTOCOLS:
                raise FormatError(
                    f"pickle protocol {protocol}, expected 2 to 5", path=path, offset=where(at), field="index"
                )
        elif code == 0x95:  # FRAME: an 8-byte length that only tells a reader how much to buffer
            need(8, at)
            (frame,) = struct.unpack_from("<Q", buf, pos)
            pos += 8
            if frame > size - pos:
                raise TruncatedError(
                    f"pickle FRAME announces {frame} bytes, {size - pos} remain",
                    path=path,
                    offset=where(at),
                    field="index",
                )
        elif code == 0x5D:  # EMPTY_LIST
            if result_list is not None:
                raise corrupt("a second list, expected exactly one list of tuples", at)
            result_list = []
            stack.append(result_list)
        elif code == 0x28:  # MARK
            marks.append(len(stack))
        elif code == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif code in _BININTS:  # BININT1, BININT2 (unsigned), BININT (signed)
            width = _BININTS[code]
            need(width, at)
            stack.append(int.from_bytes(buf[pos : pos + width], "little", signed=width == 4))
            pos += width
        elif code == 0x8A:  # LONG1
            need(1, at)
            length = buf[pos]
            pos += 1
            if length > MAX_LONG_BYTES:
                raise ResourceLimitError(
                    f"pickled integer of {length} bytes, at most {MAX_LONG_BYTES} are accepted",
                    path=path,
                    offset=where(at),
                    field="index",
                )
            need(length, at)
            stack.append(int.from_bytes(buf[pos : pos + length], "little", signed=True))
            pos += length
        elif code in (0x85, 0x86, 0x87):  # TUPLE1, TUPLE2, TUPLE3
            count = code - 0x84
            values = [pop_one(at) for _ in range(count)][::-1]
            stack.append(make_tuple(values, at))
        elif code == 0x74:  # TUPLE
            stack.append(make_tuple(pop_items(at), at))
        elif code == 0x61:  # APPEND
            value = pop_one(at)
            append_to_list([value], at)
        elif code == 0x65:  # APPENDS
            append_to_list(pop_items(at), at)
        elif code in (0x94, 0x71, 0x72):  # MEMOIZE, BINPUT, LONG_BINPUT
            index = len(memo) if code == 0x94 else read_memo_index(1 if code == 0x71 else 4, at)
            if not above_mark():
                raise corrupt(f"{_opcode_name(code)} on an empty stack", at)
            memo[index] = stack[-1]
        elif code in (0x68, 0x6A):  # BINGET, LONG_BINGET
            index = read_memo_index(1 if code == 0x68 else 4, at)
            if index not in memo:
                raise corrupt(f"memo entry {index} was never stored", at)
            value = memo[index]
            if type(value) is list:
                raise corrupt("a reference back to the list (a cycle), expected tuples", at)
            stack.append(value)
        elif code == 0x2E:  # STOP
            if marks or len(stack) != 1 or type(stack[0]) is not list:
                raise corrupt("the pickle does not end with exactly one list on its stack", at)
            if pos != size:
                raise corrupt(f"{size - pos} bytes follow the pickle's STOP opcode", pos)
            return stack[0]  # type: ignore[return-value]
        else:
            raise UnsafeFormatError(
                f"pickle opcode {_opcode_name(code)} is not allowed in an index (only lists, tuples and ints are read)",
                path=path,
                offset=where(at),
                field="index",
            )
    raise TruncatedError("the pickled index ends without a STOP opcode", path=path, offset=where(size), field="index")


_BATCH = 1000  # items per APPENDS, as Python's pickler batches them


def _encode_int(value: int, out: bytearray) -> None:
    if 0 <= value < 0x100:
        out += b"K" + value.to_bytes(1, "little")
    elif 0 <= value < 0x10000:
        out += b"M" + value.to_bytes(2, "little")
    elif -(1 << 31) <= value < 1 << 31:
        out += b"J" + value.to_bytes(4, "little", signed=True)
    else:
        encoded = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        out += b"\x8a" + len(encoded).to_bytes(1, "little") + encoded


def dump_int_tuples(pairs: Iterable[tuple[int, int]]) -> bytes:
    """Pickle (protocol 2) a list of int pairs with the opcodes :func:`load_int_tuples` accepts."""
    out = bytearray(b"\x80\x02]")
    batch: list[tuple[int, int]] = []

    def flush() -> None:
        if len(batch) == 1:
            _encode_pair(batch[0], out)
            out.extend(b"a")
        elif batch:
            out.extend(b"(")
            for pair in batch:
                _encode_pair(pair, out)
            out.extend(b"e")
        batch.clear()

    for pair in pairs:
        batch.append(pair)
        if len(batch) == _BATCH:
            flush()
    flush()
    out.extend(b".")
    return bytes(out)


def _encode_pair(pair: tuple[int, int], out: bytearray) -> None:
    _encode_int(int(pair[0]), out)
    _encode_int(int(pair[1]), out)
    out.extend(b"\x86")
