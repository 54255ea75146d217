"""What the commands share for URL inputs: a path-or-URL argument, ``--storage-option`` and ``--block-cache-dir``.

Credentials come from the environment (AWS_*, GOOGLE_*, AZURE_*, read by obstore) or from
``--storage-option KEY=VALUE``; no value given here is ever printed (the dataset's summary shows
the URL only, errors mask secret values).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tokenloom.formats.errors import ConfigError
from tokenloom.formats.io.urls import is_remote_url

__all__ = ["PATH_OR_URL", "remote_kwargs", "remote_options"]

#: obstore's HTTP client settings: given as --storage-option, they go to client_options
_CLIENT_KEYS = frozenset({"allow_http", "allow_invalid_certificates", "timeout", "connect_timeout", "proxy_url"})


class _PathOrURL(click.ParamType):
    """A local path (as a Path) or an object-store URL (kept as text: a Path would fold ``s3://`` into ``s3:/``)."""

    name = "PATH|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Path) or not is_remote_url(value):
            return Path(value)
        return str(value)


PATH_OR_URL = _PathOrURL()


def remote_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--storage-option KEY=VALUE`` (repeatable) and ``--block-cache-dir DIR`` to a command."""
    command = click.option(
        "--block-cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="URL input: the per-node block cache [default: $TOKENLOOM_CACHE_DIR or ~/.cache/tokenloom/remote].",
    )(command)
    return click.option(
        "--storage-option",
        "storage_option",
        multiple=True,
        metavar="KEY=VALUE",
        help="URL input: an obstore store setting (endpoint=..., region=...), repeatable; credentials are best "
        "left in the environment (AWS_*, GOOGLE_*, AZURE_*). Values are never printed.",
    )(command)


def remote_kwargs(path: str | os.PathLike[str], storage_option: tuple[str, ...], block_cache_dir: Path | None) -> dict:
    """``{"remote": RemoteOptions}`` for a URL (``open_dataset``'s keyword), {} for a local path (ConfigError if
    the flags were given for one)."""
    if not is_remote_url(path):
        if storage_option or block_cache_dir is not None:
            flag = "--storage-option" if storage_option else "--block-cache-dir"
            raise ConfigError(f"{flag} applies to s3://, gs://, az:// and https:// inputs only", field=flag)
        return {}
    options: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for item in storage_option:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"--storage-option {key or '(empty)'!r} is not KEY=VALUE",
                field="--storage-option",
                hint="Write it as --storage-option endpoint=http://127.0.0.1:8333",
            )
        if key.startswith("client_options."):
            client[key.removeprefix("client_options.")] = value
        elif key in _CLIENT_KEYS:
            client[key] = value
        else:
            options[key] = value
    if client:
        options["client_options"] = client
    from tokenloom.formats.remote.options import RemoteOptions

    return {"remote": RemoteOptions.from_keywords(storage_options=options, block_cache_dir=block_cache_dir)}
