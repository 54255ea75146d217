"""A remote source is classified as a local one is: by its magic bytes (ranged reads of its first and last
bytes), its suffix cross-checked; a row reader opens an object with its own remote options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_remote_stream import stream

from tokenloom.formats import FormatError, RemoteOptions
from tokenloom.hf_streaming._units import file_sources, open_rows
from tokenloom.tokenize.inputs import InputReader, register, unregister
from tokenloom.tokenize.inputs.parquet import PARQUET

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(path: Path) -> Path:
    from conftest import make_text

    rng = __import__("random").Random(3)
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        for g in range(3):
            writer.write_table(pa.table({"text": [make_text(rng, g * 50 + i) for i in range(50)]}))
    return path


def test_a_remote_parquet_under_another_name_is_read_as_parquet(range_server, tokenizer_dir):
    """The name promises nothing (``.data``): the PAR1 magic decides, where the name used to (jsonl)."""
    local = _parquet(range_server.root / "rows.parquet")
    (range_server.root / "rows.data").write_bytes(local.read_bytes())
    [source] = file_sources([f"{range_server.url}/rows.data"])
    assert source.kind == PARQUET.name and source.row_groups == (50, 50, 50)
    assert stream([f"{range_server.url}/rows.data"], tokenizer_dir) == stream([str(local)], tokenizer_dir)


def test_a_remote_name_that_lies_about_its_content_is_named(range_server, corpus):
    (range_server.root / "plain.jsonl.zst").write_bytes(Path(corpus[0]).read_bytes())
    url = f"{range_server.url}/plain.jsonl.zst"
    with pytest.raises(FormatError, match=r"plain.jsonl.zst is named as zstd-compressed jsonl.*plain text") as caught:
        file_sources([url])
    assert url in str(caught.value) and "Rename it to end in .jsonl" in str(caught.value)


def test_a_row_reader_opens_an_object_with_its_own_remote_options(range_server):
    """Another row-group format gets none of parquet's options (``metadata``, ``pre_buffer``): its own hook
    decides; what its RowFile leaves ``reusable`` is handed back on the next open of the same object."""
    _parquet(range_server.root / "other.parquet")
    seen: list[tuple[dict, object]] = []

    class _Rowz(InputReader):
        name = "test rowz"
        suffixes = (".rowz",)
        magic = (b"RWZ\x00",)
        rows = True
        cut = PARQUET.cut

        def open(self, source, **options):
            seen.append((options, None))
            return PARQUET.open(source)  # no parquet remote options: a plain ParquetFile

        def open_remote(self, source, *, shown, reuse=None):
            seen.append(({"shown": shown}, reuse))
            rows = self.open(source)
            rows.reusable = "footer token"
            return rows

    reader = register(_Rowz())
    try:
        [parquet] = file_sources([f"{range_server.url}/other.parquet"], RemoteOptions())
        source = dataclasses.replace(parquet, kind=reader.name)  # a row-group format of its own, over parquet bytes
        open_rows(source)
        open_rows(source)
    finally:
        unregister(reader.name)
    assert all("metadata" not in options and "pre_buffer" not in options for options, _ in seen)
    assert [reuse for options, reuse in seen if "shown" in options] == [None, "footer token"]
