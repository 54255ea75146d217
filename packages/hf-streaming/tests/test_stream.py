"""The stream itself: every document exactly once per pass on any topology, packing, epochs, sources."""

from __future__ import annotations

import gzip
import json
import logging

import numpy as np
import pytest
import torch
from _hfs_oracle import compare, expected_documents
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.hf_streaming import StreamingHuggingFaceDataset, merge_rank_states


def make(files, tokenizer_dir, **kwargs):
    options = {"seq_len": 16, "data_files": files, "seed": 3, "shuffle_buffer_size": 8, "with_provenance": True}
    options.update(kwargs)
    return StreamingHuggingFaceDataset("json", "train", "text", tokenizer_path=str(tokenizer_dir), **options)


def documents_from(samples) -> dict[int, list[int]]:
    docs: dict[int, list[int]] = {}
    for sample in samples:
        tokens = [*sample["input_ids"].tolist(), int(sample["labels"][-1])]
        ids = [*sample["doc_index"].tolist(), int(sample["label_doc_index"][-1])]
        for token, doc in zip(tokens, ids, strict=True):
            if doc >= 0:
                docs.setdefault(doc, []).append(token)
    return docs


@pytest.mark.parametrize("world_size", [1, 3])
def test_one_pass_holds_every_document_once(corpus, tokenizer_dir, world_size):
    samples = []
    for rank in range(world_size):
        samples.extend(make(corpus, tokenizer_dir, rank=rank, world_size=world_size))
    assert compare(expected_documents(corpus, tokenizer_dir, eos_id=0), documents_from(samples)) == []
    assert all(s["input_ids"].shape == (16,) for s in samples)


def test_sample_layout_and_packing(corpus, tokenizer_dir):
    sample = next(iter(make(corpus, tokenizer_dir, pack_sequences=True)))
    assert set(sample) == {"input_ids", "labels", "doc_ids", "doc_index", "label_doc_index"}
    assert all(v.dtype == torch.int64 and v.shape == (16,) for v in sample.values())
    crossing = sample["doc_index"] != sample["label_doc_index"]
    assert crossing.any()
    assert (sample["labels"][crossing] == -100).all()
    assert (sample["labels"][~crossing] != -100).all()
    assert sample["doc_ids"][0] == 0
    assert (torch.diff(sample["doc_ids"]) >= 0).all()


def test_last_window_is_padded_with_ignored_labels(corpus, tokenizer_dir):
    samples = list(make(corpus, tokenizer_dir))
    last = samples[-1]
    assert (last["doc_index"] == -1).any()
    assert (last["labels"][last["label_doc_index"] == -1] == -100).all()
    dropped = list(make(corpus, tokenizer_dir, drop_remainder=True))
    assert len(dropped) == len(samples) - 1
    assert all((s["doc_index"] >= 0).all() for s in dropped)


def test_same_settings_same_stream_and_seed_changes_it(corpus, tokenizer_dir):
    first = [s["input_ids"].tolist() for s in make(corpus, tokenizer_dir)]
    again = [s["input_ids"].tolist() for s in make(corpus, tokenizer_dir)]
    other = [s["input_ids"].tolist() for s in make(corpus, tokenizer_dir, seed=4)]
    assert first == again
    assert first != other


def test_epochs_differ_with_two_workers_reproducibly(corpus, tokenizer_dir):
    def two_epochs():
        ds = make(corpus, tokenizer_dir)
        loader = StatefulDataLoader(ds, batch_size=4, num_workers=2, timeout=120)
        return [[b["doc_index"][:, 0].tolist() for b in loader] for _ in range(2)]

    epoch0, epoch1 = two_epochs()
    assert epoch0 != epoch1
    assert sorted(map(str, epoch0)) != sorted(map(str, epoch1))
    assert two_epochs() == [epoch0, epoch1]
    # a loader state saved after the pass ended resumes into the next epoch, not the same one again
    ds = make(corpus, tokenizer_dir)
    loader = StatefulDataLoader(ds, batch_size=4, num_workers=2, timeout=120)
    assert [b["doc_index"][:, 0].tolist() for b in loader] == epoch0
    finished = json.loads(json.dumps(loader.state_dict()))
    resumed = StatefulDataLoader(make(corpus, tokenizer_dir), batch_size=4, num_workers=2, timeout=120)
    resumed.load_state_dict(finished)
    assert [b["doc_index"][:, 0].tolist() for b in resumed] == epoch1
    # the same without workers (no prefetch that could end the old pass by chance)
    single = StatefulDataLoader(make(corpus, tokenizer_dir), batch_size=4)
    first = [b["doc_index"][:, 0].tolist() for b in single]
    finished = json.loads(json.dumps(single.state_dict()))
    again = StatefulDataLoader(make(corpus, tokenizer_dir), batch_size=4)
    again.load_state_dict(finished)
    second = [b["doc_index"][:, 0].tolist() for b in again]
    assert second != first
    assert second == [b["doc_index"][:, 0].tolist() for b in single]  # the in-process second pass
    # an epoch set explicitly gives the same pass as the counter did
    ds = make(corpus, tokenizer_dir)
    ds.set_epoch(1)
    loader = StatefulDataLoader(ds, batch_size=4, num_workers=2, timeout=120)
    assert [b["doc_index"][:, 0].tolist() for b in loader] == epoch1


def test_infinite_stream_moves_to_the_next_epoch(corpus, tokenizer_dir):
    finite = list(make(corpus, tokenizer_dir, drop_remainder=True))
    ds = make(corpus, tokenizer_dir, infinite=True)
    stream = iter(ds)
    taken = [next(stream) for _ in range(2 * len(finite) + 5)]
    assert ds.state_dict()["epoch"] >= 1
    assert [s["input_ids"].tolist() for s in taken[:10]] == [s["input_ids"].tolist() for s in finite[:10]]


def test_fewer_shards_than_slots_strides_with_a_warning(tmp_path, tokenizer_dir, caplog):
    from conftest import write_corpus

    files = write_corpus(tmp_path / "gz", docs_per_file=(), gz_docs=70, parquet_groups=())
    samples = []
    with caplog.at_level(logging.WARNING, logger="tokenloom.hf_streaming"):
        for rank in range(3):
            ds = make(files, tokenizer_dir, rank=rank, world_size=3)
            part = list(ds)
            assert part, f"rank {rank} idles"
            samples.extend(part)
    assert "every 3-th example" in caplog.text
    assert compare(expected_documents(files, tokenizer_dir, eos_id=0), documents_from(samples)) == []


def test_plain_jsonl_is_split_into_byte_ranges_for_more_slots(tmp_path, tokenizer_dir):
    from conftest import write_corpus

    files = write_corpus(tmp_path / "one", docs_per_file=(120,), gz_docs=0, parquet_groups=())
    per_rank = [list(make(files, tokenizer_dir, rank=r, world_size=4)) for r in range(4)]
    assert all(per_rank)
    assert (
        compare(
            expected_documents(files, tokenizer_dir, eos_id=0), documents_from([s for part in per_rank for s in part])
        )
        == []
    )


def test_rows_match_hugging_face_streaming(corpus, tokenizer_dir):
    """Our readers see the records load_dataset(..., streaming=True) sees, file by file."""
    import datasets

    from tokenloom.hf_streaming._blocks import Reading, read_blocks
    from tokenloom.hf_streaming._units import Layout, enumerate_units, file_sources

    sources = file_sources(corpus)
    units = enumerate_units(sources, Layout())
    ours: dict[str, list[str]] = {}
    for unit in units:
        for block in read_blocks(
            unit, sources[unit.source], unit.source, Reading(7, "text", "raise"), start_block=0, hint=-1
        ):
            ours.setdefault(sources[unit.source].path, []).extend(t for t in block.texts if t is not None)
    for path in corpus:
        builder = "parquet" if path.endswith(".parquet") else "json"
        hf = datasets.load_dataset(builder, data_files=[path], split="train", streaming=True)
        assert [r["text"] for r in hf] == ours[path]


def test_a_built_iterable_dataset_is_accepted(corpus, tokenizer_dir):
    import datasets

    jsonl = [p for p in corpus if p.endswith(".jsonl")]
    hf = datasets.load_dataset("json", data_files=jsonl, split="train", streaming=True)
    samples = []
    for rank in range(2):
        ds = StreamingHuggingFaceDataset(
            hf,
            "train",
            "text",
            16,
            str(tokenizer_dir),
            rank=rank,
            world_size=2,
            seed=3,
            shuffle_buffer_size=8,
            with_provenance=True,
        )
        samples.extend(ds)
    got = documents_from(samples)
    texts = [r["text"] for r in datasets.load_dataset("json", data_files=jsonl, split="train", streaming=True)]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    expected = sorted([*e.ids, 0] for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    assert sorted(got.values()) == expected


def test_resume_state_is_plain_json_and_continues_in_process(corpus, tokenizer_dir):
    ds = make(corpus, tokenizer_dir)
    loader = StatefulDataLoader(ds, batch_size=3, num_workers=0)
    batches = []
    state = None
    for step, batch in enumerate(loader):
        batches.append(batch["input_ids"])
        if step == 6:
            state = json.loads(json.dumps(loader.state_dict()))
    assert state is not None
    resumed_ds = make(corpus, tokenizer_dir)
    resumed = StatefulDataLoader(resumed_ds, batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(batches) - 7
    assert all(torch.equal(a, b) for a, b in zip(rest, batches[7:], strict=True))
    # the same state through merge_rank_states continues identically too
    merged_ds = make(corpus, tokenizer_dir)
    merged_ds.load_state_dict(merge_rank_states([state]))
    again = [b["input_ids"] for b in StatefulDataLoader(merged_ds, batch_size=3)]
    assert all(torch.equal(a, b) for a, b in zip(again, batches[7:], strict=True))


def test_resume_seeks_instead_of_replaying(tmp_path, tokenizer_dir, monkeypatch):
    """A late position starts reading at its block's byte offset, not at the file start."""
    from conftest import write_corpus

    from tokenloom.hf_streaming import _blocks

    files = write_corpus(tmp_path / "big", docs_per_file=(400,), gz_docs=0, parquet_groups=())
    ds = make(files, tokenizer_dir)
    stream = iter(ds)
    for _ in range(int(0.9 * 400 * 20 / 16)):
        next(stream)
    state = ds.state_dict()
    assert state["current"] is not None and state["current"][2] > 0
    seen: list[int] = []
    original = _blocks._line_blocks

    def spy(unit, source, source_index, **kwargs):
        seen.append(kwargs["hint"])
        return original(unit, source, source_index, **kwargs)

    monkeypatch.setattr(_blocks, "_line_blocks", spy)
    resumed = make(files, tokenizer_dir)
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert seen == [state["current"][2]]


def test_compressed_and_plain_give_the_same_documents(tmp_path, tokenizer_dir):
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps({"text": f"doc {i} alpha"}) + "\n" for i in range(30)))
    packed = tmp_path / "a.jsonl.gz"
    with gzip.open(packed, "wb") as f:
        f.write(plain.read_bytes())
    a = documents_from(make([str(plain)], tokenizer_dir))
    b = documents_from(make([str(packed)], tokenizer_dir))
    assert sorted(a.values()) == sorted(b.values())
    assert np.array_equal(sorted(a), sorted(b))


ENCODE_CALLS: list[int] = []


def counting_encoder(spec):
    """A user-supplied engine through the seam: the default one, counting its calls."""
    from tokenloom.hf_streaming import hf_encoder

    inner = hf_encoder(spec)

    def encode(texts):
        ENCODE_CALLS.append(len(texts))
        return inner(texts)

    return encode


def test_encoder_seam_and_position_keys(corpus, tokenizer_dir):
    ENCODE_CALLS.clear()
    ds = make(corpus, tokenizer_dir, encoder=counting_encoder, pack_sequences=True, position_ids=True, cu_seqlens=True)
    samples = list(ds)
    assert ENCODE_CALLS and max(ENCODE_CALLS) <= 256
    reference = list(make(corpus, tokenizer_dir, pack_sequences=True))
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(samples, reference, strict=True))
    sample = samples[0]
    starts = torch.cat([torch.tensor([True]), sample["doc_ids"][1:] != sample["doc_ids"][:-1]])
    assert (sample["position_ids"][starts] == 0).all()
    assert sample["cu_seqlens"].shape == (17,) and sample["cu_seqlens"][-1] == 16


def test_default_engine_is_fast_and_identical_to_hf(corpus, tokenizer_dir, caplog):
    """The default encoder is tokenloom-tokenize's engine selection: fastokens here, same ids as tokenizers."""
    import functools

    from tokenloom.hf_streaming import engine_encoder, hf_encoder, resolve_tokenizer

    spec = resolve_tokenizer(tokenizer_dir, None)
    texts = [json.loads(line)["text"] for path in corpus if path.endswith(".jsonl") for line in open(path)]  # noqa: SIM115
    assert texts
    with caplog.at_level(logging.DEBUG, logger="tokenloom.hf_streaming"):  # DEBUG: said at INFO once per process
        fast = engine_encoder(spec)
    assert "encoding engine: fast" in caplog.text
    hf_ids, hf_lengths = hf_encoder(spec)(texts)
    ids, lengths = fast(texts)
    assert ids.dtype == np.int64 and np.array_equal(ids, hf_ids) and np.array_equal(lengths, hf_lengths)
    forced = make(corpus, tokenizer_dir, encoder=functools.partial(engine_encoder, engine="hf"))
    default = make(corpus, tokenizer_dir)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(forced, default, strict=True))


def test_workers_inherit_the_tokenizers_built_before_the_fork(tokenizer_dir, monkeypatch, caplog):
    """The dataset builds the tokenizers once where workers fork; the engine then probes them, builds none."""
    import multiprocessing

    from tokenloom.hf_streaming import _encode, engine_encoder, resolve_tokenizer
    from tokenloom.tokenize import engine as engine_module

    monkeypatch.setattr(_encode, "_BUILT", {})
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "fork")
    spec = resolve_tokenizer(tokenizer_dir, None)
    _encode.prebuild(spec)
    hf, fast = _encode._BUILT[spec.fingerprint]
    assert fast is not None

    def no_second_build(backend):
        raise AssertionError("built again")

    monkeypatch.setattr(engine_module, "_load_fast", no_second_build)
    with caplog.at_level(logging.DEBUG, logger="tokenloom.hf_streaming"):
        ids, lengths = engine_encoder(spec)(["hello world", "again"])
    want = [hf.encode(text, add_special_tokens=False).ids for text in ("hello world", "again")]
    assert "encoding engine: fast" in caplog.text
    assert ids.tolist() == want[0] + want[1] and lengths.tolist() == [len(want[0]), len(want[1])]
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    monkeypatch.setattr(_encode, "_BUILT", {})
    _encode.prebuild(spec)  # workers that do not fork build their own: nothing is built here for them
    assert _encode._BUILT == {}


def test_a_text_re_checked_once_is_not_encoded_again(tokenizer_dir):
    """The fast engine's run-time check re-encodes a text with hf once: a duplicate is not re-checked again."""
    from tokenizers import Tokenizer

    from tokenloom.tokenize.engine import load_encoder

    encoder = load_encoder(Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")), "fast", verify_fraction=1.0)
    seen: list[str] = []
    reference = encoder.reference.encode_lists  # type: ignore[attr-defined]
    encoder.reference.encode_lists = lambda texts: seen.extend(texts) or reference(texts)  # type: ignore[attr-defined]
    texts = ["one text", "another text", "one text"]
    encoder.encode_flat(texts)
    encoder.encode_flat(texts[::-1])
    assert sorted(seen) == ["another text", "one text", "one text"]  # the first batch checks all it holds
    assert encoder.verified_documents == 3  # type: ignore[attr-defined]
