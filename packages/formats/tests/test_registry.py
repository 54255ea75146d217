"""Format detection: a directory of datasets is named as such, not as an unknown layout."""

from __future__ import annotations

import numpy as np
import pytest

from tokenloom.formats import FormatError, open_dataset, open_writer


def test_a_directory_of_datasets_names_them_and_says_which_to_open(tmp_path):
    for bucket in ("books", "code"):
        with open_writer(tmp_path / "val" / bucket, dtype="uint16", vocab_size=100, eos_id=0) as writer:
            writer.add(np.array([1, 2, 0]))
    (tmp_path / "val" / "notes").mkdir()  # not a dataset: not listed
    with pytest.raises(FormatError, match=r"holds 2 dataset directories \(books, code\)") as caught:
        open_dataset(tmp_path / "val")
    assert str(tmp_path / "val" / "books") in str(caught.value) and "open_buckets" in str(caught.value)
    assert len(open_dataset(tmp_path / "val" / "books")) == 1


def test_an_unknown_layout_still_lists_the_readers_tried(tmp_path):
    (tmp_path / "notes.txt").write_text("not tokens")
    with pytest.raises(FormatError, match="no reader recognises this layout"):
        open_dataset(tmp_path)
