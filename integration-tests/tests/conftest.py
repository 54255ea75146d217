"""Lets the tests import their helper module (torchrun_helpers) under --import-mode=importlib."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
