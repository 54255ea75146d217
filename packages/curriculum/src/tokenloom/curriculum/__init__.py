"""tokenloom.curriculum: token-budget phases over data buckets, on a schedule fixed before step 0.

    buckets (PATH/train/<bucket>/ token shards, wave-1 datasets)
        -> plan      phases cut at every drain; exact sample/token positions, known up front
        -> schedule  global position g -> (phase, bucket, index in the bucket's permutation), O(1)
                     (CurriculumPlan: plan and schedule without torch, what `validate --curriculum` builds)
        -> sampler   ResumableDistributedSampler(shuffle=False) splits g over ranks and workers
        -> loader    DataLoader / StatefulDataLoader; state = one number, any topology

Example::

    from tokenloom.curriculum import CurriculumConfig, CurriculumDataset
    from tokenloom.sampler import ResumableDistributedSampler

    cfg = CurriculumConfig.from_file("curriculum.yaml")   # GPT-Simple's data: block, or TOML
    ds = CurriculumDataset(cfg, seed=1234)                  # len(ds): samples of the whole curriculum
    sampler = ResumableDistributedSampler(ds, shuffle=False, seed=1234)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=8, num_workers=2)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports

if TYPE_CHECKING:
    from tokenloom.curriculum._buckets import Bucket, sample_budget_tokens
    from tokenloom.curriculum._config import BudgetUnit, CurriculumConfig, ExhaustionPolicy, Phase
    from tokenloom.curriculum._dataset import STATE_FORMAT, CurriculumDataset
    from tokenloom.curriculum._errors import BucketExhausted, BucketMismatchError, EmptyBucketError, MissingValTwinError
    from tokenloom.curriculum._findings import Finding, findings
    from tokenloom.curriculum._order import BucketOrder
    from tokenloom.curriculum._plan import CurriculumPlan, build_plan
    from tokenloom.curriculum._status import STATUS_FILE, read_run_status, record_halt, write_run_status

#: Public name -> the module that defines it, imported on first use: ``import tokenloom.curriculum`` (and
#: so ``tokenloom curriculum status`` and every ``--help``) costs no torch until a dataset is asked for.
_EXPORTS = {
    "Bucket": "tokenloom.curriculum._buckets",
    "sample_budget_tokens": "tokenloom.curriculum._buckets",
    "BucketOrder": "tokenloom.curriculum._order",
    "BudgetUnit": "tokenloom.curriculum._config",
    "CurriculumConfig": "tokenloom.curriculum._config",
    "ExhaustionPolicy": "tokenloom.curriculum._config",
    "Phase": "tokenloom.curriculum._config",
    "STATE_FORMAT": "tokenloom.curriculum._dataset",
    "CurriculumDataset": "tokenloom.curriculum._dataset",
    "BucketExhausted": "tokenloom.curriculum._errors",
    "BucketMismatchError": "tokenloom.curriculum._errors",
    "EmptyBucketError": "tokenloom.curriculum._errors",
    "MissingValTwinError": "tokenloom.curriculum._errors",
    "Finding": "tokenloom.curriculum._findings",
    "findings": "tokenloom.curriculum._findings",
    "CurriculumPlan": "tokenloom.curriculum._plan",
    "build_plan": "tokenloom.curriculum._plan",
    "STATUS_FILE": "tokenloom.curriculum._status",
    "read_run_status": "tokenloom.curriculum._status",
    "record_halt": "tokenloom.curriculum._status",
    "write_run_status": "tokenloom.curriculum._status",
}

__all__ = [
    "STATE_FORMAT",
    "STATUS_FILE",
    "Bucket",
    "BucketExhausted",
    "BucketMismatchError",
    "BucketOrder",
    "BudgetUnit",
    "CurriculumConfig",
    "CurriculumDataset",
    "CurriculumPlan",
    "EmptyBucketError",
    "ExhaustionPolicy",
    "Finding",
    "MissingValTwinError",
    "Phase",
    "build_plan",
    "findings",
    "read_run_status",
    "record_halt",
    "sample_budget_tokens",
    "write_run_status",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
