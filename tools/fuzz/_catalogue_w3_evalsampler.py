"""Catalogue rows for wave 3's correctness issue (#21): the evalsampler items that are an input or a fault."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Run, case, copy


@case("sampler state with its data_fingerprint removed", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    a = copy("native", tmp)
    state = ResumableDistributedSampler(open_dataset(a), 1, 0).state_dict()
    del state["data_fingerprint"]
    other = ResumableDistributedSampler(open_dataset(a), 1, 0)
    return Run(call=lambda: other.load_state_dict(state), sources=[a])


@case("sampler state with data_fingerprint null", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    a = copy("native", tmp)
    state = {**ResumableDistributedSampler(open_dataset(a), 1, 0).state_dict(), "data_fingerprint": None}
    other = ResumableDistributedSampler(open_dataset(a), 1, 0)
    return Run(call=lambda: other.load_state_dict(state), sources=[a])
