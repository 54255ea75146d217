"""A curriculum whose data.path is a bucket prefix on a real S3 server: same samples, local caches, named changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from curriculum_helpers import make_corpus, write_yaml

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, CurriculumPlan, Phase
from tokenloom.formats import ConfigError, MissingFileError, RemoteOptions, ResumeMismatchError

SEED = 11
PHASES = [
    {"duration_tokens": 1600, "mix": {"a": 1, "b": 1}},
    {"duration_tokens": 1600, "mix": {"b": 1, "c": 3}},
]


def upload_tree(seaweed, local: Path) -> str:
    prefix = f"cur-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(local, prefix)
    return f"s3://{seaweed.bucket}/{prefix}"


@pytest.fixture
def remote_corpus(seaweed, tmp_path):
    local = make_corpus(tmp_path / "data", {"a": 60, "b": 40, "c": 80})
    return local, upload_tree(seaweed, local)


def _windows(ds: CurriculumDataset) -> np.ndarray:
    return np.stack([ds[i]["input_ids"].numpy() for i in range(len(ds))])


def test_a_yaml_config_reads_buckets_from_s3_into_its_cache_dir(seaweed, remote_corpus, tmp_path, monkeypatch):
    local, url = remote_corpus
    monkeypatch.chdir(tmp_path)
    options = seaweed.storage_options()
    data = {"path": url, "max_length": 16, "packing": False, "curriculum": PHASES, "allow_bucket_exhaustion": True}
    config_file = write_yaml(tmp_path / "cfg.yaml", {**data, "storage_options": options, "block_cache_dir": "node0"})
    ds = CurriculumDataset(config_file, seed=SEED)
    reference = CurriculumDataset(CurriculumConfig.from_dict({**data, "path": str(local)}), seed=SEED)
    assert ds.buckets == ["a", "b", "c"] and len(ds) == len(reference)
    assert np.array_equal(_windows(ds), _windows(reference))
    assert ds.identity()["data"] != reference.identity()["data"]  # the objects' ETags are in the fingerprints
    assert list((tmp_path / "node0").rglob("b*-0")), "blocks go to the config's block_cache_dir (relative to the file)"
    assert not (tmp_path / "s3:").exists()
    assert str(options["secret_access_key"]) not in repr(ds.config) + json.dumps(ds.state_dict(0))
    val = ds.val_dataset("b")
    assert len(val) == 4


def test_the_environment_supplies_the_endpoint_credentials_and_cache(seaweed, remote_corpus, tmp_path):
    _, url = remote_corpus
    config_file = write_yaml(tmp_path / "cfg.yaml", {"path": url, "max_length": 16, "packing": True})
    env = {
        **os.environ,
        **seaweed.env,
        "AWS_ENDPOINT_URL": seaweed.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "TOKENLOOM_CACHE_DIR": str(tmp_path / "env-cache"),
    }
    code = (
        "import sys; from tokenloom.curriculum import CurriculumPlan; "
        "plan = CurriculumPlan(sys.argv[1], seed=1, plan_cache_dir=sys.argv[2]); print(plan.buckets, len(plan))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(config_file), str(tmp_path / "plans")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("['a', 'b', 'c']")
    assert list((tmp_path / "env-cache").rglob("whole")) and list((tmp_path / "plans").glob("packplan-*"))


def test_a_bucket_changed_between_save_and_resume_is_named(seaweed, remote_corpus, tmp_path):
    local, url = remote_corpus
    config = CurriculumConfig(
        path=url,
        seq_len=16,
        packing=False,
        curriculum=tuple(Phase(**p) for p in PHASES),
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(), block_cache_dir=tmp_path / "node0"
        ),
    )
    state = CurriculumDataset(config, seed=SEED).state_dict(consumed=5)
    assert any(key.endswith("train/c/shard_00000.bin") for key in state["data_objects"])
    shard = local / "train" / "c" / "shard_00000.bin"
    changed = bytearray(shard.read_bytes())
    changed[:2] = b"\x01\x00"
    seaweed.put(f"{url.split('/', 3)[3]}/train/c/shard_00000.bin", bytes(changed))
    resumed = CurriculumDataset(
        config.replace(remote=RemoteOptions.from_keywords(remote=config.remote, block_cache_dir=tmp_path / "node1")),
        seed=SEED,
    )
    with pytest.raises(ResumeMismatchError, match=r"train/c/shard_00000\.bin changed \(saved size:ETag"):
        resumed.load_state_dict(state)


def test_bad_remote_settings_are_named(seaweed, remote_corpus, tmp_path):
    local, url = remote_corpus
    with pytest.raises(ConfigError, match=r"remote \(storage_options, block_cache_dir\) is set but data.path"):
        CurriculumConfig.from_dict({"path": str(local), "storage_options": {"region": "x"}})
    with pytest.raises(ConfigError, match="block_cache_dir is 's3://b/c', expected a local directory"):
        CurriculumConfig.from_dict({"path": url, "block_cache_dir": "s3://b/c"}, source=str(tmp_path / "cfg.yaml"))
    missing = CurriculumConfig(
        path=url + "-nope", remote=RemoteOptions.from_keywords(storage_options=seaweed.storage_options())
    )
    with pytest.raises(MissingFileError, match=r"data.path s3://.*-nope does not exist"):
        CurriculumPlan(missing, seed=1)


def test_curriculum_plan_and_validate_commands_read_a_bucket_prefix(seaweed, remote_corpus, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tokenloom.formats.cli import main

    monkeypatch.chdir(tmp_path)
    _, url = remote_corpus
    data = {"path": url, "max_length": 16, "packing": True, "storage_options": seaweed.storage_options()}
    config_file = write_yaml(
        tmp_path / "cfg.yaml", {**data, "block_cache_dir": "node0", "allow_bucket_exhaustion": True}
    )
    plans = ["curriculum", "plan", str(config_file), "--plan-cache-dir", str(tmp_path / "plans")]
    result = CliRunner().invoke(main, plans)
    assert result.exit_code == 0, result.output
    assert "192 samples" in result.output and "0 blocking" in result.output
    old_name = CliRunner().invoke(main, ["curriculum", "plan", str(config_file), "--cache-dir", str(tmp_path)])
    assert old_name.exit_code == 2 and "No such option '--cache-dir'" in old_name.output  # the old name is gone
    helped = CliRunner().invoke(main, ["curriculum", "plan", "--help"]).output
    assert "--plan-cache-dir" in helped and "--cache-dir" not in helped
    checked = CliRunner().invoke(main, ["validate", "--curriculum", str(config_file)])
    assert checked.exit_code == 0, checked.output
    secret = str(seaweed.storage_options()["secret_access_key"])
    assert secret not in result.output + checked.output and not (tmp_path / "s3:").exists()
