"""Catalogue rows for issue #23's consumers: URLs in datasets, curricula, eval sources; the block order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _catalogue_base import Outcome, Run, case, copy

from tokenloom.formats import RemoteOptions

_SECRET = "consumer-secret-never-printed"
_NOWHERE = {
    "endpoint": "http://127.0.0.1:9",  # nothing listens: no network
    "access_key_id": "k",
    "secret_access_key": _SECRET,
    "client_options": {"allow_http": True},
}


def _url(text: str) -> Any:
    return text  # a URL string where the config's annotation names the parsed root


def _names_url_no_dir(url: str, cwd: Path):
    def check(outcome: Outcome) -> str | None:
        text = str(outcome.exception)
        if _SECRET in text:
            return "the secret appears in the error"
        if (cwd / "s3:").exists():
            return f"a local directory {cwd / 's3:'} was made for a URL"
        return None if url in text else f"the error does not name {url}"

    return check


@case("MemoryMappedDataset: storage_options with a local path", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import MemoryMappedDataset

    src = copy("native", tmp)
    return Run(
        call=lambda: MemoryMappedDataset(src, 4, remote=RemoteOptions.from_keywords(storage_options={"region": "x"})),
        sources=[src],
    )


@case("MemoryMappedDataset: s3:// where nothing listens", "bad input", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import MemoryMappedDataset

    url = "s3://bucket/ds"
    remote = RemoteOptions.from_keywords(storage_options=_NOWHERE, block_cache_dir=tmp / "c")
    call = lambda: MemoryMappedDataset(url, 4, remote=remote)  # noqa: E731
    return Run(call=call, check=_names_url_no_dir(url, Path.cwd()))


@case("PackedDocumentDataset: s3:// where nothing listens", "bad input", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import PackedDocumentDataset

    url = "s3://bucket/packed"
    remote = RemoteOptions.from_keywords(storage_options=_NOWHERE, block_cache_dir=tmp / "c")
    call = lambda: PackedDocumentDataset(url, 8, plan_cache_dir=tmp / "c", remote=remote)  # noqa: E731
    return Run(call=call, check=_names_url_no_dir(url, Path.cwd()))


@case("curriculum: storage_options with a local data.path", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig

    return Run(call=lambda: CurriculumConfig.from_dict({"path": str(tmp), "storage_options": {"region": "x"}}))


@case("curriculum: block_cache_dir is a URL", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig

    return Run(
        call=lambda: CurriculumConfig.from_dict({"path": "s3://bucket/data", "block_cache_dir": "s3://bucket/cache"})
    )


@case("curriculum: storage_options is a list", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig

    return Run(call=lambda: CurriculumConfig.from_dict({"path": "s3://bucket/data", "storage_options": ["endpoint"]}))


@case("curriculum: data.path s3:// where nothing listens", "bad input", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig, CurriculumPlan

    url = "s3://bucket/data"
    config = CurriculumConfig.from_dict(
        {"path": _url(url), "storage_options": _NOWHERE, "block_cache_dir": str(tmp / "c")}
    )
    return Run(call=lambda: CurriculumPlan(config, seed=1), check=_names_url_no_dir(url, Path.cwd()))


@case("curriculum: data.path https:// (no listing)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumConfig, CurriculumPlan

    config = CurriculumConfig.from_dict({"path": _url("https://127.0.0.1:9/data"), "block_cache_dir": str(tmp / "c")})
    return Run(call=lambda: CurriculumPlan(config, seed=1), check=_names_url_no_dir("https://127.0.0.1:9/data", tmp))


@case("eval-broadcast: PathEvalSource s3:// where nothing listens", "bad input", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.eval_broadcast import PathEvalSource

    url = "s3://bucket/val"
    source = PathEvalSource(
        url, remote=RemoteOptions.from_keywords(storage_options=_NOWHERE, block_cache_dir=tmp / "c")
    )
    return Run(call=source.fingerprint, check=_names_url_no_dir(url, Path.cwd()))


@case("sampler: block_samples with order='feistel'", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    return Run(call=lambda: ResumableDistributedSampler(100, 1, 0, block_samples=8))


@case("sampler: order='block' with window_blocks=0", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    return Run(call=lambda: ResumableDistributedSampler(100, 1, 0, order="block", window_blocks=0))


@case("sampler: a block-order state without its block shape", "bad input", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    state = ResumableDistributedSampler(100, 1, 0, order="block", block_samples=10).state_dict()
    del state["block_samples"]
    sampler = ResumableDistributedSampler(100, 2, 1, order="block", block_samples=10)
    return Run(call=lambda: sampler.load_state_dict(state))


@case("sampler: a block-order state loaded with another block size", "bad input", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    state = ResumableDistributedSampler(100, 1, 0, order="block", block_samples=10).state_dict()
    sampler = ResumableDistributedSampler(100, 2, 1, order="block", block_samples=20)
    return Run(call=lambda: sampler.load_state_dict(state))


@case(
    "datasets: a state whose remote object changed (edited data_objects)", "bad input", "error", "ResumeMismatchError"
)
def _(tmp: Path) -> Run:
    from tokenloom.datasets import check_state

    ours = {"s3://b/ds/shard_00000.bin": '100:"etag-new"'}
    state = {"fingerprint": "old", "data_objects": {"s3://b/ds/shard_00000.bin": '100:"etag-old"'}}

    def check(outcome: Outcome) -> str | None:
        return None if "shard_00000.bin changed" in str(outcome.exception) else "the changed object is not named"

    return Run(call=lambda: check_state(state, fingerprint="new", owner="X", objects=ours), check=check)
