"""tokenloom.tokenize.inputs: the one input room. Every corpus kind is an :class:`InputReader`, read the same way
by tokenize and by hf-streaming.

    a file --sniff (magic bytes; the suffix must agree)--> its InputReader (jsonl, jsonl.gz, jsonl.zst, parquet,
    Arrow IPC: one module each, registered on import)
        line readers: open(raw) -> decompressed bytes -> stream_lines (bounded: 1 MiB reads, a line over the cap
                      is an Issue, never held whole) -> Record(path, line, bytes, offset) / Issue
        row readers:  open(path or file) -> RowFile (row groups or record batches) -> Record(path, row, dict)
    units: cut_units (line-aligned byte ranges, runs of row groups, whole files) -> UnitSource
    tokenize's text runs: read_chunks (chunks of lines or rows, in input order)

A new corpus kind is one module with a class that subclasses :class:`InputReader` and one
``register(...)`` line (and its import below). A record transform takes a :class:`Record` (its value and
identity) and returns what is written.
"""

# isort: off
# The built-in readers, registered in this order (the order suffixes are listed in messages):
from tokenloom.tokenize.inputs import jsonl, jsonl_gz, jsonl_zst, parquet, arrow  # noqa: F401

# isort: on
from tokenloom.tokenize.inputs._chunks import Chunk, read_chunks
from tokenloom.tokenize.inputs._discover import discover_inputs, discover_remote_inputs, input_staging_dir
from tokenloom.tokenize.inputs._files import InputFile, local_path
from tokenloom.tokenize.inputs._lines import (
    Issue,
    IssueKind,
    invalid_utf8,
    line_cuts,
    line_start,
    lines_before,
    open_lines,
    stream_lines,
)
from tokenloom.tokenize.inputs._records import Record, line_records, read_records, row_records
from tokenloom.tokenize.inputs._registry import (
    Cut,
    InputReader,
    claimed_format,
    detect,
    format_named,
    input_suffixes,
    readers,
    register,
    sniff,
    sniff_file,
    unregister,
)
from tokenloom.tokenize.inputs._rows import RowFile
from tokenloom.tokenize.inputs._units import ByteRange, RowGroups, UnitSource, cut_units
from tokenloom.tokenize.inputs.jsonl_zst import CutStreamError, StreamError, WindowError

__all__ = [
    "ByteRange",
    "Chunk",
    "Cut",
    "CutStreamError",
    "InputFile",
    "InputReader",
    "Issue",
    "IssueKind",
    "Record",
    "RowFile",
    "RowGroups",
    "StreamError",
    "UnitSource",
    "WindowError",
    "claimed_format",
    "cut_units",
    "detect",
    "discover_inputs",
    "discover_remote_inputs",
    "format_named",
    "input_staging_dir",
    "input_suffixes",
    "invalid_utf8",
    "line_cuts",
    "line_records",
    "line_start",
    "lines_before",
    "local_path",
    "open_lines",
    "read_chunks",
    "read_records",
    "readers",
    "register",
    "row_records",
    "sniff",
    "sniff_file",
    "stream_lines",
    "unregister",
]
