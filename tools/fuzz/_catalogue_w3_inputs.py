"""Catalogue rows for wave 3's data-preparation issue (#24, item 1): tokenize's corpus inputs gone bad.

Each row builds its input with the real library (gzip, zstandard, pyarrow), runs `tokenloom tokenize`
and checks the error names the file and that nothing was published (no manifest, no shards).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from _catalogue_base import Outcome, Run, case


def _records(count: int) -> list[dict[str, object]]:
    return [{"meta": {"body": f"document {i}: " + "alpha beta gamma " * (1 + i % 13)}} for i in range(count)]


def _jsonl(count: int) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in _records(count))


def _tokenize(tmp: Path, inputs: Path, *, names: str, extra: tuple[str, ...] = ()) -> Run:
    """`tokenloom tokenize` over ``inputs``; the check: the error names ``names`` and OUT holds no dataset."""
    out = tmp / "out"
    argv = [
        "tokenize",
        "--input-dir",
        str(inputs),
        "--output-dir",
        str(out),
        "--num-workers",
        "0",
        "--no-progress",
        "--shard-size-tokens",
        "200",
        *extra,
    ]

    def check(outcome: Outcome) -> str | None:
        message = f"{outcome.exception}{outcome.stdout}{outcome.stderr}"
        if names not in message:
            return f"the error does not name {names!r}: {message[-200:]}"
        if (out / "manifest.json").exists() or list(out.glob("unit_*")):
            return "a dataset or shards were left in the output directory"
        return None

    return Run(argv=argv, check=check, sources=sorted(p for p in inputs.iterdir() if p.is_file()))


def _with_good_file(tmp: Path) -> Path:
    """An input directory whose first file is good (so shards exist before the bad one is reached)."""
    inputs = tmp / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_bytes(_jsonl(200))
    return inputs


@case("tokenize input: a .jsonl.zst cut short", "bad input", "error", "RecordError")
def _(tmp: Path) -> Run:
    import zstandard

    inputs = _with_good_file(tmp)
    data = zstandard.ZstdCompressor().compress(_jsonl(3000))
    (inputs / "b.jsonl.zst").write_bytes(data[: len(data) // 2])
    return _tokenize(tmp, inputs, names=f"compressed byte {len(data) // 2}", extra=("--text-field", "meta.body"))


@case("tokenize input: a .json.gz cut short", "bad input", "error", "RecordError")
def _(tmp: Path) -> Run:
    inputs = _with_good_file(tmp)
    data = gzip.compress(_jsonl(3000), mtime=0)
    (inputs / "b.json.gz").write_bytes(data[: len(data) // 2])
    return _tokenize(tmp, inputs, names=f"compressed byte {len(data) // 2}", extra=("--text-field", "meta.body"))


@case("tokenize input: a parquet file without the --text-field column", "bad input", "error", "MissingKeyError")
def _(tmp: Path) -> Run:
    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs = tmp / "in"
    inputs.mkdir()
    pq.write_table(pa.Table.from_pylist(_records(50)), inputs / "a.parquet")
    return _tokenize(tmp, inputs, names="no column 'text'")


@case("tokenize input: a parquet row group with a corrupt page", "bad input", "error", "FormatError")
def _(tmp: Path) -> Run:
    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs = _with_good_file(tmp)
    path = inputs / "b.parquet"
    pq.write_table(pa.Table.from_pylist(_records(300)), path, row_group_size=100, write_page_checksum=True)
    group = pq.ParquetFile(path).metadata.row_group(2)
    start = group.column(0).dictionary_page_offset or group.column(0).data_page_offset
    data = bytearray(path.read_bytes())
    for i in range(start + 40, start + 60):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return _tokenize(tmp, inputs, names="row group 2 (of 3, rows 201-300)", extra=("--text-field", "meta.body"))


@case("tokenize input: a .jsonl file that holds gzip (mislabelled)", "bad input", "error", "FormatError")
def _(tmp: Path) -> Run:
    inputs = _with_good_file(tmp)
    (inputs / "b.jsonl").write_bytes(gzip.compress(_jsonl(10), mtime=0))
    return _tokenize(tmp, inputs, names="named as jsonl but its first bytes (1f 8b 08 00) are gzip-compressed jsonl")


@case("tokenize input: a .parquet file that is a jsonl dump (mislabelled)", "bad input", "error", "FormatError")
def _(tmp: Path) -> Run:
    inputs = _with_good_file(tmp)
    (inputs / "b.parquet").write_bytes(_jsonl(10))
    return _tokenize(tmp, inputs, names="b.parquet is named as parquet but its first bytes")


@case("tokenize input: a parquet file cut before its footer", "bad input", "error", "TruncatedError")
def _(tmp: Path) -> Run:
    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs = _with_good_file(tmp)
    pq.write_table(pa.Table.from_pylist(_records(50)), inputs / "b.parquet")
    data = (inputs / "b.parquet").read_bytes()
    (inputs / "b.parquet").write_bytes(data[: len(data) - 100])
    return _tokenize(tmp, inputs, names="footer is missing")


@case("tokenize input: an Arrow stream cut inside a record batch", "bad input", "error", "FormatError")
def _(tmp: Path) -> Run:
    import pyarrow as pa

    inputs = _with_good_file(tmp)
    table = pa.Table.from_pylist(_records(300))
    with pa.OSFile(str(inputs / "b.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=100)
    data = (inputs / "b.arrow").read_bytes()
    (inputs / "b.arrow").write_bytes(data[: len(data) * 2 // 3])
    return _tokenize(tmp, inputs, names="b.arrow", extra=("--text-field", "meta.body"))
