"""The built-in demo corpus: the standard library's own docstrings as jsonl.

Every machine that runs Python has this text, so ``tokenloom demo`` and the
tests need no download. One document per module, class, function or method
whose docstring is at least ``min_chars`` long, as ``{"id": ..., "text": ...}``
lines sorted by id. The same Python build gives the same bytes on every run.

Importing hundreds of modules has side effects (warnings, registered codecs,
threads), so the walk runs in a child interpreter (``python -I -S``: isolated,
and without site-packages, so installed packages such as setuptools' distutils
shim cannot change the result); the caller's process imports nothing new.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from tokenloom.formats import ConfigError, DataError
from tokenloom.formats.io import atomic_write_bytes

__all__ = ["SKIPPED_MODULES", "CorpusInfo", "build_stdlib_corpus"]

CORPUS_FILE_NAME = "stdlib-docs.jsonl"

#: Modules never imported: they open windows or browsers, print on import, run
#: test suites, or only exist to be run as scripts.
SKIPPED_MODULES = frozenset(
    {
        "__hello__",
        "__phello__",
        "__main__",
        "antigravity",
        "idlelib",
        "lib2to3",
        "pydoc_data",
        "test",
        "this",
        "tkinter",
        "turtle",
        "turtledemo",
        "ensurepip",
        "venv",
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CorpusInfo:
    """What :func:`build_stdlib_corpus` wrote."""

    path: Path
    """The jsonl file."""
    documents: int
    """Number of lines (documents)."""
    num_bytes: int
    """Size of the file in bytes."""
    sha256: str
    """Hex digest of the file, to compare runs."""


def build_stdlib_corpus(
    out_dir: str | os.PathLike[str],
    *,
    min_chars: int = 200,
    modules: Iterable[str] | None = None,
    timeout_s: float = 600.0,
) -> CorpusInfo:
    """Write ``out_dir/stdlib-docs.jsonl`` from the running Python's stdlib docstrings.

    Args:
        out_dir: directory to write into (created if missing).
        min_chars: shortest docstring (after ``inspect.cleandoc``) kept as a document.
        modules: top-level modules to walk; default every name in
            ``sys.stdlib_module_names`` except :data:`SKIPPED_MODULES`.
        timeout_s: how long the child interpreter may take.
    """
    if min_chars < 1:
        raise ConfigError(f"min_chars is {min_chars}, expected >= 1", field="min_chars")
    names = sorted(set(sys.stdlib_module_names) if modules is None else set(modules))
    names = [name for name in names if name not in SKIPPED_MODULES]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / CORPUS_FILE_NAME
    walk = target.with_name(target.name + ".walk.json")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONWARNINGS"] = "ignore"
    script = Path(__file__).with_name("_stdlib_docs.py")
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(script), str(walk), str(min_chars), *names],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        walk.unlink(missing_ok=True)
        raise DataError(
            f"the stdlib docstring walk failed with exit code {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace')[-2000:]}",
            path=target,
            hint="Report this with your Python version; pass modules=[...] to narrow the walk",
        )
    data = b"".join(orjson.dumps({"id": key, "text": text}) + b"\n" for key, text in orjson.loads(walk.read_bytes()))
    walk.unlink()
    atomic_write_bytes(target, data)
    return CorpusInfo(
        path=target,
        documents=data.count(b"\n"),
        num_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
