"""Attack on order: block: an exactly-once oracle over save/kill/resume on changing topologies; bad YAML."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from curriculum_helpers import EOS, SEQ_LEN, make_corpus, write_bucket
from test_oracle import _resume_schedule

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, Phase
from tokenloom.formats import ConfigError, RemoteOptions, ResumeMismatchError

SEED = 77
# a: not a multiple of block_samples; b: fewer samples than one block; c: a multiple
SIZES = {"a": 101, "b": 5, "c": 48}
TOPOLOGIES = [(2, 1), (1, 0), (4, 2), (3, 0)]


@pytest.fixture(scope="module")
def odd_corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("cbo-oracle") / "data", SIZES)


def _config(root, policy, max_repetition=None):
    phases = (
        Phase(duration_tokens=900, mix={"a": 1, "b": 1}),
        Phase(duration_tokens=2200, mix={"a": 0.3, "b": 0.3, "c": 0.4}),
    )
    return CurriculumConfig(
        path=root, seq_len=SEQ_LEN, packing=False, curriculum=phases, bucket_exhaustion=policy,
        **({"max_repetition": max_repetition} if max_repetition else {}),
        order="block", block_samples=16, window_blocks=3,
    )  # fmt: skip


@pytest.mark.parametrize(("policy", "repetition", "seed"), [("repeat", 30, 3), ("renormalise", None, 4)])
def test_block_order_is_exactly_once_on_random_resumes(odd_corpus, policy, repetition, seed):
    ds = CurriculumDataset(_config(odd_corpus, policy, repetition), seed=SEED)
    _, bucket, index = ds.locate(np.arange(len(ds)))
    expected = list(zip(bucket.tolist(), index.tolist(), strict=True))
    for b, n in enumerate(SIZES.values()):  # the reference: every bucket epoch a permutation of the bucket
        draws = [i for bucket_id, i in expected if bucket_id == b]
        for first in range(0, len(draws), n):
            epoch = draws[first : first + n]
            assert len(set(epoch)) == len(epoch) and (len(epoch) < n or sorted(epoch) == list(range(n)))
    if policy == "repeat":
        assert sum(1 for bucket_id, _ in expected if bucket_id == 1) > 3 * SIZES["b"]  # the tiny bucket, re-read
    rng = np.random.default_rng(seed)
    targets = sorted(rng.choice(np.arange(5, len(ds) - 5), size=4, replace=False).tolist())

    def reopen(state):
        resumed = CurriculumDataset(_config(odd_corpus, policy, repetition), seed=SEED)
        if state is not None:
            resumed.load_state_dict(ds.state_dict(consumed=state["consumed"]))
        return resumed

    seen = _resume_schedule(ds, targets, TOPOLOGIES, reopen)
    assert [seen[p] for p in range(len(ds))] == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("order: blocky", r"order is 'blocky', expected one of feistel, block"),
        ("order: block\nblock_samples: 0", r"block_samples is 0, expected an integer >= 1"),
        ("order: block\nblock_samples: -1", r"block_samples is -1"),
        ("order: block\nblock_samples: 1.5", r"block_samples is 1.5"),
        ("order: block\nblock_samples: x", r"block_samples is 'x'"),
        (
            "order: block\nwindow_blocks: 100000000000000000000",
            r"window_blocks is 100000000000000000000, .* <= 1,048,576",
        ),
        ("order: block\nblock_samples: 9223372036854775807", r"block_samples is 9223372036854775807"),
        ("order: {a: block}\nblock_samples: 1099511627776\nwindow_blocks: 1048576", None),
    ],
)
def test_bad_block_values_in_yaml_are_named_before_the_first_sample(odd_corpus, tmp_path, text, match):
    config = tmp_path / "c.yaml"
    config.write_text(
        f"path: {odd_corpus}\nmax_length: {SEQ_LEN}\npacking: false\n"
        "curriculum: [{duration_tokens: 400, mix: {a: 1}}]\n" + text + "\n"
    )
    if match is None:  # the largest sizes accepted serve samples (no int64 overflow)
        ds = CurriculumDataset(CurriculumConfig.from_file(config), seed=SEED)
        index = ds.locate(np.arange(len(ds)))[2].tolist()
        assert len(set(index)) == len(index) and all(0 <= i < SIZES["a"] for i in index)
        assert int(ds[0]["bucket"]) == 0
        return
    with pytest.raises(ConfigError, match=match) as caught:
        CurriculumConfig.from_file(config)
    assert caught.value.path == str(config)


# -- fetched/used from a real S3 server: a second run and a resume on the same node's cache ---------------
S3_BLOCK = 8192
S3_MAX_LENGTH = 127


def test_fetch_figures_count_this_run_not_the_earlier_runs_on_the_same_cache(seaweed, tmp_path, monkeypatch):
    local = tmp_path / "data"
    rng = np.random.default_rng(9)
    for split, count in (("train", 512), ("val", 4)):
        write_bucket(local / split / "a", rng.integers(0, EOS, size=count * S3_MAX_LENGTH + 1), doc_length=4000)
    prefix = f"cbo-attack-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(local, prefix)
    monkeypatch.setenv("TOKENLOOM_BLOCK_SIZE", str(S3_BLOCK))
    monkeypatch.delenv("TOKENLOOM_CACHE_LIMIT", raising=False)
    config = CurriculumConfig.from_dict(
        {
            "path": f"s3://{seaweed.bucket}/{prefix}", "max_length": S3_MAX_LENGTH, "packing": False,
            "curriculum": [{"duration_tokens": 256 * S3_MAX_LENGTH, "mix": {"a": 1}}],
            "storage_options": seaweed.storage_options(), "block_cache_dir": str(tmp_path / "node-cache"),
            "order": "block", "block_samples": 64, "window_blocks": 2,
        }
    )  # fmt: skip
    sample_bytes = (S3_MAX_LENGTH + 1) * 2

    first = CurriculumDataset(config, seed=SEED)
    assert first.fetch_figures(0)["fetched_bytes"] == 0
    first.__getitems__(list(range(len(first))))
    ran = first.fetch_figures(len(first))
    assert ran["used_bytes"] == len(first) * sample_bytes and ran["fetched_bytes"] >= ran["used_bytes"]

    again = CurriculumDataset(config, seed=SEED)  # a second run on the warm cache fetches nothing
    again.__getitems__(list(range(len(again))))
    assert again.fetch_figures(len(again))["fetched_bytes"] == 0

    resumed = CurriculumDataset(
        config.replace(remote=RemoteOptions.from_keywords(remote=config.remote, block_cache_dir=tmp_path / "new-node")),
        seed=SEED,
    )
    resumed.load_state_dict(first.state_dict(consumed=100))  # a resume on a node with an empty cache
    resumed.__getitems__(list(range(100, len(resumed))))
    figures = resumed.fetch_figures(len(resumed))
    assert figures["used_bytes"] == (len(resumed) - 100) * sample_bytes  # what this run used, since the resume
    assert figures["used_bytes"] <= figures["fetched_bytes"] <= 2 * 128 * sample_bytes, figures  # its 2 windows


@pytest.mark.parametrize(
    ("saved", "loaded", "loads"),
    [
        ({}, {"order": "block"}, False),  # global -> block
        ({"order": "block"}, {}, False),  # block -> global
        ({"order": "block", "block_samples": 16}, {"order": "block", "block_samples": 32}, False),
        ({"order": {"a": "block"}}, {"order": {"c": "block"}}, False),
        ({"order": "block"}, {"order": "block", "block_samples": 16384, "window_blocks": 8}, True),  # the defaults
        ({}, {"order": {"a": "feistel"}}, True),
        ({"order": "block"}, {"order": {"a": "block", "b": "block", "c": "block"}}, True),
    ],
)
def test_a_state_loads_exactly_when_the_resolved_orders_agree(odd_corpus, saved, loaded, loads):
    def dataset(**order):
        config = CurriculumConfig.from_dict(
            {"path": str(odd_corpus), "max_length": SEQ_LEN, "packing": False,
             "curriculum": [{"duration_tokens": 900, "mix": {"a": 1, "c": 1}}], **order}
        )  # fmt: skip
        return CurriculumDataset(config, seed=SEED)

    state = dataset(**saved).state_dict(consumed=7)
    target = dataset(**loaded)
    if loads:
        target.load_state_dict(state)
        return
    with pytest.raises(ResumeMismatchError, match=r"differing fields: orders: saved"):
        target.load_state_dict(state)


def test_an_order_for_an_empty_bucket_no_phase_uses_is_moot_as_the_bucket(tmp_path):
    root = make_corpus(tmp_path / "data", {"a": 40, "b": 40})
    (root / "train" / "spare").mkdir()  # skipped: empty and no phase names it
    config = CurriculumConfig.from_dict(
        {"path": str(root), "max_length": SEQ_LEN, "packing": False, "order": {"a": "block", "spare": "block"},
         "curriculum": [{"duration_tokens": 300, "mix": {"a": 1, "b": 1}}]}
    )  # fmt: skip
    ds = CurriculumDataset(config, seed=SEED)  # was: "order names buckets ['spare'] that are not under .../train"
    assert ds.buckets == ["a", "b"] and ds.orders == [(16384, 8), None]
