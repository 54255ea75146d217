"""Under tox this package's env holds only its own dependencies: torch must be absent."""

import importlib.util
import os

import pytest


@pytest.mark.skipif(
    os.environ.get("TOKENLOOM_ISOLATED_ENV") != "formats",
    reason="only meaningful inside the isolated tox env for tokenloom-formats",
)
def test_torch_is_not_installed_in_the_formats_env() -> None:
    assert importlib.util.find_spec("torch") is None
    assert importlib.util.find_spec("tokenloom.formats") is not None
