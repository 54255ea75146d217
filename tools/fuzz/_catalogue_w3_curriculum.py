"""Catalogue rows for wave 3's correctness issue (#21): the curriculum items that are an input or a fault."""

from __future__ import annotations

import json
import os
from pathlib import Path

from _catalogue_base import Outcome, Run, case
from _catalogue_other import _curriculum_corpus, _curriculum_yaml


@case("curriculum plan: a YAML that is not UTF-8", "curriculum", "report")
def _(tmp: Path) -> Run:
    config = _curriculum_yaml(tmp)
    config.write_bytes(config.read_bytes() + b"# caf\xe9\n")

    def check(o: Outcome) -> str | None:
        return None if "ConfigError" in o.stdout and "not UTF-8" in o.stdout and "offset" in o.stdout else "unnamed"

    return Run(argv=["curriculum", "plan", str(config)], sources=[config], check=check)


@case("CurriculumConfig.from_file on a YAML that is not UTF-8", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig

    config = tmp / "latin1.yaml"
    config.write_bytes(b"data:\n  path: .\n  # caf\xe9\n")
    return Run(call=lambda: CurriculumConfig.from_file(config), sources=[config])


@case("curriculum budget_unit: an unknown unit", "curriculum", "report")
def _(tmp: Path) -> Run:
    config = _curriculum_yaml(tmp, budget_unit="tokens")
    return Run(
        argv=["validate", "--curriculum", str(config)],
        sources=[config],
        check=lambda o: (
            None
            if "budget_unit" in o.stdout + o.stderr and "loss_tokens" in o.stdout + o.stderr
            else "the refusal does not name budget_unit and its valid values"
        ),
    )


def _dataset(tmp: Path, **data):
    from tokenloom.curriculum import CurriculumConfig, CurriculumDataset

    return CurriculumDataset(
        CurriculumConfig.from_file(_curriculum_yaml(tmp, **data)), seed=0, plan_cache_dir=tmp / "c"
    )


@case("curriculum state with a garbage prefix_end under another policy", "curriculum", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    saved = _dataset(tmp).state_dict(consumed=2)
    saved["prefix_end"] = "garbage"
    other = _dataset(tmp / "b", allow_bucket_exhaustion=True)
    return Run(call=lambda: other.load_state_dict(saved))


@case(
    "curriculum state saved under loss_tokens, loaded under input_tokens", "curriculum", "error", "ResumeMismatchError"
)
def _(tmp: Path) -> Run:
    saved = _dataset(tmp, budget_unit="loss_tokens").state_dict(consumed=2)
    other = _dataset(tmp / "b")
    return Run(call=lambda: other.load_state_dict(saved))


@case("validate --curriculum with an empty bucket no phase uses", "curriculum", "ok")
def _(tmp: Path) -> Run:
    config = _curriculum_yaml(tmp)
    for split in ("train", "val"):
        (tmp / "buckets" / split / "spare").mkdir()

    def check(o: Outcome) -> str | None:
        return None if "'spare' is empty and no phase uses it" in o.stdout else "not said"

    # exit 2: warnings only (the plan is printed); the runner's "ok" wants 0, so run it as a Python call
    def call() -> int:
        from tokenloom.curriculum._commands import validate_curriculum

        return validate_curriculum(config)

    def judge(o: Outcome) -> str | None:
        return None if o.value == 2 else f"exit code {o.value}, expected 2 (warnings only)"

    return Run(call=call, sources=[config], check=judge)


@case("curriculum plan piped: long bucket names are never cut", "curriculum", "ok")
def _(tmp: Path) -> Run:
    import numpy as np

    from tokenloom.formats import open_writer

    name = "a_bucket_name_much_longer_than_any_table_column_would_allow_2026_v2"
    config = _curriculum_yaml(tmp, curriculum=[{"duration_tokens": 400, "mix": {"a": 1, "b": 1, name: 1}}])
    root = tmp / "buckets"
    for split in ("train", "val"):
        with open_writer(root / split / name, format="native", dtype="uint16", vocab_size=65536, eos_id=65535) as w:
            for start in range(0, 1000, 50):
                w.add(np.append(np.arange(start, start + 49) % 60000, 65535))
    return Run(
        argv=["curriculum", "plan", str(config)],
        sources=[config],
        check=lambda o: None if name in o.stdout and "…" not in o.stdout else "a bucket name was cut",
    )


@case("BucketExhausted from a 2-worker DataLoader: fields kept, clean status message", "curriculum", "ok")
def _(tmp: Path) -> Run:
    def call() -> str | None:
        from torch.utils.data import DataLoader

        from tokenloom.curriculum import BucketExhausted, record_halt

        ds = _dataset(tmp, curriculum=[{"duration_tokens": 3000, "mix": {"a": 3, "b": 1}}], seq_len=16)
        try:
            for _ in DataLoader(ds, batch_size=4, num_workers=2):
                pass
        except BucketExhausted as exc:
            record_halt(tmp / "run", exc)
            status = json.loads((tmp / "run" / "run_status.json").read_text())
            if exc.bucket != "a" or exc.position is None or "Caught" in status["message"]:
                return f"fields {exc.bucket!r} {exc.position!r}, message {status['message'][:80]!r}"
            return None
        return "no BucketExhausted"

    return Run(call=call, check=lambda o: o.value)


@case("packing-plan cache: plan.json is a FIFO", "curriculum", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import PackedDocumentDataset
    from tokenloom.formats import open_dataset

    data = open_dataset(_curriculum_corpus(tmp) / "train" / "a")
    first = PackedDocumentDataset(data, 64, plan_cache_dir=tmp / "c")
    (first.plan_dir / "plan.json").unlink()
    os.mkfifo(first.plan_dir / "plan.json")

    def call() -> int:
        return len(PackedDocumentDataset(data, 64, plan_cache_dir=tmp / "c"))

    return Run(call=call, check=lambda o: None if o.value == len(first) else "another plan")
