"""The object-store client: stores built lazily per process, ranged GETs with If-Match, retries and named errors.

Credentials and endpoint come from the usual environment variables (for S3: AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP=true for a plain-http endpoint;
GOOGLE_* and AZURE_* likewise, read by obstore) and from an explicit ``storage_options`` dict
(obstore's config keys: ``endpoint``, ``access_key_id``, ``secret_access_key``, ``region``, ...).
obstore's runtime is not fork-safe: a store is created on first use in each process and re-created
when the process id changes (a DataLoader worker after fork). Secret values never reach an error
message or a log line: :func:`redact` masks them.
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tokenloom.formats.errors import ConfigError, DataError, MissingFileError, ResumeMismatchError, StorageError
from tokenloom.formats.io.optional import require
from tokenloom.formats.io.urls import RemoteURL
from tokenloom.formats.remote import _waits
from tokenloom.formats.remote._waits import RetryPolicy

__all__ = [
    "ObjectInfo",
    "RetryPolicy",
    "StoreConfig",
    "check_bucket",
    "is_credential",
    "fetch_range",
    "head",
    "list_dir",
    "list_objects",
    "list_prefix",
    "redact",
]

log = logging.getLogger("tokenloom.formats.remote")


#: environment variables obstore reads for credentials and endpoints
ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")


def _obstore() -> Any:
    return require(
        "obstore",
        distribution="tokenloom-formats",
        extra="remote",
        purpose="reading s3://, gs://, az:// and https:// data",
    )


@dataclass(frozen=True)
class StoreConfig:
    """Where and how to reach one store root; ``repr`` and errors never show secret values."""

    url: RemoteURL
    storage_options: dict[str, Any] = field(default_factory=dict)
    retries: RetryPolicy = field(default_factory=RetryPolicy)

    def __repr__(self) -> str:
        shown = {k: ("***" if _is_secret(k) else v) for k, v in self.storage_options.items()}
        return f"StoreConfig(url={str(self.url)!r}, storage_options={shown}, retries={self.retries})"

    def secrets(self) -> list[str]:
        """Secret values this config carries (from the dict and the environment), to mask in messages."""
        values = [str(v) for k, v in self.storage_options.items() if _is_secret(k) and v]
        values += [v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and _is_secret(k) and v]
        return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


_SECRET_WORDS = ("secret", "token", "password", "sas", "credential", "key")


def is_credential(name: str) -> bool:
    """A store setting whose value is a credential (kept apart in ``RemoteOptions.credentials``)."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _is_secret(name: str) -> bool:
    return is_credential(name) and "id" not in name.lower().split("_")[-1:]  # a key id is shown, its secret never


def redact(text: str, config: StoreConfig) -> str:
    """``text`` with every secret value of ``config`` replaced by ``***``."""
    for secret in config.secrets():
        text = text.replace(secret, "***")
    return text


_STORES: dict[tuple[int, str, str], Any] = {}


def _store(config: StoreConfig) -> Any:
    """The obstore store of ``config`` in this process (built after fork, never inherited)."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES))
    policy = config.retries
    timeouts = (policy.timeout, policy.connect_timeout, policy.read_timeout, policy.seconds())
    options = sorted((k, repr(v)) for k, v in config.storage_options.items())
    key = (os.getpid(), config.url.root, repr([options, env, timeouts]))
    store = _STORES.get(key)
    if store is None:
        for stale in [k for k in _STORES if k[0] != key[0]]:
            del _STORES[stale]  # a parent's store: its runtime does not survive fork
        obstore_store = require(
            "obstore.store", distribution="tokenloom-formats", extra="remote", purpose="reading object-store data"
        )
        options = dict(config.storage_options)
        _check_endpoints(config, options)
        policy = config.retries
        budget = policy.seconds()  # no single attempt outlasts the budget (a silent server is named within it)
        client: dict[str, Any] = {  # "%.3fs": obstore cannot parse "1e-05s"
            "timeout": f"{max(min(policy.timeout, budget), 0.001):.3f}s",
            "connect_timeout": f"{max(min(policy.connect_timeout, policy.timeout, budget), 0.001):.3f}s",
            "read_timeout": f"{max(min(policy.read_timeout, budget), 0.001):.3f}s",
        }
        client.update(options.pop("client_options", {}) or {})
        if config.url.scheme == "http" or os.environ.get("AWS_ALLOW_HTTP", "").lower() == "true":
            client.setdefault("allow_http", True)
        try:
            store = obstore_store.from_url(
                config.url.root, client_options=client, retry_config={"max_retries": 0}, **options
            )
        except Exception as exc:
            raise ConfigError(
                f"cannot build a client for {config.url.root}: {redact(_first_line(exc), config)}",
                path=str(config.url),
                field="storage_options",
                hint="Check the storage_options keys (obstore's config names) and the AWS_/GOOGLE_/AZURE_ variables",
            ) from None
        _STORES[key] = store
    return store


def _check_endpoints(config: StoreConfig, options: dict[str, Any]) -> None:
    """An endpoint that is not an http(s) URL is a ConfigError here (obstore panics on it at the first request)."""
    found = [(f"storage_options[{k!r}]", v) for k, v in options.items() if k.lower().endswith(("endpoint", "_url"))]
    found = [(where, v) for where, v in found if where != "storage_options['proxy_url']"]
    if config.url.scheme == "s3":
        found += [(name, os.environ[name]) for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT") if name in os.environ]
    for where, value in found:
        try:
            parts = urllib.parse.urlsplit(str(value))
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
        except ValueError:
            valid = False
        if not valid:
            raise ConfigError(
                f"the endpoint {redact(repr(str(value)), config)} ({where}) is not an http(s) URL",
                path=str(config.url),
                field="storage_options",
                hint="Write it as http://HOST:PORT or https://HOST (with AWS_ALLOW_HTTP=true or "
                "client_options={'allow_http': True} for http)",
            )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n", 1)[0]
    return text[:300] or type(exc).__name__


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """An object's identity as recorded at open: its URL, size and ETag (or version)."""

    url: str
    key: str
    size: int
    etag: str


def _permanent(exc: BaseException, config: StoreConfig, url: str, doing: str) -> Exception | None:
    """The named error for a permanent failure, or None when ``exc`` is transient (to retry)."""
    errors = _obstore().exceptions
    text = redact(_first_line(exc), config)
    everything = str(exc)
    found = re.search(r"status code: (\d{3})", everything)
    status = int(found[1]) if found else None
    if isinstance(exc, FileNotFoundError | errors.NotFoundError) or status == 404 or "NoSuchBucket" in everything:
        return MissingFileError(
            f"{url} does not exist (404 while {doing})",
            path=url,
            hint="Check the bucket and prefix (list them with your cloud's CLI) and the endpoint (AWS_ENDPOINT_URL)",
        )
    if isinstance(exc, errors.PreconditionError) or status == 412:
        return ResumeMismatchError(
            f"{url} changed since it was opened (its ETag no longer matches, 412 while {doing})",
            path=url,
            hint="The object was overwritten under a running reader: reopen the dataset (a saved state of the old "
            "data no longer applies), or restore the original object",
        )
    if isinstance(exc, errors.PermissionDeniedError | errors.UnauthenticatedError) or status in (401, 403):
        return StorageError(
            f"access to {url} was refused while {doing} ({text})",
            path=url,
            hint="Check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or storage_options) and that "
            "they may read this bucket",
        )
    if isinstance(exc, errors.InvalidPathError | errors.NotSupportedError | errors.UnknownConfigurationKeyError):
        return ConfigError(f"{url}: {text}", path=url, hint="Check the URL and the storage_options")
    not_s3 = re.search(r"non-partial response when range requested|invalid list response", everything)
    if not_s3:  # a web server or another service, not the store's API: that never changes, so no wait
        endpoint = _waits.endpoint_of(config)
        what = "ignored the byte range" if not_s3[0].startswith("non") else "sent a listing that is not S3's"
        return StorageError(
            f"{url}: the server at {endpoint} {what} while {doing} ({text})",
            path=url,
            hint=f"Check the endpoint {endpoint}: it must be the store's S3 API (SeaweedFS: its s3 port, 8333 by "
            "default; not the filer or master port), or, for an https:// URL, a server that supports Range requests",
        )
    if status in (501, 505):  # permanent (AWS S3 answered a conditional PUT with 501 before it supported it)
        return StorageError(
            f"{url} was refused while {doing}: the server does not implement this request ({text})",
            path=url,
            hint="Check that the endpoint is an S3-compatible store (not a web server or proxy) whose version "
            "supports ranged GETs and conditional PUTs (If-Match, If-None-Match)",
        )
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return StorageError(f"{url} was refused while {doing} ({text})", path=url, hint="Check the URL and endpoint")
    return None


def _with_retries(config: StoreConfig, url: str, doing: str, attempt_once: Any) -> Any:
    """``attempt_once()``, retried on transient faults until the policy's time budget is spent (see _waits)."""
    policy = config.retries
    endpoint = _waits.endpoint_of(config)
    attempt = 0
    began = time.monotonic()
    while True:
        try:
            result = attempt_once()
        except Exception as exc:
            if isinstance(exc, DataError):
                raise
            named = _permanent(exc, config, url, doing)
            if named is not None:
                if not isinstance(named, ConfigError):  # an HTTP status: the server answered
                    _waits.answered(endpoint)
                raise named from None
            if not isinstance(exc, OSError | TimeoutError | _obstore().exceptions.BaseError):
                raise  # not a fault of the store or the network: a bug to see, not to retry
            budget = policy.seconds()
            elapsed = time.monotonic() - began
            reason, server_answered = _waits.describe(exc)
            attempt += 1
            by_count = policy.max_retries is not None and attempt > policy.max_retries and elapsed < budget
            if elapsed >= budget or by_count:
                last = redact(_first_line(exc), config)
                limit = policy.max_retries if by_count else None
                raise _waits.exhausted(url, endpoint, doing, reason, attempt, elapsed, budget, last, limit) from None
            if _waits.first_of_wait(endpoint, reason, server_answered):
                never = "" if _waits.ever_answered(endpoint) else f"; nothing at {endpoint} has answered yet"
                log.warning(
                    "waiting for %s: %s, attempt %d, %.0f s of %g (%s%s)",
                    url,
                    reason,
                    attempt,
                    elapsed,
                    budget,
                    doing,
                    never,
                    extra={"wait_key": [endpoint, reason]},
                )
            time.sleep(min(policy.delay(attempt - 1), max(0.0, budget - elapsed)))
        else:
            _waits.answered(endpoint)
            return result


def head(config: StoreConfig, name: str) -> ObjectInfo:
    """Size and ETag of ``name`` under the URL's prefix (retried; a missing object is MissingFileError)."""
    key = config.url.key(name)
    url = config.url.url(name)
    meta = _with_retries(config, url, "reading its size and ETag", lambda: _obstore().head(_store(config), key))
    return ObjectInfo(url=url, key=key, size=int(meta["size"]), etag=etag_of(meta))  # the key asked (http: as named)


def heads(config: StoreConfig, names: list[str]) -> list[ObjectInfo]:
    """:func:`head` of every name, up to 16 at once: the files an http(s) dataset's manifest lists, which the
    server cannot list (one at a time, 1,000 shards at 20 ms were 40 s of HEADs before the first batch)."""
    if len(names) <= 1:
        return [head(config, name) for name in names]
    with ThreadPoolExecutor(min(16, len(names)), thread_name_prefix="tokenloom-head") as pool:
        return list(pool.map(lambda name: head(config, name), names))


def etag_of(meta: Any) -> str:
    """The ETag (or, where the store has none, the version) of an obstore answer's metadata."""
    return str(meta.get("e_tag") or meta.get("version") or "")


def _info(config: StoreConfig, meta: Any) -> ObjectInfo:
    key = str(meta["path"])
    return ObjectInfo(url=f"{config.url.root}/{key}", key=key, size=int(meta["size"]), etag=etag_of(meta))


def _listed(config: StoreConfig, prefix: str | None, url: str, doing: str) -> list[ObjectInfo]:
    """Every object whose key starts with ``prefix``, sorted by key (one LIST per 1000; retried as a whole)."""

    def list_all() -> list[ObjectInfo]:
        chunks = _obstore().list(_store(config), prefix=prefix, chunk_size=1000)
        return [_info(config, meta) for chunk in chunks for meta in chunk]

    return sorted(_with_retries(config, url, doing, list_all), key=lambda info: info.key)


def list_objects(config: StoreConfig) -> list[ObjectInfo]:
    """Every object under the URL's prefix (recursively), sorted by key, with size and ETag (one LIST per 1000)."""
    _refuse_http_listing(
        config,
        str(config.url),
        "Open a dataset with a manifest.json there (`tokenloom validate --write-manifest` before uploading), "
        "or name the file itself (https://HOST/data.pbin)",
    )
    prefix = config.url.prefix
    return _listed(config, f"{prefix}/" if prefix else None, str(config.url), "listing the prefix")


def fetch_range(config: StoreConfig, obj: ObjectInfo, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``obj``, sent with If-Match; faults are retried from the byte already read."""
    if end <= start:
        return b""
    received = bytearray()
    doing = f"reading bytes {start}-{end}"
    endpoint = _waits.endpoint_of(config)

    def once() -> None:
        begin = start + len(received)
        options: dict[str, Any] = {"range": (begin, end)}
        if obj.etag:
            options["if_match"] = obj.etag
        result = _obstore().get(_store(config), obj.key, options=options)
        _waits.heard(endpoint)  # headers came: a body that stalls or breaks later is not "nothing ever answered"
        for chunk in result.stream(min_chunk_size=1 << 20):
            received.extend(memoryview(chunk))
            if start + len(received) > end:
                raise StorageError(f"{obj.url} sent more bytes than asked for ({doing})", path=obj.url)
        if start + len(received) < end:
            raise ConnectionError(f"short read: {len(received)} of {end - start} bytes")

    _with_retries(config, obj.url, doing, once)
    return bytes(received)


def check_bucket(config: StoreConfig) -> None:
    """MissingFileError naming the bucket when it does not exist (a 404 on an object cannot tell)."""
    if config.url.scheme in ("http", "https"):
        return

    def list_one() -> None:
        for _chunk in _obstore().list(_store(config), prefix=config.url.prefix or None, chunk_size=1):
            return

    try:
        _with_retries(config, config.url.root, "listing the bucket", list_one)
    except MissingFileError:
        raise MissingFileError(
            f"the bucket {config.url.bucket!r} of {config.url} does not exist",
            path=str(config.url),
            hint="Check the bucket name and the endpoint (AWS_ENDPOINT_URL or storage_options['endpoint'])",
        ) from None


def list_dir(config: StoreConfig, name: str = "") -> tuple[list[str], list[str]]:
    """``(folders, objects)`` directly under ``name`` of the URL's prefix, as names (sorted; no listing over http)."""
    key = config.url.key(name) if name else config.url.prefix
    prefix = f"{key.strip('/')}/" if key.strip("/") else None
    url = config.url.url(name)
    _refuse_http_listing(config, url, "Name the objects directly, or put the data in a bucket (s3://, gs://, az://)")
    found = _with_retries(config, url, "listing it", lambda: _obstore().list_with_delimiter(_store(config), prefix))
    folders = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])
    objects = sorted(str(o["path"]).rsplit("/", 1)[-1] for o in found["objects"])
    return folders, objects


def list_prefix(config: StoreConfig, prefix: str) -> list[ObjectInfo]:
    """Every object whose key starts with ``prefix`` (sorted by key; retried). http(s) stores cannot list."""
    hint = "Name each file explicitly; globs work on s3://, gs:// and az://"
    _refuse_http_listing(config, config.url.url(prefix), hint, field="data_files")
    return _listed(config, prefix or None, config.url.url(prefix), "listing objects")


def _refuse_http_listing(config: StoreConfig, url: str, hint: str, field: str | None = None) -> None:
    """ConfigError for a listing of ``url`` on an http(s) store (a plain HTTP server has no object listing)."""
    if config.url.scheme in ("http", "https"):
        raise ConfigError(
            f"{url} cannot be listed: an http(s) server has no object listing", path=url, field=field, hint=hint
        )
