"""order: block inside a curriculum: exact and resumable, the same mix, and fetched ~ used bytes from S3."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from curriculum_helpers import EOS, make_corpus, write_train_val
from torch.utils.data import DataLoader

from tokenloom.curriculum import (
    CurriculumConfig,
    CurriculumDataset,
    CurriculumPlan,
    build_plan,
    findings,
    write_run_status,
)
from tokenloom.curriculum._commands import curriculum
from tokenloom.curriculum._remote_dir import RemoteDir
from tokenloom.datasets import collate
from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.formats.io import parse_url
from tokenloom.sampler import ResumableDistributedSampler

SEED = 21
SIZES = {"a": 300, "b": 200, "c": 400}
PHASES = [
    {"duration_tokens": 2400, "mix": {"a": 1, "b": 1}},
    {"duration_tokens": 3200, "mix": {"a": 1, "b": 1, "c": 3}},
]
BLOCK = {"order": "block", "block_samples": 16, "window_blocks": 2}


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("cblock") / "data", SIZES)


def _config(path, **extra) -> CurriculumConfig:
    return CurriculumConfig.from_dict(
        {"path": str(path), "max_length": 16, "packing": False, "curriculum": PHASES, **extra}
    )


def _rank_positions(ds, *, world: int, state: dict | None, steps: int | None, batch: int = 4) -> tuple[list, dict]:
    """Every rank's positions for ``steps`` batches (None: to the end); the state after them (all ranks agree)."""
    taken, states = [], []
    for rank in range(world):
        sampler = ResumableDistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False, seed=0, pad=False)
        if state is not None:
            sampler.load_state_dict(state)
        positions = list(sampler)
        if steps is not None:
            positions = positions[: steps * batch]
        taken += positions
        states.append(len(positions))
    consumed = (state or {}).get("consumed", 0) + sum(states)
    return taken, {"consumed": consumed}


def test_block_order_is_exact_across_a_resume_on_another_world_size(local):
    ds = CurriculumDataset(_config(local, **BLOCK), seed=SEED)
    first, state = _rank_positions(ds, world=2, state=None, steps=9)
    sampler = ResumableDistributedSampler(ds, num_replicas=2, rank=0, shuffle=False, seed=0, pad=False)
    sampler.load_state_dict({**sampler.state_dict(), "consumed": state["consumed"]})
    saved = {"sampler": sampler.state_dict(), "curriculum": ds.state_dict(consumed=state["consumed"])}
    resumed = CurriculumDataset(_config(local, **BLOCK), seed=SEED)
    resumed.load_state_dict(saved["curriculum"])
    rest, _ = _rank_positions(resumed, world=3, state=saved["sampler"], steps=None)
    positions = np.asarray(first + rest)
    assert np.array_equal(np.sort(positions), np.arange(len(ds)))  # every position once
    _, bucket, index = ds.locate(positions)
    assert len({(int(b), int(i)) for b, i in zip(bucket, index, strict=True)}) == len(positions)
    for position, b, i in zip(positions[::7].tolist(), bucket[::7].tolist(), index[::7].tolist(), strict=True):
        served = resumed[position] if position >= state["consumed"] else ds[position]
        expected = ds.bucket_dataset(b)[i]["input_ids"]
        assert int(served["bucket"]) == b and np.array_equal(served["input_ids"].numpy(), expected.numpy())


def test_block_order_keeps_a_buckets_draws_inside_one_window_at_a_time(local):
    ds = CurriculumPlan(_config(local, **BLOCK), seed=SEED)
    _, bucket, index = ds.locate(np.arange(len(ds)))
    window = 16 * 2
    for b, name in enumerate(ds.buckets):
        draws = index[bucket == b]
        assert len(np.unique(draws)) == len(draws)
        for first in range(0, len(draws) - window + 1, window):  # each window of draws: window_blocks blocks
            assert len(np.unique(draws[first : first + window] // 16)) <= 2, name
    feistel = CurriculumPlan(_config(local), seed=SEED)
    _, spread_bucket, spread = feistel.locate(np.arange(len(feistel)))
    assert len(np.unique(spread[spread_bucket == 0][:window] // 16)) > 2  # the global order touches many blocks


def test_the_mix_per_phase_is_the_one_of_the_global_order(local):
    block = CurriculumPlan(_config(local, **BLOCK), seed=SEED)
    feistel = CurriculumPlan(_config(local), seed=SEED)
    phase_b, bucket_b, _ = block.locate(np.arange(len(block)))
    phase_f, bucket_f, _ = feistel.locate(np.arange(len(feistel)))
    assert len(block) == len(feistel)
    assert np.array_equal(phase_b, phase_f) and np.array_equal(bucket_b, bucket_f)  # which bucket: unchanged
    plan = build_plan(block)
    tolerance = (float(plan["discrepancy_samples"]) + 1) / min(
        end - start for start, end in block.schedule.phase_bounds
    )
    for p, phase in enumerate(block.config.curriculum or ()):
        shares = np.bincount(bucket_b[phase_b == p], minlength=3) / (phase_b == p).sum()
        for b, name in enumerate(block.buckets):
            assert abs(shares[b] - phase.mix.get(name, 0.0)) <= tolerance, (p, name, shares)


def test_per_bucket_orders_and_the_fingerprint(local):
    mixed = CurriculumPlan(_config(local, order={"c": "block"}, block_samples=16), seed=SEED)
    assert mixed.orders == [None, None, (16, 8)]
    feistel = CurriculumPlan(_config(local), seed=SEED)
    _, bucket, index = mixed.locate(np.arange(len(mixed)))
    _, _, global_index = feistel.locate(np.arange(len(feistel)))
    assert np.array_equal(index[bucket < 2], global_index[bucket < 2])  # a and b keep their global order
    assert not np.array_equal(index[bucket == 2], global_index[bucket == 2])
    assert mixed.identity() != feistel.identity()
    assert "orders" not in feistel.identity()  # states saved before order existed still load
    block = CurriculumDataset(_config(local, **BLOCK), seed=SEED)
    with pytest.raises(ResumeMismatchError, match="config"):
        block.load_state_dict(CurriculumDataset(_config(local), seed=SEED).state_dict(consumed=4))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"order": "blocks"}, r"order is 'blocks', expected one of feistel, block"),
        ({"order": {"a": "random"}}, r"order\.a is 'random'"),
        ({"order": 3}, r"order is 3"),
        ({"block_samples": 16}, r"block_samples is set but no bucket has order block"),
        ({"order": "block", "window_blocks": 0}, r"window_blocks is 0, expected an integer >= 1"),
        ({"order": "block", "block_samples": True}, r"block_samples is True"),
    ],
)
def test_bad_order_settings_are_named(local, extra, match):
    with pytest.raises(ConfigError, match=match):
        _config(local, **extra)


def test_an_order_for_a_bucket_that_does_not_exist_is_named(local):
    with pytest.raises(ConfigError, match=r"order names buckets \['web'\]") as caught:
        CurriculumPlan(_config(local, order={"web": "block"}), seed=SEED)
    assert caught.value.field == "order.web"


def test_curriculum_status_shows_fetched_per_used(tmp_path):
    write_run_status(tmp_path, "running", fetched_bytes=3000, used_bytes=2000)
    result = CliRunner().invoke(curriculum, ["status", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "fetched/used 1.50" in result.output


# -- from a real S3 server: the fetched bytes of a 3-bucket mix -------------------------------------------
# The 8 MiB target scaled down 1024x: 8 KiB cache blocks, 256-byte samples (32 a block); a block of samples
# spans 8 cache blocks (as the default 16,384 samples of 2,049 uint16 tokens span 8 blocks of 8 MiB).
S3_BLOCK = 8192
S3_MAX_LENGTH = 127
S3_SAMPLE_BYTES = (S3_MAX_LENGTH + 1) * 2
S3_SIZES = {"a": 6144, "b": 6144, "c": 6144}  # 1.5 MiB each; the curriculum reads about a quarter of each
S3_PHASES = [
    {"duration_tokens": 2304 * S3_MAX_LENGTH, "mix": {"a": 0.5, "b": 0.3, "c": 0.2}},
    {"duration_tokens": 2304 * S3_MAX_LENGTH, "mix": {"a": 0.1, "b": 0.3, "c": 0.6}},
]
S3_ORDER = {"order": "block", "block_samples": 256, "window_blocks": 2}


@pytest.fixture(scope="module")
def s3_local(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cblock-s3") / "data"
    rng = np.random.default_rng(3)
    return write_train_val(
        root, S3_SIZES, lambda count: rng.integers(0, EOS, size=count * S3_MAX_LENGTH + 1), doc_length=4000
    )


def _fetched_per_used(seaweed, proxy, local: Path, cache: Path, monkeypatch, **order) -> tuple[float, dict]:
    prefix = f"cbo-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(local, prefix)
    monkeypatch.setenv("TOKENLOOM_BLOCK_SIZE", str(S3_BLOCK))
    monkeypatch.delenv("TOKENLOOM_CACHE_LIMIT", raising=False)
    config = CurriculumConfig.from_dict(
        {
            "path": f"s3://{seaweed.bucket}/{prefix}",
            "max_length": S3_MAX_LENGTH,
            "packing": False,
            "curriculum": S3_PHASES,
            "storage_options": seaweed.storage_options(endpoint=proxy.url),
            "block_cache_dir": str(cache),
            **order,
        }
    )
    ds = CurriculumDataset(config, seed=SEED)
    sampler = ResumableDistributedSampler(ds, shuffle=False, seed=0)
    ds.prefetch(sampler, batch_size=16, lookahead=64, num_workers=2)
    assert isinstance(config.path, RemoteDir)
    path_prefix = parse_url(config.path.url).prefix

    def bin_bytes() -> int:
        return sum(n for path, n in proxy.get_bytes.items() if path_prefix in path and path.endswith(".bin"))

    before = bin_bytes()
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2, collate_fn=collate)
    samples = sum(len(batch["input_ids"]) for batch in loader)
    proxy.wait_idle()
    figures = ds.fetch_figures(samples)
    assert samples == len(ds) and figures["used_bytes"] == samples * S3_SAMPLE_BYTES
    assert figures["fetched_bytes"] == bin_bytes() - before  # the cache's ledger: what went over the wire
    hints = [f for f in findings(config, seed=SEED)[0] if f.code == "data.order"]
    assert len(hints) == (0 if order else 1) and all(f.severity == "info" for f in hints)  # exit codes unchanged
    return figures["fetched_bytes"] / figures["used_bytes"], figures


def test_a_three_bucket_mix_in_block_order_fetches_about_what_it_uses(
    seaweed, fault_proxy, s3_local, tmp_path, monkeypatch
):
    block, figures = _fetched_per_used(seaweed, fault_proxy, s3_local, tmp_path / "block", monkeypatch, **S3_ORDER)
    feistel, _ = _fetched_per_used(seaweed, fault_proxy, s3_local, tmp_path / "feistel", monkeypatch)
    print(f"fetched / used: block {block:.3f}, feistel {feistel:.3f} ({figures})")
    assert block <= 1.5, figures
    assert feistel > 1.5  # the global order touches nearly every block of each bucket


def test_block_order_over_packed_buckets_serves_the_samples_the_schedule_names(local):
    phases = [{"duration_tokens": 1200, "mix": {"a": 1, "b": 1}}, {"duration_tokens": 1600, "mix": {"c": 1}}]
    config = CurriculumConfig.from_dict(
        {"path": str(local), "max_length": 32, "packing": True, "curriculum": phases, **BLOCK}
    )
    ds = CurriculumDataset(config, seed=SEED, plan_cache_dir=local.parent / "plans")
    _, bucket, index = ds.locate(np.arange(len(ds)))
    assert len({(int(b), int(i)) for b, i in zip(bucket, index, strict=True)}) == len(ds)
    batch = ds.__getitems__(list(range(len(ds))))
    for g in range(0, len(ds), 5):
        expected = ds.bucket_dataset(int(bucket[g]))[int(index[g])]["input_ids"].numpy()
        assert np.array_equal(batch.batched["input_ids"][g].numpy(), expected)
    tokens = int(ds.budget_tokens(np.arange(len(ds)), "input_tokens").sum())
    assert ds.used_bytes(len(ds)) == 2 * tokens and ds.used_bytes(40, 10) == 2 * int(
        ds.budget_tokens(np.arange(10, 40), "input_tokens").sum()
    )


def test_the_plan_names_each_buckets_order(local):
    plan = build_plan(CurriculumPlan(_config(local, order={"b": "block"}, window_blocks=3), seed=SEED))
    orders = {b["name"]: (b["order"], b.get("block_samples"), b.get("window_blocks")) for b in plan["buckets"]}
    assert orders == {"a": ("feistel", None, None), "b": ("block", 16384, 3), "c": ("feistel", None, None)}


def test_curriculum_plan_prints_the_block_orders(local, tmp_path):
    config = tmp_path / "c.yaml"
    data = {"path": str(local), "max_length": 16, "packing": False, "curriculum": PHASES, "order": {"c": "block"}}
    config.write_text(yaml.safe_dump({"data": data}))
    result = CliRunner().invoke(curriculum, ["plan", str(config), "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "order block: c (blocks of 16,384 samples, 8 a window); the other buckets feistel" in result.output
