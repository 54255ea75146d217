"""An outage during a DataLoader epoch with 2 workers: identical bytes, at most one wait line per worker process."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import numpy as np
import pytest

from tokenloom.formats import RemoteOptions, open_dataset, open_writer

torch = pytest.importorskip("torch")


def _write_native(root: Path) -> Path:
    rng = np.random.default_rng(5)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(400):
            doc = rng.integers(1, 50_000, size=int(rng.integers(5, 300)), dtype=np.uint16)
            writer.add(np.append(doc, np.uint16(0)))
    return root


class Items(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return np.asarray(self.ds[i]).tobytes()


def test_outage_during_a_two_worker_epoch(seaweed, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOOM_RETRY_BUDGET", "60")
    local = _write_native(tmp_path / "local")
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    expected = [np.asarray(e).tobytes() for e in open_dataset(local)]
    ds = open_dataset(
        url,
        remote=RemoteOptions.from_keywords(
            storage_options=seaweed.storage_options(endpoint=fault_proxy.url),
            block_cache_dir=tmp_path / "c",
            block_size=4096,
        ),
    )
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
