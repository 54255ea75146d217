"""Bad input ends in a named DataError that says what, where and what to do; nothing is guessed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tokenloom.formats import (
    ConfigError,
    FormatError,
    MissingFileError,
    MissingKeyError,
    RecordError,
    ResumeMismatchError,
)
from tokenloom.hf_streaming import StreamingHuggingFaceDataset, merge_rank_states


def make(files, tokenizer_dir, **kwargs):
    options = {"seq_len": 8, "data_files": files, "shuffle_buffer_size": 4}
    options.update(kwargs)
    return StreamingHuggingFaceDataset("json", "train", "text", tokenizer_path=str(tokenizer_dir), **options)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return [str(path)]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (json.dumps({"body": "x"}), "no 'text' field"),
        (json.dumps({"text": 3}), "is int, expected a string"),
        (json.dumps(["text"]), "JSON list"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_record_names_file_and_offset(tmp_path, tokenizer_dir, line, problem):
    good = json.dumps({"text": "alpha beta"})
    files = write(tmp_path / "bad.jsonl", [good, line, good])
    with pytest.raises(RecordError, match=problem) as caught:
        list(make(files, tokenizer_dir))
    assert caught.value.path == files[0]
    assert caught.value.offset == len(good) + 1
    assert "on_error='skip'" in str(caught.value)


def test_bad_records_skipped_and_counted_on_request(tmp_path, tokenizer_dir, caplog):
    good = json.dumps({"text": "alpha beta gamma delta"})
    files = write(tmp_path / "bad.jsonl", [good, json.dumps({"text": None}), good, "{", good])
    ds = make(files, tokenizer_dir, on_error="skip", with_provenance=True)
    samples = list(ds)
    assert ds.state_dict()["skipped"] == 2
    assert "skipped 2 bad records" in caplog.text
    assert len({d for s in samples for d in s["doc_index"].tolist() if d >= 0}) == 3


def test_missing_parquet_column(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), path)
    with pytest.raises(MissingKeyError, match="column 'text' is absent"):
        list(make([str(path)], tokenizer_dir))


def test_json_array_file_is_refused_with_a_hint(tmp_path, tokenizer_dir):
    path = tmp_path / "array.json"
    path.write_text(json.dumps([{"text": "a"}, {"text": "b"}]))
    with pytest.raises(FormatError, match="JSON array"):
        list(make([str(path)], tokenizer_dir))


def test_empty_dataset_and_missing_files(tmp_path, tokenizer_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        make([str(empty)], tokenizer_dir)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n  \n")
    with pytest.raises(ConfigError, match="found no record"):
        list(make([str(blank)], tokenizer_dir))
    with pytest.raises(MissingFileError, match="not found"):
        make([str(tmp_path / "absent.jsonl")], tokenizer_dir)
    with pytest.raises(MissingFileError, match="matches no file"):
        make([str(tmp_path / "*.parquet")], tokenizer_dir)
    with pytest.raises(ConfigError, match="data_files lists no file"):
        make([], tokenizer_dir)


@pytest.mark.parametrize("seq_len", [0, -3, 2.5, True])
def test_seq_len_below_one(corpus, tokenizer_dir, seq_len):
    with pytest.raises(ConfigError, match="seq_len"):
        make(corpus, tokenizer_dir, seq_len=seq_len)


def test_bad_options(corpus, tokenizer_dir):
    with pytest.raises(ConfigError, match="mode"):
        make(corpus, tokenizer_dir, mode="fast")
    with pytest.raises(ConfigError, match="on_error"):
        make(corpus, tokenizer_dir, on_error="ignore")
    with pytest.raises(ConfigError, match="rank"):
        make(corpus, tokenizer_dir, rank=2, world_size=2)


def test_tokenizer_without_eos_needs_eos_id(tmp_path, corpus):
    from conftest import train_tokenizer

    directory = train_tokenizer(tmp_path / "noeos", with_eos=False)
    with pytest.raises(ConfigError, match="defines no EOS") as caught:
        make(corpus, directory)
    assert "eos_id" in str(caught.value)
    ds = make(corpus, directory, eos_id=5)
    sample = next(iter(ds))
    assert ds.eos_id == 5 and sample["input_ids"].shape == (8,)


def test_missing_tokenizer(tmp_path, corpus):
    with pytest.raises(MissingFileError, match="no tokenizer.json"):
        make(corpus, tmp_path)


def test_state_from_other_settings_lists_the_fields(corpus, tokenizer_dir):
    ds = make(corpus, tokenizer_dir)
    next(iter(ds))
    state = ds.state_dict()
    other = make(corpus, tokenizer_dir, seq_len=9, seed=1)
    with pytest.raises(ResumeMismatchError) as caught:
        other.load_state_dict(state)
    assert "seq_len: saved 8, now 9" in str(caught.value)
    assert "seed: saved 42, now 1" in str(caught.value)
    with pytest.raises(ResumeMismatchError, match="data"):
        make(corpus[:2], tokenizer_dir).load_state_dict(state)
    with pytest.raises(ResumeMismatchError, match="version"):
        make(corpus, tokenizer_dir).load_state_dict({**state, "version": 99})
    with pytest.raises(ResumeMismatchError, match="rank 0 of 1 loaded on rank 1 of 2"):
        make(corpus, tokenizer_dir, rank=1, world_size=2).load_state_dict(state)


def test_states_that_do_not_cover_the_topology(corpus, tokenizer_dir):
    states = []
    for rank in range(3):
        ds = make(corpus, tokenizer_dir, rank=rank, world_size=3)
        next(iter(ds))
        states.append(ds.state_dict())
    with pytest.raises(ResumeMismatchError, match=r"missing \(rank, worker\) \[\(1, 0\)\]"):
        merge_rank_states([states[0], states[2]])
    with pytest.raises(ResumeMismatchError, match="no StreamingHuggingFaceDataset state"):
        merge_rank_states([{"something": 1}])
    other = make(corpus, tokenizer_dir, seed=5, rank=1, world_size=3)
    next(iter(other))
    with pytest.raises(ResumeMismatchError, match="seed"):
        merge_rank_states([states[0], other.state_dict(), states[2]])
    assert merge_rank_states(states)["world_size"] == 3


def test_a_hand_edited_merged_state_must_still_cover_the_topology(corpus, tokenizer_dir):
    """load_state_dict(merged) checks what merge_rank_states checks: a merged state with a slot removed,
    duplicated, or disagreeing with the merged header was an IndexError on the missing rank and a silent
    re-partition (documents lost or read twice) on any other topology."""
    import copy

    states = []
    for rank in range(2):
        ds = make(corpus, tokenizer_dir, rank=rank, world_size=2)
        next(iter(ds))
        states.append(ds.state_dict())
    merged = merge_rank_states(states)
    missing = {**copy.deepcopy(merged), "slots": merged["slots"][:1]}
    for rank, world_size in ((1, 2), (0, 3)):
        with pytest.raises(ResumeMismatchError, match=r"missing \(rank, worker\) \[\(1, 0\)\]"):
            ds = make(corpus, tokenizer_dir, rank=rank, world_size=world_size)
            ds.load_state_dict(missing)
            next(iter(ds))
    doubled = {**copy.deepcopy(merged), "slots": [merged["slots"][0], merged["slots"][0]]}
    with pytest.raises(ResumeMismatchError, match="do not cover"):
        make(corpus, tokenizer_dir, world_size=3).load_state_dict(doubled)
    with pytest.raises(ResumeMismatchError, match="world_size 2 differs"):
        make(corpus, tokenizer_dir).load_state_dict({**copy.deepcopy(merged), "world_size": 1})
    other = copy.deepcopy(merged)
    other["slots"][1]["fingerprint"]["seed"] = 99
    with pytest.raises(ResumeMismatchError, match="seed"):
        make(corpus, tokenizer_dir, world_size=3).load_state_dict(other)
    make(corpus, tokenizer_dir, world_size=3).load_state_dict(merged)


def test_hub_name_offline_fails_fast_with_a_clear_error(tmp_path):
    code = (
        "import os\n"
        "os.environ['HF_HUB_OFFLINE']='1'; os.environ['HF_DATASETS_OFFLINE']='1'\n"
        "from tokenloom.hf_streaming import StreamingHuggingFaceDataset\n"
        "from tokenloom.formats import ConfigError\n"
        f"tok = {str(tmp_path)!r}\n"
        "import json, pathlib\n"
        "p = pathlib.Path(tok) / 'tokenizer.json'\n"
        "from tokenizers import Tokenizer, models\n"
        "t = Tokenizer(models.WordLevel({'a': 0, '<eos>': 1}, unk_token='a')); t.save(str(p))\n"
        "try:\n"
        "    StreamingHuggingFaceDataset('someone/not-here', 'train', 'text', 8, tok, eos_id=1)\n"
        "except ConfigError as exc:\n"
        "    print('ERR', exc)\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 120
    assert "ERR load_dataset('someone/not-here'" in proc.stdout, proc.stderr[-2000:]
    assert "HF_HUB_OFFLINE" in proc.stdout


def test_stream_state_command(tmp_path, corpus, tokenizer_dir):
    from click.testing import CliRunner

    from tokenloom.hf_streaming import save_rank_state
    from tokenloom.hf_streaming._commands import stream_state

    for rank in range(2):
        ds = make(corpus, tokenizer_dir, rank=rank, world_size=2)
        next(iter(ds))
        save_rank_state(tmp_path / "ckpt", rank, ds.state_dict())
    result = CliRunner().invoke(stream_state, [str(tmp_path / "ckpt")])
    assert result.exit_code == 0, result.output
    assert "topology   2 ranks x 1 workers" in result.output
    (tmp_path / "ckpt" / "hf_stream_rank00001.json").unlink()
    result = CliRunner().invoke(stream_state, [str(tmp_path / "ckpt"), "--world-size", "2"])
    assert result.exit_code == 1
    assert "rank state files missing" in result.output
    result = CliRunner().invoke(stream_state, [str(tmp_path / "ckpt")])
    assert result.exit_code == 1
    assert "do not cover the saved topology" in result.output


@pytest.mark.parametrize("eos_id", [10**7, 1.5, True, "3"])
def test_eos_id_outside_the_vocabulary_or_not_an_int_is_refused(tokenizer_dir, eos_id):
    from tokenloom.formats import ConfigError
    from tokenloom.hf_streaming import resolve_tokenizer

    with pytest.raises(ConfigError, match="eos_id"):
        resolve_tokenizer(tokenizer_dir, eos_id)
    assert resolve_tokenizer(tokenizer_dir, 5).eos_id == 5


def test_an_over_long_line_is_a_named_error_naming_file_offset_and_cap(tmp_path, tokenizer_dir):
    good = json.dumps({"text": "alpha beta"})
    long = json.dumps({"text": "gamma " * 400})
    files = write(tmp_path / "long.jsonl", [good, long, good])
    with pytest.raises(RecordError, match=f"line has {len(long) + 1} bytes, over the cap of 1000 bytes") as caught:
        list(make(files, tokenizer_dir, max_line_bytes=1000))
    assert caught.value.path == files[0]
    assert caught.value.offset == len(good) + 1
    assert "max_line_bytes" in str(caught.value)
    # a line of exactly the cap (newline not counted) is a record
    assert list(make(files, tokenizer_dir, max_line_bytes=len(long)))


def test_over_long_lines_skipped_and_counted_on_request(tmp_path, tokenizer_dir):
    good = [json.dumps({"text": f"doc{i} alpha beta gamma"}) for i in range(6)]
    long = json.dumps({"text": "delta " * 500})
    files = write(tmp_path / "long.jsonl", [good[0], long, *good[1:3], long, *good[3:]])
    ds = make(files, tokenizer_dir, max_line_bytes=500, on_error="skip", with_provenance=True, unit_bytes=64)
    samples = list(ds)
    assert ds.state_dict()["skipped"] == 2
    seen = {d for s in samples for d in s["doc_index"].tolist() if d >= 0}
    offsets = {sum(len(x) + 1 for x in [good[0], long, *good[1:3], long, *good[3:]][:i]) for i in (0, 2, 3, 5, 6, 7)}
    assert seen == offsets  # every good line once, after and between the skipped ones


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path, tokenizer_dir):
    """A 192 MiB line under the default 64 MiB cap: refused, and the process never holds the line."""
    from conftest import READ_AND_PRINT_GROWTH

    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "a b"}\n{"text": "')
        chunk = b"word " * (1 << 18)
        for _ in range(192 * (1 << 20) // len(chunk)):
            f.write(chunk)
        f.write(b'"}\n')
    code = (
        "import resource, sys\n"
        "from tokenloom.hf_streaming import StreamingHuggingFaceDataset\n"
        "from tokenloom.formats import RecordError\n"
        f"ds = StreamingHuggingFaceDataset('json', 'train', 'text', 8, {str(tokenizer_dir)!r}, "
        f"data_files=[{str(path)!r}])\n" + READ_AND_PRINT_GROWTH
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "over the cap of 67108864 bytes" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    growth = int(proc.stdout.split("GROWTH_MIB")[1])
    assert growth < 160, f"peak RSS grew by {growth} MiB reading a 192 MiB line"


def _one_state(corpus, tokenizer_dir, **kwargs):
    ds = make(corpus, tokenizer_dir, **kwargs)
    stream = iter(ds)
    for _ in range(3):
        next(stream)
    return json.loads(json.dumps(ds.state_dict()))


def _without(state, key):
    return {k: v for k, v in state.items() if k != key}


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda s: _without(s, "fingerprint"), "'fingerprint' is missing"),
        (lambda s: _without(s, "world_size"), "'world_size' is missing"),
        (lambda s: {**s, "fingerprint": {"seed": 42}}, "the fingerprint lacks"),
        (lambda s: {**s, "layout": "zz"}, "layout is 'zz'"),
        (lambda s: {**s, "layout": {"unit_bytes": "x", "split": 1, "stride": 1}}, "layout.unit_bytes is 'x'"),
        (lambda s: {**s, "layout": {"unit_bytes": 1, "split": 1, "stride": 1 << 20}}, "layout .* units, more than"),
        (
            lambda s: {**s, "base": {"start": 0, "epochs": [{"epoch": 0, "done": [[0, 10**9]], "partial": []}]}},
            "unit 999999999 .* past the data",
        ),
        (lambda s: {**s, "base": {"start": 0, "epochs": "zz"}}, "base.epochs is 'zz'"),
        (lambda s: {**s, "item": -1}, "item is -1, expected an integer >= 0"),
        (lambda s: {**s, "current": [-5, 0, -1]}, "current is -5"),
        (lambda s: {**s, "current": "row 3"}, "current is 'row 3', expected a list of 3 integers"),
        (lambda s: {**s, "item": 999}, "past the data: unit cursor 999"),
        (lambda s: {**s, "current": [10**6, 0, -1]}, "past the data: row 1000000"),
        (lambda s: {**s, "current": [s["current"][0], 0, 10**9]}, "past the data: block offset 1000000000"),
        (lambda s: {**s, "current": [s["current"][0], 10**6, s["current"][2]]}, "past the data: token offset 1000000"),
    ],
)
def test_a_damaged_state_is_a_named_error(corpus, tokenizer_dir, damage, named):
    jsonl = [p for p in corpus if p.endswith(".jsonl")]  # byte-addressed units: every check applies
    state = _one_state(jsonl, tokenizer_dir)
    ds = make(jsonl, tokenizer_dir)
    with pytest.raises(ResumeMismatchError, match=named):
        ds.load_state_dict(damage(state))
        list(ds)  # positions past the data are found where the data is known: at the first read


def test_a_compat_state_past_the_stream_is_a_named_error(corpus, tokenizer_dir):
    jsonl = [p for p in corpus if p.endswith(".jsonl")]
    state = _one_state(jsonl, tokenizer_dir, mode="compat")
    for damaged, named in (
        ({**state, "item": 2}, "past the data: unit cursor 2"),
        ({**state, "current": [10**5, 0, -1]}, "stream has .* documents, the state resumes at document 100000"),
    ):
        ds = make(jsonl, tokenizer_dir, mode="compat")
        with pytest.raises(ResumeMismatchError, match=named):
            ds.load_state_dict(damaged)
            list(ds)


def test_merge_of_garbage_names_the_field(corpus, tokenizer_dir):
    from tokenloom.hf_streaming._state import FORMAT

    with pytest.raises(ResumeMismatchError, match="'mode' is missing"):
        merge_rank_states([{"format": FORMAT, "version": 1, "kind": "slot"}])
    state = _one_state(corpus, tokenizer_dir)
    with pytest.raises(ResumeMismatchError, match="'rank' is missing"):
        merge_rank_states([_without(state, "rank")])
    with pytest.raises(ResumeMismatchError, match="'fingerprint' is missing"):
        merge_rank_states([_without(state, "fingerprint")])


def _loader_states(corpus, tokenizer_dir, steps, num_workers=0):
    from torchdata.stateful_dataloader import StatefulDataLoader

    states = []
    for rank, count in enumerate(steps):
        ds = make(corpus, tokenizer_dir, rank=rank, world_size=len(steps))
        loader = StatefulDataLoader(ds, batch_size=2, num_workers=num_workers, timeout=60 if num_workers else 0)
        iterator = iter(loader)
        for _ in range(count):
            next(iterator)
        states.append(json.loads(json.dumps(loader.state_dict())))
    return states


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_saved_at_different_steps_are_refused(tmp_path, corpus, tokenizer_dir, num_workers):
    from click.testing import CliRunner

    from tokenloom.hf_streaming import save_rank_state
    from tokenloom.hf_streaming._commands import stream_state

    same = _loader_states(corpus, tokenizer_dir, [3, 3], num_workers)
    assert merge_rank_states(same)["world_size"] == 2
    skewed = _loader_states(corpus, tokenizer_dir, [3, 5], num_workers)
    with pytest.raises(ResumeMismatchError, match="saved at different steps: rank 0 at step 3, rank 1 at step 5"):
        merge_rank_states(skewed)
    for rank, state in enumerate(skewed):
        save_rank_state(tmp_path / "ckpt", rank, state)
    result = CliRunner().invoke(stream_state, [str(tmp_path / "ckpt")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "ResumeMismatchError: the rank states were saved at" in result.output


def test_stream_state_on_a_damaged_state_is_one_line(tmp_path, corpus, tokenizer_dir):
    from click.testing import CliRunner

    from tokenloom.hf_streaming import save_rank_state
    from tokenloom.hf_streaming._commands import stream_state

    save_rank_state(tmp_path / "ckpt", 0, _without(_one_state(corpus, tokenizer_dir), "world_size"))
    result = CliRunner().invoke(stream_state, [str(tmp_path / "ckpt")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "'world_size' is missing" in result.output


@pytest.mark.parametrize("world_size", [None, 2])
def test_a_fifo_where_a_rank_state_is_expected_is_refused_not_waited_on(tmp_path, corpus, tokenizer_dir, world_size):
    import os

    from tokenloom.formats import UnsafePathError
    from tokenloom.hf_streaming import load_rank_states, save_rank_state

    save_rank_state(tmp_path / "ckpt", 0, _one_state(corpus, tokenizer_dir))
    os.mkfifo(tmp_path / "ckpt" / "hf_stream_rank00001.json")
    code = (
        "import sys\n"
        "from tokenloom.formats import UnsafePathError\n"
        "from tokenloom.hf_streaming import load_rank_states\n"
        "try:\n"
        f"    load_rank_states({str(tmp_path / 'ckpt')!r}, {world_size!r})\n"
        "except UnsafePathError as exc:\n"
        "    print('ERR', exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ERR hf_stream_rank00001.json is a FIFO, expected a regular state file" in proc.stdout, proc.stderr
    with pytest.raises(UnsafePathError, match="is a directory"):
        (tmp_path / "ckpt" / "hf_stream_rank00001.json").unlink()
        (tmp_path / "ckpt" / "hf_stream_rank00001.json").mkdir()
        load_rank_states(tmp_path / "ckpt", world_size)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_cut_compressed_file_is_a_truncated_error_with_a_hint_that_fits(tmp_path, tokenizer_dir, suffix):
    """A .jsonl.gz cut short was "cannot read: ..." with the hint of `tokenloom convert --format` (review)."""
    import gzip

    from tokenloom.formats import TruncatedError

    data = "".join(json.dumps({"text": f"document number {i} " * 5}) + "\n" for i in range(2000)).encode()
    if suffix == ".jsonl.gz":
        packed = gzip.compress(data)
    else:
        import zstandard

        packed = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(TruncatedError) as info:
        list(make([str(path)], tokenizer_dir))
    assert info.value.path == str(path)
    assert "convert" not in str(info.value) and "again" in str(info.value)
