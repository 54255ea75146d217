"""torchdata's StatefulDataLoader warns about a torch function that is gone on every loader built (#21)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torchdata")


def test_a_stateful_dataloader_over_the_sampler_shows_no_set_vital_warning():
    code = (
        "import warnings\n"
        "warnings.simplefilter('default')\n"
        "from tokenloom.sampler import ResumableDistributedSampler\n"
        "from torchdata.stateful_dataloader import StatefulDataLoader\n"
        "data = list(range(40))\n"
        "for workers in (0, 2):\n"
        "    sampler = ResumableDistributedSampler(data, num_replicas=1, rank=0, seed=1)\n"
        "    loader = StatefulDataLoader(data, batch_size=4, sampler=sampler, num_workers=workers)\n"
        "    seen = sorted(int(x) for batch in loader for x in batch)\n"
        "    assert seen == data, seen\n"
        "    loader.state_dict()\n"
        "    print('LOADER', workers)\n"
        "warnings.warn('other UserWarnings still show')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("LOADER") == 2
    assert "set_vital" not in proc.stderr, proc.stderr
    assert "other UserWarnings still show" in proc.stderr
