"""budget_unit: loss_tokens over GPT-Simple's own output (shards without a manifest, so without an EOS id): the
EOS id comes from the curriculum config (``eos_id``, or the local ``tokenizer`` directory, as GPT-Simple does)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from curriculum_helpers import EOS, write_bucket, write_yaml

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset
from tokenloom.formats import ConfigError, DataError


def _corpus(root, *, manifest: bool):
    for split, total in (("train", 4000), ("val", 64)):
        for number, (name, length) in enumerate({"a": 8, "b": 4}.items()):
            tokens = (np.arange(total, dtype=np.int64) + number * 7) % 60000
            tokens[length - 1 :: length] = EOS
            write_bucket(root / split / name, tokens, doc_length=length)
            if not manifest:
                (root / split / name / "manifest.json").unlink()  # GPT-Simple's pretokenize writes none
    return root


def _data(root, **extra):
    phases = [{"duration_tokens": 1000, "mix": {"a": 1, "b": 1}}, {"duration_tokens": 900, "mix": {"b": 1}}]
    return {"path": str(root), "max_length": 16, "budget_unit": "loss_tokens", "curriculum": phases, **extra}


def _boundaries(config_file):
    ds = CurriculumDataset(CurriculumConfig.from_file(config_file), seed=3, shuffle=False)
    return [b.budget_tokens for b in ds._buckets], list(ds.schedule.phase_tokens)


def test_without_an_eos_id_anywhere_the_error_says_to_put_it_in_the_config(tmp_path):
    root = _corpus(tmp_path / "data", manifest=False)
    config = write_yaml(tmp_path / "c.yaml", {"data": _data(root)})
    with pytest.raises(ConfigError, match="needs the EOS id") as caught:
        _boundaries(config)
    assert "eos_id: ID" in str(caught.value)


def test_eos_id_in_the_yaml_gives_the_plan_a_manifest_would(tmp_path):
    expected = _boundaries(write_yaml(tmp_path / "m.yaml", {"data": _data(_corpus(tmp_path / "m", manifest=True))}))
    root = _corpus(tmp_path / "data", manifest=False)
    got = _boundaries(write_yaml(tmp_path / "c.yaml", {"data": _data(root, eos_id=EOS)}))
    assert got == expected


def test_the_eos_id_of_a_local_tokenizer_directory_is_used(tmp_path):
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|end|>"}}))
    table = {"added_tokens": [{"id": EOS, "content": "<|end|>"}], "model": {"type": "BPE", "vocab": {"a": 0}}}
    (tokenizer / "tokenizer.json").write_text(json.dumps(table))
    expected = _boundaries(write_yaml(tmp_path / "m.yaml", {"data": _data(_corpus(tmp_path / "m", manifest=True))}))
    root = _corpus(tmp_path / "data", manifest=False)
    config_file = write_yaml(tmp_path / "c.yaml", {"data": _data(root, tokenizer=str(tokenizer))})
    assert CurriculumConfig.from_file(config_file).eos_id == EOS
    assert _boundaries(config_file) == expected


def test_an_eos_id_that_contradicts_the_data_is_refused(tmp_path):
    root = _corpus(tmp_path / "data", manifest=True)
    with pytest.raises(DataError, match=f"eos_id 7 differs from the EOS id {EOS}"):
        _boundaries(write_yaml(tmp_path / "c.yaml", {"data": _data(root, eos_id=7)}))


@pytest.mark.parametrize("bad", [-1, "50256", True, 1.5])
def test_a_bad_eos_id_is_a_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="eos_id is"):
        CurriculumConfig.from_dict(_data(tmp_path, eos_id=bad))


def test_an_eos_id_the_data_type_cannot_hold_is_refused_not_counted_as_no_document_ends(tmp_path):
    """GPT-Simple's shards are uint16: eos_id 100257 (another tokenizer's) can never occur, so every token would
    count as a loss token and the budgets would be silently wrong."""
    root = _corpus(tmp_path / "data", manifest=False)
    with pytest.raises(ConfigError, match="eos_id 100257 cannot occur in bucket") as caught:
        _boundaries(write_yaml(tmp_path / "c.yaml", {"data": _data(root, eos_id=100257)}))
    assert "uint16" in str(caught.value)
