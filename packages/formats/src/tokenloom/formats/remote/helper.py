"""Object-store calls: in-process where obstore's runtime is safe, else through a helper process.

obstore (tokio) hangs in a forked child once its runtime ran in the parent, and a DataLoader forks
its workers after the dataset was opened. :mod:`._runtime` decides per process: a child process
(a DataLoader worker) whose address space never ran the runtime calls obstore itself; every other
process (the top-level process that forks the workers, a child forked after the runtime ran) starts
one helper per thread on first use (forked from it where that is clean, see ``_Forked``; else a fresh
interpreter that imports only what serving needs, see ``_BOOTSTRAP``; again after a fork: the pid is
checked) and sends it requests as JSON lines on a pipe (no pickles): ``head``, ``fetch`` (write bytes
``[start, end)`` of an object into a file), ``check_bucket``, and for writes ``put`` (upload a local file,
multipart when large), ``stat`` and ``delete`` (:mod:`.writes`).
Both paths answer the same requests with the same code (:func:`_answer`) and the same errors.
``storage_options`` credentials travel only on that pipe, never in argv. The helper's retry warnings
come back with each answer and are logged by the caller, so they count in the caller's logs. The
helper exits when its pipe closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, cast

import orjson

from tokenloom.formats import errors
from tokenloom.formats.errors import DataError, StorageError
from tokenloom.formats.io.optional import require
from tokenloom.formats.io.storage import storage_errors
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote import _runtime, _waits, client, writes
from tokenloom.formats.remote.client import ENV_PREFIXES, ObjectInfo, RetryPolicy, StoreConfig

__all__ = [
    "check_bucket",
    "delete",
    "fetch_into",
    "head",
    "heads",
    "in_process",
    "list_dir",
    "list_objects",
    "list_prefix",
    "put_file",
    "put_once",
    "read_range",
    "stat",
]

log = logging.getLogger("tokenloom.formats.remote")


def _config_json(config: StoreConfig) -> dict[str, Any]:
    return {
        "url": str(config.url),
        "storage_options": config.storage_options,
        "retries": dataclasses.asdict(config.retries.resolved()),  # the budget of this process's environment
        # obstore's environment variables travel with each request: a helper started earlier sees the current ones
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
    }


def _config_from(raw: dict[str, Any]) -> StoreConfig:
    env = raw.get("env")
    if isinstance(env, dict):
        for name in [k for k in os.environ if k.startswith(ENV_PREFIXES) and k not in env]:
            del os.environ[name]
        os.environ.update({k: str(v) for k, v in env.items() if k.startswith(ENV_PREFIXES)})
    return StoreConfig(parse_url(raw["url"]), raw["storage_options"], RetryPolicy(**raw["retries"]))


#: What a helper's interpreter runs. The package ``__init__``s above this module import every format and
#: numpy (0.3-0.5 s of a helper's 0.4-0.5 s start here, paid by a top-level process's first remote call, e.g.
#: a streaming dataset's HEADs at construction); serving needs none of it, so the packages are made bare over
#: their folders, and only this module and its imports load (about 0.1 s).
_BOOTSTRAP = """\
import importlib.util, sys, types
for name in ("tokenloom.formats", "tokenloom.formats.io", "tokenloom.formats.remote"):
    spec = importlib.util.find_spec(name)
    package = types.ModuleType(name)
    package.__spec__, package.__loader__, package.__package__ = spec, spec.loader, name
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = package
from tokenloom.formats.remote.helper import serve
serve()
"""


class _Forked:
    """A helper forked from this process: no interpreter start and no imports (0.1-0.8 s of a warm open, whose
    only requests are a HEAD and a LIST, went to starting the interpreter above). Only where the fork is clean:
    this thread is the only Python thread (no lock another thread holds is copied) and obstore's runtime never ran
    in this address space (see ``_runtime``); else the helper is a fresh interpreter (:data:`_BOOTSTRAP`)."""

    @staticmethod
    def clean() -> bool:
        return threading.active_count() == 1 and _runtime.runtime_owner() is None and not _runtime.tokio_threads()

    def __init__(self) -> None:
        requests, self._requests = os.pipe()
        self._answers, answers = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the helper: serve this pipe, then leave without the parent's exit handlers
            code = 1
            try:
                gc.freeze()  # the parent's objects are never scanned here (a scan would copy every page they are on)
                os.close(self._requests)
                os.close(self._answers)
                _runtime.claim()  # this address space starts its own runtime
                serve(os.fdopen(requests, "rb"), os.fdopen(answers, "wb"))
                code = 0
            finally:
                os._exit(code)
        os.close(requests)
        os.close(answers)
        self.stdin, self.stdout = os.fdopen(self._requests, "wb"), os.fdopen(self._answers, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


class _Helper:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.process: _Forked | subprocess.Popen[bytes] = (
            _Forked()
            if _Forked.clean()
            else subprocess.Popen([sys.executable, "-c", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        )

    def call(self, op: str, config: StoreConfig, **payload: Any) -> Any:
        endpoint = _waits.endpoint_of(config)
        if _waits.ever_answered(endpoint):
            payload["answered"] = True  # a helper started mid-outage must not say that nothing there ever answered
        request = orjson.dumps({"op": op, "config": _config_json(config), **payload}) + b"\n"
        with self.lock:
            stdin, stdout = cast(IO[bytes], self.process.stdin), cast(IO[bytes], self.process.stdout)
            try:
                stdin.write(request)
                stdin.flush()
                line = stdout.readline()
                while line.startswith(b'{"interim"'):  # a wait begins: said now, not when the answer comes
                    _log_wait(orjson.loads(line)["interim"])
                    line = stdout.readline()
            except OSError as exc:
                line = b""
                cause: BaseException | None = exc
            else:
                cause = None
            if not line:
                if getattr(_LOCAL, "helper", None) is self:
                    _LOCAL.helper = None  # the next call starts a new helper: one crash does not fail every later read
                raise StorageError(
                    f"the object-store helper process (pid {self.process.pid}) ended unexpectedly ({op})",
                    hint="Check memory limits and the helper's output on stderr; rerunning restarts it",
                ) from cause
        answer = orjson.loads(line)
        for message in answer.get("warnings", []):
            if isinstance(message, dict):  # a wait: one line per (endpoint, reason) over all this process's helpers
                _log_wait(message)
            else:
                log.warning("%s", message)
        if "error" in answer:
            raise _rebuild(answer["error"])
        _waits.answered(endpoint)
        return answer.get("result")


def _log_wait(message: dict[str, Any]) -> None:
    """Log a helper's wait once per (endpoint, reason) over all this process's helpers."""
    key = message.get("key") or ["", ""]
    if _waits.first_of_wait(str(key[0]), str(key[1]), False):
        log.warning("%s", message["message"])


def _rebuild(error: dict[str, Any]) -> Exception:
    cls = getattr(errors, error["cls"], None)
    if isinstance(cls, type) and issubclass(cls, StorageError):
        where = {"path": error.get("path"), "field": error.get("field"), "hint": error.get("hint")}
        return cls(error["problem"], errno=error.get("errno"), **where)
    if isinstance(cls, type) and issubclass(cls, DataError):
        return cls(error["problem"], path=error.get("path"), field=error.get("field"), hint=error.get("hint"))
    if error["cls"] == "ImportError":
        return ImportError(error["problem"])
    return StorageError(f"the object-store helper failed: {error['cls']}: {error['problem']}")


_LOCAL = threading.local()  # one helper per thread: a prefetch thread's GETs never queue behind the reader's
_STALE: list[_Helper] = []  # a parent's helper, inherited by fork: never used, never collected


def _call(op: str, config: StoreConfig, **payload: Any) -> Any:
    """Run request ``op`` in this process when the runtime is safe here, else in this thread's helper."""
    if _runtime.in_process():
        try:
            return _answer(op, config, payload)
        except (DataError, ImportError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # also a Rust panic in obstore (pyo3's PanicException): a named error
            problem = str(exc).split("\n", 1)[0][:500]
            raise StorageError(f"the object-store client failed: {type(exc).__name__}: {problem}") from exc
    return _helper().call(op, config, **payload)


def _helper() -> _Helper:
    helper: _Helper | None = getattr(_LOCAL, "helper", None)
    if helper is None or helper.pid != os.getpid():
        require("obstore", distribution="tokenloom-formats", extra="remote", purpose="reading object-store data")
        if helper is not None:
            _STALE.append(helper)
        helper = _LOCAL.helper = _Helper()
    return helper


def head(config: StoreConfig, name: str) -> ObjectInfo:
    """Size and ETag of ``name`` under the URL's prefix."""
    return ObjectInfo(**_call("head", config, name=name))


def heads(config: StoreConfig, names: list[str]) -> list[ObjectInfo]:
    """:func:`head` of every name (several at once)."""
    return [ObjectInfo(**item) for item in _call("heads", config, names=names)]


def list_objects(config: StoreConfig) -> list[ObjectInfo]:
    """Every object under the URL's prefix, sorted by key."""
    return [ObjectInfo(**item) for item in _call("list", config)]


def fetch_into(config: StoreConfig, obj: ObjectInfo, start: int, end: int, path: str | os.PathLike[str]) -> None:
    """Write bytes ``[start, end)`` of ``obj`` (If-Match its ETag) into the new file ``path`` (not fsynced).

    The caller publishes it by rename: other processes never see it partly written. See :mod:`.cache` for
    why a cached block needs no fsync.
    """
    _call("fetch", config, obj=dataclasses.asdict(obj), start=start, end=end, path=os.fspath(path))


def in_process() -> bool:
    """True when this process calls obstore itself (then :func:`read_range` hands bytes over without a file)."""
    return _runtime.in_process()


def read_range(config: StoreConfig, obj: ObjectInfo, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``obj`` (If-Match its ETag); only where :func:`in_process` (else: fetch_into)."""
    if not _runtime.in_process():
        raise RuntimeError("read_range runs only where obstore is called in process; use fetch_into")
    return _call("read", config, obj=dataclasses.asdict(obj), start=start, end=end)


def check_bucket(config: StoreConfig) -> None:
    """MissingFileError naming the bucket when it does not exist."""
    _call("check_bucket", config)


def list_dir(config: StoreConfig, name: str = "") -> tuple[list[str], list[str]]:
    """``(folders, objects)`` directly under ``name`` of the URL's prefix (names, sorted)."""
    folders, objects = _call("list_dir", config, name=name)
    return list(folders), list(objects)


def put_file(
    config: StoreConfig,
    path: str | os.PathLike[str],
    name: str,
    checksum: str,
    part_size: int = writes.DEFAULT_PART_SIZE,
) -> str:
    """Upload the local file ``path`` as ``name`` (its checksum as metadata; multipart when large); the ETag."""
    return _call("put", config, path=os.fspath(path), name=name, checksum=checksum, part_size=part_size)


def put_once(config: StoreConfig, path: str | os.PathLike[str], name: str, checksum: str) -> bool:
    """Create ``name`` from the small file ``path`` unless it already exists (an atomic create); False if it did."""
    return _call("put_once", config, path=os.fspath(path), name=name, checksum=checksum)


def stat(config: StoreConfig, name: str) -> dict[str, Any] | None:
    """``{"size", "etag", "checksum"}`` of ``name`` (checksum None if it was not put by tokenloom), or None."""
    return _call("stat", config, name=name)


def delete(config: StoreConfig, name: str) -> None:
    """Delete ``name`` under the URL's prefix."""
    _call("delete", config, name=name)


def list_prefix(config: StoreConfig, prefix: str) -> list[ObjectInfo]:
    """Every object under ``prefix`` of the store root of ``config``, sorted by key (s3, gs, az)."""
    return [ObjectInfo(**raw) for raw in _call("list_prefix", config, prefix=prefix)]


# -- the helper side -------------------------------------------------------------------------------------


class _Collect(logging.Handler):
    """Warnings of a request go back with its answer; a wait is sent at once (an interim line), so an outage of
    minutes is seen when it begins, not when it ends."""

    def __init__(self, out: IO[bytes] | None = None) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str | dict[str, Any]] = []
        self.out = out
        self.out_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        key = getattr(record, "wait_key", None)
        message = record.getMessage()
        if key and self.out is not None:
            with self.out_lock:
                self.out.write(orjson.dumps({"interim": {"key": key, "message": message}}) + b"\n")
                self.out.flush()
            return
        self.messages.append({"key": key, "message": message} if key else message)


def _fetch(config: StoreConfig, request: dict[str, Any]) -> None:
    data = client.fetch_range(config, ObjectInfo(**request["obj"]), request["start"], request["end"])
    # named (a full disk: the folder and its free space); the block cache names its own directory (_cachedir)
    path = request["path"]
    with storage_errors(os.path.dirname(path), f"writing {len(data)} fetched bytes into it"), open(path, "xb") as out:
        out.write(data)


#: every request: op -> the call that answers it (in this process, or in the helper for a caller)
_OPS: dict[str, Callable[[StoreConfig, dict[str, Any]], Any]] = {
    "head": lambda config, r: dataclasses.asdict(client.head(config, r["name"])),
    "heads": lambda config, r: [dataclasses.asdict(info) for info in client.heads(config, r["names"])],
    "fetch": _fetch,
    "read": lambda config, r: client.fetch_range(config, ObjectInfo(**r["obj"]), r["start"], r["end"]),
    "list": lambda config, r: [dataclasses.asdict(info) for info in client.list_objects(config)],
    "check_bucket": lambda config, r: client.check_bucket(config),
    "list_dir": lambda config, r: client.list_dir(config, r["name"]),
    "put": lambda config, r: writes.put_file(config, r["path"], r["name"], r["checksum"], r["part_size"]),
    "put_once": lambda config, r: writes.put_file(config, r["path"], r["name"], r["checksum"], once=True),
    "stat": lambda config, r: writes.stat(config, r["name"]),
    "delete": lambda config, r: writes.delete(config, r["name"]),
    "list_prefix": lambda config, r: [dataclasses.asdict(info) for info in client.list_prefix(config, r["prefix"])],
}


def _answer(op: str, config: StoreConfig, request: dict[str, Any]) -> Any:
    if op not in _OPS:
        raise ValueError(f"unknown request {op!r}")
    return _OPS[op](config, request)


def serve(requests: IO[bytes] | None = None, answers: IO[bytes] | None = None) -> None:
    """Answer requests from ``requests`` (default: this process's stdin) until it closes."""
    stdin: IO[bytes] = requests if requests is not None else sys.stdin.buffer
    stdout: IO[bytes] = answers if answers is not None else sys.stdout.buffer
    collect = _Collect(stdout)
    logger = logging.getLogger("tokenloom.formats.remote")
    logger.addHandler(collect)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    for line in stdin:
        collect.messages = []
        answer: dict[str, Any]
        try:
            request = orjson.loads(line)
            config = _config_from(request["config"])
            if request.get("answered"):
                _waits.heard(_waits.endpoint_of(config))
            answer = {"result": _answer(request["op"], config, request)}
        except DataError as exc:
            answer = {"error": {"cls": type(exc).__name__, "problem": exc.problem, "path": exc.path}}
            answer["error"].update(field=exc.field, hint=exc.hint, errno=getattr(exc, "errno", None))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # also a Rust panic in obstore (pyo3's PanicException): answer, stay alive
            answer = {"error": {"cls": type(exc).__name__, "problem": str(exc).split("\n", 1)[0][:500]}}
        answer["warnings"] = collect.messages
        with collect.out_lock:
            stdout.write(orjson.dumps(answer) + b"\n")
            stdout.flush()
