"""Caches heal: a damaged packing plan or tokenized HF cache is logged and rebuilt; unwritable -> memory."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import subprocess
import tempfile

import pytest

from tokenloom.datasets import PackedDocumentDataset

DOCS = [[1, 2, 3, 0], [4, 5, 0], [6, 0], [0], [7, 8, 9, 10, 0]]


def _rows(ds: PackedDocumentDataset) -> list[list[int]]:
    return [ds[i]["input_ids"].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-record", "bad-record"])
def test_damaged_plan_cache_is_detected_logged_and_rebuilt(native, tmp_path, caplog, damage):
    data = native(DOCS, eos_id=0)
    first = PackedDocumentDataset(data, 6, plan_cache_dir=tmp_path / "c")
    expected = _rows(first)
    target = first.plan_dir / "token_start.npy"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:-8])
    elif damage == "flip":
        raw = bytearray(target.read_bytes())
        raw[-1] ^= 0xFF
        target.write_bytes(bytes(raw))
    elif damage == "no-record":
        (first.plan_dir / "plan.json").unlink()
    else:
        (first.plan_dir / "plan.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="tokenloom.datasets"):
        again = PackedDocumentDataset(data, 6, plan_cache_dir=tmp_path / "c")
    assert any("damaged" in r.getMessage() for r in caplog.records)
    assert _rows(again) == expected
    record = json.loads((again.plan_dir / "plan.json").read_bytes())
    assert set(record["files"]) == {"token_start.npy", "length.npy", "prefix.npy", "bin_offsets.npy"}


def test_unwritable_plan_cache_falls_back_to_memory_simulated(native, tmp_path, caplog, monkeypatch):
    data = native(DOCS, eos_id=0)
    expected = _rows(PackedDocumentDataset(data, 6, plan_cache_dir=tmp_path / "good"))

    def read_only(*_args, **_kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with caplog.at_level(logging.WARNING, logger="tokenloom.datasets"):
        ds = PackedDocumentDataset(data, 6, plan_cache_dir=tmp_path / "ro")
    assert ds.plan_in_memory and not ds.plan_dir.exists()
    assert any("keeping the plan in memory" in r.getMessage() for r in caplog.records)
    assert _rows(ds) == expected
    assert _rows(pickle.loads(pickle.dumps(ds))) == expected  # a DataLoader worker gets the plan too


def test_plan_cache_on_a_read_only_mount_falls_back_to_memory(native, tmp_path, caplog):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root; the simulated test covers this case")
    point = tmp_path / "ro"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.decode().strip()}")
    try:
        data = native(DOCS, eos_id=0)
        with caplog.at_level(logging.WARNING, logger="tokenloom.datasets"):
            ds = PackedDocumentDataset(data, 6, plan_cache_dir=point / "plans")
        assert ds.plan_in_memory and len(ds) > 0
        assert any("Read-only file system" in r.getMessage() for r in caplog.records)
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)


def test_damaged_hf_cache_is_rebuilt(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from tokenloom.datasets import HuggingFaceDataset

    texts = ["the cat sat on the mat", "a dog ran", "the dog sat on the cat"]
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    model.train_from_iterator(texts, tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(tmp_path / "tok")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    kwargs = {"data_files": str(tmp_path / "d.jsonl"), "seq_len": 3, "tokenizer": str(tmp_path / "tok")}
    first = HuggingFaceDataset("json", cache_dir=tmp_path / "c", **kwargs)
    expected = [first[i]["input_ids"].tolist() for i in range(len(first))]
    shard = next(first.cache_path.glob("*.bin"))
    shard.write_bytes(shard.read_bytes()[:-2])  # truncated
    with caplog.at_level(logging.WARNING, logger="tokenloom.datasets"):
        again = HuggingFaceDataset("json", cache_dir=tmp_path / "c", **kwargs)
    assert any("damaged" in r.getMessage() for r in caplog.records)
    assert [again[i]["input_ids"].tolist() for i in range(len(again))] == expected


def _word_level_tokenizer(tmp_path, texts):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    model.train_from_iterator(texts, tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def test_byte_flip_inside_an_hf_cache_shard_is_detected_logged_and_rebuilt(tmp_path, caplog):
    """The size is unchanged: only the xxh3 recorded in the cache manifest sees the flip."""
    from tokenloom.datasets import HuggingFaceDataset

    texts = [" ".join(f"w{(i * 7 + j) % 13}" for j in range(3 + i % 5)) for i in range(60)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    kwargs = {
        "data_files": str(tmp_path / "d.jsonl"),
        "seq_len": 4,
        "tokenizer": str(_word_level_tokenizer(tmp_path, texts)),
    }
    first = HuggingFaceDataset("json", cache_dir=tmp_path / "c", **kwargs)
    expected = [first[i]["input_ids"].tolist() for i in range(len(first))]
    shard = next(first.cache_path.glob("*.bin"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # another valid id: no range check could notice
    shard.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="tokenloom.datasets"):
        trusting = HuggingFaceDataset("json", cache_dir=tmp_path / "c", verify_cache=False, **kwargs)
    assert not any("damaged" in r.getMessage() for r in caplog.records)  # the switch: sizes only
    assert [trusting[i]["input_ids"].tolist() for i in range(len(trusting))] != expected
    with caplog.at_level(logging.WARNING, logger="tokenloom.datasets"):
        again = HuggingFaceDataset("json", cache_dir=tmp_path / "c", **kwargs)
    damaged = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(damaged) == 1 and "checksum" in damaged[0] and shard.name in damaged[0]
    assert [again[i]["input_ids"].tolist() for i in range(len(again))] == expected
    assert shard.read_bytes() != bytes(raw)  # rebuilt
