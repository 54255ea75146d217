"""Wave 3 (#21): BucketExhausted through DataLoader workers, bad config bytes and states, empty unused buckets,
piped tables, the status hint."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from click.testing import CliRunner
from curriculum_helpers import SEQ_LEN, plain_config, tokenloom_group, write_yaml
from torch.utils.data import DataLoader

from tokenloom.curriculum import (
    STATUS_FILE,
    BucketExhausted,
    CurriculumConfig,
    CurriculumDataset,
    Phase,
    record_halt,
)
from tokenloom.formats import ConfigError, ResumeMismatchError
from tokenloom.sampler import ResumableDistributedSampler

main = tokenloom_group()


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def halting(root, **overrides):
    phases = (
        Phase(duration_tokens=3000, mix={"a": 1, "b": 1}),
        Phase(duration_tokens=4000, mix={"a": 0.2, "b": 0.3, "c": 0.5}),
        Phase(duration_tokens=4000, mix={"b": 0.6, "c": 0.4}),
    )
    return CurriculumConfig(path=root, seq_len=SEQ_LEN, packing=False, curriculum=phases, **overrides)


# -- BucketExhausted across processes --------------------------------------------------------------------


def test_bucket_exhausted_from_two_workers_keeps_its_fields_and_a_clean_message(corpus, tmp_path):
    ds = CurriculumDataset(halting(corpus), seed=7, global_batch_size=4)
    direct = ds.exhausted(ds.halt_position)  # what the main process itself would raise
    sampler = ResumableDistributedSampler(ds, num_replicas=1, rank=0, shuffle=False, seed=7)
    loader = DataLoader(ds, sampler=sampler, batch_size=4, num_workers=2)
    with pytest.raises(BucketExhausted) as caught:
        for _ in loader:
            pass
    error = caught.value
    assert (error.bucket, error.phase, error.position, error.step) == (
        direct.bucket,
        direct.phase,
        direct.position,
        direct.step,
    )
    assert error.bucket == "b" and error.step is not None
    assert error.field == "allow_bucket_exhaustion"
    message = str(error)
    assert "Caught" not in message and "Traceback" not in message
    assert message.count(BucketExhausted.default_hint) == 1
    assert message.startswith("bucket 'b' runs dry at sample ")
    assert error.problem.split(" (sample ")[0] == direct.problem.split(" (sample ")[0]
    record_halt(tmp_path / "run", error)
    saved = json.loads((tmp_path / "run" / STATUS_FILE).read_text())
    assert saved["message"] == message and saved["bucket"] == "b" and saved["position"] == direct.position
    assert saved["message"].count("runs dry") == 1


def test_bucket_exhausted_pickles_with_its_fields():
    error = BucketExhausted("bucket 'x' ran out", bucket="x", phase=2, position=90, step=11, field="f")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is BucketExhausted and str(again) == str(error)
    assert (again.bucket, again.phase, again.position, again.step, again.field) == ("x", 2, 90, 11, "f")


def test_a_plain_string_without_fields_is_just_a_message():
    error = BucketExhausted("Caught BucketExhausted in DataLoader worker process 0.\nno fields here")
    assert error.bucket is None and error.position is None


# -- bad inputs ------------------------------------------------------------------------------------------


def test_a_config_that_is_not_utf8_names_the_file_and_the_byte_offset(corpus, tmp_path):
    text = f"data:\n  path: {corpus}\n  # caf\xe9\n".encode("latin-1")
    path = tmp_path / "latin1.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match="not UTF-8") as caught:
        CurriculumConfig.from_file(path)
    offset = text.index(b"\xe9")
    assert caught.value.path == str(path) and caught.value.offset == offset
    result = run("validate", "--curriculum", path)
    assert result.exit_code == 1 and "not UTF-8" in result.output and f"offset {offset}" in result.output


@pytest.mark.parametrize("garbage", ["abc", None, -3, 1.5, True, [1]])
def test_a_state_with_a_garbage_policy_prefix_is_a_resume_mismatch(corpus, garbage):
    ds = CurriculumDataset(halting(corpus), seed=7)
    state = ds.state_dict(consumed=3)
    state["prefix_end"] = garbage
    other = CurriculumDataset(halting(corpus, bucket_exhaustion="renormalise"), seed=7)
    with pytest.raises(ResumeMismatchError, match="prefix_end"):
        other.load_state_dict(state)


def test_an_empty_bucket_no_phase_uses_is_a_warning_not_a_block(corpus, tmp_path):
    (corpus / "train" / "spare").mkdir()
    (corpus / "val" / "spare").mkdir()
    (corpus / "train" / "later").mkdir()  # no val twin either
    config = write_yaml(
        tmp_path / "c.yaml", plain_config(corpus, [{"duration_tokens": 1000, "mix": {"a": 1, "b": 1, "c": 1}}])
    )
    for command in (["validate", "--curriculum"], ["curriculum", "plan"]):
        result = run(*command, config)
        assert result.exit_code == 2, result.output  # warnings only: the plan is printed
        assert "'spare' is empty and no phase uses it" in result.output
        assert "'later' is empty and no phase uses it" in result.output
        assert "drain points" in result.output
    ds = CurriculumDataset(CurriculumConfig.from_file(config), seed=0)
    assert ds.buckets == ["a", "b", "c"]
    # an empty bucket that a phase does use still blocks
    used = write_yaml(
        tmp_path / "u.yaml",
        {"data": {"path": str(corpus), "curriculum": [{"duration_tokens": 1000, "mix": {"a": 1, "spare": 1}}]}},
    )
    result = run("validate", "--curriculum", used)
    assert result.exit_code == 1 and "empty bucket directory" in result.output


# -- output ----------------------------------------------------------------------------------------------


def test_piped_tables_never_cut_a_bucket_name_and_count_entries(tmp_path):
    from curriculum_helpers import make_corpus

    long_a = "web_crawl_english_high_quality_deduplicated_2026_shard_group_alpha"
    long_b = "books_and_long_form_reference_material_filtered_2026_group_beta"
    corpus = make_corpus(tmp_path / "data", {long_a: 300, long_b: 200})
    config = write_yaml(
        tmp_path / "c.yaml", plain_config(corpus, [{"duration_tokens": 1000, "mix": {long_a: 1, long_b: 1}}])
    )
    result = run("curriculum", "plan", config)
    assert result.exit_code == 0, result.output
    assert long_a in result.output and long_b in result.output
    assert "…" not in result.output
    header = next(line for line in result.output.splitlines() if "bucket" in line and "samples" in line)
    assert "entries" in header and "documents" not in header
    plan = json.loads(run("curriculum", "plan", config, "--json").output)["plan"]
    entries = {b["name"]: b["entries"] for b in plan["buckets"]}
    assert entries == {long_a: int(np.ceil(300 * (SEQ_LEN + 1) / 50)), long_b: int(np.ceil(200 * (SEQ_LEN + 1) / 50))}


def test_status_hint_names_a_real_parameter(tmp_path):
    import inspect

    result = CliRunner().invoke(main, ["curriculum", "status", str(tmp_path)])
    assert result.exit_code == 1 and "run_dir=" not in result.output
    assert "record_halt(run_dir" in result.output
    assert "run_dir" in inspect.signature(record_halt).parameters
    assert "run_dir" not in inspect.signature(CurriculumDataset).parameters
