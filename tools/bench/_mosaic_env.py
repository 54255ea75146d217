"""The Python of a MosaicML streaming environment for the benchmarks, made once and kept between runs.

MosaicML streaming is not in the workspace (its pins would downgrade numpy / transformers for every package),
so bench_datasets.py and bench_remote_peers.py run it in a venv of its own: ``uv venv`` + ``uv pip install
mosaicml-streaming torch==<the workspace's> numpy`` (linked from uv's cache). It lives under
``$XDG_CACHE_HOME/tokenloom-bench`` (``~/.cache`` by default), named by the Python and torch versions, so a
run makes it at most once (about 20 s) and later runs and sections reuse it; it is rebuilt when
``streaming`` or ``torch`` is no longer found in it. ``TOKENLOOM_BENCH_CACHE`` puts it elsewhere.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def _root() -> Path:
    explicit = os.environ.get("TOKENLOOM_BENCH_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokenloom-bench"


def _works(python: Path) -> bool:
    if not python.exists():
        return False
    # found, not imported: importing torch there takes seconds, and an install that breaks at import shows in the leg
    probe = "import importlib.util as u, sys; sys.exit(not (u.find_spec('streaming') and u.find_spec('torch')))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=120, check=False)
    return done.returncode == 0


PACKAGES = ("mosaicml-streaming", "numpy")


@functools.cache
def mosaic_python() -> str:
    """The venv's python (made or repaired first); RuntimeError naming the failed step."""
    torch_version = importlib.metadata.version("torch").split("+")[0]
    venv = _root() / f"mosaic-py{platform.python_version()}-torch{torch_version}"
    python = venv / "bin" / "python"
    if _works(python):
        return str(python)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        ["uv", "venv", "-q", "--python", sys.executable, str(venv)],
        ["uv", "pip", "install", "-q", "--python", str(python), *PACKAGES, f"torch=={torch_version}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"no MosaicML environment ({' '.join(step[:3])}): {tail[:200]}")
    return str(python)
