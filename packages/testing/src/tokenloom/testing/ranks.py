"""Real ranks in separate processes for tests of distributed code: started, joined, killed on a hang."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["run_ranks"]


def run_ranks(
    worker: Callable[..., Any], args: tuple[Any, ...], nprocs: int, *, timeout_s: float, start_method: str = "spawn"
) -> None:
    """Run ``worker(rank, *args)`` in ``nprocs`` processes; a rank still running after ``timeout_s`` fails the
    test as a hang, and every rank left alive is killed (torch's ``start_processes``; imported here, so the
    testing member needs no torch of its own)."""
    from torch.multiprocessing.spawn import start_processes

    context = start_processes(worker, args=args, nprocs=nprocs, join=False, start_method=start_method)
    if context is None:  # join=False always returns one
        raise RuntimeError("start_processes returned no context")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                pytest.fail(f"{nprocs} ranks did not finish within {timeout_s} s (a hang)")
    finally:
        for process in context.processes:
            if process is not None and process.is_alive():
                process.kill()
