"""Record stores (sft, dpo, grpo) read from a real S3 server: ``open_records(URL)`` equals the local store.

Found by the chaos integration test (integration-tests/tests/test_chaos_torchrun.py): ``open_records`` took
every path for a local directory, so a post-training store in a bucket could not be read at all.
"""

from __future__ import annotations

import pickle
import uuid

import numpy as np

from tokenloom.formats import RecordStoreWriter, open_records


def _values(record: dict[str, object]) -> dict[str, list]:
    return {key: [np.asarray(v).tolist() for v in value] if isinstance(value, list) else np.asarray(value).tolist()
            for key, value in record.items()}  # fmt: skip


def test_a_record_store_in_a_bucket_reads_as_the_local_one(seaweed, tmp_path, monkeypatch):
    local = tmp_path / "grpo"
    with RecordStoreWriter(local, train_type="grpo", dtype="uint16", key_dtypes={"masks": "bool"}) as writer:
        for i in range(40):
            responses = [[i, i + 1][: 1 + j % 2] * (1 + j) for j in range(1 + i % 3)]
            masks = [[1] * len(r) for r in responses]
            writer.add_record(
                {"prompts": [i, 7], "responses": responses, "masks": masks, "rewards": [0.5] * len(masks)}
            )
    url = seaweed.upload_dir(local, f"records-{uuid.uuid4().hex[:8]}")
    for name, value in {**seaweed.env, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ALLOW_HTTP": "true",
                        "AWS_REGION": "us-east-1", "TOKENLOOM_CACHE_DIR": str(tmp_path / "cache")}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    remote, expected = open_records(url), open_records(local)
    assert str(remote.path) == url and len(remote) == len(expected) == 40  # named by its URL, not the local view
    assert [_values(remote.record(i)) for i in range(40)] == [_values(expected.record(i)) for i in range(40)]
    copy = pickle.loads(pickle.dumps(remote))  # what a DataLoader worker receives: it reads through the cache
    assert _values(copy.record(39)) == _values(expected.record(39))
    assert list((tmp_path / "cache").rglob("b*-0"))  # the data files came by blocks through the node's cache
