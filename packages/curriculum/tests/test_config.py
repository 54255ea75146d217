"""Config: GPT-Simple's YAML unchanged, TOML, the Python API, and every bad input as a named error."""

from __future__ import annotations

import math

import pytest

from tokenloom.curriculum import (
    CurriculumConfig,
    CurriculumDataset,
    EmptyBucketError,
    ExhaustionPolicy,
    MissingValTwinError,
    Phase,
)
from tokenloom.formats import ConfigError, DataError

GPT_SIMPLE_YAML = """\
# GPT-Simple configuration (as `gpt-simple init` writes it, curriculum filled in)
model:
  n_embd: 768
  n_layer: 12
  n_head: 12
  n_positions: 2048
  activation: swish
data:
  path: ./data            # root directory with .bin/.idx shards
  tokenizer: gpt2
  format: pretokenized
  max_length: 16
  overlap_size: 4
  packing: false
  num_workers: 4
  curriculum:
    - duration_tokens: 3_000
      mix: {a: 0.6, b: 0.4}
    - duration_tokens: 4000
      mix: {a: 1, b: 1, c: 2}
  allow_bucket_exhaustion: true
  allow_budget_mismatch: false
optimizer:
  learning_rate: 3.0e-4
  warmup_steps: 100
training:
  per_device_batch_size: 4
  gradient_accumulation_steps: 4
  max_steps: 1000
  seed: 42
"""


def test_gpt_simple_yaml_is_accepted_unchanged(corpus, tmp_path):
    (tmp_path / "run.yaml").write_text(GPT_SIMPLE_YAML)
    cfg = CurriculumConfig.from_file(tmp_path / "run.yaml")
    assert cfg.path == tmp_path / "data" and cfg.seq_len == 16 and cfg.packing is False
    assert cfg.curriculum is not None
    assert [p.duration_tokens for p in cfg.curriculum] == [3000, 4000]
    assert cfg.curriculum[1].mix == {"a": 0.25, "b": 0.25, "c": 0.5}  # normalised as the seed does
    assert cfg.policy is ExhaustionPolicy.RENORMALISE and cfg.tokenizer == "gpt2"
    ds = CurriculumDataset(cfg, seed=1)
    assert ds.buckets == ["a", "b", "c"] and len(ds) * 16 >= 7000


def test_toml_and_the_python_api_give_the_same_config(corpus, tmp_path):
    (tmp_path / "c.toml").write_text(
        f'[data]\npath = "{corpus}"\nmax_length = 16\npacking = false\n'
        "[[data.curriculum]]\nduration_tokens = 3000\nmix = { a = 3, b = 2 }\n"
    )
    from_toml = CurriculumConfig.from_file(tmp_path / "c.toml")
    from_api = CurriculumConfig(
        path=corpus, seq_len=16, packing=False, curriculum=(Phase(duration_tokens=3000, mix={"a": 3, "b": 2}),)
    )
    assert from_toml.schedule_fingerprint() == from_api.schedule_fingerprint()
    assert from_toml.curriculum == from_api.curriculum


@pytest.mark.parametrize(
    ("phase", "match"),
    [
        ({"duration_tokens": "5e9", "mix": {"a": 1}}, "the string '5e9'"),
        ({"duration_tokens": 5e9, "mix": {"a": 1}}, "float"),
        ({"duration_tokens": 0, "mix": {"a": 1}}, "expected an integer >= 1"),
        ({"duration_tokens": -10, "mix": {"a": 1}}, "expected an integer >= 1"),
        ({"duration_tokens": 10, "mix": {"a": -1, "b": 2}}, "finite weight >= 0"),
        ({"duration_tokens": 10, "mix": {"a": math.nan}}, "finite weight >= 0"),
        ({"duration_tokens": 10, "mix": {"a": 0, "b": 0}}, "every weight"),
        ({"duration_tokens": 10, "mix": {}}, "non-empty mapping"),
        ({"duration_tokens": 10, "mix": {"a": 1}, "weight": 2}, "unknown keys"),
        ({"mix": {"a": 1}}, "missing"),
    ],
)
def test_bad_phases_are_config_errors_naming_the_field(phase, match, tmp_path):
    with pytest.raises(ConfigError, match=match) as caught:
        CurriculumConfig.from_dict({"data": {"path": str(tmp_path), "curriculum": [phase]}})
    assert caught.value.field and caught.value.field.startswith("curriculum[0]")


def test_yaml_5e9_is_refused_with_the_fix(tmp_path):
    (tmp_path / "c.yaml").write_text("data:\n  path: .\n  curriculum:\n    - duration_tokens: 5e9\n      mix: {a: 1}\n")
    with pytest.raises(ConfigError, match="5000000000") as caught:
        CurriculumConfig.from_file(tmp_path / "c.yaml")
    assert str(tmp_path / "c.yaml") in str(caught.value)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"path": ".", "max_lenght": 5}, "unknown keys \\['max_lenght'\\]"),
        ({"path": ".", "max_length": 0}, "seq_len"),
        ({"path": ".", "packing": "yes"}, "packing"),
        ({"path": ".", "format": "jsonl"}, "token shards"),
        ({"path": ".", "bucket_exhaustion": "skip"}, "expected one of halt, renormalise, repeat"),
        ({"path": ".", "bucket_exhaustion": "repeat"}, "max_repetition"),
        ({"path": ".", "max_repetition": 3}, "policy is halt"),
        ({"path": ".", "curriculum": []}, "empty list"),
        ({"max_length": 8}, "no 'path'"),
    ],
)
def test_bad_data_blocks(data, match):
    with pytest.raises(ConfigError, match=match):
        CurriculumConfig.from_dict({"data": data})


def test_unknown_top_level_section_is_refused():
    with pytest.raises(ConfigError, match="unknown top-level keys \\['dataa'\\]"):
        CurriculumConfig.from_dict({"data": {"path": "."}, "dataa": {}})


def test_unknown_bucket_empty_bucket_and_missing_val_twin(corpus):
    bad_mix = CurriculumConfig(path=corpus, curriculum=(Phase(duration_tokens=10, mix={"a": 1, "web": 1}),))
    with pytest.raises(ConfigError, match="\\['web'\\]"):
        CurriculumDataset(bad_mix, seed=0)
    (corpus / "train" / "d").mkdir()
    with pytest.raises(EmptyBucketError, match="train/d"):
        CurriculumDataset(CurriculumConfig(path=corpus, seq_len=16, packing=False), seed=0)
    (corpus / "train" / "d").rmdir()
    import shutil

    shutil.rmtree(corpus / "val" / "b")
    with pytest.raises(MissingValTwinError, match="'b' has no val/ twin"):
        CurriculumDataset(CurriculumConfig(path=corpus, seq_len=16, packing=False), seed=0)
    assert issubclass(MissingValTwinError, DataError)


def test_buckets_with_different_eos_ids_and_shards_with_different_dtypes(tmp_path):
    import numpy as np

    from tokenloom.curriculum import BucketMismatchError
    from tokenloom.formats import open_writer

    for split in ("train", "val"):
        for name, eos in (("a", 0), ("b", 1)):
            with open_writer(tmp_path / split / name, dtype="uint16", eos_id=eos, vocab_size=100) as writer:
                writer.add(np.arange(2, 90))
    with pytest.raises(BucketMismatchError, match="different EOS ids"):
        CurriculumDataset(CurriculumConfig(path=tmp_path, seq_len=16, packing=False), seed=0)
    mixed = tmp_path / "mixed"
    (mixed / "train" / "c").mkdir(parents=True)
    np.save(mixed / "train" / "c" / "s0.npy", np.arange(100, dtype=np.uint16))
    np.save(mixed / "train" / "c" / "s1.npy", np.arange(100, dtype=np.int32))
    with pytest.raises(DataError, match="different dtypes"):
        CurriculumDataset(CurriculumConfig(path=mixed, seq_len=16, packing=False), seed=0)


def test_gpt_simple_directories_without_manifests_read_the_same(corpus, tmp_path):
    import shutil

    import numpy as np

    bare = tmp_path / "bare"
    shutil.copytree(corpus, bare)
    for manifest in bare.glob("*/*/manifest.json"):
        manifest.unlink()
    assert not list(bare.glob("*/*/manifest.json"))
    with_manifest = CurriculumDataset(CurriculumConfig(path=corpus, seq_len=16, packing=False), seed=4)
    without = CurriculumDataset(CurriculumConfig(path=bare, seq_len=16, packing=False), seed=4)
    assert len(without) == len(with_manifest)
    positions = list(range(0, len(without), 7))
    assert all(
        np.array_equal(a.numpy(), b.numpy())
        for a, b in zip(
            without.__getitems__(positions).batched.values(),
            with_manifest.__getitems__(positions).batched.values(),
            strict=True,
        )
    )
