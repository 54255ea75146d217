"""Review 2: hf-streaming classifies every source by its magic bytes (_units._reader_of), local and remote.

Attacks: a jsonl.zst named .jsonl, a gzip named .jsonl, a parquet named .data (local and over ranged HTTP),
a .json file holding one JSON array (what `load_dataset("json")` also reads).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_remote_stream import stream

from tokenloom.formats import DataError, FormatError
from tokenloom.hf_streaming._units import file_sources
from tokenloom.tokenize.inputs.parquet import PARQUET

zstandard = pytest.importorskip("zstandard")


def _zst_named_jsonl(corpus: list[str], where: Path) -> Path:
    path = where / "hidden.jsonl"
    path.write_bytes(zstandard.ZstdCompressor().compress(Path(corpus[0]).read_bytes()))
    return path


def test_a_local_jsonl_zst_named_jsonl_is_named_not_read_as_text(corpus: list[str], tokenizer_dir: Path) -> None:
    path = _zst_named_jsonl(corpus, Path(corpus[0]).parent)
    with pytest.raises(FormatError, match=r"hidden.jsonl is named as .* but its first bytes .* are zstd") as caught:
        file_sources([str(path)])
    assert "Rename it to end in .jsonl.zst" in str(caught.value)
    with pytest.raises(FormatError, match="hidden.jsonl"):
        stream([str(path)], tokenizer_dir)


def test_a_remote_jsonl_zst_named_jsonl_is_named(range_server, corpus: list[str]) -> None:
    _zst_named_jsonl(corpus, range_server.root)
    url = f"{range_server.url}/hidden.jsonl"
    with pytest.raises(FormatError, match="are zstd") as caught:
        file_sources([url])
    assert url in str(caught.value) and "Rename it to end in .jsonl.zst" in str(caught.value)


def test_a_gzip_named_jsonl_is_named(corpus: list[str]) -> None:
    path = Path(corpus[0]).with_name("gz.jsonl")
    path.write_bytes(gzip.compress(Path(corpus[0]).read_bytes()))
    with pytest.raises(FormatError, match="Rename it to end in .jsonl.gz"):
        file_sources([str(path)])


def test_a_local_parquet_named_data_streams_as_the_parquet(corpus: list[str], tokenizer_dir: Path) -> None:
    parquet = Path(corpus[-1])
    assert parquet.suffix == ".parquet"
    other = parquet.with_name("rows.data")
    other.write_bytes(parquet.read_bytes())
    [source] = file_sources([str(other)])
    assert source.kind == PARQUET.name and sum(source.row_groups) == 55
    assert stream([str(other)], tokenizer_dir) == stream([str(parquet)], tokenizer_dir)


def test_a_remote_parquet_named_data_beside_jsonl_streams_in_order(range_server, corpus, tokenizer_dir) -> None:
    for name in ("part0.jsonl", "part_pq.parquet"):
        (range_server.root / name).write_bytes(Path(corpus[0]).with_name(name).read_bytes())
    (range_server.root / "rows.data").write_bytes((range_server.root / "part_pq.parquet").read_bytes())
    remote = [f"{range_server.url}/part0.jsonl", f"{range_server.url}/rows.data"]
    local = [corpus[0], corpus[-1]]
    assert stream(remote, tokenizer_dir) == stream(local, tokenizer_dir)


def test_a_json_array_file_is_read_or_named(corpus: list[str], tokenizer_dir: Path) -> None:
    """`load_dataset("json", data_files="x.json")` reads a JSON array of objects; streaming it must either give
    the same documents as the jsonl or refuse with a DataError naming the file, never yield garbage."""
    lines = Path(corpus[0]).read_text().splitlines()
    array = Path(corpus[0]).with_name("array.json")
    array.write_text(json.dumps([json.loads(line) for line in lines]))
    try:
        got = stream([str(array)], tokenizer_dir)
    except DataError as exc:
        assert "array.json" in str(exc)
        return
    assert got == stream([corpus[0]], tokenizer_dir)


@pytest.mark.parametrize("dictionary", [False, True])
def test_a_remote_arrow_stream_streams_like_the_local_one(range_server, tmp_path, tokenizer_dir, dictionary) -> None:
    """Arrow over ranged reads: many small batches; with a dictionary column that changes between batches
    (the lazy reader falls back to pyarrow's reader of the whole object)."""
    import random

    pa = pytest.importorskip("pyarrow")
    from conftest import make_text

    rng = random.Random(5)
    texts = [make_text(rng, i) for i in range(120)]
    path = range_server.root / "rows.arrow"
    size = 12 if dictionary else 7
    if dictionary:
        schema = pa.schema([("text", pa.dictionary(pa.int32(), pa.string()))])
        with pa.ipc.new_stream(str(path), schema) as writer:
            for start in range(0, 120, size):
                chunk = texts[start : start + size]
                array = pa.DictionaryArray.from_arrays(pa.array(range(len(chunk)), pa.int32()), pa.array(chunk))
                writer.write_batch(pa.record_batch([array], schema=schema))
    else:
        table = pa.table({"text": texts})
        with pa.ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table, max_chunksize=size)
    local = tmp_path / "rows.arrow"
    local.write_bytes(path.read_bytes())
    plain = tmp_path / "plain.arrow"  # the same batches, plain strings: the same units, so the same samples
    table = pa.table({"text": texts})
    with pa.ipc.new_stream(str(plain), table.schema) as writer:
        writer.write_table(table, max_chunksize=size)
    expected = stream([str(plain)], tokenizer_dir)
    assert stream([str(local)], tokenizer_dir) == expected
    assert stream([f"{range_server.url}/rows.arrow"], tokenizer_dir) == expected
