"""tokenloom curriculum plan|report|status and tokenloom validate --curriculum (through the entry points)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from curriculum_helpers import SEQ_LEN, tokenloom_group, write_yaml

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, write_run_status


def _config(tmp_path, corpus, *, durations=(3000, 4000), allow=False, extra=None):
    data = {
        "path": str(corpus),
        "max_length": SEQ_LEN,
        "packing": False,
        "curriculum": [
            {"duration_tokens": durations[0], "mix": {"a": 1, "b": 1}},
            {"duration_tokens": durations[1], "mix": {"a": 0.2, "b": 0.3, "c": 0.5}},
        ],
        "allow_bucket_exhaustion": allow,
        **(extra or {}),
    }
    return write_yaml(tmp_path / "curriculum.yaml", {"data": data})


# the `tokenloom` command as installed: its subcommands come from the entry points
main = tokenloom_group()


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_clean_config_exits_0_and_never_halts_at_runtime(corpus, tmp_path):
    config = _config(tmp_path, corpus)
    result = run("curriculum", "plan", config, "--json", "--seed", 5)
    payload = json.loads(result.output)
    assert result.exit_code == 0, result.output
    assert payload["plan"]["drains"] == [] and payload["findings"] == []
    ds = CurriculumDataset(CurriculumConfig.from_file(config), seed=5)
    batch = ds.__getitems__(list(range(len(ds)))).batched  # every sample, no BucketExhausted
    assert len(batch["bucket"]) == len(ds) == payload["plan"]["samples"]


def test_shortfall_blocks_unless_exhaustion_is_allowed_and_the_drain_is_exact(corpus, tmp_path):
    config = _config(tmp_path, corpus, durations=(3000, 9000))
    result = run("curriculum", "plan", config, "--json")
    payload = json.loads(result.output)
    assert result.exit_code == 1
    drain = payload["plan"]["drains"][0]
    assert drain["bucket"] == "b" and drain["effect"] == "halt"
    ds = CurriculumDataset(CurriculumConfig.from_file(config), seed=0)
    _, bucket, _ = ds.locate(np.arange(drain["sample"]))
    assert (bucket == ds.buckets.index("b")).sum() == 200  # the bucket's last sample is right before the drain
    assert any(f["code"] == "curriculum.shortfall.b" and f["severity"] == "error" for f in payload["findings"])
    allowed = _config(tmp_path, corpus, durations=(3000, 9000), allow=True)
    result = run("curriculum", "plan", allowed)
    assert result.exit_code == 2 and "WARNING" in result.output and "renormalise" in result.output


def test_budget_mismatch_and_the_formula(corpus, tmp_path):
    config = _config(tmp_path, corpus)
    samples = CurriculumDataset(CurriculumConfig.from_file(config), seed=0).__len__()
    good = run("validate", "--curriculum", config, "--global-batch-size", 8, "--max-steps", samples // 8)
    assert good.exit_code == 0, good.output
    bad = run("validate", "--curriculum", config, "--global-batch-size", 8, "--max-steps", samples // 8 + 10)
    assert (
        bad.exit_code == 1 and "budget_mismatch" in bad.output and f"max_steps should be {samples // 8}" in bad.output
    )
    tolerated = _config(tmp_path, corpus, extra={"allow_budget_mismatch": True})
    assert run("validate", "--curriculum", tolerated, "--global-batch-size", 8, "--max-steps", 1).exit_code == 2
    assert "len(ds) // global_batch_size" in run("curriculum", "plan", "--help").output


def test_unknown_unused_empty_and_missing_twins_are_all_listed(corpus, tmp_path):
    import shutil

    (corpus / "train" / "empty").mkdir()
    (corpus / "val" / "empty").mkdir()
    shutil.rmtree(corpus / "val" / "c")
    config = write_yaml(
        tmp_path / "c.yaml",
        {"data": {"path": str(corpus), "curriculum": [{"duration_tokens": 100, "mix": {"a": 1, "web": 1}}]}},
    )
    result = run("validate", "--curriculum", config)
    assert result.exit_code == 1
    for text in ("['web']", "val twin missing", "is empty and no phase uses it", "unused_buckets"):
        assert text in result.output, text


def test_plot_and_table(corpus, tmp_path):
    config = _config(tmp_path, corpus, durations=(3000, 9000), allow=True)
    result = run("curriculum", "plan", config, "--plot", tmp_path / "plan.png")
    assert result.exit_code == 2
    assert "drain points" in result.output and "phase" in result.output
    png = (tmp_path / "plan.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_report_realised_vs_target(corpus, tmp_path):
    config = _config(tmp_path, corpus)
    result = run("curriculum", "report", config, "--step", 20, "--global-batch-size", 10, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["position"] == 200
    first = payload["phases"][0]
    assert first["tokens"] == sum(row["tokens"] for row in first["buckets"].values())
    for row in first["buckets"].values():
        assert abs(row["tokens"] - row["target_tokens"]) <= 2 * SEQ_LEN
        assert row["planned_tokens"] == row["tokens"]
        assert row["padding"] == 0 and row["loss_tokens"] == row["tokens"]  # windows: every label counts


def test_status_prints_and_halted_exits_3(tmp_path):
    write_run_status(tmp_path / "run", "halted", bucket="b", phase=1, step=7, message="bucket 'b' runs dry")
    write_run_status(tmp_path / "run", "stopped", step=8)
    result = run("curriculum", "status", tmp_path / "run")
    assert result.exit_code == 3 and "halted" in result.output and "bucket" in result.output
    write_run_status(tmp_path / "run", "running", after_halt=True, step=8)
    assert run("curriculum", "status", tmp_path / "run").exit_code == 0


def test_status_without_a_status_file_names_the_error_class(tmp_path):
    """Found by tools/fuzz/catalogue.py: the one error line named no DataError class."""
    (tmp_path / "run").mkdir()
    for run_dir in (tmp_path / "run", tmp_path / "nowhere"):
        result = run_cli_errors("curriculum", "status", run_dir)
        assert result.exit_code == 1
        assert result.output.strip().splitlines() == [
            f"Error: MissingFileError: {run_dir} has no run status (run_status.json) [file {run_dir}]. "
            "Pass the directory your training loop gives to record_halt(run_dir, error) or "
            "write_run_status(run_dir, status)"
        ]


def run_cli_errors(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_bad_config_is_blocking_with_the_message(tmp_path):
    (tmp_path / "c.yaml").write_text("data:\n  path: .\n  curriculum:\n    - duration_tokens: 5e9\n      mix: {a: 1}\n")
    result = run("validate", "--curriculum", tmp_path / "c.yaml")
    assert result.exit_code == 1 and "5000000000" in result.output


@pytest.mark.parametrize("command", ["plan", "report", "status"])
def test_help_has_an_example(command):
    assert "Example" in run("curriculum", command, "--help").output


def test_under_halt_the_drains_after_the_first_are_not_reached(corpus, tmp_path):
    halting = json.loads(run("curriculum", "plan", _config(tmp_path, corpus, durations=(3000, 30000)), "--json").output)
    effects = [d["effect"] for d in halting["plan"]["drains"]]
    assert len(effects) >= 2, halting["plan"]["drains"]  # the corpus runs out of more than one bucket
    assert effects == ["halt"] + ["not reached (after the halt)"] * (len(effects) - 1)
    allowed = _config(tmp_path, corpus, durations=(3000, 30000), allow=True)
    renormalising = json.loads(run("curriculum", "plan", allowed, "--json").output)
    assert {d["effect"] for d in renormalising["plan"]["drains"]} == {"renormalise"}


def test_report_names_a_bad_state_file_and_says_when_the_position_is_past_the_end(corpus, tmp_path):
    config = _config(tmp_path, corpus)
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\xff\xfe not json")
    result = CliRunner().invoke(main, ["curriculum", "report", str(config), "--state", str(junk)])
    assert result.exit_code == 1 and "FormatError: the sampler state is not JSON" in result.output
    assert str(junk) in result.output and "sampler_state_from_loader" in result.output
    junk.write_text('{"epoch": 0}')
    result = CliRunner().invoke(main, ["curriculum", "report", str(config), "--state", str(junk)])
    assert result.exit_code == 1 and "has no 'consumed' position" in result.output
    length = len(CurriculumDataset(CurriculumConfig.from_file(config), seed=0))
    past = ["curriculum", "report", str(config), "--step", "10000", "--global-batch-size", "8"]
    result = CliRunner().invoke(main, past)
    assert result.exit_code == 0 and f"up to sample {length:,}" in result.output
    assert f"note: sample 80,000 is past the end: the curriculum ends at sample {length:,}" in result.output


def test_a_config_that_does_not_parse_is_one_line_with_its_line_number(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("data:\n  path: .\n  curriculum: [\n")
    result = run("validate", "--curriculum", broken)
    line = next(x for x in result.output.splitlines() if "cannot parse" in x)
    assert "at line 4, column 1" in line and "Fix the YAML syntax" in line and "<unicode string>" not in result.output


def test_an_unknown_bucket_names_the_phase_the_file_and_the_fix(corpus, tmp_path):
    data = {
        "path": str(corpus),
        "max_length": SEQ_LEN,
        "packing": False,
        "curriculum": [
            {"duration_tokens": 3000, "mix": {"a": 1}},
            {"duration_tokens": 3000, "mix": {"a": 0.5, "bogus": 0.5}},
        ],
    }
    config = write_yaml(tmp_path / "typo.yaml", {"data": data})
    result = run("validate", "--curriculum", config)
    line = next(x for x in result.output.splitlines() if "bogus" in x)
    assert result.exit_code == 1 and "phase(s) [1]" in line and str(config) in line
    assert "not under" in line and "fix the names in the mix" in line
