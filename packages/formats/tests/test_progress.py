"""Deep validation reports progress: (stage, done, total), monotone per stage, reaching the total."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tokenloom.formats import open_dataset, open_writer
from tokenloom.formats.cli.commands import validate
from tokenloom.formats.cli.deep import _stage_bars


def _write(path: Path, fmt: str = "native") -> int:
    rng = np.random.default_rng(0)
    tokens = 0
    shards = {} if fmt == "megatron" else {"shard_size_tokens": 700_000}
    with open_writer(path, format=fmt, dtype="uint16", vocab_size=1000, eos_id=0, **shards) as w:
        for _ in range(30):  # 3 M tokens, 6 MB in several shards: several 1 MiB checksum chunks
            doc = np.append(rng.integers(1, 1000, 100_000), 0)
            w.add(doc)
            tokens += len(doc)
    return tokens


def _stages(calls: list[tuple[str, int, int]]) -> dict[str, list[tuple[int, int]]]:
    stages: dict[str, list[tuple[int, int]]] = {}
    for stage, done, total in calls:
        stages.setdefault(stage, []).append((done, total))
    return stages


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("native", {"checksums", "token ids", "EOS placement"}),
        ("flat", {"checksums", "token ids"}),  # entries come from recorded lengths, not EOS: no EOS check
        ("megatron", {"token ids", "EOS placement"}),  # no manifest, no checksums
    ],
)
def test_deep_open_reports_monotone_progress_reaching_the_total(tmp_path: Path, fmt: str, expected: set) -> None:
    target = tmp_path / "ds" / ("data" if fmt == "megatron" else "")
    tokens = _write(target, fmt)
    calls: list[tuple[str, int, int]] = []
    options: dict[str, int] = {"vocab_size": 1000, "eos_id": 0} if fmt == "megatron" else {}
    ds = open_dataset(tmp_path / "ds", validate="deep", on_progress=lambda *c: calls.append(c), **options)  # pyright: ignore[reportArgumentType]
    stages = _stages(calls)
    assert set(stages) == expected
    for stage, points in stages.items():
        total = points[0][1]
        assert points[0][0] == 0 and all(t == total for _, t in points)
        dones = [d for d, _ in points]
        assert dones == sorted(dones) and dones[-1] == total, stage
    assert stages["token ids"][-1][1] == tokens == ds.num_tokens
    if "EOS placement" in stages:
        assert stages["EOS placement"][-1][1] == len(ds)
    if fmt != "megatron":
        size = sum(p.stat().st_size for p in (tmp_path / "ds").iterdir() if p.name != "manifest.json")
        assert stages["checksums"][-1][1] == size and len(stages["checksums"]) > 6  # chunk by chunk


def test_no_callback_no_calls_and_fast_open_reports_nothing(tmp_path: Path) -> None:
    _write(tmp_path / "ds")
    calls: list[tuple[str, int, int]] = []
    open_dataset(tmp_path / "ds", validate="fast", on_progress=lambda *c: calls.append(c))
    assert calls == []
    open_dataset(tmp_path / "ds", validate="deep")  # no callback: nothing to report to, nothing fails


def test_validate_deep_is_quiet_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    _write(tmp_path / "ds")
    result = CliRunner().invoke(validate, [str(tmp_path / "ds"), "--deep"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert "problems   none (deep validation)" in result.stdout


def test_the_bars_show_a_percentage_per_stage(tmp_path: Path) -> None:
    """What a terminal shows: one bar per stage, its percentage and counts, fed by the callback."""
    import io

    from rich.console import Console

    _write(tmp_path / "ds")
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with _stage_bars(console, enabled=True) as bars:
        assert bars is not None
        open_dataset(tmp_path / "ds", validate="deep", on_progress=bars)
        finished = {t.description: (t.completed, t.total, t.percentage) for t in bars.progress.tasks}
        columns = bars.progress.columns
    assert set(finished) == {"checksums", "token ids", "EOS placement"}
    assert all(done == total and percent == 100.0 for done, total, percent in finished.values())
    assert {type(c).__name__ for c in columns} >= {"BarColumn", "TaskProgressColumn", "TimeRemainingColumn"}
    with _stage_bars(console, enabled=False) as none:
        assert none is None
