"""Catalogue rows from the review of #38 item 4 (``order: block`` in a curriculum): sizes past int64, states."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Run, case
from _catalogue_other import _curriculum_yaml
from _catalogue_w4_currblock import _config, _names


@case("curriculum window_blocks: 10^20 (past int64 position arithmetic)", "curriculum", "report")
def _(tmp: Path) -> Run:
    config = _curriculum_yaml(tmp, order="block", window_blocks=10**20)
    return Run(argv=["validate", "--curriculum", str(config)], sources=[config], check=_names("window_blocks", "<="))


@case("curriculum block_samples: 2^63", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, order="block", block_samples=2**63))


@case("curriculum state saved in block order, loaded in feistel order", "curriculum", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumDataset

    saved = CurriculumDataset(_config(tmp, order="block", block_samples=4), seed=0).state_dict(consumed=2)
    other = CurriculumDataset(_config(tmp / "b"), seed=0)
    return Run(call=lambda: other.load_state_dict(saved))
