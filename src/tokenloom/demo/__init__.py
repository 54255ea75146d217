"""tokenloom.demo: the whole flow on the built-in corpus (``tokenloom demo``).

    stdlib docstrings -> jsonl -> tokenize -> validate -> pack -> DataLoader x elastic sampler
        -> checkpoint on 2 ranks -> resume on 3 ranks -> every sample exactly once

Example::

    from tokenloom.demo import run_demo
    report = run_demo(Path("demo-work"), steps=100)
    assert report.consumed_once
"""

from tokenloom.demo._flow import DemoReport, run_demo

__all__ = ["DemoReport", "run_demo"]
