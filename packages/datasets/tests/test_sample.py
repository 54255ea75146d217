"""build_sample / build_batch: every variant pinned by a hand-computed example."""

import numpy as np
import pytest
import torch

from tokenloom.datasets import IGNORE_INDEX, build_batch, build_sample, collate, to_torch
from tokenloom.formats import ConfigError

X = IGNORE_INDEX
#          doc 0     | doc 1     | doc 2
WINDOW = [5, 6, 0, 7, 8, 0, 9]  # EOS = 0; 7 tokens -> L = 6


def test_plain_shift():
    s = build_sample(WINDOW)
    assert s["input_ids"].tolist() == [5, 6, 0, 7, 8, 0]
    assert s["labels"].tolist() == [6, 0, 7, 8, 0, 9]
    assert set(s) == {"input_ids", "labels"}
    assert s["input_ids"].dtype == np.int64


def test_documents_kempnerforge():
    s = build_sample(WINDOW, eos_id=0, packing=True)
    assert s["doc_ids"].tolist() == [0, 0, 0, 1, 1, 1]  # the EOS belongs to the document it ends
    assert s["labels"].tolist() == [6, 0, X, 8, 0, X]  # an EOS never predicts the next document
    assert "position_ids" not in s


def test_documents_position_reset_and_cu_seqlens():
    s = build_sample(WINDOW, eos_id=0, packing="documents", position_ids=True, cu_seqlens=True)
    assert s["position_ids"].tolist() == [0, 1, 2, 0, 1, 2]
    assert s["cu_seqlens"].tolist() == [0, 3, 6, 6, 6, 6, 6]  # padded with L to L + 1 entries
    assert s["cu_seqlens"].dtype == np.int32


def test_gpt_simple_positions_continuous_token_after_eod_masked():
    s = build_sample(WINDOW, eos_id=0, packing="gpt-simple")
    assert s["position_ids"].tolist() == [0, 1, 2, 3, 4, 5]
    assert s["labels"].tolist() == [6, 0, X, 8, 0, X]


def test_window_starting_inside_a_document_numbers_documents_from_zero():
    s = build_sample([3, 0, 4, 0, 5], eos_id=0, packing=True, position_ids=True)
    assert s["doc_ids"].tolist() == [0, 0, 1, 1]
    assert s["position_ids"].tolist() == [0, 1, 0, 1]
    assert s["labels"].tolist() == [0, X, 0, X]


def test_label_ignore_masks_label_positions():
    ignore = np.zeros(len(WINDOW), bool)
    ignore[[1, 2]] = True  # tokens 6 and 0 are an overlap prefix: never labels
    s = build_sample(WINDOW, label_ignore=ignore)
    assert s["labels"].tolist() == [X, X, 7, 8, 0, 9]


def test_explicit_doc_ids_replace_eos_detection():
    s = build_sample([1, 2, 3, 4, 9], doc_ids=[0, 0, 1, 1, 2], position_ids=True, packing=True)
    assert s["labels"].tolist() == [2, X, 4, X]
    assert s["position_ids"].tolist() == [0, 1, 0, 1]


def test_batch_rows_are_independent():
    windows = np.array([WINDOW, [0, 0, 1, 2, 3, 0, 4]])
    b = build_batch(windows, eos_id=0, packing=True, position_ids=True, cu_seqlens=True)
    assert b["labels"][1].tolist() == [X, X, 2, 3, 0, X]
    assert b["doc_ids"][1].tolist() == [0, 1, 2, 2, 2, 2]
    assert b["cu_seqlens"][1].tolist() == [0, 1, 2, 6, 6, 6, 6]
    assert b["position_ids"][1].tolist() == [0, 0, 0, 1, 2, 3]


def test_samples_collate_with_default_collate():
    samples = [to_torch(build_sample(WINDOW, eos_id=0, packing=True, cu_seqlens=True)) for _ in range(3)]
    batch = collate(samples)
    assert batch["input_ids"].shape == (3, 6)
    assert batch["cu_seqlens"].dtype == torch.int32


def test_missing_eos_is_a_config_error():
    with pytest.raises(ConfigError, match="EOS"):
        build_sample(WINDOW, packing=True)


def test_unknown_packing_and_bad_shape():
    with pytest.raises(ConfigError, match="pack_sequences"):
        build_sample(WINDOW, packing="zigzag")
    with pytest.raises(ConfigError, match="shape"):
        build_sample([1])
