"""Review: cutting a plain .jsonl into units a MiB at a time cuts at the very lines the whole-line readline did.

The unit byte ranges decide which node encodes which lines; a changed cut would change nothing in the dataset
but would make a node of an old run and a node of the new code disagree on the plan. The old cutter is the oracle.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenloom.tokenize.inputs import line_cuts as _line_cuts

MIB = 1 << 20


def _old_line_cuts(path: Path, size: int, unit_bytes: int) -> list[int]:
    """_line_cuts before the bounded scan (w4-bounded): one readline per target."""
    cuts = [0]
    with open(path, "rb") as handle:
        for target in range(unit_bytes, size, unit_bytes):
            if target <= cuts[-1]:
                continue
            handle.seek(target - 1)
            handle.readline()
            cut = handle.tell()
            if cut < size and cut > cuts[-1]:
                cuts.append(cut)
    cuts.append(size)
    return cuts


line = st.one_of(
    st.integers(0, 40),
    st.sampled_from([MIB - 2, MIB - 1, MIB, MIB + 1, 2 * MIB - 1, 2 * MIB, 2 * MIB + 1]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(line, min_size=1, max_size=8),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    unit_bytes=st.one_of(st.integers(1, 64), st.sampled_from([MIB - 1, MIB, MIB + 1, 3 * MIB])),
)
def test_bounded_cuts_are_the_readline_cuts(tmp_path_factory, lengths, crlf, final_newline, unit_bytes):
    end = b"\r\n" if crlf else b"\n"
    data = end.join(b"x" * n for n in lengths) + (end if final_newline else b"")
    unit_bytes = max(unit_bytes, len(data) // 500)  # at most 500 targets: a MiB line with 1-byte units is slow
    path = tmp_path_factory.mktemp("cuts") / "a.jsonl"
    path.write_bytes(data)
    cuts = _line_cuts(path, len(data), unit_bytes)
    assert cuts == _old_line_cuts(path, len(data), unit_bytes)
    assert all(c == 0 or c == len(data) or data[c - 1 : c] == b"\n" for c in cuts)  # every cut is a line start
