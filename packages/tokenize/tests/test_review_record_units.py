"""Review of issue 36's one unit executor for --train-type record units: bad records under the worker pool
(skip counts, raise names file and record), and committed units damaged on disk before the last node publishes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from test_review_unit_executor import SIDECAR_NAME, _lines, run_cli, sft_record

from tokenloom.formats import open_records


def _bad_corpus(directory: Path) -> None:
    """Good lines with bad ones deep in a file cut into several units, and a second clean file."""
    directory.mkdir()
    good = _lines([sft_record(i) for i in range(60)])
    bad = good + b"{broken\n" + _lines([{"messages": "hi"}]) + good
    (directory / "a.jsonl").write_bytes(bad)
    (directory / "b.jsonl").write_bytes(good)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_skip_counts_bad_records_the_same_in_process_and_in_the_pool(
    workers: str, tmp_path: Path, chat_tokenizer_dir
) -> None:
    tok = chat_tokenizer_dir("chatml")
    _bad_corpus(tmp_path / "in")
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok,
        "--on-error", "skip", "--unit-bytes", 1500, "--num-workers", workers,
    )  # fmt: skip
    assert code == 0, output
    stats = orjson.loads((out / SIDECAR_NAME).read_bytes())["stats"]
    assert stats["errors"] == {"ConversationError": 1, "malformed_json": 1}, stats
    assert stats["skipped_errors"] == 2 and stats["records"] == 180
    assert len(open_records(out)) == 180


def test_raise_names_the_bad_record_from_a_pool_worker(tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    _bad_corpus(tmp_path / "in")
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok,
        "--unit-bytes", 1500, "--num-workers", 2,
    )  # fmt: skip
    assert code == 1, output
    assert "RecordError" in output and "not valid JSON" in output, output
    assert "a.jsonl" in output and "record 61" in output and "Traceback" not in output, output
    assert not (out / "meta.json").exists() and not (out / SIDECAR_NAME).exists()


@pytest.mark.parametrize(
    "damage",
    ["truncated_bin", "bad_marker", "missing_unit_meta"],
)
def test_a_damaged_committed_unit_is_named_at_publish_never_merged(
    damage: str, tmp_path: Path, chat_tokenizer_dir
) -> None:
    """Node 0 of 2 commits its units; one is damaged on disk; node 1 (the last) publishes: a named error."""
    tok = chat_tokenizer_dir("chatml")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(_lines([sft_record(i) for i in range(120)]))
    out = tmp_path / "out"
    common = ["--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok]
    common += ["--unit-bytes", 1500, "--num-workers", 0, "--num-nodes", 2]
    code, output = run_cli(*common, "--node-rank", 0)
    assert code == 0, output
    markers = sorted(out.glob(".tokenloom-unit-*.done"))
    assert markers
    unit = int(markers[0].name.split("-")[-1].split(".")[0])
    store = out / f"unit_{unit:06d}.records"
    if not store.is_dir():
        store = next(p for p in out.iterdir() if p.name.endswith(".records"))
    if damage == "truncated_bin":
        victim = max(store.glob("*.bin"), key=lambda p: p.stat().st_size)
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif damage == "bad_marker":
        markers[0].write_bytes(b"{not json")
    else:
        next(p for p in store.iterdir() if p.suffix == ".json").unlink()
    code, output = run_cli(*common, "--node-rank", 1)
    assert code == 1, output
    assert "Error" in output and "Traceback" not in output, output
    assert not (out / "meta.json").exists(), output
    if damage == "truncated_bin":
        assert ".records" in output, output  # the damaged unit store is named, not a merged file
