"""End-to-end runs: determinism, shard cutting, resume, settings checks, EOS and dtype."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from tokenize_helpers import make_texts, tree_digest
from tokenizers import Tokenizer, models, pre_tokenizers

from tokenloom.formats import ConfigError, ResumeMismatchError, open_dataset, read_manifest
from tokenloom.tokenize import TokenizeConfig, tokenize


def run(tokenizer: Path | str, input_dir: Path, out: Path, **kw: Any):
    options: dict[str, Any] = {"num_workers": 0, "shard_size_tokens": 2000}
    options.update(kw)
    return tokenize(TokenizeConfig(input_dir=input_dir, output_dir=out, tokenizer=str(tokenizer), **options))  # type: ignore[arg-type]


@pytest.fixture
def corpus(jsonl_dir: Callable[..., Path]) -> Path:
    texts = make_texts(600, seed=1)
    return jsonl_dir(
        {
            "b/part-1.jsonl": [{"text": t} for t in texts[:250]],
            "a.jsonl.gz": [{"text": t} for t in texts[250:400]],
            "b/part-0.jsonl": [{"text": t} for t in texts[400:]],
        }
    )


def test_worker_counts_give_identical_bytes(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    outputs = {}
    for workers in (0, 1, 2):
        out = tmp_path / f"out{workers}"
        summary = run(tiny_tokenizer, corpus, out, num_workers=workers, seq_len=32, overlap_size=8, chunk_lines=37)
        assert summary.documents == 600 and summary.shards > 3
        outputs[workers] = tree_digest(out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert "manifest.json" in outputs[2] and ".tokenloom-writing" not in outputs[2]


def test_output_follows_input_order_and_ignores_chunking_and_file_splits(
    tmp_path: Path,
    tiny_tokenizer: Path,
    jsonl_dir: Callable[..., Path],
) -> None:
    texts = make_texts(300, seed=2)
    one = tmp_path / "one"
    (one / "all.jsonl").parent.mkdir()
    (one / "all.jsonl").write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))
    many = jsonl_dir({f"p{i:02d}.jsonl": [{"text": t} for t in texts[i * 30 : (i + 1) * 30]] for i in range(10)})
    run(tiny_tokenizer, one, tmp_path / "o1", chunk_lines=1000)
    run(tiny_tokenizer, many, tmp_path / "o2", chunk_lines=7)
    # each input file is a unit with its own shards: the documents must be the same tokens, in input order
    first, second = open_dataset(tmp_path / "o1", validate="deep"), open_dataset(tmp_path / "o2", validate="deep")
    assert len(first) == len(second) == 300
    assert all(first[i].tolist() == second[i].tolist() for i in range(300))
    ds = first
    tok = Tokenizer.from_file(str(tiny_tokenizer / "tokenizer.json"))
    for i in (0, 17, 299):
        assert ds[i].tolist() == [*tok.encode(texts[i], add_special_tokens=False).ids, 0]


def test_shards_are_cut_at_the_token_target(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    run(tiny_tokenizer, corpus, tmp_path / "out", shard_size_tokens=5000)
    ds = open_dataset(tmp_path / "out", validate="deep")
    longest = int(ds.doc_lengths.max())
    manifest = read_manifest(tmp_path / "out")
    units = [entry.name[:11] for entry in manifest.files if entry.name.endswith(".idx")]  # unit_UUUUUU
    for k in range(ds.num_shards):  # every shard but a unit's (an input file's) last reaches the target
        size = ds.shards[k].tokens.size
        last = k + 1 == ds.num_shards or units[k + 1] != units[k]
        assert (0 if last else 5000) < size < 5000 + longest
    assert ds.eos_id == 0 and ds.vocab_size == 300 and ds.dtype == np.uint16


class Interrupt(Exception):
    pass


def test_resume_after_an_interruption_mid_chunk_is_byte_identical(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path
) -> None:
    options: dict[str, Any] = {"chunk_lines": 50, "shard_size_tokens": 1500, "seq_len": 24, "overlap_size": 6}
    run(tiny_tokenizer, corpus, tmp_path / "whole", **options)
    out = tmp_path / "cut"
    for stop_after in (3, 6):
        calls: list[int] = []

        def on_progress(*_args: int, stop_after: int = stop_after, calls: list[int] = calls) -> None:
            calls.append(1)
            if len(calls) == stop_after:
                raise Interrupt

        with pytest.raises(Interrupt):
            tokenize(
                TokenizeConfig(
                    input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), num_workers=0, **options
                ),
                on_progress=on_progress,
            )
        assert not (out / "manifest.json").exists()
    assert len(list(out.glob(".tokenloom-unit-*.done"))) == 1  # the first file (3 chunks) is a committed unit
    with pytest.raises(Exception, match="writer did not finish"):
        open_dataset(out)
    summary = run(tiny_tokenizer, corpus, out, **options)
    assert summary.resumed_units == 1
    assert tree_digest(out) == tree_digest(tmp_path / "whole")


def test_kill_before_the_first_shard_then_rerun(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    run(tiny_tokenizer, corpus, tmp_path / "whole", shard_size_tokens=10**9)
    out = tmp_path / "cut"

    def stop(*_args: int) -> None:
        raise Interrupt

    config = TokenizeConfig(
        input_dir=corpus, output_dir=out, tokenizer=str(tiny_tokenizer), num_workers=0, shard_size_tokens=10**9
    )
    with pytest.raises(Interrupt):
        tokenize(config, on_progress=stop)
    assert not out.exists()  # an interrupted run that committed no unit leaves nothing (issue #11)
    out.mkdir()  # as if SIGKILLed before the plan was written: only our marker is left
    (out / ".tokenloom-writing").touch()
    run(tiny_tokenizer, corpus, out, shard_size_tokens=10**9)
    assert tree_digest(out) == tree_digest(tmp_path / "whole")


def test_rerun_of_a_complete_run_does_nothing(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    first = run(tiny_tokenizer, corpus, tmp_path / "out")
    mtime = (tmp_path / "out" / "manifest.json").stat().st_mtime_ns
    again = run(tiny_tokenizer, corpus, tmp_path / "out", num_workers=0)
    assert again.already_complete and (again.tokens, again.documents) == (first.tokens, first.documents)
    assert (tmp_path / "out" / "manifest.json").stat().st_mtime_ns == mtime


def test_other_settings_need_overwrite(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    run(tiny_tokenizer, corpus, tmp_path / "out")
    with pytest.raises(ResumeMismatchError, match="--overwrite"):
        run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=16)
    (corpus / "new.jsonl").write_bytes(b'{"text": "one more"}\n')
    with pytest.raises(ResumeMismatchError):
        run(tiny_tokenizer, corpus, tmp_path / "out")
    summary = run(tiny_tokenizer, corpus, tmp_path / "out", seq_len=16, overwrite=True)
    assert summary.documents == 601 and not summary.already_complete
    assert open_dataset(tmp_path / "out").metadata["tokenize"]["settings"]["max_length"] == 16


def test_foreign_files_in_the_output_dir_are_never_deleted(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        run(tiny_tokenizer, corpus, out)
    assert (out / "notes.txt").exists()
    with pytest.raises(ConfigError, match=r"not a tokenloom dataset: it holds notes\.txt"):
        run(tiny_tokenizer, corpus, out, overwrite=True)  # --overwrite replaces only tokenloom output
    assert (out / "notes.txt").read_text() == "mine"


def test_changed_tokenizer_is_a_mismatch(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    import shutil

    copy = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, copy)
    run(copy, corpus, tmp_path / "out")
    config = orjson.loads((copy / "tokenizer_config.json").read_bytes())
    config["model_max_length"] = 7
    (copy / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    with pytest.raises(ResumeMismatchError):
        run(copy, corpus, tmp_path / "out")


def _word_level(path: Path, vocab_size: int, *, eos: str | None) -> Path:
    vocab = {"<eos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"}
    if eos:
        config["eos_token"] = eos
    (path / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    return path


def test_vocab_over_65536_is_stored_as_uint32(tmp_path: Path, jsonl_dir: Callable[..., Path]) -> None:
    tokenizer = _word_level(tmp_path / "wl", 70_000, eos="<eos>")
    corpus = jsonl_dir({"x.jsonl": [{"text": "w5 w65535 w65536 w69999"}, {"text": ""}]})
    run(tokenizer, corpus, tmp_path / "out")
    ds = open_dataset(tmp_path / "out", validate="deep")
    assert ds.dtype == np.uint32
    assert [x.tolist() for x in (ds[0], ds[1])] == [[5, 65535, 65536, 69999, 0], [0]]


def test_missing_eos_is_an_error_unless_eos_id_is_given(tmp_path: Path, jsonl_dir: Callable[..., Path]) -> None:
    tokenizer = _word_level(tmp_path / "wl", 100, eos=None)
    corpus = jsonl_dir({"x.jsonl": [{"text": "w5 w6"}]})
    with pytest.raises(ConfigError, match="no EOS token.*--eos-id"):
        run(tokenizer, corpus, tmp_path / "out")
    with pytest.raises(ConfigError, match="outside the tokenizer's vocabulary"):
        run(tokenizer, corpus, tmp_path / "out", eos_id=100, overwrite=True)
    run(tokenizer, corpus, tmp_path / "out", eos_id=1, overwrite=True)
    ds = open_dataset(tmp_path / "out")
    assert ds[0].tolist() == [5, 6, 1] and ds.eos_id == 1


def test_default_tokenizer_is_the_shipped_bpe(tmp_path: Path, jsonl_dir: Callable[..., Path]) -> None:
    corpus = jsonl_dir({"x.jsonl": [{"text": "Return the sum of a and b."}]})
    summary = tokenize(TokenizeConfig(input_dir=corpus, output_dir=tmp_path / "out", num_workers=0))
    assert summary.vocab_size == 16384 and summary.dtype == "uint16" and summary.tokens > 2


def test_workers_get_the_tokenizer_through_a_file_so_spawn_never_waits_on_a_worker(tiny_tokenizer: Path) -> None:
    """The initializer's arguments stay far below a pipe's 64 KB whatever the tokenizer's size.

    spawn writes them to a pipe that a worker drains only after its imports; a 1 MB backend
    there stalled the parent about half a second per worker. The file is private to the run
    and gone when the pool is.
    """
    import pickle

    from tokenloom.tokenize._executor import executor_for
    from tokenloom.tokenize._worker import SerializedHandoff

    serialized = (tiny_tokenizer / "tokenizer.json").read_text() + " " * 2_000_000  # JSON allows trailing blanks
    with executor_for(1, str(tiny_tokenizer), serialized) as executor:
        initargs = executor._initargs  # type: ignore[attr-defined]
        assert len(pickle.dumps(initargs)) < 4096
        handoff = next(arg for arg in initargs if isinstance(arg, SerializedHandoff))
        assert Path(handoff.path).read_text() == serialized
        assert executor.submit(len, "ok").result(timeout=120) == 2  # the worker read it and runs
    assert not Path(handoff.path).exists()
    assert not Path(handoff.path).parent.exists()


def test_a_tokenizer_handoff_that_changed_is_refused(tmp_path: Path) -> None:
    from tokenloom.tokenize._worker import SerializedHandoff

    handoff = SerializedHandoff.write(tmp_path / "tokenizer.json", '{"model": 1}')
    assert handoff.read() == '{"model": 1}'
    (tmp_path / "tokenizer.json").write_text('{"model": 2}')
    with pytest.raises(RuntimeError, match="changed after the parent wrote it"):
        handoff.read()


def test_the_output_opens_by_index_blocks(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    """Every .idx in tokenize's manifest carries block hashes, so a fresh open reads no whole index (each block is
    checked when first touched; without hashes the open falls back to the full index scan); a damaged index byte
    is still a ChecksumError naming the file, never wrong documents."""
    from tokenloom.formats.errors import ChecksumError

    run(tiny_tokenizer, corpus, tmp_path / "out", shard_size_tokens=5000)
    manifest = read_manifest(tmp_path / "out")
    indexes = [entry for entry in manifest.files if entry.name.endswith(".idx")]
    assert len(indexes) > 1 and all(e.blocks is not None and e.blocks.covers(e.bytes) for e in indexes)
    first = tmp_path / "out" / indexes[0].name
    raw = bytearray(first.read_bytes())
    raw[-3] ^= 0x40  # one of the first shard's offsets
    first.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=indexes[0].name):
        ds = open_dataset(tmp_path / "out")
        [ds[i] for i in range(len(ds))]
    with pytest.raises(ChecksumError, match=indexes[0].name):
        open_dataset(tmp_path / "out", validate="deep")
