"""Errors of tokenloom.eval_broadcast: every one is a :class:`tokenloom.formats.errors.DataError`."""

from __future__ import annotations

from tokenloom.formats.errors import DataError

__all__ = ["EvalBroadcastError", "EvalBuildError", "EvalTransferError"]


class EvalBroadcastError(DataError):
    """Base of the eval-broadcast errors."""


class EvalBuildError(EvalBroadcastError):
    """Building the eval set failed on the source rank; every rank raises this with the source's message."""

    default_hint = "Fix the cause reported by the source rank (its traceback has the details) and restart"


class EvalTransferError(EvalBroadcastError):
    """The transfer broke: a peer died or stalled past the timeout, or the received bytes fail their checksum."""

    default_hint = (
        "Check the other ranks' logs: a crashed or stuck rank is the usual cause; "
        "raise `timeout` only if the source rank is merely slow"
    )
