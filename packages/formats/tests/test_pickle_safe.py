"""The restricted unpickler: reads what pickle emits for lists of int pairs, refuses everything else."""

from __future__ import annotations

import builtins
import pickle
import pickletools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.formats import DataError, IndexCorruptError, ResourceLimitError, TruncatedError, UnsafeFormatError
from tokenloom.formats.packed.pickle_safe import dump_int_tuples, load_int_tuples

PAIRS = st.lists(
    st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    max_size=40,
)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("count", [0, 1, 2, 999, 1000, 1001, 2500])
def test_reads_what_pickle_writes(protocol: int, count: int) -> None:
    # widths that exercise BININT1, BININT2, BININT and LONG1; > 1000 items span several APPENDS,
    # > 256 memo entries need LONG_BINPUT (protocols 2-3), repeated tuples give BINGET
    pairs = [(i * 7919 % 300, (i * 104729) ** 2 % (2**40)) for i in range(count)]
    if count > 3:
        pairs[3] = pairs[2]
    assert load_int_tuples(pickle.dumps(pairs, protocol=protocol)) == pairs


def test_reads_large_frames_and_shared_tuples() -> None:
    shared = (5, 6)
    pairs = [shared] * 5 + [(i, i + 70000) for i in range(20000)]  # several 64 KiB frames, memo gets
    data = pickle.dumps(pairs, protocol=5)
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert {"FRAME", "BINGET", "MEMOIZE", "BININT"} <= ops
    assert load_int_tuples(data) == pairs


@settings(deadline=None)  # a loaded CI machine stalls a single example past hypothesis' 200 ms
@given(PAIRS)
def test_writer_round_trips_through_pickle_and_the_reader(pairs: list[tuple[int, int]]) -> None:
    data = dump_int_tuples(pairs)
    assert load_int_tuples(data) == pairs
    assert pickle.loads(data) == pairs  # in-memory bytes this test just made, not file contents
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert ops <= {"PROTO", "EMPTY_LIST", "MARK", "APPENDS", "APPEND", "BININT1", "BININT2", "BININT", "LONG1"} | {
        "TUPLE2",
        "STOP",
    }


class Boom:
    def __reduce__(self):
        return (print, ("executed",))


@pytest.mark.parametrize(
    ("payload", "opcode"),
    [
        (pickle.dumps([Boom()], protocol=4), "SHORT_BINUNICODE"),  # the module name, before STACK_GLOBAL
        (b"\x80\x04](K\x01K\x02\x93", "STACK_GLOBAL"),
        (b"\x80\x02](K\x01\x85R", "REDUCE"),
        (b"\x80\x02]K\x01b", "BUILD"),
        (pickle.dumps([Boom()], protocol=2), "GLOBAL"),
        (pickle.dumps(["text"], protocol=4), "SHORT_BINUNICODE"),
        (pickle.dumps({1: 2}, protocol=4), "EMPTY_DICT"),
        (pickle.dumps([1.5], protocol=4), "BINFLOAT"),
        (pickle.dumps([None], protocol=2), "NONE"),
    ],
)
def test_refuses_every_other_opcode_by_name_and_offset(payload: bytes, opcode: str) -> None:
    with pytest.raises(UnsafeFormatError, match=opcode) as info:
        load_int_tuples(payload, path="x.pbin", base_offset=100)
    assert info.value.offset is not None and info.value.offset > 100
    assert info.value.path == "x.pbin"


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x02].junk",  # bytes after STOP
        b"\x80\x02]K\x01a.",  # an int appended, not a tuple
        b"\x80\x02](K\x01K\x02\x86]\x86e.",  # a tuple holding a list
        b"\x80\x02]\x94h\x00a.",  # a cycle: the list appended to itself
        b"\x80\x02K\x01.",  # the result is not a list
        b"\x80\x02]h\x07.",  # a memo entry never stored
        b"\x80\x02]e.",  # APPENDS without MARK
        b"\x80\x02]\x80\x02.",  # a second PROTO
        b"K\x01.",  # does not start like a pickled list
        b"\x80\x02]].",  # two lists
    ],
)
def test_structural_problems_are_index_corruption(payload: bytes) -> None:
    with pytest.raises(IndexCorruptError):
        load_int_tuples(payload)


@pytest.mark.parametrize("payload", [b"", b"\x80\x02](K\x01", b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00]."])
def test_truncation_is_reported(payload: bytes) -> None:
    with pytest.raises(TruncatedError):
        load_int_tuples(payload)


def test_caps_integer_width_and_item_count() -> None:
    with pytest.raises(ResourceLimitError, match="bytes"):
        load_int_tuples(b"\x80\x02](\x8a\x20" + b"\x01" * 32 + b"K\x01\x86e.")
    with pytest.raises(ResourceLimitError, match="more than 2 entries"):
        load_int_tuples(pickle.dumps([(1, 2)] * 3, protocol=4), max_items=2)


ALL_OPCODE_BYTES = sorted({op.code.encode("latin-1")[0] for op in pickletools.opcodes})


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=64)
    | st.lists(st.sampled_from(ALL_OPCODE_BYTES) | st.integers(0, 255), max_size=40).map(bytes)
    | st.lists(st.sampled_from(ALL_OPCODE_BYTES), max_size=30).map(lambda ops: b"\x80\x04]" + bytes(ops))
)
def test_fuzz_never_executes_and_only_raises_data_errors(data: bytes) -> None:
    calls: list[str] = []
    real_import, real_loads, real_unpickler = builtins.__import__, pickle.loads, pickle.Unpickler

    def spy(name: str):
        def record(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called")

        return record

    builtins.__import__ = spy("__import__")
    pickle.loads = spy("pickle.loads")
    pickle.Unpickler = spy("pickle.Unpickler")  # type: ignore[misc]
    try:
        result = load_int_tuples(data)
    except DataError:
        result = None
    finally:
        builtins.__import__, pickle.loads, pickle.Unpickler = real_import, real_loads, real_unpickler
    assert calls == []  # nothing imported (find_class imports), no real unpickling
    if result is not None:
        assert isinstance(result, list)
        assert all(isinstance(t, tuple) and all(type(v) is int for v in t) for t in result)
