"""The block line reader cuts exactly the chunks a line-by-line reader would.

``read_chunks`` reads each jsonl stream a block at a time and cuts lines out of a block with one split
(tokenize's reading was a fifth of a threaded run's GIL time line by line). The reference below is the
line-by-line reader it replaced, kept here as the oracle: on any bytes (\\r\\n, empty lines, lines over the
cap inside a block and across blocks, a last line without a newline, plain, gzip and zstd, truncated
streams, byte ranges) and any chunk limits, both give the same chunks: lines, issues, first lines and
byte counts.
"""

from __future__ import annotations

import gzip
import io
import itertools
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tokenloom.tokenize.inputs import (
    ByteRange,
    Issue,
    IssueKind,
    StreamError,
    detect,
    discover_inputs,
    open_lines,
    read_chunks,
)
from tokenloom.tokenize.inputs import _lines as _inputs
from tokenloom.tokenize.inputs.jsonl import JSONL


def reference_lines(path: Path, kind, max_line_bytes: int, part: ByteRange | None):
    """(line or None, issue or None, raw bytes) per line, one ``readline`` at a time (the old reader)."""
    line_number, pending, skipping = 0, None, False
    if part is None:
        handle, raw = open_lines(path, kind)
    else:
        raw = handle = io.BytesIO(path.read_bytes()[part.start : part.stop])
    broken = None
    with handle, raw:
        try:
            while True:
                raw_line = handle.readline(max_line_bytes + 1)
                if not raw_line:
                    break
                if pending is not None:
                    yield pending
                    pending = None
                line_number += 1
                size = len(raw_line)
                if size > max_line_bytes and not (size == max_line_bytes + 1 and raw_line.endswith(b"\n")):
                    skipping = True
                    while not raw_line.endswith(b"\n"):
                        raw_line = handle.readline(1 << 20)
                        if not raw_line:
                            break
                        size += len(raw_line)
                    skipping = False
                    yield None, _inputs._too_long(line_number, size, max_line_bytes), size
                    continue
                if raw_line.endswith(b"\n"):
                    yield raw_line[:-2] if raw_line.endswith(b"\r\n") else raw_line[:-1], None, size
                else:
                    pending = (raw_line, None, size)
        except (EOFError, gzip.BadGzipFile, zlib_error(), StreamError) as exc:
            # one deliberate change: a stream that ends inside a line over the cap is truncated at that line
            # (the old reader named the line after it)
            at = line_number if pending is not None or skipping else line_number + 1
            broken = _inputs._truncated(kind, at, 0, exc)
    if broken is not None:
        yield None, broken, 0
        return
    if pending is not None:
        yield pending
    if line_number == 0:
        yield None, Issue(0, IssueKind.EMPTY_FILE, "empty"), 0


def zlib_error():
    import zlib

    return zlib.error


def reference_chunks(path: Path, kind, chunk_lines: int, chunk_bytes: int, max_line_bytes: int, part=None):
    chunks, lines, issues, num_bytes, first = [], [], [], 0, 1
    for line, issue, size in reference_lines(path, kind, max_line_bytes, part):
        if issue is not None:
            issues.append(issue)
        if issue is None or issue.line > 0:
            lines.append(line)
        num_bytes += size
        if len(lines) >= chunk_lines or num_bytes >= chunk_bytes:
            chunks.append((first, lines, issues, num_bytes))
            first, lines, issues, num_bytes = first + len(lines), [], [], 0
    if lines or issues:
        chunks.append((first, lines, issues, num_bytes))
    return chunks


def comparable(chunks):
    """Issues by line and kind (the truncation's compressed offset is where each reader stopped)."""
    return [(first, lines, [(i.line, i.kind) for i in issues], num_bytes) for first, lines, issues, num_bytes in chunks]


lines_strategy = st.lists(
    st.one_of(
        st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")),
        st.sampled_from([b"", b"\r", b'{"text": "a"}\r', b"x" * 40]),
        st.integers(20, 90).map(lambda n: b"y" * n),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    lines=lines_strategy,
    final_newline=st.booleans(),
    compression=st.sampled_from(["plain", "gz", "zst"]),
    truncate=st.integers(0, 12),
    chunk_lines=st.integers(1, 7),
    chunk_bytes=st.integers(1, 120),
    max_line_bytes=st.integers(1, 60),
    block=st.integers(1, 50),
)
@example(
    lines=[b"y" * 30, b"ab\r", b"", b"c"], final_newline=False, compression="plain", truncate=0,
    chunk_lines=2, chunk_bytes=100, max_line_bytes=10, block=4,
)  # fmt: skip
def test_block_reader_cuts_the_chunks_the_line_reader_cuts(
    tmp_path_factory, lines, final_newline, compression, truncate, chunk_lines, chunk_bytes, max_line_bytes, block,
) -> None:  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_inputs, "READ_BLOCK", block)
        check_file(
            tmp_path_factory, lines, final_newline, compression, truncate, chunk_lines, chunk_bytes, max_line_bytes
        )


def check_file(tmp_path_factory, lines, final_newline, compression, truncate, chunk_lines, chunk_bytes, max_line_bytes):
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    root = tmp_path_factory.mktemp("in")
    name = {"plain": "a.jsonl", "gz": "a.jsonl.gz", "zst": "a.jsonl.zst"}[compression]
    blob = {
        "plain": lambda d: d,
        "gz": lambda d: gzip.compress(d, mtime=0),
        "zst": lambda d: zstandard.ZstdCompressor().compress(d),
    }[compression](data)
    if compression != "plain" and truncate:
        blob = blob[: max(len(blob) - truncate, 1)]
    if not blob:
        blob = b""
    (root / name).write_bytes(blob)
    try:
        [info] = discover_inputs(root)
    except Exception:  # a blob cut so short that its magic bytes are gone: not this test's subject
        return
    got = [
        (c.first_line, c.lines, c.issues, c.num_bytes)
        for c in read_chunks([info], chunk_lines=chunk_lines, chunk_bytes=chunk_bytes, max_line_bytes=max_line_bytes)
    ]
    want = reference_chunks(root / name, info.kind, chunk_lines, chunk_bytes, max_line_bytes)
    assert comparable(got) == comparable(want)


def test_a_line_over_the_cap_across_many_blocks_is_skipped_not_held(tmp_path: Path, monkeypatch) -> None:
    """A 3 MB line with a 1 KB cap: one LINE_TOO_LONG issue with its full size, the lines around it kept."""
    monkeypatch.setattr(_inputs, "READ_BLOCK", 4096)
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "before"}\n' + b"z" * 3_000_000 + b'\n{"text": "after"}\n')
    [info] = discover_inputs(tmp_path)
    [chunk] = list(read_chunks([info], chunk_lines=10, chunk_bytes=1 << 30, max_line_bytes=1024))
    assert chunk.lines == [b'{"text": "before"}', None, b'{"text": "after"}']
    [issue] = chunk.issues
    assert (issue.line, issue.kind) == (2, IssueKind.LINE_TOO_LONG)
    assert "3000001 bytes" in issue.message
    assert chunk.num_bytes == 19 + 3_000_001 + 18


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_a_truncated_stream_names_the_line_after_the_last_whole_one(tmp_path: Path, compression: str) -> None:
    data = b"".join(b'{"text": "%d"}\n' % i for i in range(5000))
    blob = gzip.compress(data, mtime=0) if compression == "gz" else zstandard.ZstdCompressor().compress(data)
    (tmp_path / f"a.jsonl.{compression}").write_bytes(blob[: len(blob) // 2])
    [info] = discover_inputs(tmp_path)
    chunks = list(read_chunks([info], chunk_lines=100_000, chunk_bytes=1 << 30, max_line_bytes=1 << 20))
    lines = [line for chunk in chunks for line in chunk.lines]
    [issue] = [issue for chunk in chunks for issue in chunk.issues]
    assert issue.kind in (IssueKind.TRUNCATED_GZIP, IssueKind.TRUNCATED_ZSTD)
    whole = lines[:-1]
    assert lines[-1] is None and all(line == b'{"text": "%d"}' % i for i, line in enumerate(whole))
    assert issue.line == len(whole) + 1


# Wider (from review): longer lines, many blocks, truncation anywhere, multi-member gzip and multi-frame zstd,
# resume from any chunk, and the progress bytes (none negative, summing to the file; a plain file's exact).
piece = st.one_of(
    st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"", b"\r", b"\r\r", b'{"text": "a"}\r', b"x" * 40]),
    st.integers(0, 300).map(lambda n: b"y" * n),
    st.integers(0, 300).map(lambda n: b"z" * n + b"\r"),
)


def compress_members(kind, data, members):
    if kind == "plain":
        return data
    cuts = sorted({0, len(data), *members})
    parts = [data[a:b] for a, b in itertools.pairwise(cuts)] or [b""]
    if kind == "gz":
        return b"".join(gzip.compress(p, mtime=0) for p in parts)
    return b"".join(zstandard.ZstdCompressor().compress(p) for p in parts)


def _fuzz(max_examples: int):
    """The readers' hypothesis settings: no deadline, large and slow examples allowed."""
    slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
    return settings(max_examples=max_examples, deadline=None, suppress_health_check=slow)


def _limits(lines: int, size: int) -> dict[str, st.SearchStrategy[int]]:
    """Reader limits drawn for a fuzz case: lines and bytes per chunk, the line cap, the read block."""
    chunk_lines, chunk_bytes, block = st.integers(1, lines), st.integers(1, size), st.integers(1, size)
    return {
        "chunk_lines": chunk_lines,
        "chunk_bytes": chunk_bytes,
        "max_line_bytes": st.integers(1, 320),
        "block": block,
    }


@_fuzz(200)
@given(
    lines=st.lists(piece, max_size=60),
    final_newline=st.booleans(),
    compression=st.sampled_from(["plain", "gz", "zst"]),
    members=st.lists(st.integers(0, 3000), max_size=3),
    cut=st.one_of(st.none(), st.floats(0.05, 0.999)),
    start_chunk=st.integers(0, 8),
    **_limits(12, 700),
)
def test_resumes_progress_and_multi_member_streams_match_the_line_reader(
    tmp_path_factory,
    lines,
    final_newline,
    compression,
    members,
    cut,
    chunk_lines,
    chunk_bytes,
    max_line_bytes,
    block,
    start_chunk,
):
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    blob = compress_members(compression, data, members)
    if compression != "plain" and cut is not None:
        blob = blob[: max(int(len(blob) * cut), 1)]
    root = tmp_path_factory.mktemp("in")
    name = {"plain": "a.jsonl", "gz": "a.jsonl.gz", "zst": "a.jsonl.zst"}[compression]
    (root / name).write_bytes(blob)
    try:
        [info] = discover_inputs(root)
    except Exception:
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_inputs, "READ_BLOCK", block)
        kw = dict(chunk_lines=chunk_lines, chunk_bytes=chunk_bytes, max_line_bytes=max_line_bytes)
        full = list(read_chunks([info], **kw))
        resumed = list(read_chunks([info], start_chunk=start_chunk, **kw))
    want = reference_chunks(root / name, info.kind, chunk_lines, chunk_bytes, max_line_bytes)
    assert comparable([(c.first_line, c.lines, c.issues, c.num_bytes) for c in full]) == comparable(want)

    # resume: the same chunks from start_chunk on, source bytes included
    def key(c):
        return c.index, c.first_line, c.lines, [(i.line, i.kind) for i in c.issues], c.num_bytes, c.source_bytes

    assert [key(c) for c in resumed] == [key(c) for c in full if c.index >= start_chunk]
    # progress: every source byte is counted once, none negative
    assert all(c.source_bytes >= 0 for c in full), [c.source_bytes for c in full]
    assert sum(c.source_bytes for c in full) == len(blob)
    if compression == "plain":
        assert [c.source_bytes for c in full] == [c.num_bytes for c in full]


@_fuzz(100)
@given(
    lines=st.lists(piece, max_size=40),
    cut=st.integers(0, 40),
    **_limits(9, 400),
)
def test_byte_ranges_with_any_limits_match_the_line_reader(
    tmp_path_factory, lines, cut, block, max_line_bytes, chunk_lines, chunk_bytes
):
    data = b"".join(line + b"\n" for line in lines)
    if not data:
        return
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    middle = starts[min(cut, len(starts) - 1)]
    root = tmp_path_factory.mktemp("in")
    (root / "a.jsonl").write_bytes(data)
    if detect(data[:8]) is not JSONL:
        return  # bytes the sniffer takes for another format (a named error: not this test's subject)
    [info] = discover_inputs(root)
    for part in (ByteRange(0, middle), ByteRange(middle, len(data))):
        if part.stop == part.start:
            continue
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_inputs, "READ_BLOCK", block)
            got = list(
                read_chunks(
                    [info],
                    chunk_lines=chunk_lines,
                    chunk_bytes=chunk_bytes,
                    max_line_bytes=max_line_bytes,
                    parts=[part],
                )
            )
        want = reference_chunks(root / "a.jsonl", info.kind, chunk_lines, chunk_bytes, max_line_bytes, part)
        assert comparable([(c.first_line, c.lines, c.issues, c.num_bytes) for c in got]) == comparable(want)
        assert sum(c.source_bytes for c in got) == part.stop - part.start


def test_a_plain_file_that_grew_after_listing_never_counts_negative_bytes(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "x"}\n' * 10)
    [info] = discover_inputs(tmp_path)
    with open(path, "ab") as handle:
        handle.write(b'{"text": "y"}\n' * 10)
    chunks = list(read_chunks([info], chunk_lines=3, chunk_bytes=1 << 30, max_line_bytes=1 << 20))
    assert all(chunk.source_bytes >= 0 for chunk in chunks), [chunk.source_bytes for chunk in chunks]
    assert sum(chunk.source_bytes for chunk in chunks) == info.size


def test_a_capped_line_is_the_old_readline_at_any_block(monkeypatch):
    """Review: the input room's line reader (1 MiB blocks, a line over the cap never joined) keeps the
    whole-readline rule exactly: a line of cap bytes plus its newline is kept, cap + 1 bytes is over, \\r\\n and
    a last line without a newline alike, with the same byte offsets, whatever the block size."""
    import io
    import random

    from tokenloom.tokenize.inputs import _lines, format_named, line_records, stream_lines

    def old(f, cap):
        rows, offset = [], 0
        while line := f.readline(cap + 1):
            size = len(line)
            if size > cap and not (size == cap + 1 and line.endswith(b"\n")):
                while line and not line.endswith(b"\n"):
                    line = f.readline(1 << 20)
                    size += len(line)
                rows.append((None, offset, size))
            else:
                rows.append((line.rstrip(b"\n").removesuffix(b"\r"), offset, size))
            offset += size
        return rows

    rng = random.Random(1)
    plain = format_named("jsonl")
    for block in (1, 2, 3, 5, 1 << 20):
        monkeypatch.setattr(_lines, "READ_BLOCK", block)
        for _ in range(500):
            cap = rng.randint(1, 12)
            ends = (b"\n", b"\r\n")
            data = b"".join(b"x" * rng.randint(0, 15) + rng.choice(ends) for _ in range(rng.randint(0, 5)))
            data += b"y" * rng.randint(0, 15) * rng.randint(0, 1)
            handle = io.BufferedReader(io.BytesIO(data), 16)
            records = line_records(stream_lines(handle, handle, plain, cap), "x")
            got = [(r.value, r.offset, r.size) for r in records if not isinstance(r, _lines.Issue)]
            assert got == old(io.BytesIO(data), cap), (block, cap, data)
