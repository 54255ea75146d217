"""tokenloom.curriculum: token-budget phases over data buckets, on a schedule fixed before step 0.

    buckets (PATH/train/<bucket>/ token shards, wave-1 datasets)
        -> plan      phases cut at every drain; exact sample/token positions, known up front
        -> schedule  global position g -> (phase, bucket, index in the bucket's permutation), O(1)
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

from tokenloom.curriculum._buckets import Bucket, sample_budget_tokens
from tokenloom.curriculum._config import BudgetUnit, CurriculumConfig, ExhaustionPolicy, Phase
from tokenloom.curriculum._dataset import STATE_FORMAT, CurriculumDataset
from tokenloom.curriculum._errors import BucketExhausted, BucketMismatchError, EmptyBucketError, MissingValTwinError
from tokenloom.curriculum._plan import Finding, build_plan, findings
from tokenloom.curriculum._status import STATUS_FILE, read_run_status, record_halt, write_run_status

__all__ = [
    "STATE_FORMAT",
    "STATUS_FILE",
    "Bucket",
    "BucketExhausted",
    "BudgetUnit",
    "BucketMismatchError",
    "CurriculumConfig",
    "CurriculumDataset",
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
