"""Every object-store call runs in a helper process: obstore's runtime does not survive ``fork``.

obstore (tokio) hangs in a forked child once its runtime ran in the parent, and a DataLoader forks
its workers after the dataset was opened. So no tokenloom process ever starts that runtime itself:
each process (parent, worker, rank) starts one helper on first use
(``python -m tokenloom.formats.remote._serve``; again after a fork: the process id is checked) and
sends it requests as JSON lines on a pipe (no pickles): ``head``, ``fetch`` (write bytes
``[start, end)`` of an object into a file) and ``check_bucket``. ``storage_options`` credentials
travel only on that pipe, never in argv. The helper's retry warnings come back with each answer and
are logged by the caller, so they count in the caller's logs. The helper exits when its pipe closes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
from typing import IO, Any, cast

import orjson

from tokenloom.formats import errors
from tokenloom.formats.errors import DataError, StorageError
from tokenloom.formats.io.optional import require
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote import client
from tokenloom.formats.remote.client import ObjectInfo, RetryPolicy, StoreConfig

__all__ = ["check_bucket", "fetch_into", "head", "list_objects"]

log = logging.getLogger("tokenloom.formats.remote")


def _config_json(config: StoreConfig) -> dict[str, Any]:
    return {
        "url": str(config.url),
        "storage_options": config.storage_options,
        "retries": dataclasses.asdict(config.retries),
    }


def _config_from(raw: dict[str, Any]) -> StoreConfig:
    return StoreConfig(parse_url(raw["url"]), raw["storage_options"], RetryPolicy(**raw["retries"]))


class _Helper:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tokenloom.formats.remote._serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )

    def call(self, op: str, **payload: Any) -> Any:
        with self.lock:
            stdin, stdout = cast(IO[bytes], self.process.stdin), cast(IO[bytes], self.process.stdout)
            try:
                stdin.write(orjson.dumps({"op": op, **payload}) + b"\n")
                stdin.flush()
                line = stdout.readline()
            except OSError as exc:
                line = b""
                cause: BaseException | None = exc
            else:
                cause = None
            if not line:
                raise StorageError(
                    f"the object-store helper process (pid {self.process.pid}) ended unexpectedly ({op})",
                    hint="Check memory limits and the helper's output on stderr; rerunning restarts it",
                ) from cause
        answer = orjson.loads(line)
        for message in answer.get("warnings", []):
            log.warning("%s", message)
        if "error" in answer:
            raise _rebuild(answer["error"])
        return answer.get("result")


def _rebuild(error: dict[str, Any]) -> Exception:
    cls = getattr(errors, error["cls"], None)
    if isinstance(cls, type) and issubclass(cls, DataError):
        return cls(error["problem"], path=error.get("path"), field=error.get("field"), hint=error.get("hint"))
    if error["cls"] == "ImportError":
        return ImportError(error["problem"])
    return StorageError(f"the object-store helper failed: {error['cls']}: {error['problem']}")


_HELPER: _Helper | None = None
_STALE: list[_Helper] = []  # a parent's helper, inherited by fork: never used, never collected


def _helper() -> _Helper:
    global _HELPER
    if _HELPER is None or _HELPER.pid != os.getpid():
        require("obstore", distribution="tokenloom-formats", extra="remote", purpose="reading object-store data")
        if _HELPER is not None:
            _STALE.append(_HELPER)
        _HELPER = _Helper()
    return _HELPER


def head(config: StoreConfig, name: str) -> ObjectInfo:
    """Size and ETag of ``name`` under the URL's prefix."""
    return ObjectInfo(**_helper().call("head", config=_config_json(config), name=name))


def fetch_into(config: StoreConfig, obj: ObjectInfo, start: int, end: int, path: str | os.PathLike[str]) -> None:
    """Write bytes ``[start, end)`` of ``obj`` (If-Match its ETag) into the new file ``path``, fsynced."""
    _helper().call(
        "fetch", config=_config_json(config), obj=dataclasses.asdict(obj), start=start, end=end, path=os.fspath(path)
    )


def check_bucket(config: StoreConfig) -> None:
    """MissingFileError naming the bucket when it does not exist."""
    _helper().call("check_bucket", config=_config_json(config))


def list_objects(config: StoreConfig, prefix: str) -> list[ObjectInfo]:
    """Every object under ``prefix`` of the store root of ``config``, sorted by key (s3, gs, az)."""
    return [ObjectInfo(**raw) for raw in _helper().call("list", config=_config_json(config), prefix=prefix)]


# -- the helper side -------------------------------------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _answer(request: dict[str, Any]) -> Any:
    config = _config_from(request["config"])
    if request["op"] == "head":
        return dataclasses.asdict(client.head(config, request["name"]))
    if request["op"] == "fetch":
        data = client.fetch_range(config, ObjectInfo(**request["obj"]), request["start"], request["end"])
        with open(request["path"], "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return None
    if request["op"] == "check_bucket":
        return client.check_bucket(config)
    if request["op"] == "list":
        return _answer_list(config, request)
    raise ValueError(f"unknown request {request['op']!r}")


def _answer_list(config: StoreConfig, request: dict[str, Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(info) for info in client.list_objects(config, request["prefix"])]


def serve() -> None:
    """Answer requests from stdin until it closes."""
    collect = _Collect()
    logger = logging.getLogger("tokenloom.formats.remote")
    logger.addHandler(collect)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    for line in stdin:
        collect.messages = []
        answer: dict[str, Any]
        try:
            answer = {"result": _answer(orjson.loads(line))}
        except DataError as exc:
            answer = {"error": {"cls": type(exc).__name__, "problem": exc.problem, "path": exc.path}}
            answer["error"].update(field=exc.field, hint=exc.hint)
        except Exception as exc:
            answer = {"error": {"cls": type(exc).__name__, "problem": str(exc).split("\n", 1)[0][:500]}}
        answer["warnings"] = collect.messages
        stdout.write(orjson.dumps(answer) + b"\n")
        stdout.flush()
