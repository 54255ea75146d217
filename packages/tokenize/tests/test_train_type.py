"""tokenize --train-type sft|dpo|grpo: post-training records through the unit-planned pipeline.

The CLI's store equals write_post_training's over the same records in input order; it is the same bytes for
one process, two workers, two node processes and Ray tasks, and after a SIGKILL and a rerun (each for sft, dpo
and grpo); bad input is a named error with file and line and nothing published; settings that differ from the
output's are refused.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from tokenloom.formats import FormatError, open_records, read_manifest
from tokenloom.tokenize._commands import tokenize as tokenize_command
from tokenloom.tokenize.chat import SIDECAR_NAME, RecordPlace, write_post_training


def sft_record(i: int) -> dict:
    if i % 3 == 0:
        return {"prompt": f"what is {i}?", "completion": f"it is {i} " + "and more " * (i % 5)}
    messages = [
        {"role": "system", "content": "" if i % 2 else "You answer briefly."},
        {"role": "user", "content": f"question {i}: what does str.upper do? ünïcode ✓"},
        {"role": "assistant", "content": f"answer {i} " + "word " * (i % 7)},
    ]
    if i % 4 == 1:
        messages += [{"role": "user", "content": "and then?"}, {"role": "assistant", "content": "then done."}]
    return {"messages": messages}


def dpo_record(i: int) -> dict:
    return {"prompt": f"pick {i}", "chosen": f"good answer {i}", "rejected": "bad " * (1 + i % 4)}


def grpo_record(i: int) -> dict:
    return {
        "prompt": [{"role": "user", "content": f"solve {i}"}],
        "responses": [f"try {j} of {i}" for j in range(1 + i % 3)],
        "rewards": [float(j) - 0.5 for j in range(1 + i % 3)],
    }


MAKERS: dict[str, Callable[[int], dict]] = {"sft": sft_record, "dpo": dpo_record, "grpo": grpo_record}


def _lines(records: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def write_corpus(
    directory: Path, train_type: str, n: int = 60, *, parquet: bool = False
) -> list[tuple[dict, RecordPlace]]:
    """Records over a plain .jsonl (cut into byte-range units), a .jsonl.gz, a .jsonl.zst (and a parquet file)."""
    import zstandard

    make = MAKERS[train_type]
    records = [make(i) for i in range(n)]
    third = n // 3
    parts = {"a.jsonl": records[:third], "b.jsonl.gz": records[third : 2 * third], "c.jsonl.zst": records[2 * third :]}
    directory.mkdir(parents=True, exist_ok=True)
    placed = []
    for name, chunk in parts.items():
        data = _lines(chunk)
        if name.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        elif name.endswith(".zst"):
            data = zstandard.ZstdCompressor().compress(data)
        (directory / name).write_bytes(data)
        placed += [(r, RecordPlace(name, i + 1)) for i, r in enumerate(chunk)]
    if parquet:  # rows as objects (a messages column of structs); in row groups of 7, cut into units by --unit-bytes
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        rows = [r for r in (make(n + i) for i in range(n // 2)) if "messages" in r or train_type != "sft"]
        pq.write_table(pa.Table.from_pylist(rows), directory / "d.parquet", row_group_size=7)
        placed += [(r, RecordPlace("d.parquet", i + 1)) for i, r in enumerate(rows)]
    return placed


def run_cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(tokenize_command, [str(a) for a in args] + ["--no-progress"])
    return result.exit_code, result.output


def store_bytes(out: Path) -> dict[str, bytes]:
    names = [*sorted(p.name for p in out.iterdir() if p.suffix == ".bin"), SIDECAR_NAME]
    names.append("data.h5" if (out / "data.h5").exists() else "meta.json")
    return {name: (out / name).read_bytes() for name in names}


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_cli_store_equals_the_librarys(train_type: str, tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    placed = write_corpus(tmp_path / "in", train_type, parquet=True)
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", train_type, "--tokenizer", tok,
        "--num-workers", 1, "--unit-bytes", 700,
    )  # fmt: skip
    assert code == 0, output
    assert f"records {len(placed)}" in output and "(bin-meta)" not in output.splitlines()[1]
    plan = orjson.loads((out / ".tokenloom-plan.json").read_bytes())
    assert len(plan["units"]) > 3  # a.jsonl was cut into byte ranges
    stats = write_post_training(placed, tmp_path / "lib", train_type, tokenizer=tok)
    assert stats.records == len(placed)
    mine, theirs = store_bytes(out), store_bytes(tmp_path / "lib")
    assert {k: v for k, v in mine.items() if k != SIDECAR_NAME} == {
        k: v for k, v in theirs.items() if k != SIDECAR_NAME
    }
    sidecar = orjson.loads(mine[SIDECAR_NAME])
    assert sidecar["stats"]["records"] == len(placed) and sidecar["train_type"] == train_type
    assert sidecar["units"] == len(plan["units"])
    store = open_records(out)
    assert len(store) == len(placed)
    # sealed by the manifest native datasets carry (block hashes: a bucket reader verifies every block)
    sealed, library = read_manifest(out), read_manifest(tmp_path / "lib")
    assert [f for f in sealed.files if f.name != SIDECAR_NAME] == [f for f in library.files if f.name != SIDECAR_NAME]
    assert sealed.num_documents == len(placed) and all(f.blocks for f in sealed.files if f.role == "data")
    # nothing of the units is left beside the store
    assert not [p.name for p in out.iterdir() if p.name.startswith(("unit_", ".tokenloom-unit-"))]


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_workers_and_nodes_write_the_same_bytes(train_type: str, tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("header_bos")
    write_corpus(tmp_path / "in", train_type, 90)
    common = ["--input-dir", tmp_path / "in", "--train-type", train_type, "--tokenizer", tok, "--unit-bytes", 900]
    common += ["--seq-len", 60, "--truncate", "keep-start" if train_type == "sft" else "skip"]
    code, output = run_cli(*common, "--output-dir", tmp_path / "one", "--num-workers", 0)
    assert code == 0, output
    code, output = run_cli(*common, "--output-dir", tmp_path / "two", "--num-workers", 2)
    assert code == 0, output
    cmd = [
        sys.executable,
        "-m",
        "tokenloom.formats",
        "tokenize",
        *map(str, common),
        "--output-dir",
        str(tmp_path / "nodes"),
    ]
    nodes = [
        subprocess.Popen([*cmd, "--num-nodes", "2", "--node-rank", str(r), "--num-workers", "1", "--no-progress"])
        for r in (0, 1)
    ]
    assert [n.wait(timeout=300) for n in nodes] == [0, 0]
    one = store_bytes(tmp_path / "one")
    assert store_bytes(tmp_path / "two") == one
    assert store_bytes(tmp_path / "nodes") == one
    stats = orjson.loads(one[SIDECAR_NAME])["stats"]
    assert stats["records"] == 90 and len(open_records(tmp_path / "nodes")) == 90
    if train_type == "sft":
        assert stats["truncated"] > 0  # counted in post_training.json
    # the same command again: already complete, nothing rewritten
    code, output = run_cli(*common, "--output-dir", tmp_path / "one", "--num-workers", 0)
    assert code == 0 and "already complete" in output
    assert store_bytes(tmp_path / "one") == one


def test_a_node_with_another_num_nodes_is_refused_and_no_record_store_left_behind(
    tmp_path: Path, chat_tokenizer_dir
) -> None:
    """The record path keeps the node-count rule of text runs: a node of another --num-nodes is a ConfigError."""
    tok = chat_tokenizer_dir("chatml")
    write_corpus(tmp_path / "in", "sft", 30)
    out = tmp_path / "out"
    common = ["--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok]
    common += ["--unit-bytes", 900, "--num-workers", 0]
    code, output = run_cli(*common, "--num-nodes", 2, "--node-rank", 0)
    assert code == 0, output
    # the first node published nothing: it says what it committed, not "wrote OUT (records record store" (review)
    assert "committed" in output and "still to be committed by other nodes" in output and "wrote" not in output
    code, output = run_cli(*common, "--num-nodes", 3, "--node-rank", 1)
    assert code == 1 and "ConfigError: this node was started with --num-nodes 3" in output, output
    assert not (out / "meta.json").exists()
    code, output = run_cli(*common, "--num-nodes", 2, "--node-rank", 1)  # the right count: the last node publishes
    assert code == 0, output
    assert (out / "meta.json").is_file() and not list(out.glob(".tokenloom-node*"))


def test_skips_and_truncations_are_counted(tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    good = [sft_record(i) for i in range(6)]
    lines = _lines(good[:3]) + b"{not json\n" + _lines([{"messages": "hi"}]) + _lines(good[3:])
    lines += _lines([{"messages": [{"role": "user", "content": "no answer"}]}])
    lines += _lines([{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x " * 400}]}])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.jsonl").write_bytes(lines)
    (tmp_path / "in" / "d.jsonl.gz").write_bytes(gzip.compress(_lines(good[:2]), mtime=0)[:-12])  # cut short
    (tmp_path / "in" / "e.jsonl").write_bytes(b'{"messages": []}\n')  # a unit of no good record
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok,
        "--on-error", "skip", "--seq-len", 200, "--num-workers", 0,
    )  # fmt: skip
    assert code == 0, output
    stats = orjson.loads((out / SIDECAR_NAME).read_bytes())["stats"]
    assert stats["skipped_too_long"] == 1
    assert stats["errors"] == {"ConversationError": 2, "MaskError": 1, "malformed_json": 1, "truncated_gzip": 1}
    assert stats["skipped_errors"] == 5
    assert stats["records"] == 6 + 1  # the lines of d.jsonl.gz before the cut are kept
    assert "skipped too long 1" in output and "malformed_json 1" in output
    assert len(open_records(out)) == 7


@pytest.mark.parametrize(
    ("train_type", "line", "name", "words"),
    [
        ("sft", b'{"messages": "hi"}', "ConversationError", "messages is str"),
        ("sft", b'{"messages": [{"role": "robot", "content": "x"}]}', "ConversationError", "role 'robot'"),
        ("sft", b"{broken", "RecordError", "not valid JSON"),
        ("dpo", b'{"prompt": "p", "chosen": "c"}', "ConversationError", "has no 'rejected'"),
        ("grpo", b'{"prompt": "p", "responses": ["a", "b"], "rewards": [1.0]}', "ConversationError", "1 rewards for 2"),
        ("grpo", b'{"prompt": "p", "responses": ["a"], "rewards": ["high"]}', "ConversationError", "a finite number"),
    ],
)
def test_bad_input_is_a_named_error_and_nothing_is_published(
    train_type: str, line: bytes, name: str, words: str, tmp_path: Path, chat_tokenizer_dir
) -> None:
    tok = chat_tokenizer_dir("chatml")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.jsonl").write_bytes(_lines([MAKERS[train_type](1), MAKERS[train_type](2)]) + line + b"\n")
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", train_type, "--tokenizer", tok,
        "--num-workers", 0,
    )  # fmt: skip
    assert code == 1
    assert output.count("\n") == 1 and name in output and words in output
    assert "c.jsonl" in output and "record 3" in output and "Traceback" not in output
    assert not (out / "meta.json").exists() and not (out / SIDECAR_NAME).exists()


def test_a_bad_record_deep_in_a_cut_file_names_its_line_in_the_file(tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    (tmp_path / "in").mkdir()
    lines = _lines([sft_record(i) for i in range(40)]) + b'{"messages": 7}\n' + _lines([sft_record(1)])
    (tmp_path / "in" / "c.jsonl").write_bytes(lines)
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok,
        "--num-workers", 0, "--unit-bytes", 1000,
    )  # fmt: skip
    assert code == 1 and "ConversationError" in output and "record 41" in output, output
    assert (tmp_path / "in" / "c.jsonl").stat().st_size > 3 * 1000  # the bad line is not in the first unit
    assert not any(out.iterdir())  # a single process's data error publishes nothing and leaves nothing


def test_a_damaged_parquet_file_is_a_format_error(tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    write_corpus(tmp_path / "in", "dpo", 9, parquet=True)
    damaged = tmp_path / "in" / "d.parquet"
    data = bytearray(damaged.read_bytes())
    data[8:48] = b"\xff" * 40  # the first pages overwritten: the footer (and so discovery) is intact
    damaged.write_bytes(bytes(data))
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "dpo", "--tokenizer", tok,
        "--num-workers", 0, "--on-error", "skip",
    )  # fmt: skip
    assert code == 1 and output.count("\n") == 1, output
    assert "FormatError" in output and "d.parquet" in output and "Traceback" not in output
    assert not (out / "meta.json").exists()


def test_no_chat_template_fails_before_writing(tmp_path: Path) -> None:
    from tokenloom.tokenize import default_tokenizer_path

    write_corpus(tmp_path / "in", "sft", 6)
    out = tmp_path / "out"
    code, output = run_cli(
        "--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer",
        default_tokenizer_path(),
    )  # fmt: skip
    assert code == 1 and "ConfigError" in output and "chat template" in output
    assert not out.exists() or not any(out.iterdir())


def test_other_settings_into_the_same_output_are_refused(tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    write_corpus(tmp_path / "in", "dpo", 12)
    out = tmp_path / "out"
    base = ["--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "dpo", "--tokenizer", tok]
    code, output = run_cli(*base, "--num-workers", 0)
    assert code == 0, output
    before = store_bytes(out)
    code, output = run_cli(*base, "--num-workers", 0, "--seq-len", 20)
    assert code == 1 and "ResumeMismatchError" in output and "max_length None -> 20" in output
    assert store_bytes(out) == before
    code, output = run_cli(*base, "--num-workers", 0, "--seq-len", 20, "--overwrite")
    assert code == 0, output
    assert orjson.loads((out / SIDECAR_NAME).read_bytes())["max_length"] == 20


@pytest.mark.parametrize("store_format", ["bin-meta", "h5"])
def test_a_publish_killed_after_the_merge_is_finished_by_a_rerun(
    store_format: str, tmp_path: Path, chat_tokenizer_dir
) -> None:
    """The state a kill leaves after the merge and the removal of the unit stores, before meta.json (data.h5)."""
    from tokenloom.formats.io import WRITING_MARKER

    if store_format == "h5":
        pytest.importorskip("h5py")  # the formats[h5] extra (the tokenize env has no h5py)

    tok = chat_tokenizer_dir("chatml")
    write_corpus(tmp_path / "in", "sft", 30)
    out = tmp_path / "out"
    args = ["--input-dir", tmp_path / "in", "--output-dir", out, "--train-type", "sft", "--tokenizer", tok]
    args += ["--num-workers", 0, "--unit-bytes", 900, "--format", store_format]
    code, output = run_cli(*args)
    assert code == 0, output
    published = store_bytes(out)
    if store_format == "h5":
        (out / "data.h5").rename(out / ".tokenloom-records-data.h5.merged")
    else:
        (out / "meta.json").rename(out / ".tokenloom-records-meta.json")
    (out / WRITING_MARKER).touch()
    with pytest.raises(FormatError, match="tokenloom-writing"):
        open_records(out)
    code, output = run_cli(*args)
    assert code == 0, output
    assert store_bytes(out) == published and not (out / WRITING_MARKER).exists()
    assert not [p for p in out.iterdir() if p.name.startswith(("unit_", ".tokenloom-unit-"))]


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_sigkill_mid_run_then_rerun_gives_the_same_bytes(train_type: str, tmp_path: Path, chat_tokenizer_dir) -> None:
    tok = chat_tokenizer_dir("chatml")
    make = MAKERS[train_type]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.jsonl").write_bytes(_lines([make(i) for i in range(900)]))
    args = ["--input-dir", tmp_path / "in", "--train-type", train_type, "--tokenizer", tok, "--unit-bytes", 8000]
    args = [*map(str, args), "--num-workers", "1", "--no-progress"]
    code, output = run_cli(*args, "--output-dir", tmp_path / "clean")
    assert code == 0, output
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokenloom.formats", "tokenize", *args, "--output-dir", str(out)]
    victim = subprocess.Popen(cmd, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / ".tokenloom-unit-000003.done").exists():
        assert victim.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert not (out / "meta.json").exists()
    with pytest.raises(FormatError, match="tokenloom-writing"):  # the committed units do not open as a store
        open_records(out)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert store_bytes(out) == store_bytes(tmp_path / "clean")
    assert len(open_records(out)) == 900
    key = {"sft": "sequence", "dpo": "chosen", "grpo": "prompts"}[train_type]
    mine, clean = open_records(out).record(7)[key], open_records(tmp_path / "clean").record(7)[key]
    assert isinstance(mine, np.ndarray) and isinstance(clean, np.ndarray)
    assert np.array_equal(mine, clean)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="a local Ray head")
def test_ray_tasks_write_the_same_record_store(tmp_path: Path, chat_tokenizer_dir, request) -> None:
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # read by ray at import: its workers use this Python
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    pytest.importorskip("ray")
    ray_head = request.getfixturevalue("ray_head")  # a real local head (conftest), started for this module
    tok = chat_tokenizer_dir("chatml")
    for train_type in ("sft", "dpo", "grpo"):  # one Ray head for the three
        root = tmp_path / train_type
        placed = write_corpus(root / "in", train_type, 45, parquet=True)
        common = ["--input-dir", root / "in", "--train-type", train_type, "--tokenizer", tok, "--unit-bytes", 600]
        code, output = run_cli(*common, "--output-dir", root / "local", "--num-workers", 0)
        assert code == 0, output
        code, output = run_cli(*common, "--output-dir", root / "ray", "--executor", "ray", "--ray-address", ray_head)
        assert code == 0, output
        assert f"records {len(placed)}" in output
        assert store_bytes(root / "ray") == store_bytes(root / "local"), train_type


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_format_h5_holds_the_records_of_bin_meta(train_type: str, tmp_path: Path, chat_tokenizer_dir) -> None:
    """--format h5: OUT/data.h5 in AstrAI's H5 layout, the same records (values and dtypes) as --format bin-meta."""
    pytest.importorskip("h5py")
    tok = chat_tokenizer_dir("chatml")
    placed = write_corpus(tmp_path / "in", train_type, 30)
    common = ["--input-dir", tmp_path / "in", "--train-type", train_type, "--tokenizer", tok, "--unit-bytes", 700]
    code, output = run_cli(*common, "--output-dir", tmp_path / "bin", "--num-workers", 0)
    assert code == 0, output
    code, output = run_cli(*common, "--output-dir", tmp_path / "h5", "--num-workers", 2, "--format", "h5")
    assert code == 0 and "record store, h5" in output, output
    listing = [".tokenloom-plan.json", "data.h5", "manifest.json", SIDECAR_NAME]  # its manifest: as bin-meta's
    assert sorted(p.name for p in (tmp_path / "h5").iterdir()) == listing
    ours, theirs = open_records(tmp_path / "h5"), open_records(tmp_path / "bin")
    assert len(ours) == len(theirs) == len(placed) and ours.keys == theirs.keys
    for i in range(len(ours)):
        mine: dict[str, Any] = ours.record(i)
        base: dict[str, Any] = theirs.record(i)
        for key, value in base.items():
            got = mine[key]
            pairs: Iterable[tuple[object, object]]
            if isinstance(value, list):
                assert isinstance(got, list), (i, key)
                pairs = zip(got, value, strict=True)
            else:
                pairs = [(got, value)]
            for a, b in pairs:
                assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (i, key)
                assert a.dtype == b.dtype and np.array_equal(a, b), (i, key)
    sidecar = orjson.loads((tmp_path / "h5" / SIDECAR_NAME).read_bytes())
    assert sidecar["stats"] == orjson.loads((tmp_path / "bin" / SIDECAR_NAME).read_bytes())["stats"]
    code, output = run_cli(*common, "--output-dir", tmp_path / "h5", "--num-workers", 2, "--format", "h5")
    assert code == 0 and "already complete" in output, output
    code, output = run_cli(*common, "--output-dir", tmp_path / "h5-one", "--num-workers", 0, "--format", "h5")
    assert code == 0, output
    assert store_bytes(tmp_path / "h5-one") == store_bytes(tmp_path / "h5")  # the same bytes for any process count
    code, output = run_cli(*common, "--output-dir", tmp_path / "h5", "--num-workers", 2)  # bin-meta into it
    assert code != 0 and "format" in output, output


# --input-dir in a bucket (a real S3 server, and one that fails requests)
def _upload(seaweed, local: Path) -> str:
    key = f"chat-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(local, key)
    return f"s3://{seaweed.bucket}/{key}"


def _env(monkeypatch, seaweed, endpoint: str, cache: Path) -> None:
    env = {**seaweed.env, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOKENLOOM_CACHE_DIR", str(cache))


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_inputs_in_a_bucket_give_the_bytes_of_a_local_run(
    train_type: str, seaweed, tmp_path: Path, chat_tokenizer_dir, monkeypatch
) -> None:
    tok = chat_tokenizer_dir("chatml")
    write_corpus(tmp_path / "in", train_type, 45)
    url = _upload(seaweed, tmp_path / "in")
    _env(monkeypatch, seaweed, seaweed.endpoint, tmp_path / "cache")
    common = ["--train-type", train_type, "--tokenizer", tok, "--unit-bytes", 700, "--num-workers", 0]
    code, output = run_cli("--input-dir", tmp_path / "in", "--output-dir", tmp_path / "local", *common)
    assert code == 0, output
    code, output = run_cli("--input-dir", url, "--output-dir", tmp_path / "remote", *common)
    assert code == 0, output
    assert store_bytes(tmp_path / "remote") == store_bytes(tmp_path / "local")


def test_inputs_through_a_failing_server_give_the_same_bytes(
    seaweed, fault_proxy, tmp_path: Path, chat_tokenizer_dir, monkeypatch
) -> None:
    tok = chat_tokenizer_dir("chatml")
    write_corpus(tmp_path / "in", "sft", 45)
    url = _upload(seaweed, tmp_path / "in")
    common = ["--train-type", "sft", "--tokenizer", tok, "--unit-bytes", 700, "--num-workers", 0]
    code, output = run_cli("--input-dir", tmp_path / "in", "--output-dir", tmp_path / "local", *common)
    assert code == 0, output
    _env(monkeypatch, seaweed, fault_proxy.url, tmp_path / "cache")
    fault_proxy.fault_paths = ".jsonl"  # the input objects' GETs (a flipped listing is not detectable)
    fault_proxy.faults = ["503", "reset", "truncate", "503"]  # one per GET, then clean answers
    code, output = run_cli("--input-dir", url, "--output-dir", tmp_path / "remote", *common)
    assert code == 0, output
    assert sum(fault_proxy.injected.values()) == 4  # the faults were met, not skipped
    assert store_bytes(tmp_path / "remote") == store_bytes(tmp_path / "local")


def test_a_text_run_never_imports_the_post_training_modules(tmp_path: Path) -> None:
    """Without --train-type, tokenize.chat is not imported (issue 38); the transform seam is, for TextTransform."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello world"}\n')
    script = (
        "import sys; from pathlib import Path\n"
        "from tokenloom.tokenize import TokenizeConfig, tokenize\n"
        f"tokenize(TokenizeConfig(input_dir=Path({str(tmp_path / 'in')!r}), "
        f"output_dir=Path({str(tmp_path / 'out')!r}), num_workers=0))\n"
        "names = ('tokenloom.tokenize.chat',)\n"
        "print(sorted(m for m in sys.modules if m.startswith(names)))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
