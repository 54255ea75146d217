"""Three real gloo ranks; a bucket drains: every rank stops at the same step, no rank hangs, status halted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # spawned children inherit sys.path
import curriculum_gloo_worker
from curriculum_helpers import SEQ_LEN, write_yaml

from tokenloom.curriculum import CurriculumConfig, CurriculumDataset, read_run_status
from tokenloom.testing.ranks import run_ranks

TIMEOUT_S = 240


@pytest.mark.slow
def test_three_gloo_ranks_halt_at_the_same_step_without_a_collective(corpus, tmp_path):
    config_file = write_yaml(
        tmp_path / "curriculum.yaml",
        {
            "data": {
                "path": str(corpus),
                "max_length": SEQ_LEN,
                "packing": False,
                "curriculum": [
                    {"duration_tokens": 3000, "mix": {"a": 1, "b": 1}},
                    {"duration_tokens": 8000, "mix": {"b": 0.7, "c": 0.3}},
                ],
            }
        },
    )
    world, batch = 3, 4
    expected = CurriculumDataset(CurriculumConfig.from_file(config_file), seed=99, global_batch_size=world * batch)
    assert expected.halt is not None and expected.halt_step() is not None
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_ranks(
        curriculum_gloo_worker.run_rank, (world, str(workdir), str(config_file), batch), world, timeout_s=TIMEOUT_S
    )
    results = [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(world)]
    assert {r["completed_steps"] for r in results} == {expected.halt_step()}
    assert all(r["bucket"] == "b" and r["error_step"] == expected.halt_step() for r in results)
    status = read_run_status(workdir / "run")
    assert status is not None and status["status"] == "halted"  # "stopped" did not overwrite it
    assert status["bucket"] == "b" and status["step"] == expected.halt_step()
