"""Review of issue 36's bucket completion (manifest_complete/records_complete, _bucket_objects folded into _bucket)
under the one unit executor: a text run to an s3:// output with two workers, SIGKILLed twice mid-upload, then
finished in process (another executor), with or without its local plan cache: the bucket holds the bytes of an
uninterrupted local run."""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from tokenize_helpers import REMOTE_TOKENIZE_SCRIPT, kill_script_when, same_dataset, wait_group_gone

from tokenloom.formats import RemoteOptions
from tokenloom.tokenize import TokenizeConfig, tokenize

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and process groups")

OPTIONS: dict[str, Any] = {"shard_size_tokens": 3000, "chunk_lines": 40, "seq_len": 64, "overlap_size": 16}
SCRIPT = REMOTE_TOKENIZE_SCRIPT


@pytest.mark.parametrize("cache", ["kept", "lost"])
def test_two_worker_upload_killed_twice_then_finished_in_process(
    cache: str, seaweed, fault_proxy, jsonl_dir, make_texts, tiny_tokenizer, tmp_path: Path
) -> None:
    texts = make_texts(900, seed=4)
    corpus = jsonl_dir({f"part{i}.jsonl": [{"text": t} for t in texts[i * 300 : (i + 1) * 300]] for i in range(3)})
    local = tmp_path / "local"
    tokenize(TokenizeConfig(input_dir=corpus, output_dir=local, tokenizer=str(tiny_tokenizer), num_workers=0,
                            num_nodes=1, **OPTIONS))  # fmt: skip
    url = f"s3://{seaweed.bucket}/review-{uuid.uuid4().hex[:8]}"
    kwargs: dict[str, Any] = {
        "input_dir": str(corpus),
        "output_dir": url,
        "tokenizer": str(tiny_tokenizer),
        "num_workers": 2,
        "storage_options": seaweed.storage_options(fault_proxy.url),
        "plan_cache_dir": str(tmp_path / "cache"),
        **OPTIONS,
    }
    fault_proxy.fault_methods = {"PUT"}
    fault_proxy.stall_seconds = 0.1
    fault_proxy.faults = ["stall"] * 10_000

    def units() -> int:
        return sum(1 for path in fault_proxy.uploads if "/unit_" in path)

    for at_least in (2, 5):
        group = kill_script_when(SCRIPT, kwargs, lambda n=at_least: units() >= n, 90)
        assert wait_group_gone(group)
        fault_proxy.wait_idle()
    assert "manifest.json" not in seaweed.objects(url)
    fault_proxy.faults = []
    if cache == "lost":
        shutil.rmtree(tmp_path / "cache")
    remote = RemoteOptions.from_keywords(storage_options=seaweed.storage_options())
    rest = {k: v for k, v in kwargs.items() if k != "storage_options"}
    rest.update(num_workers=0, input_dir=corpus, plan_cache_dir=tmp_path / "cache")
    config = TokenizeConfig(**rest, remote=remote)
    summary = tokenize(config)
    assert not summary.already_complete
    same_dataset(local, seaweed.objects(url))
    assert tokenize(config).already_complete
