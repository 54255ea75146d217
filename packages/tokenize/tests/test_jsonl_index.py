"""The byte-offset index of a jsonl file and random access through it."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import ConfigError, MissingFileError, RecordError
from tokenloom.tokenize import JsonlIndex, build_index, index_path


def test_index_gives_every_line_by_number(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n{"text": "\xc3\xa9t\xc3\xa9"}\r\n{"text": "last, no newline"}')
    index = JsonlIndex(path)
    assert index_path(path).exists() and len(index) == 4
    assert index.raw(1) == b"" and index[2] == {"text": "été"} and index[-1]["text"] == "last, no newline"
    stored = np.load(index_path(path), allow_pickle=False)
    assert stored.dtype == np.int64 and stored.shape == (4, 2)
    assert stored[0].tolist() == [0, 13]
    with pytest.raises(RecordError) as info:
        index[1]
    assert info.value.record == 2
    with pytest.raises(IndexError):
        index.raw(4)


def test_index_is_built_lazily_and_rebuilt_when_stale(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n')
    with pytest.raises(MissingFileError, match="tokenloom index"):
        JsonlIndex(path, create=False)
    assert len(JsonlIndex(path)) == 2
    with path.open("ab") as handle:
        handle.write(b'{"n": 3}\n')
    os.utime(index_path(path), ns=(0, 0))  # older than the file
    index = JsonlIndex(path)
    assert len(index) == 3 and index[2] == {"n": 3}


def test_empty_file_and_gzip(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    assert len(build_index(tmp_path / "e.jsonl")) == 0
    (tmp_path / "z.jsonl.gz").write_bytes(gzip.compress(b'{"n": 1}\n'))
    with pytest.raises(ConfigError, match="gzip"):
        JsonlIndex(tmp_path / "z.jsonl.gz")


def test_a_mislabeled_file_is_refused_by_its_content(tmp_path: Path) -> None:
    """Detection is the input room's: magic bytes first, the suffix cross-checked (not the suffix first)."""
    from tokenloom.formats import FormatError

    gzipped = tmp_path / "named-plain.jsonl"  # gzip bytes under a plain .jsonl name
    gzipped.write_bytes(gzip.compress(b'{"n": 1}\n'))
    with pytest.raises(FormatError, match="named as jsonl but its first bytes .* are gzip") as info:
        build_index(gzipped)
    assert info.value.path == str(gzipped) and info.value.offset == 0 and "Rename it" in str(info.value)
    plain = tmp_path / "named-gzip.jsonl.gz"  # plain jsonl under a .gz name
    plain.write_bytes(b'{"n": 1}\n')
    with pytest.raises(FormatError, match="named as gzip-compressed jsonl but its first bytes .* are plain text"):
        JsonlIndex(plain)
    unnamed = tmp_path / "rows.txt"  # no input suffix: the content decides
    unnamed.write_bytes(gzip.compress(b'{"n": 1}\n'))
    with pytest.raises(ConfigError, match="gzip"):
        build_index(unnamed)
    assert not index_path(gzipped).exists() and not index_path(plain).exists()


def test_large_file_spanning_read_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    lines = [f'{{"i": {i}, "pad": "{"x" * (i % 300)}"}}'.encode() for i in range(120_000)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    index = JsonlIndex(path)
    assert len(index) == len(lines)
    for i in (0, 1, 65_535, 119_999):
        assert index[i]["i"] == i


def test_rewritten_file_with_the_same_size_and_mtime_is_reindexed(tmp_path, caplog):
    import logging
    import os

    from tokenloom.tokenize.jsonl_index import JsonlIndex

    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "aaaa"}\n{"text": "bb"}\n{"text": "c"}\n')
    first = JsonlIndex(path)
    assert first[1]["text"] == "bb"
    info = path.stat()
    path.write_bytes(b'{"text": "a"}\n{"text": "bbbbb"}\n{"text": "c"}\n')  # same size, other line ends
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="tokenloom.tokenize"):
        again = JsonlIndex(path)
    assert any("rebuilding the index" in r.getMessage() for r in caplog.records)
    assert again[1]["text"] == "bbbbb"


def test_full_hash_catches_a_change_in_the_middle(tmp_path, caplog):
    import logging
    import os

    from tokenloom.tokenize.jsonl_index import JsonlIndex, build_index

    lines = [b'{"text": "%06d"}\n' % i for i in range(200_000)]  # > 2 MiB: the middle is not hashed by default
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(lines))
    build_index(path, full_hash=True)
    info = path.stat()
    lines[100_000] = b'{"text": "XXXXXX"}\n'
    path.write_bytes(b"".join(lines))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="tokenloom.tokenize"):
        index = JsonlIndex(path)
    assert any("xxh3_128 changed" in r.getMessage() for r in caplog.records)
    assert index[100_000]["text"] == "XXXXXX"


def test_damaged_index_files_found_by_the_fuzzer_are_rebuilt(tmp_path):
    import numpy as np

    from tokenloom.tokenize.jsonl_index import JsonlIndex, index_path

    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": "bb"}\n')
    JsonlIndex(path)
    idx = index_path(path)
    good = idx.read_bytes()
    idx.write_bytes(good[:10] + b"{'descr': ('<i8'," + good[28:])  # numpy's header parser: tokenize.TokenError
    assert JsonlIndex(path)[1]["text"] == "bb"
    np.save(idx, np.array([[0, 13], [-50, 14]], dtype=np.int64))  # a negative offset: seek() raised EINVAL
    assert JsonlIndex(path)[1]["text"] == "bb"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"text": "a"}\n\x00\x01\x02\x03binary', "NUL byte"),
        (b'{"text": "\xff\xfe"}\n', "invalid UTF-8"),
        (b"\n\n[1, 2, 3]\n", "a JSON list, expected an object"),
        (b"PK\x03\x04 not json at all\n", "first line is not JSON"),
    ],
)
def test_index_refuses_a_file_that_is_not_text_jsonl(tmp_path: Path, content: bytes, problem: str) -> None:
    from click.testing import CliRunner

    from tokenloom.formats import FormatError
    from tokenloom.tokenize._commands import index

    path = tmp_path / "blob.jsonl"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=problem) as info:
        build_index(path)
    assert info.value.path == str(path) and "one JSON object per line" in str(info.value)
    result = CliRunner().invoke(index, [str(path)])
    assert result.exit_code == 1 and "FormatError" in result.output and problem in result.output
    assert not index_path(path).exists()


def test_a_blank_or_empty_file_is_still_indexed(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert len(build_index(path)) == 0


def test_concurrent_index_runs_on_one_file_all_succeed(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(b'{"text": "%d"}\n' % i for i in range(20_000)))
    code = "from tokenloom.formats.cli import main; main()"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "index", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0] * 8, [err for _out, err in outputs]
    assert len(JsonlIndex(path, create=False)) == 20_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.jsonl.idx.json", "a.jsonl.idx.npy"]
