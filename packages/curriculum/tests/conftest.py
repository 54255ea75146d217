from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from curriculum_helpers import make_corpus


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path / "data", {"a": 300, "b": 200, "c": 400})
