"""Real gloo ranks in separate processes: 2 ranks part-way, then 3 ranks resume to the end."""

import json
import sys
import time
from pathlib import Path

import pytest
from torch.multiprocessing.spawn import start_processes

from tokenloom.sampler import ResumableDistributedSampler

sys.path.insert(0, str(Path(__file__).parent))  # spawned children inherit sys.path
import sampler_gloo_worker

N = 61
TIMEOUT_S = 90


def spawn_ranks(world: int, workdir: Path, steps: int, state_file: Path | None) -> list[dict]:
    workdir.mkdir()
    context = start_processes(
        sampler_gloo_worker.run_rank,
        args=(world, str(workdir), N, steps, None if state_file is None else str(state_file)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    assert context is not None
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process is not None and process.is_alive():
                    process.kill()
            pytest.fail(f"{world} gloo ranks did not finish within {TIMEOUT_S} s (a hang)")
    return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_two_gloo_ranks_then_three_continue_one_global_order(tmp_path: Path) -> None:
    first = spawn_ranks(2, tmp_path / "two", steps=9, state_file=None)
    assert [(out["rank"], out["world"]) for out in first] == [(0, 2), (1, 2)]
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(first[0]["state"]))
    assert first[0]["state"]["consumed"] == 18

    second = spawn_ranks(3, tmp_path / "three", steps=-1, state_file=state_file)
    assert [(out["rank"], out["world"]) for out in second] == [(0, 3), (1, 3), (2, 3)]

    merged = [i for step in zip(*(out["indices"] for out in first), strict=True) for i in step]
    merged += [i for step in zip(*(out["indices"] for out in second), strict=True) for i in step]
    single = list(ResumableDistributedSampler(N, 1, 0, seed=21))
    assert merged[:N] == single  # exactly once, in the single-rank order
    padded = len(merged) - N
    assert padded == (3 - (N - 18) % 3) % 3 == 2
    assert merged[N:] == single[:padded]
