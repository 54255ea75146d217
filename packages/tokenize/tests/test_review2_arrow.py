"""Review 2 of the lazy Arrow IPC reader (tokenize/inputs/arrow.py, hand-parsed message metadata).

Every case compares the rows ArrowRows reads batch by batch with pyarrow's own reader of the same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tokenloom.formats import DataError
from tokenloom.tokenize.inputs import sniff
from tokenloom.tokenize.inputs.arrow import ARROW, ArrowRows


def _pyarrow_rows(data: bytes) -> list[dict[str, Any]]:
    if data[:6] == b"ARROW1":
        reader = pa.ipc.open_file(pa.BufferReader(data))
        return pa.Table.from_batches(
            [reader.get_batch(i) for i in range(reader.num_record_batches)], reader.schema
        ).to_pylist()
    return pa.ipc.open_stream(pa.BufferReader(data)).read_all().to_pylist()


def _our_rows(source: Any) -> list[dict[str, Any]]:
    rows = ArrowRows(source)
    out: list[dict[str, Any]] = []
    for unit in range(len(rows.units)):
        batch = rows.read(unit)
        assert batch.num_rows == rows.units[unit]
        out.extend(batch.to_pylist())
    return out


def _write(layout: str, schema: pa.Schema, batches: list[pa.RecordBatch], **options: Any) -> bytes:
    sink = io.BytesIO()
    opts = pa.ipc.IpcWriteOptions(**options) if options else None
    opener = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
    with opener(sink, schema, options=opts) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def _texts(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch([pa.array([f"doc {start + i} ünï ✓" for i in range(n)], pa.string())], names=["text"])


LAYOUTS = ["file", "stream"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_many_small_batches_and_empty_batches(layout: str, tmp_path: Path) -> None:
    batches = [_texts(i % 3, i * 10) for i in range(3000)]  # a third are 0-row batches
    data = _write(layout, batches[0].schema, batches)
    path = tmp_path / "small.arrow"
    path.write_bytes(data)
    assert sniff(path) is ARROW
    assert _our_rows(path) == _pyarrow_rows(data)
    assert sum(ArrowRows(path).units) == sum(i % 3 for i in range(3000))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_schema_only_no_batches(layout: str, tmp_path: Path) -> None:
    path = tmp_path / "empty.arrow"
    path.write_bytes(_write(layout, pa.schema([("text", pa.string())]), []))
    rows = ArrowRows(path)
    assert rows.units == [] and rows.schema.names == ["text"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("delta", [False, True])
def test_dictionary_columns(layout: str, delta: bool, tmp_path: Path) -> None:
    """A dictionary column whose dictionary is the same (unified) or grows by deltas, in both layouts."""
    schema = pa.schema([("text", pa.dictionary(pa.int32(), pa.string())), ("n", pa.int64())])
    batches = []
    for i in range(5):
        words = [f"w{j}" for j in range(i + 2)] if delta else ["a", "b", "c"]
        array = pa.DictionaryArray.from_arrays(
            pa.array([j % len(words) for j in range(7)], pa.int32()), pa.array(words)
        )
        batches.append(pa.record_batch([array, pa.array(range(i * 7, i * 7 + 7))], schema=schema))
    try:
        data = _write(layout, schema, batches, emit_dictionary_deltas=delta)
    except pa.ArrowInvalid:
        pytest.skip("pyarrow itself refuses this layout")
    path = tmp_path / "dict.arrow"
    path.write_bytes(data)
    assert _our_rows(path) == _pyarrow_rows(data)
    with open(path, "rb") as handle:
        assert _our_rows(handle) == _pyarrow_rows(data)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_batches_many_columns_nested(layout: str, compression: str, tmp_path: Path) -> None:
    """Body compression, 60 columns (metadata over the 512-byte peek), a struct and a list column."""
    n = 50
    columns = {f"col_{k:02d}_with_a_long_name": pa.array(range(n)) for k in range(60)}
    columns["meta"] = pa.array([{"body": f"nested {i}", "tags": [i, i + 1]} for i in range(n)])
    columns["text"] = pa.array([f"text {i}" for i in range(n)], pa.large_string())
    table = pa.table(columns)
    data = _write(layout, table.schema, table.to_batches(max_chunksize=7), compression=compression)
    path = tmp_path / "wide.arrow"
    path.write_bytes(data)
    assert _our_rows(path) == _pyarrow_rows(data)
    rows = ArrowRows(path)
    assert rows.read(1, ["text"]).column(0).to_pylist() == [f"text {i}" for i in range(7, 14)]


@pytest.mark.parametrize("cut", [1, 9, 200, 700])
def test_a_truncated_file_layout_is_a_named_error(cut: int, tmp_path: Path) -> None:
    data = _write("file", _texts(1).schema, [_texts(100, i * 100) for i in range(5)])
    path = tmp_path / "cut.arrow"
    path.write_bytes(data[:-cut])
    with pytest.raises(DataError) as info:
        ArrowRows(path)
    assert str(path) in str(info.value)


def test_a_stream_cut_inside_a_batch_is_a_named_error(tmp_path: Path) -> None:
    batches = [_texts(100, i * 100) for i in range(5)]
    data = _write("stream", batches[0].schema, batches)
    path = tmp_path / "cut.arrow"
    for cut in (3, 50, len(data) // 2):
        path.write_bytes(data[:-cut] if cut != 3 else data[: len(data) - 8 - 3])
        with pytest.raises(DataError):
            _our_rows(path)


def test_legacy_pre_015_stream_reads_like_pyarrow(tmp_path: Path) -> None:
    """Streams written before Arrow 0.15 (no continuation marker); the scan has a branch for them."""
    batches = [_texts(10, i * 10) for i in range(4)]
    data = _write("stream", batches[0].schema, batches, use_legacy_format=True)
    path = tmp_path / "legacy.arrow"
    path.write_bytes(data)
    assert _our_rows(path) == _pyarrow_rows(data)


def test_hf_save_to_disk_shards_read_like_datasets(tmp_path: Path) -> None:
    """A real `datasets` save_to_disk (3 shards, features with a ClassLabel, after shuffle and select)."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["neg", "pos"]),
            "score": datasets.Value("float32"),
        }
    )
    rows = [{"text": f"row {i} " + "word " * (i % 11), "label": i % 2, "score": i / 3} for i in range(2500)]
    ds = datasets.Dataset.from_list(rows, features=features).shuffle(seed=1).select(range(0, 2500, 2))
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    files = sorted((tmp_path / "saved").glob("*.arrow"))
    assert len(files) == 3
    ours = [row for path in files for row in _our_rows(path)]
    for path in files:
        assert sniff(path) is ARROW
    assert ours == datasets.load_from_disk(str(tmp_path / "saved")).to_list()


@pytest.mark.parametrize("workers", [0, 2])
def test_tokenize_of_an_arrow_with_empty_and_tiny_batches_matches_jsonl(
    tmp_path: Path, tiny_tokenizer: Path, workers: int
) -> None:
    import orjson

    from tokenloom.tokenize import TokenizeConfig, tokenize

    batches = [_texts(i % 4, i * 10) for i in range(400)]
    texts = [row["text"] for batch in batches for row in batch.to_pylist()]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.jsonl").write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))
    (tmp_path / "arrow").mkdir()
    (tmp_path / "arrow" / "a.arrow").write_bytes(_write("stream", batches[0].schema, batches))
    options = {"shard_size_tokens": 3000, "chunk_lines": 40, "engine": "hf", "tokenizer": str(tiny_tokenizer)}
    plain = tokenize(TokenizeConfig(input_dir=tmp_path / "plain", output_dir=tmp_path / "p", num_workers=0, **options))
    ours = tokenize(
        TokenizeConfig(input_dir=tmp_path / "arrow", output_dir=tmp_path / "o", num_workers=workers, **options)
    )
    assert ours.documents == plain.documents == len(texts)
    shards = {p.name: p.read_bytes() for p in sorted((tmp_path / "p").glob("unit_*"))}
    assert shards and {p.name: p.read_bytes() for p in sorted((tmp_path / "o").glob("unit_*"))} == shards
