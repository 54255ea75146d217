"""The contract every format shares, tested across all of them at once.

Round trips of any documents through every writer and reader, detection of every
layout, ``tokenloom convert`` between every pair, constant memory, and crash
safety: a writer SIGKILLed at any instant leaves nothing a reader accepts as
complete.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from formats_helpers import fuzz
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.formats import (
    ConfigError,
    DataError,
    FormatError,
    MissingFileError,
    available_formats,
    convert_dataset,
    detect_format,
    open_dataset,
    open_writer,
)
from tokenloom.formats.cli.commands import convert

h5py = pytest.importorskip("h5py") if os.environ.get("TOKENLOOM_ISOLATED_ENV") != "formats" else __import__("h5py")

#: label -> (format, target path relative to a fresh directory, writer options)
WRITERS: dict[str, tuple[str, str, dict]] = {
    "native": ("native", "ds", {}),
    "native-sharded": ("native", "ds", {"shard_size_tokens": 4}),
    "flat-npy": ("flat", "ds", {"shard_size_tokens": 4}),
    "flat-bin": ("flat", "ds", {"file_format": "bin"}),
    "megatron": ("megatron", "ds/train", {}),
    "packed": ("packed", "ds.pbin", {}),
    "packed-legacy": ("packed", "ds.pbin", {"legacy": True}),
    "h5": ("h5", "ds.h5", {}),
    "bin-meta": ("bin-meta", "ds", {}),
}
#: formats whose files record the vocab size and EOS id
RECORDS_VOCAB = {"native", "flat"}
DOCS = [[5, 6, 0], [7, 0], [], [8, 9, 10, 11, 0], [12], []]


def write(
    root: Path, label: str, docs, *, vocab_size: int = 100, eos_id: int | None = 0, overlaps=None, **extra: Any
) -> Path:
    fmt, rel, options = WRITERS[label]
    path = root / rel
    with open_writer(path, format=fmt, dtype="uint16", vocab_size=vocab_size, eos_id=eos_id, **options, **extra) as w:
        for i, doc in enumerate(docs):
            w.add(np.asarray(doc, dtype=np.int64), overlap_prefix=0 if overlaps is None else overlaps[i])
    return path


def entries(ds) -> list[list[int]]:
    return [ds[i].tolist() for i in range(len(ds))]


# -- any documents through every writer and reader ------------------------------------------------

VOCAB = 1 << 16  # uint16 holds every id up to vocab - 1


@pytest.mark.parametrize("label", WRITERS)
@fuzz(30)
@given(data=st.data())
def test_any_documents_round_trip_through_every_writer_and_reader(tmp_path_factory, label: str, data) -> None:
    fmt = WRITERS[label][0]
    ids = st.integers(0, VOCAB - 1) | st.sampled_from([0, VOCAB - 1])
    docs = data.draw(st.lists(st.lists(ids, max_size=9), max_size=9), label="docs")
    overlaps = None
    if fmt == "native":
        overlaps = [data.draw(st.integers(0, max(0, len(d) - 1)), label="overlap") for d in docs]
    root = tmp_path_factory.mktemp(label)
    if fmt == "flat" and not any(docs):
        with pytest.raises(ConfigError, match="empty dataset"):
            write(root, label, docs, vocab_size=VOCAB, eos_id=None)
        return
    path = write(root, label, docs, vocab_size=VOCAB, eos_id=None, overlaps=overlaps)
    options: dict[str, Any] = {} if fmt in RECORDS_VOCAB else {"vocab_size": VOCAB}
    ds = open_dataset(path, validate="deep", **options)
    assert ds.format == fmt
    assert entries(ds) == docs
    assert ds.doc_lengths.tolist() == [len(d) for d in docs]
    assert ds.num_tokens == sum(map(len, docs))
    assert ds.tokens(0, ds.num_tokens).tolist() == [t for d in docs for t in d]
    assert ds.overlap_prefix.tolist() == (overlaps if overlaps is not None else [0] * len(docs))
    if fmt in RECORDS_VOCAB:
        assert ds.vocab_size == VOCAB


# -- detection ----------------------------------------------------------------------------------


@pytest.mark.parametrize("label", WRITERS)
def test_detect_format_recognises_every_written_layout(tmp_path: Path, label: str) -> None:
    fmt = WRITERS[label][0]
    path = write(tmp_path, label, DOCS)
    assert detect_format(path) == fmt
    others = [name for name, spec in available_formats().items() if name != fmt and spec.detect(path)]
    assert others == []  # e.g. a bin-meta store is not also flat, a megatron directory not also native
    if fmt == "megatron":
        for form in (path.with_name("train.idx"), path.with_name("train.bin"), path.parent):
            assert detect_format(form) == "megatron"
    if fmt in ("packed", "h5"):
        assert detect_format(path.parent) == fmt  # a directory of such files


def test_detect_format_on_foreign_layouts(tmp_path: Path) -> None:
    npy = tmp_path / "kf"
    npy.mkdir()
    np.save(npy / "tokens_000.npy", np.arange(5, dtype=np.uint32))
    assert detect_format(npy) == detect_format(npy / "tokens_000.npy") == "flat"
    tatm = tmp_path / "tatm"
    tatm.mkdir()
    np.arange(4, dtype=np.uint16).tofile(tatm / "tok_0.bin")
    (tatm / "metadata.yaml").write_text("tokenized_info:\n  file_prefix: tok_\n  dtype: uint16\n")
    assert detect_format(tatm) == "flat"
    astrai = tmp_path / "astrai"
    (astrai / "part0").mkdir(parents=True)
    np.arange(3, dtype=np.int64).tofile(astrai / "part0" / "sequence.bin")
    (astrai / "part0" / "meta.json").write_text('{"sequence": {"shape": [3], "dtype": "int64"}}')
    (astrai / "meta.json").write_text('{"sequence": {"shape": [0], "dtype": "int64"}}')
    (astrai / "sequence.bin").write_bytes(b"")
    assert detect_format(astrai) == "bin-meta"
    assert not available_formats()["flat"].detect(astrai)
    assert entries(open_dataset(astrai)) == [[], [0, 1, 2]]


def test_detect_format_ambiguous_unknown_missing_and_unfinished(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    write(mixed, "packed", DOCS)
    np.save(mixed / "b.npy", np.arange(3, dtype=np.uint16))
    with pytest.raises(FormatError, match="ambiguous: it could be flat or packed") as info:
        detect_format(mixed)
    assert info.value.path == str(mixed)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "README.txt").write_text("not tokens")
    with pytest.raises(FormatError, match="tried bin-meta, flat, h5, megatron, native, packed"):
        detect_format(unknown)
    with pytest.raises(FormatError, match="tried"):
        detect_format(unknown / "README.txt")
    with pytest.raises(MissingFileError):
        detect_format(tmp_path / "absent")
    writer = open_writer(tmp_path / "busy", format="flat", dtype="uint16", shard_size_tokens=1)
    writer.add([1, 2])  # one shard published, no manifest yet
    with pytest.raises(FormatError, match="a writer did not finish"):
        open_dataset(tmp_path / "busy")
    writer.abort()


# -- convert between every pair -----------------------------------------------------------------


def _convert_args(source: Path, target: Path, label: str) -> list[str]:
    fmt, _, options = WRITERS[label]
    args = [str(source), str(target), "--to", fmt, "--no-progress", "--chunk-tokens", "3"]
    if options.get("legacy"):
        args.append("--legacy")
    if "file_format" in options:
        args += ["--file-format", options["file_format"]]
    if "shard_size_tokens" in options:
        args += ["--shard-size-tokens", str(options["shard_size_tokens"])]
    return args


@pytest.mark.parametrize(("source_label", "target_label"), list(itertools.product(WRITERS, WRITERS)))
def test_convert_between_every_pair_is_lossless(tmp_path: Path, source_label: str, target_label: str) -> None:
    source = write(tmp_path / "src", source_label, DOCS)
    target = tmp_path / "dst" / WRITERS[target_label][1]
    args = _convert_args(source, target, target_label)
    if source_label == "packed-legacy" and WRITERS[target_label][0] == "megatron":
        refused = CliRunner().invoke(convert, args)  # legacy .pbin holds uint32, which Megatron has no code for
        assert refused.exit_code == 1 and "ConfigError" in refused.output and "uint32" in refused.output
        args += ["--dtype", "uint16"]
    result = CliRunner().invoke(convert, args)
    assert result.exit_code == 0, result.output
    assert f"converted {len(DOCS)} entries, {sum(map(len, DOCS))} tokens" in result.output
    ds = open_dataset(target)  # (not deep: DOCS[4] does not end with the EOS id, on purpose)
    assert ds.format == WRITERS[target_label][0]
    assert entries(ds) == DOCS
    if WRITERS[source_label][0] in RECORDS_VOCAB and WRITERS[target_label][0] in RECORDS_VOCAB:
        assert (ds.vocab_size, ds.eos_id) == (100, 0)


def test_convert_shows_a_progress_bar(tmp_path: Path) -> None:
    source = write(tmp_path / "src", "native", DOCS)
    result = CliRunner().invoke(convert, [str(source), str(tmp_path / "dst"), "--to", "flat"])
    assert result.exit_code == 0, result.output
    assert entries(open_dataset(tmp_path / "dst")) == DOCS


@pytest.mark.parametrize("label", WRITERS)
def test_convert_memory_is_bounded_by_the_batch_not_the_dataset(tmp_path: Path, label: str) -> None:
    doc_tokens, docs = 50_000, 80  # 4 M uint16 tokens, 8 MB
    with open_writer(tmp_path / "src", format="native", dtype="uint16", vocab_size=VOCAB) as writer:
        block = (np.arange(doc_tokens * 8) % 60_000).astype(np.uint16)
        for _ in range(docs // 8):
            writer.add_batch(block, [doc_tokens] * 8)
    fmt, rel, options = WRITERS[label]
    source = open_dataset(tmp_path / "src")
    tracemalloc.start()
    try:
        convert_dataset(source, tmp_path / "dst" / rel, to=fmt, chunk_tokens=1 << 12, writer_options=options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"{label}: peak {peak} bytes for a {2 * doc_tokens * docs}-byte dataset"
    assert open_dataset(tmp_path / "dst" / rel).num_tokens == doc_tokens * docs


# -- crash safety --------------------------------------------------------------------------------

CRASH_DOCS = [[(i * 7 + j) % 1000 for j in range(i % 23)] for i in range(200)]
KILLS = 12


def _write_crash_docs(root: Path, label: str) -> None:
    fmt, rel, options = WRITERS[label]
    options = {**options, "shard_size_tokens": 300} if fmt in ("native", "flat") else options
    with open_writer(root / rel, format=fmt, dtype="uint16", vocab_size=1000, **options) as writer:
        for doc in CRASH_DOCS:
            writer.add(doc)


def _fork_writer(root: Path, label: str) -> int:
    pid = os.fork()
    if pid == 0:  # the child: write, then leave without running the parent's cleanup
        code = 1
        try:
            _write_crash_docs(root, label)
            code = 0
        finally:
            os._exit(code)
    return pid


def _accepts_only_complete_data(path: Path) -> bool:
    """True if some reader accepted the path (then the data must be complete)."""
    accepted = False
    for level in ("fast", "deep"):
        try:
            ds = open_dataset(path, validate=level)
        except DataError:
            continue
        assert entries(ds) == CRASH_DOCS, f"a reader accepted partial data at {path}"
        accepted = True
    return accepted


@pytest.mark.parametrize("label", WRITERS)
def test_a_writer_killed_at_any_instant_leaves_nothing_a_reader_accepts_as_complete(tmp_path: Path, label: str) -> None:
    rel = WRITERS[label][1]
    start = time.perf_counter()
    pid = _fork_writer(tmp_path / "full", label)
    _, status = os.waitpid(pid, 0)
    duration = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0
    assert _accepts_only_complete_data(tmp_path / "full" / rel)
    rng = random.Random(label)
    killed_early, attempt = 0, 0
    # KILLS kills; if the machine got faster than the reference run and too few landed
    # while the writer ran, keep going with shorter delays (bounded) instead of failing
    while attempt < KILLS or (killed_early < KILLS // 4 and attempt < 4 * KILLS):
        root = tmp_path / f"kill{attempt}"
        root.mkdir()
        # half the kills anywhere, half near the end where files are published
        delay = rng.uniform(0, duration) if attempt % 2 else rng.uniform(0.7 * duration, 1.1 * duration)
        pid = _fork_writer(root, label)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        landed = os.WIFSIGNALED(status)
        killed_early += landed
        if not landed and attempt >= KILLS:
            duration /= 2
        _accepts_only_complete_data(root / rel)
        attempt += 1
    assert killed_early >= KILLS // 4  # kills landed while the writer was running
