"""`tokenloom demo`, the README's first command, passes and leaves what it promises; a failed check fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tokenloom.demo import run_demo


def test_demo_command_passes_its_resume_check(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}
    result = subprocess.run(  # a relative --workdir, as in the help's example (the gloo init file must not be)
        [sys.executable, "-m", "tokenloom.formats", "demo", "--workdir", "work", "--steps", "30"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed: every sample consumed exactly once" in result.stdout
    for name in ("tokenloom-demo.png", "curriculum-plan.png"):
        assert (tmp_path / "work" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert name in result.stdout  # the summary prints where the plots are
    config = tmp_path / "work" / "curriculum.yaml"
    assert str(config) in result.stdout and "curriculum:" in config.read_text()
    for bucket in ("modules", "classes", "functions"):
        for split in ("train", "val"):
            assert (tmp_path / "work" / "buckets" / split / bucket / "manifest.json").is_file()
    for line in ("validate --curriculum exit 0", "each the sample the schedule names", "broadcast to 2 gloo ranks",
                 "resumed batches byte-identical", "curriculum mix: target vs realised", "--train-type sft",
                 "each with its end marker", "the records of an uninterrupted run"):  # fmt: skip
        assert line in result.stdout, result.stdout
    assert "FAILED" not in result.stdout
    inspected = (tmp_path / "work" / "sft-inspect.txt").read_text()  # `tokenloom inspect --records 3` output
    assert "── record 2 ·" in inspected and "What does `" in inspected


def test_demo_without_workdir_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cwd").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", "demo", "--steps", "10"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path / "cwd",
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert list((tmp_path / "tmp").iterdir()) == []  # the temporary workdir is gone
    # the plots it printed stay
    assert sorted(p.name for p in (tmp_path / "cwd").iterdir()) == ["curriculum-plan.png", "tokenloom-demo.png"]


def test_run_demo_accounts_for_every_sample_and_a_failed_check_fails_it(tmp_path: Path) -> None:
    report = run_demo(tmp_path, steps=25, log=lambda _line: None, plot=False)
    assert report.consumed_once
    assert (report.duplicates, report.missing) == (0, 0)
    assert report.steps_before == 25
    assert report.steps_after > 0
    assert report.tokens > 100_000
    assert 0 <= report.packing_padding < 0.05
    c, e, s = report.curriculum, report.eval, report.stream
    assert c is not None and e is not None and s is not None
    assert c.exactly_once and c.mix_ok and (c.duplicates, c.missing, c.wrong_samples) == (0, 0, 0)
    (_, end0), (start1, end1) = c.phase_bounds
    assert end0 == start1 < c.checkpoint < end1 == c.samples  # the checkpoint falls inside the second phase
    assert c.steps_after > 0 and len(c.mix) == 2
    assert e.ok and e.tokens > 0 and e.loss > 0
    assert s.bit_exact and s.resumed > 0
    p = report.posttrain
    assert p is not None and p.tokenize_exit == 0 and p.inspect_exit == 0
    assert p.multi_turn > 0 and p.with_system > 0 and p.prompt_completion > 0
    assert p.records + p.skipped_too_long == p.conversations and p.masks_ok and p.masks_checked == p.records
    assert 0 < p.trained_tokens < p.tokens
    assert 0 < p.checkpoint < p.packed and p.steps_after > 0
    assert p.exactly_once and p.same_as_uninterrupted and p.consumed == p.records
    assert (p.duplicates, p.missing, p.wrong_content) == (0, 0, 0)
    assert report.failures() == []

    # each check can fail the demo (the command exits 1 when failures() is not empty)
    for leg, name, value in [
        (report, "consumed_once", False),
        (c, "exactly_once", False),
        (c, "mix_ok", False),
        (c, "validate_exit", 1),
        (e, "same_loss", False),
        (e, "error", "eval ranks [1] did not finish"),
        (s, "matching", s.matching - 1),
        (p, "tokenize_exit", 1),
        (p, "mask_errors", ["record 0: trained text differs"]),
        (p, "inspect_exit", 1),
        (p, "exactly_once", False),
        (p, "same_as_uninterrupted", False),
    ]:
        saved = getattr(leg, name)
        setattr(leg, name, value)
        assert report.failures(), name
        setattr(leg, name, saved)
    assert report.failures() == []
