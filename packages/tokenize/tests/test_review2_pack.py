"""Review 2 of `tokenloom pack` on the unit pipeline (tokenize/_pack.py).

Attacks: SIGKILL a pack subprocess mid-run and rerun (same bytes as uninterrupted, no staging left);
bad records (skip/raise) through the pool; a staging directory left by an unrelated run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tokenloom.formats import ConfigError, DataError, RecordError, open_dataset
from tokenloom.tokenize import pack

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and process groups")


def _texts(n: int) -> bytes:
    return b"".join(
        orjson.dumps({"text": f"document {i} " + "lorem ipsum dolor " * (i % 23)}) + b"\n" for i in range(n)
    )


def _staging(target: Path) -> Path:
    return target.with_name(target.name + ".native-staging")


def test_pack_killed_mid_run_then_rerun_is_byte_identical_and_leaves_no_staging(
    tmp_path: Path, tiny_tokenizer: Path
) -> None:
    source, target = _source(tmp_path)
    cmd = _killed_pack(source, target, tiny_tokenizer)
    clean = tmp_path / "clean.pbin"
    pack(source, clean, tokenizer=str(tiny_tokenizer), num_workers=2)
    assert not target.exists()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert target.read_bytes() == clean.read_bytes()
    assert not _staging(target).exists()
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".tokenloom.json"))
    assert left == ["clean.pbin", "in.jsonl", "out.pbin"]


@pytest.mark.parametrize("workers", [0, 2])
def test_pack_bad_records_skip_and_raise(tmp_path: Path, tiny_tokenizer: Path, workers: int) -> None:
    good = [orjson.dumps({"text": f"ok {i}"}) for i in range(3000)]
    lines = list(good)
    lines[1200] = b'{"text": 7}'
    lines[2500] = b"{not json"
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    target = tmp_path / "bad.pbin"
    with pytest.raises(RecordError) as info:
        pack(source, target, tokenizer=str(tiny_tokenizer), num_workers=workers)
    assert info.value.record == 1201  # the first bad record in input order, 1-based
    assert not target.exists() and not _staging(target).exists()  # a failed run leaves nothing
    summary = pack(source, target, tokenizer=str(tiny_tokenizer), num_workers=workers, on_error="skip")
    assert sum(summary.skipped.values()) == 2 and summary.documents == 2998
    assert len(open_dataset(target)) == 2998
    assert not _staging(target).exists()


def test_pack_with_a_staging_dir_from_another_input_does_not_reuse_it(tmp_path: Path, tiny_tokenizer: Path) -> None:
    """Pack A to out.pbin, keep its staging (as after a kill between convert and cleanup), then pack B to out.pbin."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(_texts(50))
    b.write_bytes(b"".join(orjson.dumps({"text": f"other {i}"}) + b"\n" for i in range(40)))
    target = tmp_path / "out.pbin"
    expected = tmp_path / "expected.pbin"
    pack(b, expected, tokenizer=str(tiny_tokenizer), num_workers=0)
    # leave a staging dir from a's run under out.pbin's staging name: kill a pack of a right after its staging began
    a.write_bytes(_texts(40_000))
    _killed_pack(a, target, tiny_tokenizer, workers=0)
    assert _staging(target).is_dir()
    try:
        pack(b, target, tokenizer=str(tiny_tokenizer), num_workers=0)
    except DataError as exc:  # a refusal is fine if it names the staging dir and what to do
        assert isinstance(exc, ConfigError) or "staging" in str(exc) or "overwrite" in str(exc), exc
        pack(b, target, tokenizer=str(tiny_tokenizer), num_workers=0, overwrite=True)
    assert target.read_bytes() == expected.read_bytes()
    assert not _staging(target).exists()


def test_pack_after_a_kill_between_convert_and_cleanup(tmp_path: Path, tiny_tokenizer: Path) -> None:
    """The .pbin is complete but a staging dir survived beside it: refused without --overwrite, replaced with it."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(_texts(200))
    target = tmp_path / "out.pbin"
    pack(source, target, tokenizer=str(tiny_tokenizer), num_workers=0)
    expected = target.read_bytes()
    os.makedirs(_staging(target))  # an (empty) leftover beside the published target
    with pytest.raises(ConfigError, match="exists"):
        pack(source, target, tokenizer=str(tiny_tokenizer), num_workers=0)
    pack(source, target, tokenizer=str(tiny_tokenizer), num_workers=0, overwrite=True)
    assert target.read_bytes() == expected and not _staging(target).exists()


def _killed_pack(source: Path, target: Path, tokenizer: Path, workers: int = 2) -> list[str]:
    """``pack SOURCE --output TARGET`` in a subprocess, SIGKILLed as soon as its staging run has written its unit
    plan (so a rerun meets that plan; encoding 40,000+ documents takes far longer than the 5 ms poll); its command."""
    cmd = [sys.executable, "-m", "tokenloom.formats", "pack", str(source), "--output", str(target)]
    cmd += ["--tokenizer", str(tokenizer), "--num-workers", str(workers), "--no-progress"]
    victim = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (_staging(target) / ".tokenloom-plan.json").is_file():
        if victim.poll() is not None:
            pytest.fail(f"pack ended before it could be killed: {victim.stderr.read().decode()[-1500:]}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    assert not target.exists(), "pack finished before the kill"
    return cmd


def _source(tmp_path: Path) -> tuple[Path, Path]:
    """in.jsonl of 60,000 documents and the out.pbin beside it."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(_texts(60_000))
    return source, tmp_path / "out.pbin"


def test_pack_rerun_after_a_kill_with_the_input_changed_is_never_stale(tmp_path: Path, tiny_tokenizer: Path) -> None:
    """Killed mid-run, the input then rewritten (new records appended): the rerun gives the new input's bytes or
    a named DataError, never the staged run of the old content."""
    source, target = _source(tmp_path)
    cmd = _killed_pack(source, target, tiny_tokenizer)
    source.write_bytes(_texts(60_000) + b"".join(orjson.dumps({"text": f"late {i}"}) + b"\n" for i in range(500)))
    expected = tmp_path / "expected.pbin"
    pack(source, expected, tokenizer=str(tiny_tokenizer), num_workers=2)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if rerun.returncode != 0:
        assert "in.jsonl" in rerun.stderr or "overwrite" in rerun.stderr, rerun.stderr[-2000:]
        assert not target.exists()
        return
    assert target.read_bytes() == expected.read_bytes()
    assert not _staging(target).exists()


def test_pack_of_arrow_and_parquet_equals_pack_of_the_jsonl(tmp_path: Path, tiny_tokenizer: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document {i} " + "lorem ipsum " * (i % 9) for i in range(700)]
    (tmp_path / "a.jsonl").write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))
    table = pa.table({"text": texts})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=64)
    with pa.ipc.new_stream(str(tmp_path / "a.arrow"), table.schema) as writer:
        writer.write_table(table, max_chunksize=33)
    outputs = {}
    for name in ("a.jsonl", "a.parquet", "a.arrow"):
        target = tmp_path / f"{name}.pbin"
        pack(tmp_path / name, target, tokenizer=str(tiny_tokenizer), num_workers=2)
        outputs[name] = target.read_bytes()
        assert not _staging(target).exists()
    assert outputs["a.parquet"] == outputs["a.jsonl"] == outputs["a.arrow"]


def test_pack_of_a_zst_named_jsonl_is_named_and_leaves_nothing(tmp_path: Path, tiny_tokenizer: Path) -> None:
    import zstandard

    source = tmp_path / "z.jsonl"
    source.write_bytes(zstandard.ZstdCompressor().compress(_texts(100)))
    target = tmp_path / "z.pbin"
    with pytest.raises(DataError, match="z.jsonl"):
        pack(source, target, tokenizer=str(tiny_tokenizer), num_workers=0)
    assert not target.exists() and not _staging(target).exists()


def test_pack_rerun_with_a_changed_input_hints_in_packs_own_options(tmp_path: Path, tiny_tokenizer: Path) -> None:
    source, target = _source(tmp_path)
    cmd = _killed_pack(source, target, tiny_tokenizer)
    source.write_bytes(_texts(60_000) + b'{"text": "late"}\n')
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 1 and "in.jsonl changed" in rerun.stderr, rerun.stderr[-2000:]
    assert "--output-dir" not in rerun.stderr and "node" not in rerun.stderr
