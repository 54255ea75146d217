"""The retry policy and outages: waited out within a time budget, one log line per wait, the final named error.

A request that fails transiently is retried until the retry budget (seconds, ``RetryPolicy.budget``, default
``$TOKENLOOM_RETRY_BUDGET``, else 600) is spent. While a store is down every request of the process fails the
same way; the user sees one line per distinct wait (endpoint and reason), ``waiting for URL: 503, attempt 1,
0 s of 600``, not one per retry. A wait ends when the endpoint answers a request again. When nothing at an
endpoint ever answered in this process, the final error says so and names the endpoint (a wrong
AWS_ENDPOINT_URL or a server that is not running looks like an outage that never ends).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from tokenloom.formats.errors import ConfigError, StorageError

__all__ = [
    "BUDGET_ENV",
    "RetryPolicy",
    "DEFAULT_BUDGET",
    "answered",
    "budget_from_env",
    "describe",
    "endpoint_of",
    "exhausted",
    "first_of_wait",
    "heard",
]

#: the environment variable that sets the retry budget, in seconds, where a RetryPolicy leaves it unset
BUDGET_ENV = "TOKENLOOM_RETRY_BUDGET"
#: the retry budget (seconds) when neither the policy nor the environment sets one: a store may be down 10 minutes
DEFAULT_BUDGET = 600.0

_LOCK = threading.Lock()
_ANSWERED: set[str] = set()  # endpoints that answered something (data or an HTTP status) in this process
_WAITING: set[tuple[str, str]] = set()  # (endpoint, reason) waits already logged and not yet over


def budget_from_env() -> float:
    """``$TOKENLOOM_RETRY_BUDGET`` in seconds, else 600; a value that is not a positive number is a ConfigError."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET
    try:
        value = float(raw.removesuffix("s"))
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(
            f"{BUDGET_ENV}={raw!r} is not a number of seconds",
            field=BUDGET_ENV,
            hint=f"Set it to how long an outage may last before reading fails, e.g. {BUDGET_ENV}=600 (the default)",
        )
    return value


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Transient faults (429, 5xx, resets, timeouts, short reads) are retried until a time budget is spent.

    An outage is waited out: a request is retried (backoff with full jitter) for up to ``budget`` seconds, then
    it is a StorageError naming the URL and, when nothing there ever answered, the endpoint. Each distinct wait
    is logged once (``waiting for URL: 503, attempt 1, 0 s of 600``), not each retry.
    """

    #: at most this many retries per request as well (None: only the time budget counts)
    max_retries: int | None = None
    #: first backoff in seconds; doubled per retry (with full jitter), capped at ``max_backoff``
    backoff: float = 0.2
    max_backoff: float = 10.0
    #: per-request timeout in seconds, the whole request (a stalled server is a retried timeout)
    timeout: float = 30.0
    #: seconds a request may keep failing before it is an error; None: ``$TOKENLOOM_RETRY_BUDGET``, else 600
    budget: float | None = None
    #: seconds to establish a connection
    connect_timeout: float = 10.0
    #: seconds without a byte from the server (the first byte of an answer, or the next one of a body)
    read_timeout: float = 30.0

    def __post_init__(self) -> None:
        timeouts = (self.timeout, self.connect_timeout, self.read_timeout)
        if (
            (self.max_retries is not None and self.max_retries < 0)
            or self.backoff < 0
            or self.max_backoff < 0
            or min(timeouts) <= 0
            or (self.budget is not None and not self.budget > 0)
        ):
            raise ConfigError(
                f"retry policy {self.max_retries} retries, backoff {self.backoff}s, timeouts {timeouts}s, "
                f"budget {self.budget}s is invalid",
                field="retries",
                hint="Use max_retries >= 0 (or None), backoff >= 0, timeouts > 0 and budget > 0 seconds (or None)",
            )

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** min(attempt, 60)))

    def seconds(self) -> float:
        """The retry budget in seconds (``budget``, else ``$TOKENLOOM_RETRY_BUDGET``, else 600)."""
        return self.budget if self.budget is not None else budget_from_env()

    def resolved(self) -> RetryPolicy:
        """This policy with its budget fixed (read from the environment here, before it travels elsewhere)."""
        return self if self.budget is not None else dataclasses.replace(self, budget=self.seconds())


def endpoint_of(config: Any) -> str:
    """The endpoint requests of ``config`` (a StoreConfig) go to, as the user wrote it (never a secret)."""
    for key, value in config.storage_options.items():
        lowered = key.lower()
        if lowered.endswith(("endpoint", "endpoint_url")) and isinstance(value, str) and value:
            return value.rstrip("/")
    if config.url.scheme == "s3":
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
            if os.environ.get(name):
                return os.environ[name].rstrip("/")
    if config.url.scheme in ("http", "https"):
        parts = urllib.parse.urlsplit(config.url.root)
        return f"{parts.scheme}://{parts.netloc}"
    return f"the default {config.url.scheme}:// endpoint"


def describe(exc: BaseException) -> tuple[str, bool]:
    """``(reason, answered)``: a short name of a transient failure, and whether the server answered at all."""
    text = str(exc)
    found = re.search(r"status code: (\d{3})", text) or re.search(r"\bstatus: (\d{3})", text)
    if found:
        return found[1], True
    kind = re.search(r"kind: (\w+)", text)
    if kind and kind[1] == "Connect":
        return "cannot connect", False
    if (kind and kind[1] == "Timeout") or isinstance(exc, TimeoutError) or "timed out" in text.lower():
        return "no answer (timed out)", False
    if kind and kind[1] in ("Interrupted", "Request"):
        return "connection closed without an answer", False
    if text.startswith("short read"):
        return "short read", True
    if isinstance(exc, ConnectionRefusedError):
        return "cannot connect", False
    if isinstance(exc, ConnectionError):
        return "connection reset", False
    return type(exc).__name__, False


def answered(endpoint: str) -> None:
    """``endpoint`` answered a request: it is alive, and any wait on it is over."""
    if endpoint in _ANSWERED and not _WAITING:
        return
    with _LOCK:
        _ANSWERED.add(endpoint)
        for wait in [w for w in _WAITING if w[0] == endpoint]:
            _WAITING.discard(wait)


def heard(endpoint: str) -> None:
    """``endpoint`` sent an answer's head (a status line), even if its body then failed: it exists and runs."""
    with _LOCK:
        _ANSWERED.add(endpoint)


def first_of_wait(endpoint: str, reason: str, server_answered: bool) -> bool:
    """Record a failure; True when it starts a wait not yet logged (then the caller logs one line)."""
    with _LOCK:
        if server_answered:
            _ANSWERED.add(endpoint)
        if (endpoint, reason) in _WAITING:
            return False
        _WAITING.add((endpoint, reason))
        return True


def ever_answered(endpoint: str) -> bool:
    with _LOCK:
        return endpoint in _ANSWERED


def exhausted(
    url: str,
    endpoint: str,
    doing: str,
    reason: str,
    attempts: int,
    elapsed: float,
    budget: float,
    last: str,
    max_retries: int | None = None,
) -> StorageError:
    """The named error once the budget (or, when ``max_retries`` is given, the retry count) is spent."""
    failed = f"{url} failed {attempts} time{'s' if attempts != 1 else ''} while {doing}"
    spent = f"{reason}; {elapsed:.0f} s of a {budget:g} s retry budget; last: {last}"
    raise_it = f"raise the budget with {BUDGET_ENV}=SECONDS or retries=RetryPolicy(budget=SECONDS)"
    if max_retries is not None:  # the count ended it, not the time: raising the budget would change nothing
        spent = f"{reason}; the retry limit max_retries={max_retries} was reached after {elapsed:.0f} s; last: {last}"
        raise_it = "raise the retry count (retries=N or RetryPolicy(max_retries=N)), or leave it unset so that " + (
            f"only the time budget ({BUDGET_ENV}, default 600 s) counts"
        )
    if not ever_answered(endpoint):
        return StorageError(
            f"no answer from {endpoint} ever: {failed} ({spent})",
            path=url,
            hint=f"Check the endpoint {endpoint} (AWS_ENDPOINT_URL or storage_options['endpoint']): the host, the "
            f"port and the scheme, and that the server runs and is reachable from this machine; if it is only "
            f"slow to start, {raise_it}",
        )
    if reason == "no answer (timed out)":
        return StorageError(
            f"{endpoint} stopped answering: {failed} ({spent})",
            path=url,
            hint=f"The server accepts connections but does not answer (overloaded or hung): check it, or {raise_it}",
        )
    return StorageError(
        f"{failed} ({spent})",
        path=url,
        hint=f"The store at {endpoint} kept failing (down or throttling) for the whole wait: check its status, "
        f"or {raise_it}",
    )
