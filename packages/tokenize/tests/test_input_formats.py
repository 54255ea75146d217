"""Every input format, built with its real library, gives the tokens of the plain jsonl of the same records."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tokenloom.formats import (
    ConfigError,
    FormatError,
    MissingKeyError,
    RecordError,
    ResumeMismatchError,
    TruncatedError,
    open_dataset,
)
from tokenloom.tokenize import TokenizeConfig, tokenize

OPTIONS: dict[str, Any] = {"shard_size_tokens": 3000, "chunk_lines": 40, "engine": "hf"}


def records(texts: list[str]) -> list[dict[str, Any]]:
    return [{"id": i, "meta": {"body": text, "lang": "en"}, "text": text} for i, text in enumerate(texts)]


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def write_format(directory: Path, fmt: str, parts: list[list[dict[str, Any]]]) -> Path:
    """The same records in ``fmt``, one file per part (names sort in part order)."""
    directory.mkdir(parents=True)
    for i, rows in enumerate(parts):
        stem = directory / f"part-{i}"
        if fmt == "jsonl":
            stem.with_suffix(".jsonl").write_bytes(jsonl_bytes(rows))
        elif fmt == "jsonl.zst":  # two frames, as concatenated zstd files are in the wild
            data = jsonl_bytes(rows)
            half = data.index(b"\n", len(data) // 2) + 1
            compressor = zstandard.ZstdCompressor(write_checksum=True)
            Path(f"{stem}.jsonl.zst").write_bytes(compressor.compress(data[:half]) + compressor.compress(data[half:]))
        elif fmt == "json.gz":
            Path(f"{stem}.json.gz").write_bytes(gzip.compress(jsonl_bytes(rows), mtime=0))
        elif fmt == "parquet":  # small row groups: several units per file, some cut by chunk_lines
            pq.write_table(table(rows), f"{stem}.parquet", row_group_size=70)
        elif fmt == "arrow-file":
            with pa.ipc.new_file(f"{stem}.arrow", table(rows).schema) as writer:
                writer.write_table(table(rows), max_chunksize=90)
        elif fmt == "save_to_disk":
            from datasets import Dataset

            Dataset.from_list(rows).save_to_disk(str(directory / f"ds-{i}"))
    return directory


def tokens_of(out: Path) -> np.ndarray:
    dataset = open_dataset(out, format="native")
    return np.asarray(dataset.tokens(0, dataset.num_tokens))


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("unit_*"))}


@pytest.fixture
def parts(make_texts: Callable[..., list[str]]) -> list[list[dict[str, Any]]]:
    texts = make_texts(600, seed=3, max_words=80)
    return [records(texts[:250]), records(texts[250:])]


def run(tokenizer: Path, input_dir: Path, out: Path, **options: Any) -> Any:
    merged = {**OPTIONS, **options}
    return tokenize(TokenizeConfig(input_dir=input_dir, output_dir=out, tokenizer=str(tokenizer), **merged))


@pytest.mark.parametrize("fmt", ["jsonl.zst", "json.gz", "parquet", "arrow-file", "save_to_disk"])
@pytest.mark.parametrize("workers", [1, 2])
def test_every_format_gives_the_tokens_of_the_plain_jsonl(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]], fmt: str, workers: int
) -> None:
    plain = run(tiny_tokenizer, write_format(tmp_path / "plain", "jsonl", parts), tmp_path / "plain-out", num_workers=0)
    source = write_format(tmp_path / "in", fmt, parts)
    summary = run(tiny_tokenizer, source, tmp_path / "out", num_workers=workers)
    assert summary.documents == plain.documents == 600
    assert summary.skipped == {}
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "plain-out")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "arrow-file"])
def test_dotted_text_field_reads_nested_objects_and_struct_columns(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]], fmt: str
) -> None:
    run(tiny_tokenizer, write_format(tmp_path / "plain", "jsonl", parts), tmp_path / "plain-out", num_workers=0)
    source = write_format(tmp_path / "in", fmt, parts)
    run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, text_field="meta.body")
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "plain-out")


def test_null_struct_and_null_text_are_counted_and_named_like_jsonl(tmp_path: Path, tiny_tokenizer: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"meta": {"body": "first good document"}},
        {"meta": None},
        {"meta": {"body": None}},
        {"meta": {"body": "second good document"}},
    ]
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), source / "a.parquet")
    summary = run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, text_field="meta.body", on_error="skip")
    assert summary.documents == 2
    assert summary.skipped == {"missing_field": 1, "non_string_field": 1}
    with pytest.raises(RecordError) as info:
        run(tiny_tokenizer, source, tmp_path / "raise", num_workers=0, text_field="meta.body")
    assert info.value.path == str(source / "a.parquet")
    assert info.value.record == 2
    assert info.value.field == "missing_field"
    assert not (tmp_path / "raise" / "manifest.json").exists()


def _truncated(tmp_path: Path, parts: list[list[dict[str, Any]]], fmt: str) -> tuple[Path, Path, bytes]:
    source = write_format(tmp_path / "in", fmt, parts)
    path = sorted(p for p in source.iterdir() if p.name.startswith("part-1"))[0]
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) * 2 // 3])
    return source, path, whole


@pytest.mark.parametrize(("fmt", "kind"), [("jsonl.zst", "truncated_zstd"), ("json.gz", "truncated_gzip")])
def test_a_truncated_stream_names_file_and_offset_publishes_nothing_and_a_fixed_rerun_starts_afresh(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]], fmt: str, kind: str
) -> None:
    source, path, whole = _truncated(tmp_path, parts, fmt)
    out = tmp_path / "out"
    with pytest.raises(RecordError) as info:
        run(tiny_tokenizer, source, out, num_workers=2, shard_size_tokens=500)
    err = info.value
    assert (err.path, err.field) == (str(path), kind)
    assert err.offset == path.stat().st_size  # the stream ends there, inside a frame / before the gzip trailer
    assert f"compressed byte {err.offset}" in str(err)
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("unit_*"))  # part-0's shards were removed again
    path.write_bytes(whole)  # the input fixed: size and mtime are in the run key, so nothing old is mixed in
    run(tiny_tokenizer, source, out, num_workers=2, shard_size_tokens=500)
    run(tiny_tokenizer, write_format(tmp_path / "plain", "jsonl", parts), tmp_path / "plain-out", num_workers=0)
    assert tokens_of(out).tolist() == tokens_of(tmp_path / "plain-out").tolist()


def test_a_truncated_zstd_is_not_read_as_a_shorter_file_even_with_skip(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]]
) -> None:
    """zstandard's stream reader just stops at the cut; the rest must be counted, never silently missing."""
    source, path, whole = _truncated(tmp_path, parts, "jsonl.zst")
    summary = run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, on_error="skip")
    assert summary.skipped.get("truncated_zstd") == 1
    path.write_bytes(whole)  # fixed after a run that counted it: the recorded input differs, never mixed in
    with pytest.raises(ResumeMismatchError, match="part-1.jsonl.zst"):
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, on_error="skip")


def test_gpt_simple_windowing_refuses_inputs_gpt_simple_cannot_read(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]]
) -> None:
    source = write_format(tmp_path / "in", "parquet", parts)
    with pytest.raises(ConfigError, match=r"are not \.jsonl or \.jsonl\.gz \(part-0\.parquet, part-1\.parquet\)"):
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, windowing="gpt-simple", seq_len=64)


def test_a_parquet_file_without_the_text_column_is_a_named_error(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]]
) -> None:
    source = write_format(tmp_path / "in", "parquet", parts)
    with pytest.raises(MissingKeyError) as info:
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, text_field="body")
    assert info.value.path == str(source / "part-0.parquet")
    assert "no column 'body'" in str(info.value) and "'text'" in str(info.value)
    with pytest.raises(MissingKeyError, match="'meta' is a struct with fields 'body', 'lang', with no field 'x'"):
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, text_field="meta.x")
    with pytest.raises(MissingKeyError, match="column 'id' is of type int64, expected a string column"):
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0, text_field="id")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_corrupt_row_group_is_a_named_error_and_nothing_is_published(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]]
) -> None:
    source = write_format(tmp_path / "in", "plain", [])
    pq.write_table(table(parts[0]), source / "a.parquet", row_group_size=100, write_page_checksum=True)
    metadata = pq.ParquetFile(source / "a.parquet").metadata
    group = metadata.row_group(1)
    column = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "text")
    start = column.dictionary_page_offset or column.data_page_offset  # flip bytes of the first page's payload
    data = bytearray((source / "a.parquet").read_bytes())
    for i in range(start + 40, start + 60):
        data[i] ^= 0x5A
    (source / "a.parquet").write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(FormatError, match=r"row group 1 \(of 3, rows 101-200\)") as info:
        run(tiny_tokenizer, source, out, num_workers=0, shard_size_tokens=200)
    assert info.value.path == str(source / "a.parquet")
    assert info.value.record == 101
    assert not (out / "manifest.json").exists() and not list(out.glob("unit_*"))


@pytest.mark.parametrize(
    ("name", "data", "found"),
    [
        ("a.jsonl", gzip.compress(b'{"text": "x"}\n'), "gzip-compressed jsonl"),
        ("a.jsonl.gz", b'{"text": "x"}\n', "plain text"),
        ("a.jsonl.zst", gzip.compress(b'{"text": "x"}\n'), "gzip-compressed jsonl"),
        ("a.parquet", b'{"text": "x"}\n', "plain text"),
        ("a.jsonl", b"PAR1" + b"\0" * 20 + b"PAR1", "parquet"),
        ("a.arrow", zstandard.ZstdCompressor().compress(b'{"text": "x"}\n'), "zstd-compressed jsonl"),
    ],
)
def test_a_suffix_that_disagrees_with_the_magic_bytes_is_a_named_format_error(
    tmp_path: Path, tiny_tokenizer: Path, name: str, data: bytes, found: str
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / name).write_bytes(data)
    with pytest.raises(FormatError, match=f"named as .* but its first bytes .* are {found}") as info:
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0)
    assert info.value.path == str(source / name)
    assert not (tmp_path / "out").exists()  # found before anything is written


def test_a_parquet_file_cut_before_its_footer_is_a_truncated_error(tmp_path: Path, tiny_tokenizer: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"text": ["a", "b"]}), source / "a.parquet")
    data = (source / "a.parquet").read_bytes()
    (source / "a.parquet").write_bytes(data[:-10])
    with pytest.raises(TruncatedError, match="footer is missing"):
        run(tiny_tokenizer, source, tmp_path / "out", num_workers=0)


def test_without_the_corpus_extra_the_error_names_the_install_command(tmp_path: Path) -> None:
    """zstandard and pyarrow are the `corpus` extra: simulate their absence in a child process."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "x"}\n'))
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "in" / "b.parquet")
    script = """
import sys
sys.modules["zstandard"] = None
sys.modules["pyarrow"] = None
from pathlib import Path
from tokenloom.tokenize.inputs import discover_inputs, read_chunks
for info in discover_inputs(sys.argv[1]):
    try:
        list(read_chunks([info], chunk_lines=10, chunk_bytes=1 << 20, max_line_bytes=1 << 20))
    except ImportError as exc:
        print(exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "in")], capture_output=True, text=True, timeout=120, check=True
    )
    messages = done.stdout.strip().splitlines()
    assert len(messages) == 2, done.stdout + done.stderr
    assert "Reading zstd-compressed jsonl input needs the optional dependency 'zstandard'" in messages[0]
    assert "Reading parquet input needs the optional dependency 'pyarrow'" in messages[1]
    for message in messages:
        assert 'pip install "tokenloom-tokenize[corpus]"' in message


SCRIPT = """
import json, sys
from tokenloom.tokenize import TokenizeConfig, tokenize
tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=sys.argv[3], num_workers=2,
                        **json.loads(sys.argv[4])))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL")
@pytest.mark.parametrize("fmt", ["parquet", "arrow-file"])
def test_kill_9_of_a_columnar_run_then_rerun_is_byte_identical(
    tmp_path: Path, tiny_tokenizer: Path, parts: list[list[dict[str, Any]]], fmt: str
) -> None:
    options = {**OPTIONS, "shard_size_tokens": 400, "chunk_lines": 30}
    source = write_format(tmp_path / "in", fmt, parts)
    whole = tmp_path / "whole"
    expected = run(tiny_tokenizer, source, whole, num_workers=0, **options)
    assert expected.shards >= 10
    out = tmp_path / "killed"
    args = [str(source), str(out), str(tiny_tokenizer), orjson.dumps(options).decode()]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *args], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:  # part-0 (a unit) is committed
        if out.is_dir() and list(out.glob(".tokenloom-unit-*.done")):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert (out / ".tokenloom-plan.json").is_file() and not (out / "manifest.json").exists()
    rerun = subprocess.run([sys.executable, "-c", SCRIPT, *args], env=env, timeout=120, capture_output=True)
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    assert shard_bytes(out) == shard_bytes(whole)
    assert tokens_of(out).tolist() == tokens_of(whole).tolist()


class _CountingFile:
    """A file object that counts the bytes read from it (the largest position read, too)."""

    def __init__(self, data: bytes) -> None:
        import io

        self._inner = io.BytesIO(data)
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size)
        self.bytes_read += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()


@pytest.mark.parametrize("layout", ["file", "stream"])
def test_an_arrow_file_of_many_batches_opens_and_reads_in_bounded_memory(layout: str) -> None:
    """Opening reads the messages' metadata only; each batch is read when asked for, one at a time."""
    import io

    from tokenloom.tokenize.inputs.arrow import ArrowRows

    table = pa.table({"text": [f"document {i} " + "x" * 2000 for i in range(2000)]})
    sink = io.BytesIO()
    with (pa.ipc.new_file if layout == "file" else pa.ipc.new_stream)(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=10):
            writer.write_batch(batch)
    data = sink.getvalue()
    source = _CountingFile(data)
    rows = ArrowRows(source)
    assert rows.units == [10] * 200 and rows.schema.names == ["text"]
    assert source.bytes_read < len(data) // 20, f"opening read {source.bytes_read} of {len(data)} bytes"
    before = source.bytes_read
    first = rows.read(0, ["text"])
    assert first.column(0).to_pylist() == table.column("text").to_pylist()[:10]
    assert source.bytes_read - before < len(data) // 100  # one batch (and the schema), not the file
    assert rows.read(199).column(0).to_pylist() == table.column("text").to_pylist()[-10:]
    assert rows.unit_bytes(5) > 10 * 2000


def test_a_cut_arrow_file_is_a_format_error(tmp_path: Path) -> None:
    from tokenloom.tokenize.inputs.arrow import ArrowRows

    path = tmp_path / "cut.arrow"
    with pa.ipc.new_stream(str(path), pa.schema([("text", pa.string())])) as writer:
        for i in range(5):
            writer.write_batch(pa.record_batch([pa.array([f"row {i}"] * 100)], names=["text"]))
    path.write_bytes(path.read_bytes()[:-700])
    with pytest.raises(FormatError, match="Arrow IPC file cannot be read") as info:
        ArrowRows(path)
    assert info.value.path == str(path)


def test_an_arrow_stream_whose_dictionary_changes_reads_each_batch_with_its_own(tmp_path: Path) -> None:
    """A replacement dictionary after the first batch: a batch read alone with the first dictionary would give the
    wrong strings silently; the reader reads such a file through pyarrow's own reader instead."""
    from tokenloom.tokenize.inputs.arrow import ArrowRows

    schema = pa.schema([("text", pa.dictionary(pa.int32(), pa.string()))])
    path = tmp_path / "dict.arrow"
    words = (["a", "b"], ["c", "d"], ["e", "a"])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for pair in words:
            array = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(pair))
            writer.write_batch(pa.record_batch([array], schema=schema))
    with open(path, "rb") as handle:
        for source in (path, handle):
            rows = ArrowRows(source)
            assert [rows.read(i).column(0).to_pylist() for i in range(len(rows.units))] == list(words)
