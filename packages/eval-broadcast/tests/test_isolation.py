"""Under tox the env holds this package's dependencies (with the hf extra) and no other tokenloom package."""

import importlib.util
import os

import pytest


@pytest.mark.skipif(
    os.environ.get("TOKENLOOM_ISOLATED_ENV") != "eval-broadcast",
    reason="only meaningful inside the isolated tox env for tokenloom-eval-broadcast",
)
def test_the_env_has_what_the_tests_need_and_nothing_above() -> None:
    # tokenloom.tokenize comes with tokenloom-datasets[hf] (its engine selection encodes the HF cache)
    for needed in (
        "torch",
        "datasets",
        "transformers",
        "tokenloom.datasets",
        "tokenloom.formats",
        "tokenloom.tokenize",
        "tokenloom.sampler",  # tokenloom-datasets takes the mixture's schedule from it
    ):
        assert importlib.util.find_spec(needed) is not None, needed  # so no importorskip can hide a test
    for absent in ("tokenloom.curriculum", "tokenloom.hf_streaming", "tokenloom.demo"):
        assert importlib.util.find_spec(absent) is None, absent
