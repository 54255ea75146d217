"""Run benchmark children in processes forked from one server that has already done their imports.

A fresh interpreter here spends 3-5 s importing torch (and `datasets`, litdata...) before a child's clock
starts; the benchmarks that run a child per pass paid that 40-50 times a run, outside every figure. A
:class:`ForkServer` imports the modules once, then forks a child per job that runs the script exactly as
``python SCRIPT ARGS`` / ``python -c CODE ARGS`` would after those imports: own ``__main__``, ``sys.argv``,
``sys.path[0]``, working directory, stdout/stderr to files, its own process group (a timeout kills it and
every DataLoader worker it forked), exit code from ``SystemExit`` or 1 with the traceback on stderr, its non-daemon
threads joined and then the interpreter's exit handlers run at the end, and the run done only when every process of
its group has ended (as ``subprocess.run`` waits for all holders of the output). Each child is a process that
never made a dataset; the clocks the scripts keep (started after their imports) measure the same thing as in a
fresh process.

A server imports exactly a script's own top-level imports (:func:`script_imports`) and nothing else: a
module the script imports lazily, inside its clock, stays inside it. :class:`ForkServers` starts one server per
set of imports and environment (``datasets`` reads ``HF_DATASETS_OFFLINE`` when imported) and reuses a server
only when the new script's imports would load exactly the modules the server has loaded.

    with ForkServers(env) as servers:
        done = servers.run([script, "arg"])            # returncode, stdout, stderr, like subprocess.run
        done = servers.run(["-c", CODE, "arg"], timeout=600)
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType


class ForkServer:
    """A server process that imports ``modules`` once; :meth:`run` runs one script in a fresh fork of it."""

    def __init__(
        self, modules: Sequence[str], env: Mapping[str, str] | None = None, python: str = sys.executable
    ) -> None:
        self._files = Path(tempfile.mkdtemp(prefix="bench-forkserver-"))
        self._stderr = (self._files / "server-stderr.txt").open("w+")
        self.process = subprocess.Popen(
            [python, __file__, "serve", ",".join(modules)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        if self.process.stdin is None or self.process.stdout is None:
            raise RuntimeError("no pipes to the fork server")
        self._stdin, self._stdout = self.process.stdin, self.process.stdout
        self.modules = tuple(modules)
        self._loaded: frozenset[str] | None = None
        self._jobs = 0
        self._running: int | None = None  # the pid (and process group) of the child running now

    @property
    def loaded(self) -> frozenset[str]:
        """The modules loaded in the server after its imports (waits for them)."""
        if self._loaded is None:
            line = self._stdout.readline()
            if not line.startswith('{"serving"'):
                raise RuntimeError(f"the fork server did not start: {self._tail()}")
            self._loaded = frozenset(json.loads(line)["loaded"])
        return self._loaded

    def _tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-3000:] or "no output"

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 900,
        cwd: str | Path | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``python *argv`` in a fork of the server (``argv`` = script and args, or ``-c``, code and args);
        ``on_start`` gets the child's pid as it starts (e.g. to sample its memory)."""
        _ = self.loaded  # the server is ready
        self._jobs += 1
        out, err = self._files / f"{self._jobs}.out", self._files / f"{self._jobs}.err"
        job = {"argv": [str(a) for a in argv], "stdout": str(out), "stderr": str(err), "cwd": str(cwd or os.getcwd())}
        self._stdin.write(json.dumps(job) + "\n")
        self._stdin.flush()
        started = self._stdout.readline()
        if not started.startswith('{"pid"'):
            raise RuntimeError(f"the fork server died: {self._tail()}")
        pid = json.loads(started)["pid"]
        self._running = pid
        if on_start is not None:
            on_start(pid)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            line = self._stdout.readline()
        finally:
            timer.cancel()
        self._running = None
        if not line.startswith('{"exit"'):
            with contextlib.suppress(ProcessLookupError):  # its child would go on alone
                os.killpg(pid, signal.SIGKILL)
            raise RuntimeError(f"the fork server died: {self._tail()}")
        code = json.loads(line)["exit"]
        done = subprocess.CompletedProcess(list(argv), code, out.read_text(), err.read_text())
        out.unlink()
        err.unlink()
        if killed.is_set():
            raise subprocess.TimeoutExpired(list(argv), timeout, done.stdout, done.stderr)
        return done

    def close(self) -> None:
        """Stop the server; a child still running (a run cut short by an exception) is killed with its group."""
        running = self._running
        if running is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._stderr.close()
        for path in self._files.iterdir():
            path.unlink()
        self._files.rmdir()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


_CLOCKS = frozenset({"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"})


def _starts_a_clock(node: ast.stmt) -> bool:
    """Whether a statement (not the bodies of the functions it defines) reads a clock, e.g. ``start = time.time()``."""
    stack: list[ast.AST] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call):
            func = current.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in _CLOCKS:
                return True
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)
    return False


def script_imports(source: str) -> list[str]:
    """The modules a script imports at its top level (``import a.b`` -> a.b; ``from a.b import c`` -> a.b and
    ``a.b:c``), and in its ``if __name__ == "__main__":`` block, up to the first statement that reads a clock: an
    import after it is inside the script's clock, and stays there.

    A ``module:name`` entry is the name a ``from`` import takes: the server looks it up as the script would (a
    library's lazy attribute such as transformers' ``AutoTokenizer`` loads its modules only then), or imports
    ``module.name`` when it is a submodule."""
    names: list[str] = []
    pending = list(ast.parse(source).body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"':
            pending = [*node.body, *pending]
            continue
        if _starts_a_clock(node):
            break
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}:{alias.name}" for alias in node.names if alias.name != "*"]
    return list(dict.fromkeys(names))


def _source(argv: Sequence[str]) -> str:
    return str(argv[1]) if argv[0] == "-c" else Path(argv[0]).read_text()


class ForkServers:
    """Fork servers started on demand, one per (imports of the script, environment); see the module docstring."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env if env is not None else os.environ)
        self._servers: list[tuple[dict[str, str], ForkServer]] = []

    def prestart(self, *argvs: Sequence[str], env: Mapping[str, str] | None = None, wait: bool = True) -> None:
        """Start the servers of these scripts (as :meth:`run` takes them) side by side, and (``wait``) wait until
        all are ready: their imports then overlap, before any measurement, instead of adding up one by one."""
        chosen = dict(env) if env is not None else self.env
        known = {(server.modules, tuple(sorted(e.items()))) for e, server in self._servers}
        for argv in argvs:
            modules = tuple(script_imports(_source(argv)))
            if (modules, tuple(sorted(chosen.items()))) not in known:
                known.add((modules, tuple(sorted(chosen.items()))))
                self._servers.append((chosen, ForkServer(modules, env=chosen)))
        for _, server in self._servers if wait else ():
            _ = server.loaded

    def server_for(self, modules: Sequence[str], env: Mapping[str, str]) -> ForkServer:
        wanted = set(modules)
        for server_env, server in self._servers:
            # same modules loaded as a fresh process would have: the server's imports are among the script's,
            # and the script's extra ones are already loaded by the server's
            if server_env == env and set(server.modules) <= wanted <= server.loaded:
                return server
        server = ForkServer(list(modules), env=env)
        self._servers.append((dict(env), server))
        return server

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 900,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``python *argv`` (script and args, or ``-c``, code and args) in a fork of the server for its imports."""
        server = self.server_for(script_imports(_source(argv)), dict(env) if env is not None else self.env)
        return server.run(argv, timeout=timeout, cwd=cwd, on_start=on_start)

    def close(self) -> None:
        for _, server in self._servers:
            server.close()
        self._servers.clear()

    def __enter__(self) -> ForkServers:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _child(job: dict) -> int:
    """In the forked child: become ``python *argv`` after the server's imports; return the exit code."""
    import atexit
    import runpy
    import traceback
    import types

    os.setpgid(0, 0)
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(job["cwd"])
    argv = job["argv"]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        # as the interpreter's own exit does: wait for the non-daemon threads, then run the exit handlers
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _become_subreaper() -> bool:
    """Make this process the parent of the orphans of its children (Linux ``PR_SET_CHILD_SUBREAPER``)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _wait_for_group(pgid: int) -> None:
    """Wait until no process of the child's group is left (its workers, a process it started and left running).

    ``python SCRIPT`` under ``subprocess.run(capture_output=True)`` returns only when every process holding its
    output has ended; here they would go on running, unseen, beside the next measurement. A group that never ends
    is a timeout, as it would be for a fresh process. The orphans are this server's children (a subreaper), so
    reaping them ends the wait; without that, the group is polled until it is gone.
    """
    while True:
        try:
            os.waitpid(-pgid, 0)
        except ChildProcessError:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


def _import(entry: str) -> None:
    """Import ``module``, or for ``module:name`` look the name up as ``from module import name`` does (an attribute,
    which may load a library's lazy module, else the submodule ``module.name``)."""
    import importlib

    module_name, _, attribute = entry.partition(":")
    module = importlib.import_module(module_name)
    if attribute and not hasattr(module, attribute):
        importlib.import_module(f"{module_name}.{attribute}")


def serve(modules: list[str]) -> None:
    """Import ``modules``, then per job line on stdin: fork, report ``{"pid"}``, wait for the child and whatever it
    left running in its process group, report ``{"exit"}``."""
    _become_subreaper()

    started: dict[int, str] = {}  # thread ident -> the import (or name lookup) that started it
    for name in modules:
        _import(name)
        started.update({thread.ident or 0: name for thread in threading.enumerate() if thread.ident not in started})
    # a resolved ``module:name`` counts as loaded, so a script importing the same name can reuse this server
    loaded = sorted({*sys.modules, *(name for name in modules if ":" in name)})
    print(json.dumps({"serving": modules, "loaded": loaded}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        # a Python thread could hold a lock the child would wait for forever (idle native pools are forked
        # by every fork-started DataLoader worker too)
        threads = [thread for thread in threading.enumerate() if thread is not threading.main_thread()]
        if threads:
            named = ", ".join(f"{thread.name!r} (from {started.get(thread.ident or 0, '?')})" for thread in threads)
            raise SystemExit(
                f"the fork server has started Python threads: a fork of it would not be a clean process: {named}"
            )
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_child(job))
        # the child's group exists before its pid is reported (as a shell does it): a kill of the group right away
        # would otherwise find none and leave the child running
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpgid(pid, pid)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        _wait_for_group(pid)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: _forkserver.py serve MODULE[,MODULE...]   (started by ForkServer)")
    try:
        serve([name for name in sys.argv[2].split(",") if name])
    except BaseException as failed:  # reported, then an exit that does not wait for threads
        # a plain exit would first join the non-daemon threads an import started, which may never end: the client
        # would wait for this server's output forever
        code = 1
        if not isinstance(failed, SystemExit):
            import traceback

            traceback.print_exc()
        elif failed.code is None or isinstance(failed.code, int):
            code = failed.code or 0
        else:
            print(failed.code, file=sys.stderr)
        sys.stderr.flush()
        os._exit(code)
