"""RemoteOptions: how to reach data in object storage and cache it on this node, as one frozen value.

A dataset opened from a URL carries its RemoteOptions (``dataset.remote``) and pickles it with itself, so
a DataLoader worker's reopen, a curriculum bucket or an eval source reaches the store and the cache
exactly as the user's open did. No package passes store keywords along one by one: public entry points
take this value (``open_dataset(url, remote=RemoteOptions(...))``); :meth:`RemoteOptions.from_keywords` builds it
from a store's settings dict (``storage_options``) and the rest.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.urls import RemoteURL
from tokenloom.formats.remote import budget
from tokenloom.formats.remote._waits import RetryPolicy
from tokenloom.formats.remote.client import StoreConfig, is_credential

__all__ = ["DEFAULT_BLOCK_SIZE", "RemoteOptions", "check_block_size"]

#: token data is fetched in aligned blocks of this many bytes unless ``block_size`` says otherwise
DEFAULT_BLOCK_SIZE = 8 << 20


def check_block_size(size: Any) -> int:
    """``size`` when it is a positive multiple of 4096 bytes, else a ConfigError."""
    if not isinstance(size, int) or size < 4096 or size % 4096:
        raise ConfigError(
            f"block_size {size!r} is not a positive multiple of 4096 bytes",
            field="block_size",
            hint=f"Use a multiple of 4096 (the default is {DEFAULT_BLOCK_SIZE} bytes, 8 MiB)",
        )
    return size


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteOptions:
    """Store endpoint, credentials, block cache and retry budget of one dataset in object storage.

    ``repr`` never shows a credential value. Built from the user's keywords by :meth:`from_keywords`.
    """

    endpoint: str | None = None
    """The store's endpoint URL (``http://127.0.0.1:8333``); None: the scheme's default or ``AWS_ENDPOINT_URL``."""
    credentials: Mapping[str, Any] = field(default_factory=dict)
    """Explicit credentials in obstore's names (``access_key_id``, ``secret_access_key``, ...); empty: the
    environment's (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``, read by obstore)."""
    store_options: Mapping[str, Any] = field(default_factory=dict)
    """Every other obstore setting (``region``, ``client_options``, ...)."""
    block_cache_dir: Path | None = None
    """The per-node block cache; None: ``$TOKENLOOM_CACHE_DIR``, else ``~/.cache/tokenloom/remote``."""
    cache_limit: int | None = None
    """Bytes the block cache may hold (given as ``20GB`` too); None: ``$TOKENLOOM_CACHE_LIMIT``, else unbounded."""
    block_size: int | None = None
    """Bytes per fetched block, a multiple of 4096; None: ``$TOKENLOOM_BLOCK_SIZE``, else 8 MiB."""
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    """How long transient faults are retried (the time budget) and the request timeouts."""

    def __post_init__(self) -> None:
        for name in ("credentials", "store_options"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise ConfigError(f"{name} is a {type(value).__name__}, expected a dict", field=name)
            object.__setattr__(self, name, dict(value))
        if self.block_cache_dir is not None:
            object.__setattr__(self, "block_cache_dir", Path(self.block_cache_dir))
        object.__setattr__(self, "cache_limit", budget.parse_size(self.cache_limit))
        if self.block_size is not None:
            check_block_size(self.block_size)
        if isinstance(self.retries, int) and not isinstance(self.retries, bool):
            object.__setattr__(self, "retries", RetryPolicy(max_retries=self.retries))
        elif not isinstance(self.retries, RetryPolicy):
            raise ConfigError(f"retries is a {type(self.retries).__name__}, expected a RetryPolicy", field="retries")

    @classmethod
    def from_keywords(
        cls,
        *,
        storage_options: Mapping[str, Any] | None = None,
        block_cache_dir: str | os.PathLike[str] | None = None,
        block_size: int | None = None,
        retries: RetryPolicy | int | None = None,
        cache_limit: int | str | None = None,
        remote: RemoteOptions | None = None,
    ) -> RemoteOptions:
        """The options of the user-facing keywords (``storage_options``: obstore's settings, endpoint and
        credentials included), over ``remote`` when given (a keyword given wins)."""
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(
                f"storage_options is a {type(storage_options).__name__}, expected a dict", field="storage_options"
            )
        base = remote if remote is not None else cls()
        changes: dict[str, Any] = {}
        if storage_options is not None:
            rest = dict(storage_options)
            changes["endpoint"] = rest.pop("endpoint", None)
            changes["credentials"] = {k: rest.pop(k) for k in list(rest) if is_credential(k)}
            changes["store_options"] = rest
        for name, value in (
            ("block_cache_dir", block_cache_dir),
            ("block_size", block_size),
            ("retries", retries),
            ("cache_limit", cache_limit),
        ):
            if value is not None:
                changes[name] = value
        return dataclasses.replace(base, **changes) if changes else base

    @property
    def storage_options(self) -> dict[str, Any]:
        """obstore's settings: the endpoint, the credentials and the rest in one dict."""
        merged = {**self.store_options, **self.credentials}
        if self.endpoint is not None:
            merged["endpoint"] = self.endpoint
        return merged

    def store(self, url: RemoteURL) -> StoreConfig:
        """The connection to ``url``'s store root."""
        return StoreConfig(url, self.storage_options, self.retries)

    def __repr__(self) -> str:
        shown = [f"endpoint={self.endpoint!r}"] if self.endpoint else []
        shown += [f"credentials={{{', '.join(f'{k!r}: ***' for k in self.credentials)}}}"] if self.credentials else []
        shown += [f"store_options={_masked(self.store_options)!r}"]
        shown += [f"{name}={getattr(self, name)!r}" for name in ("block_cache_dir", "cache_limit")]
        shown += [f"block_size={self.block_size!r}", f"retries={self.retries!r}"]
        return f"RemoteOptions({', '.join(shown)})"


def _masked(value: Any) -> Any:
    """``value`` with every credential-named or header-authorising entry, at any depth, shown as ``***``."""
    if isinstance(value, Mapping):
        return {k: "***" if _secret_key(str(k)) else _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_masked(v) for v in value)
    return value


def _secret_key(name: str) -> bool:
    return is_credential(name) or name.lower() in ("authorization", "proxy-authorization", "cookie")
