"""An outage during a DataLoader epoch with 2 workers: identical bytes, at most one wait line per worker process."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest
from formats_helpers import open_cached, write_random_native

from tokenloom.formats import open_dataset

torch = pytest.importorskip("torch")


class Items(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return np.asarray(self.ds[i]).tobytes()


def test_outage_during_a_two_worker_epoch(seaweed, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "60")
    local = write_random_native(tmp_path / "local", seed=5, docs=400)
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    expected = [np.asarray(e).tobytes() for e in open_dataset(local)]
    ds = open_cached(url, seaweed.storage_options(endpoint=fault_proxy.url), tmp_path / "c", 4096)
    logfile = tmp_path / "log.txt"
    handler = logging.FileHandler(logfile)
    handler.setFormatter(logging.Formatter("%(process)d %(message)s"))
    logger = logging.getLogger("tokenloom.formats.remote")
    logger.addHandler(handler)
    try:
        loader = torch.utils.data.DataLoader(Items(ds), batch_size=None, num_workers=2, prefetch_factor=2)
        got = []
        for n, item in enumerate(loader):
            got.append(item)
            if n == 20:
                fault_proxy.down_for(3, "503")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert got == expected
    lines = [line for line in logfile.read_text().splitlines() if "waiting for" in line]
    pids = {line.split()[0] for line in lines}
    assert fault_proxy.injected["down"] > 2 and lines  # the outage was met, and said
    assert len(lines) == len(pids) <= 2, lines  # one line per worker that met it, not one per retry
