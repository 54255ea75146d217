"""Catalogue rows for performance wave 4's item 4 (#38): ``order: block`` in a curriculum and fetched/used."""

from __future__ import annotations

from pathlib import Path

import orjson
from _catalogue_base import Outcome, Run, case
from _catalogue_other import _curriculum_yaml


def _config(tmp: Path, **data):
    from tokenloom.curriculum import CurriculumConfig

    return CurriculumConfig.from_file(_curriculum_yaml(tmp, **data))


def _names(*words: str):
    def check(o: Outcome) -> str | None:
        text = o.stdout + o.stderr
        missing = [w for w in words if w not in text]
        return f"the refusal does not say {missing}" if missing else None

    return check


@case("curriculum order: an unknown order", "curriculum", "report")
def _(tmp: Path) -> Run:
    config = _curriculum_yaml(tmp, order="blocks")
    return Run(
        argv=["validate", "--curriculum", str(config)], sources=[config], check=_names("order", "feistel, block")
    )


@case("curriculum order: a mapping naming a bucket that does not exist", "curriculum", "report")
def _(tmp: Path) -> Run:
    config = _curriculum_yaml(tmp, order={"web": "block"})
    return Run(argv=["curriculum", "plan", str(config)], sources=[config], check=_names("order names buckets", "web"))


@case("curriculum order: a list instead of a name or mapping", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, order=["block"]))


@case("curriculum order: a bucket's order is not a string", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, order={"a": 7}))


@case("curriculum block_samples without any bucket in block order", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, block_samples=64))


@case("curriculum window_blocks: 0", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, order="block", window_blocks=0))


@case("curriculum block_samples: a string", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, order="block", block_samples="64"))


@case("curriculum block_samples: true", "curriculum", "error", "ConfigError")
def _(tmp: Path) -> Run:
    return Run(call=lambda: _config(tmp, order="block", block_samples=True))


@case("curriculum state saved in feistel order, loaded in block order", "curriculum", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.curriculum import CurriculumDataset

    saved = CurriculumDataset(_config(tmp), seed=0).state_dict(consumed=2)
    other = CurriculumDataset(_config(tmp / "b", order="block", block_samples=4), seed=0)
    return Run(call=lambda: other.load_state_dict(saved))


@case("curriculum status: fetched/used fields that are not numbers", "curriculum", "ok")
def _(tmp: Path) -> Run:
    run = tmp / "run"
    run.mkdir()
    status = {"status": "running", "fetched_bytes": "lots", "used_bytes": 0}
    (run / "run_status.json").write_bytes(orjson.dumps(status))
    return Run(argv=["curriculum", "status", str(run)], check=_names("fetched_bytes", "lots"))
