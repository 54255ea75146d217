"""One narrow warning filter for the loader every tokenloom resume goes through.

torchdata 0.11's ``StatefulDataLoader.__init__`` calls ``torch.set_vital(...)``, which torch
(2.6 and later) no longer has: torch's module ``__getattr__`` answers with a no-op and a
``UserWarning: 'set_vital' is deprecated, please do not call`` on every loader built. The
call does nothing either way, so the warning tells a user nothing they can act on. The filter
matches that exact message, raised from torchdata's stateful_dataloader module, and nothing else.
"""

from __future__ import annotations

import warnings

__all__ = ["silence_torchdata_set_vital"]


def silence_torchdata_set_vital() -> None:
    warnings.filterwarnings(
        "ignore",
        message=r"'set_vital' is deprecated, please do not call",
        category=UserWarning,
        module=r"torchdata\.stateful_dataloader\.",
    )
