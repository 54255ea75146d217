"""tokenloom.demo: the whole flow on the built-in corpus (``tokenloom demo``).

    stdlib docstrings -> jsonl -> tokenize -> validate -> pack -> DataLoader x elastic sampler
        -> checkpoint on 2 ranks -> resume on 3 ranks -> every sample exactly once
    stdlib conversations -> tokenize --train-type sft (masks checked) -> packed SFT on 2 ranks x 2 workers
        -> checkpoint -> resume on 3 ranks -> every record exactly once

Example::

    from tokenloom.demo import run_demo
    report = run_demo(Path("demo-work"), steps=100)
    assert report.consumed_once
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports

if TYPE_CHECKING:
    from tokenloom.demo._flow import DemoReport, run_demo
    from tokenloom.demo._remote import RemoteReport, run_remote_demo

#: Public name -> the module that defines it, imported on first use: ``import tokenloom.demo`` (and every
#: ``tokenloom ... --help``) costs no torch until something that needs it is asked for.
_EXPORTS = {
    "DemoReport": "tokenloom.demo._flow",
    "run_demo": "tokenloom.demo._flow",
    "RemoteReport": "tokenloom.demo._remote",
    "run_remote_demo": "tokenloom.demo._remote",
}

__all__ = ["DemoReport", "RemoteReport", "run_demo", "run_remote_demo"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
