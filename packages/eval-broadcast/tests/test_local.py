"""Single-process behaviour: rows, bad input, the header, EvalDataset masks, the exact split."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from tokenloom.datasets import MemoryMappedDataset
from tokenloom.eval_broadcast import (
    MAX_MESSAGE_BYTES,
    EvalBuildError,
    EvalDataset,
    EvalSet,
    EvalTokens,
    Header,
    Status,
    broadcast_eval_set,
    exact_eval_split,
    token_weighted_mean,
)
from tokenloom.eval_broadcast._protocol import encode_message
from tokenloom.formats import ConfigError, DataError, TokenRangeError, open_writer


def test_rows_take_the_narrowest_dtype():
    assert broadcast_eval_set(lambda: np.arange(20), seq_len=4, vocab_size=65_536).rows.dtype == torch.uint16
    assert broadcast_eval_set(lambda: np.arange(20), seq_len=4, vocab_size=65_537).rows.dtype == torch.uint32
    assert broadcast_eval_set(lambda: np.arange(20, dtype=np.int64), seq_len=4).rows.dtype == torch.uint16
    two_d = torch.arange(30).reshape(3, 10)
    assert broadcast_eval_set(lambda: two_d, seq_len=9).numpy().tolist() == two_d.tolist()


def test_remainder_is_kept_padded_or_dropped_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="tokenloom.eval_broadcast"):
        kept = broadcast_eval_set(lambda: EvalTokens(np.arange(1, 12), eos_id=0), seq_len=4)
    assert kept.numpy().tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 0, 0, 0, 0]]
    assert kept.tail_padding == 4 and kept.num_tokens == 11 and "padded" in caplog.text
    with caplog.at_level(logging.WARNING, logger="tokenloom.eval_broadcast"):
        dropped = broadcast_eval_set(lambda: np.arange(1, 12), seq_len=4, drop_remainder=True)
    assert len(dropped) == 2 and dropped.tail_padding == 0 and "dropping the last 1 tokens" in caplog.text


def test_empty_sets_are_legal_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tokenloom.eval_broadcast"):
        empty = broadcast_eval_set(lambda: [], seq_len=4)
    assert empty.rows.shape == (0, 5) and "0 rows" in caplog.text
    assert len(EvalDataset(empty)) == 0
    assert broadcast_eval_set(lambda: np.zeros((0, 5), np.int64), seq_len=4).rows.shape == (0, 5)


@pytest.mark.parametrize(
    ("build", "options", "cause", "text"),
    [
        (lambda: None, {}, ConfigError, "None"),
        (lambda: np.zeros(10, np.float32), {}, ConfigError, "float32"),
        (lambda: np.zeros(10, bool), {}, ConfigError, "bool"),
        (lambda: np.zeros((2, 2, 5), np.int64), {}, ConfigError, "3-D"),
        (lambda: np.array([1, -2, 3, 4, 5]), {}, TokenRangeError, "negative"),
        (lambda: np.array([1, 2, 300, 4, 5]), {"vocab_size": 256}, TokenRangeError, "300 at flat position 2 >= vocab"),
        (
            lambda: np.array([1, 270, 300, 4]),
            {"vocab_size": 256},
            TokenRangeError,
            "id 270 at flat position 1.*largest id 300",
        ),
        (lambda: np.zeros((3, 6), np.int64), {}, ConfigError, "seq_len \\+ 1 = 5"),
        (lambda: ["a", "b"], {}, ConfigError, "integer"),
        (lambda: EvalTokens(np.arange(10), eos_id=50, vocab_size=20), {}, ConfigError, "eos_id 50"),
    ],
)
def test_bad_builds_are_named_errors(build, options, cause, text):
    with pytest.raises(EvalBuildError, match=text) as info:
        broadcast_eval_set(build, seq_len=4, **options)
    assert isinstance(info.value, DataError) and isinstance(info.value.__cause__, cause)


def test_a_stream_needs_seq_len_and_arguments_are_checked():
    with pytest.raises(EvalBuildError, match="seq_len is None"):
        broadcast_eval_set(lambda: np.arange(10))
    bad_options: list[dict[str, Any]] = [
        {"timeout": 0},
        {"chunk_bytes": 0},
        {"seq_len": 0},
        {"shared_filesystem": True},
        {"src": 1},
    ]
    for bad in bad_options:
        with pytest.raises(ConfigError):
            broadcast_eval_set(lambda: np.arange(10), **{"seq_len": 4, **bad})
    with pytest.raises(EvalBuildError, match="callable"):
        broadcast_eval_set(np.arange(10), seq_len=4)  # type: ignore[arg-type]


def test_header_round_trip_and_bounded_message():
    header = Header(
        status=Status.OK,
        rows=3,
        row_len=2049,
        dtype_code=1,
        checksum=(1 << 64) - 5,
        tail_padding=7,
        eos_id=None,
        vocab_size=50_257,
        chunk_bytes=1 << 26,
    )
    encoded = header.encode()
    assert encoded.dtype == np.int64 and encoded.shape == (12,)
    assert Header.decode(encoded) == header
    broken = encoded.copy()
    broken[0] = 0
    with pytest.raises(ValueError, match="magic"):
        Header.decode(broken)
    message = encode_message("é" * 10_000)
    assert len(message) <= MAX_MESSAGE_BYTES and message.decode().endswith("[...]")


def test_exact_split_covers_every_row_once():
    for rows in range(0, 40):
        for world in range(1, 9):
            shares = [exact_eval_split(rows, rank, world) for rank in range(world)]
            covered = [i for begin, end in shares for i in range(begin, end)]
            assert covered == list(range(rows))
            sizes = [end - begin for begin, end in shares]
            assert max(sizes) - min(sizes) <= 1
    for bad in ((5, 2, 2), (5, -1, 2), (-1, 0, 1), (5, 0, 0), (5.0, 0, 1)):
        with pytest.raises(ConfigError):
            exact_eval_split(*bad)  # type: ignore[arg-type]


def test_eval_samples_use_the_training_masks(tmp_path):
    eos = 9
    stream = np.array([1, 2, eos, 3, 4, 5, eos, 6, 7, eos, 1, 2, 3, eos, 4, 5, 6, eos], dtype=np.int64)
    with open_writer(tmp_path / "d", dtype="uint16", vocab_size=10, eos_id=eos) as writer:
        writer.add(stream)
    training = MemoryMappedDataset(tmp_path / "d", seq_len=5, pack_sequences=True, position_ids=True)
    evalset = broadcast_eval_set(lambda: EvalTokens(stream, eos_id=eos, vocab_size=10), seq_len=5)
    dataset = EvalDataset(evalset, pack_sequences=True, position_ids=True)
    assert len(dataset) == len(training) == 3
    for i in range(3):
        ours, theirs = dataset[i], training[i]
        assert set(ours) == set(theirs)
        for key in theirs:
            assert ours[key].tolist() == theirs[key].tolist(), key


def test_padding_never_becomes_a_label_and_label_count_is_split_invariant():
    evalset = broadcast_eval_set(lambda: EvalTokens(np.arange(1, 24) % 7, eos_id=6, vocab_size=7), seq_len=4)
    assert evalset.tail_padding == 2
    whole = EvalDataset(evalset, pack_sequences=True)
    last = whole[len(whole) - 1]
    assert last["labels"][-2:].tolist() == [-100, -100]
    plain = EvalDataset(evalset)
    assert plain.num_label_tokens() == 23 - len(evalset)  # every real token but each row's first is a label
    for world in (1, 2, 3, 4, 7):
        parts = [EvalDataset(evalset.split(rank, world), pack_sequences=True) for rank in range(world)]
        assert sum(len(p) for p in parts) == len(evalset)
        assert sum(p.num_label_tokens() for p in parts) == whole.num_label_tokens()


def test_token_weighted_mean_without_distributed():
    assert token_weighted_mean(torch.tensor(6.0), torch.tensor(4)).item() == 1.5
    assert torch.isnan(token_weighted_mean(torch.tensor(0.0), 0))


def test_evalset_select_keeps_padding_with_the_last_row():
    evalset = EvalSet(rows=torch.zeros((5, 4), dtype=torch.uint16), tail_padding=3)
    assert evalset.select(0, 4).tail_padding == 0 and evalset.select(2, 5).tail_padding == 3
    assert evalset.select(5, 5).tail_padding == 0
    with pytest.raises(ConfigError):
        evalset.select(3, 6)


def test_eval_dataset_in_a_dataloader_with_workers(tmp_path):
    evalset = broadcast_eval_set(
        lambda: EvalTokens(np.arange(1, 200) % 11, eos_id=10, vocab_size=11),
        seq_len=8,
        cache_dir=tmp_path,
        cache_key="workers",
    )
    cached = broadcast_eval_set(lambda: None, seq_len=8, cache_dir=tmp_path, cache_key="workers")
    assert cached.origin == "cache"  # rows memory-mapped from the cache
    dataset = EvalDataset(cached, pack_sequences=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)
    labels = torch.cat([batch["labels"] for batch in loader])
    assert labels.shape == (len(evalset), 8)
    assert int((labels != -100).sum()) == EvalDataset(evalset, pack_sequences=True).num_label_tokens()
