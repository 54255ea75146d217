"""Review of issue 36's hf-streaming folds (RangeReader on the remote layer's ObjectFile, check_state once in
load_state_dict): exact resume across a changed worker count from a remote jsonl source, in one process with
real DataLoader workers; damaged state files are named errors before anything streams."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import orjson
import pytest
from _hfs_oracle import compare, expected_documents, rebuild
from test_resume import dataset_kwargs
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.formats.errors import DataError, FormatError
from tokenloom.hf_streaming import (
    StreamingHuggingFaceDataset,
    load_rank_states,
    merge_rank_states,
    save_rank_state,
)


def _records(loader, step0: int, steps: int | None) -> list[dict]:
    out = []
    for step, batch in enumerate(loader, start=step0 + 1):
        out.append({"step": step, "rank": 0, **{k: batch[k].tolist() for k in ("input_ids", "labels")}})
        out[-1].update(doc_index=batch["doc_index"].tolist(), label_doc_index=batch["label_doc_index"].tolist())
        if steps is not None and step - step0 >= steps:
            break
    return out


def test_exact_resume_from_s3_jsonl_across_a_changed_worker_count(seaweed, corpus, tokenizer_dir, tmp_path) -> None:
    files = [p for p in corpus if p.endswith(".jsonl")]
    prefix = f"review-{uuid.uuid4().hex[:8]}"
    for path in files:
        seaweed.put(f"{prefix}/{Path(path).name}", Path(path).read_bytes())
    urls = [f"s3://{seaweed.bucket}/{prefix}/{Path(p).name}" for p in files]
    kwargs = dataset_kwargs(urls, tokenizer_dir, storage_options=seaweed.storage_options(), seed=3)

    first = StreamingHuggingFaceDataset(**kwargs)
    loader = StatefulDataLoader(first, batch_size=3, num_workers=2, timeout=120)
    segment = _records(loader, 0, 7)
    save_rank_state(tmp_path / "state", 0, loader.state_dict())
    del loader

    again = StreamingHuggingFaceDataset(**kwargs)
    again.load_state_dict(merge_rank_states(load_rank_states(tmp_path / "state", world_size=1)))
    rest = _records(StatefulDataLoader(again, batch_size=3, num_workers=1, timeout=120), 7, None)
    assert rest, "the resumed run streamed nothing"
    # every document exactly once, in order within itself (the doc ids are the local files', same bytes)
    assert compare(expected_documents(files, tokenizer_dir, eos_id=0), rebuild([segment, rest])) == []


@pytest.fixture
def saved_state(corpus, tokenizer_dir, tmp_path) -> tuple[Path, dict]:
    kwargs = dataset_kwargs([p for p in corpus if p.endswith(".jsonl")], tokenizer_dir)
    loader = StatefulDataLoader(StreamingHuggingFaceDataset(**kwargs), batch_size=2, num_workers=0)
    _records(loader, 0, 3)
    path = save_rank_state(tmp_path / "state", 0, loader.state_dict())
    return path, kwargs


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped_brace", "not_a_state", "bad_field"])
def test_a_damaged_state_file_is_a_named_error(saved_state, damage: str) -> None:
    path, kwargs = saved_state
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped_brace":
        path.write_bytes(b"[" + data[1:])
    elif damage == "not_a_state":
        path.write_bytes(orjson.dumps({"hello": 1}))
    else:  # a slot's position field of the wrong type, deep inside the loader state
        text = data.decode()
        assert '"item":' in text
        path.write_bytes(text.replace('"item":', '"item":"x","was":', 1).encode())
    with pytest.raises(DataError) as caught:
        states = load_rank_states(path.parent, world_size=1)
        StreamingHuggingFaceDataset(**kwargs).load_state_dict(merge_rank_states(states))
    message = str(caught.value)
    assert "Traceback" not in message and message.strip()
    if damage in ("empty", "truncated", "flipped_brace"):
        assert isinstance(caught.value, FormatError) and path.name in message


def test_a_state_of_a_json_round_trip_loads_and_a_wrong_kind_is_refused(saved_state) -> None:
    path, kwargs = saved_state
    merged = merge_rank_states(load_rank_states(path.parent))
    StreamingHuggingFaceDataset(**kwargs).load_state_dict(json.loads(json.dumps(merged)))
    broken = {**merged, "kind": "bogus"}
    with pytest.raises(DataError):
        StreamingHuggingFaceDataset(**kwargs).load_state_dict(broken)


def _tokens_of(urls: list[str], tokenizer_dir, options) -> list[list[int]]:
    kwargs = dataset_kwargs(urls, tokenizer_dir, storage_options=options, shuffle_buffer_size=1, with_provenance=False)
    return [sample["input_ids"].tolist() for sample in StreamingHuggingFaceDataset(**kwargs)]


def test_a_zero_length_and_a_newline_less_remote_jsonl_read_like_local(seaweed, corpus, tokenizer_dir) -> None:
    """RangeReader (the remote layer's ObjectFile): an empty object, and a last line without its newline at the
    object's end (a partial last block)."""
    first = Path(next(p for p in corpus if p.endswith(".jsonl")))
    data = first.read_bytes()
    prefix = f"review-{uuid.uuid4().hex[:8]}"
    seaweed.put(f"{prefix}/empty.jsonl", b"")
    seaweed.put(f"{prefix}/cut.jsonl", data.rstrip(b"\n"))
    seaweed.put(f"{prefix}/whole.jsonl", data)
    root = f"s3://{seaweed.bucket}/{prefix}"
    options = seaweed.storage_options()
    whole = _tokens_of([f"{root}/whole.jsonl"], tokenizer_dir, options)
    assert whole
    assert _tokens_of([f"{root}/empty.jsonl", f"{root}/cut.jsonl"], tokenizer_dir, options) == whole
