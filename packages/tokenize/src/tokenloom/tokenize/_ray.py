"""``--executor ray``: the units of a plan as Ray tasks on an existing Ray cluster (extra ``ray``).

    driver: the plan, the engine choice and the encoder's facts (one in-process encoder)
        -> one task per uncommitted unit (``max_retries``: a lost worker's unit runs again)
        -> each task encodes its unit in its worker and commits it (UnitWriter: shards, done marker)
        -> the driver waits for all, then finalizes (the manifest) as any node does

A task writes exactly what the local pool writes for the unit, so the output is the
same bytes. The cluster's workers must see the tokenizer, and a local --output-dir and
local inputs, at the same paths as the driver.

Object storage (s3://, gs://, az://) is reached from each task's own machine, never through the driver's paths:

    an input prefix: the task fetches its unit's input object into this machine's cache
        (TOKENLOOM_CACHE_DIR/inputs/ of the worker's environment, or the default cache directory)
    an output prefix: the task stages its unit in this machine's cache (.../uploads/) and hands it to the
        driver's ``upload`` (_publish.upload_unit: its shards, then its done marker, an atomic create), then
        removes the staged copy; the driver established the plan at the URL before, skipped the units committed
        there, and writes the manifest last (_publish)

Text units (_unit_work.write_text_unit) and record units (_unit_records.write_record_unit) run through one task,
run_unit_task (called by _unit_work.run_unit_tasks, the one unit-task executor: Ray, a pool or this process):
the same input staging, the same upload of a unit committed in the worker's cache (a record unit's store, then its
done marker; the driver merges the stores as the last node of a --num-nodes run does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tokenloom.formats import ConfigError, StorageError
from tokenloom.formats.io import require
from tokenloom.formats.io.urls import parse_url
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize.inputs import UnitSource, input_staging_dir

__all__ = [
    "Upload",
    "check_reachable",
    "import_ray",
    "local_config",
    "preflight",
    "ray_tasks",
    "run_unit_task",
]

#: How long the driver waits for a TCP connection to the cluster's head before giving up.
CONNECT_TIMEOUT_SECONDS = 5.0
#: Ray re-runs a unit whose worker died this many times (a unit's bytes never depend on the attempt).
TASK_RETRIES = 3


def _address(ray_address: str | None) -> str:
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConfigError(
            "--executor ray needs the address of a running Ray cluster",
            field="ray_address",
            hint="Pass --ray-address HOST:PORT (the head's GCS port, 6379 by default) or set RAY_ADDRESS",
        )
    return address


def import_ray() -> Any:
    """The ray module, or the ImportError naming the extra."""
    # under `uv run`, Ray would otherwise start its workers with `uv run` in a copy of the working directory
    # (a fresh environment, without the ray extra); they must use the cluster's own Python. Read at import.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    return require("ray", distribution="tokenloom-tokenize", extra="ray", purpose="tokenize --executor ray")


def preflight(ray_address: str | None) -> None:
    """Before anything is written: ray importable, an address given (--ray-address, else RAY_ADDRESS), something
    listening there."""
    import_ray()
    check_reachable(_address(ray_address))


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """A ConfigError within ``timeout`` if nothing listens at ``address`` (ray.init would wait minutes)."""
    if address == "auto":
        return  # ray.init itself looks for a local cluster and fails fast without one
    split = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = split.hostname, split.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise ConfigError(
            f"ray address {address!r} is not HOST:PORT", field="ray_address", hint="Pass e.g. 10.0.0.1:6379"
        )
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            answer = _grpc_answer(sock, deadline)
    except OSError as exc:
        raise ConfigError(
            f"the Ray cluster at {address} cannot be reached ({exc or type(exc).__name__}; waited at most "
            f"{timeout:g} s)",
            field="ray_address",
            hint="Start the cluster (ray start --head) or pass the head's address with --ray-address HOST:PORT",
        ) from None
    if answer is not None:
        raise ConfigError(
            f"something at {address} accepts connections but is not a running Ray head: {answer} (waited at most "
            f"{timeout:g} s)",
            field="ray_address",
            hint="Check that the head is up (`ray status --address HOST:PORT`; its log: ray start's output or "
            "/tmp/ray/session_latest/logs/gcs_server.out) and that HOST:PORT is its GCS port (6379 by default)",
        )


#: an HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (a Ray head's GCS) answers with SETTINGS
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _grpc_answer(sock: socket.socket, deadline: float) -> str | None:
    """None when the peer answers as a gRPC server (HTTP/2 SETTINGS) before ``deadline``, else what it did instead.

    A port that accepts and never answers (a hung or half-started head, another program), or one that closes at
    once, made ray.init wait minutes before a StorageError. With TLS (RAY_USE_TLS) the check is the connection only.
    """
    if os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true"):
        return None
    try:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        sock.sendall(_HTTP2_HELLO)
        head = b""
        while len(head) < 9:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(9 - len(head))
            if not chunk:
                return "it closed the connection without answering"
            head += chunk
    except TimeoutError:
        return "it never answered"
    except ConnectionError:
        return "it closed the connection without answering"
    except OSError as exc:
        return f"the connection failed ({exc.strerror or exc})"
    if head[3] != 0x04:  # the frame type of the server's first frame must be SETTINGS
        return f"it does not answer as a gRPC server (first bytes {head[:9].hex()})"
    return None


#: ``upload(staging, unit)``: a unit committed in a local staging directory, put into the output bucket
Upload = Callable[[Path, int], None]


def local_config(config: TokenizeConfig, staging: Path) -> TokenizeConfig:
    """The run's config writing into the local ``staging`` directory (a bucket's copy on this machine)."""
    return dataclasses.replace(config, output_dir=staging, overwrite=False, remote=None)


def run_unit_task(
    write: Callable[..., Any],
    config: TokenizeConfig,
    unit: int,
    source: UnitSource,
    settings: tuple[Any, ...],
    plan: str,
    upload: Upload | None = None,
) -> Any:
    """One unit, encoded in this (Ray worker) process by ``write(config, unit, source, *settings, plan)`` and
    committed; plain data back to the driver. ``write``: a text unit (_unit_work.write_text_unit) or a record unit
    (_unit_records.write_record_unit). Object storage is reached from this machine: see the module docstring.
    """
    try:
        source = _inputs_here(config, source)
        if upload is None or config.output_url is None:
            return write(config, unit, source, *settings, plan)
        from tokenloom.formats.remote.publish import staging_dir  # the remote layer: only for a bucket output

        # this machine's cache (the worker's TOKENLOOM_CACHE_DIR), one directory per unit: no other task writes there
        staging = staging_dir(parse_url(config.output_url), {"plan": plan, "executor": "ray"}) / f"unit-{unit:06d}"
        shutil.rmtree(staging, ignore_errors=True)  # a killed attempt's leftovers: the unit is written afresh
        staging.mkdir(parents=True)
        try:
            outcome = write(local_config(config, staging), unit, source, *settings, plan)
            upload(staging, unit)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return outcome
    except StorageError as error:  # credentials, disk: this machine's, which the driver's message would not say
        raise type(error)(
            error.problem,
            errno=error.errno,
            path=error.path,
            offset=error.offset,
            record=error.record,
            field=error.field,
            hint=f"{error.hint} (raised on the Ray worker on {socket.gethostname()}: its credentials are the variables "
            "of the environment `ray start` ran in there, its cache that environment's TOKENLOOM_CACHE_DIR, not the "
            "driver's)",
        ) from None


def _inputs_here(config: TokenizeConfig, source: UnitSource) -> UnitSource:
    """``source`` with an object-store input staged under this machine's cache, not the driver's ``input_dir``."""
    if source.file.url is None or config.input_url is None:
        return source
    relative = source.file.path.relative_to(config.input_dir)  # <hash of ETag>/<key under the prefix>
    file = dataclasses.replace(source.file, path=input_staging_dir(config.input_url, None) / relative)
    return dataclasses.replace(source, file=file)


def ray_tasks(ray_address: str | None, function: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> Iterator[Any]:
    """``function(*call)`` for every call as a Ray task on the cluster at --ray-address; the results in call order.

    The cluster is joined here (and left again if this process joined it); an address that does not answer, or a
    head that fails to take us, is a ConfigError. A task's own error (a bad record, ...) is raised as itself.
    """
    if not calls:
        return
    ray = import_ray()
    address = _address(ray_address)
    check_reachable(address)
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # a head that died after the check: ray's ConnectionError, not a disk's error
            problem = str(exc).strip().split("\n", 1)[0][:300] or type(exc).__name__
            raise ConfigError(
                f"could not join the Ray cluster at {address}: {problem}",
                field="ray_address",
                hint="Check that the head is up (`ray status --address HOST:PORT`) and reachable from this machine",
            ) from None
    try:
        task = ray.remote(max_retries=TASK_RETRIES, num_cpus=1)(function)
        refs = [task.remote(*call) for call in calls]
        for ref in refs:
            try:
                yield ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the task's own error: raise it here
                cause = getattr(exc, "cause", None)
                if isinstance(cause, Exception):
                    raise cause from None
                raise
    finally:
        if started_here:
            with contextlib.suppress(Exception):
                ray.shutdown()
