"""The benchmarks' fork server (tools/bench/_forkserver.py) runs a child as ``python SCRIPT ARGS`` would."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "_forkserver.py"
_SPEC = importlib.util.spec_from_file_location("_bench_forkserver", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
forkserver = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = forkserver
_SPEC.loader.exec_module(forkserver)


def test_script_imports_are_the_top_level_ones() -> None:
    source = "import json, os.path as p\nfrom email import message\nfrom . import x\ndef f():\n    import csv\n"
    assert forkserver.script_imports(source) == ["json", "os.path", "email", "email:message"]


def test_a_from_import_resolves_lazy_names_and_submodules_in_the_server(tmp_path: Path) -> None:
    # transformers' AutoTokenizer is a lazy attribute: `from transformers import AutoTokenizer` loads its modules
    # only when the name is looked up, so the server must look it up as the script's own import would
    package = tmp_path / "lazypkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "def __getattr__(name):\n"
        "    if name == 'Thing':\n"
        "        from lazypkg._heavy import Thing\n"
        "        return Thing\n"
        "    raise AttributeError(name)\n"
    )
    (package / "_heavy.py").write_text("class Thing:\n    pass\n")
    (package / "sub.py").write_text("VALUE = 7\n")
    code = (
        "import sys\n"
        "preloaded = sorted(m for m in ('lazypkg._heavy', 'lazypkg.sub') if m in sys.modules)\n"
        "from lazypkg import Thing, sub\n"
        "print(preloaded, Thing.__name__, sub.VALUE)\n"
    )
    assert forkserver.script_imports(code) == ["sys", "lazypkg", "lazypkg:Thing", "lazypkg:sub"]
    with forkserver.ForkServers({**os.environ, "PYTHONPATH": str(tmp_path)}) as servers:
        done = servers.run(["-c", code])
        assert done.returncode == 0, done.stderr
        assert done.stdout == "['lazypkg._heavy', 'lazypkg.sub'] Thing 7\n"
        (server,) = [server for _, server in servers._servers]
        assert {"lazypkg._heavy", "lazypkg.sub", "lazypkg:Thing", "lazypkg:sub"} <= server.loaded
        # the same names again reuse it; a script that takes only the package does not (it would find _heavy loaded)
        assert servers.server_for(["sys", "lazypkg", "lazypkg:Thing", "lazypkg:sub"], servers.env) is server
        assert servers.server_for(["sys", "lazypkg"], servers.env) is not server


def test_a_script_sees_its_argv_path_cwd_and_main(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        "import json, os, pickle, sys\n"
        "class Box:\n"
        "    pass\n"
        "pickle.dumps(Box())  # a class of __main__ pickles by reference, as in a fresh process\n"
        "print(json.dumps([sys.argv, sys.path[0], os.getcwd(), __name__, os.getpgid(0) == os.getpid()]))\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    with forkserver.ForkServers() as servers:
        done = servers.run([str(script), "a", "b c"], cwd=work)
    assert done.returncode == 0, done.stderr
    expected = [[str(script), "a", "b c"], str(script.resolve().parent), str(work.resolve()), "__main__", True]
    assert json.loads(done.stdout) == expected


def test_exit_codes_tracebacks_and_exit_handlers() -> None:
    with forkserver.ForkServers() as servers:
        assert servers.run(["-c", "import sys; sys.exit(3)"]).returncode == 3
        assert servers.run(["-c", "import sys; sys.exit('why')"]).returncode == 1
        failed = servers.run(["-c", "import json\n1 / 0"])
        assert failed.returncode == 1
        assert "ZeroDivisionError" in failed.stderr
        handled = servers.run(["-c", "import atexit, sys\natexit.register(lambda: print('bye'))\nprint(sys.argv)", "x"])
        assert handled.stdout.splitlines() == ["['-c', 'x']", "bye"]


def test_a_timeout_kills_the_child_and_the_server_goes_on() -> None:
    with forkserver.ForkServers() as servers:
        with pytest.raises(subprocess.TimeoutExpired):
            servers.run(["-c", "import time; time.sleep(60)"], timeout=1)
        assert servers.run(["-c", "import json; print(json.dumps(1))"]).stdout == "1\n"


def test_a_server_is_reused_only_for_the_same_loaded_modules() -> None:
    with forkserver.ForkServers() as servers:
        plain = servers.server_for(["json"], servers.env)
        assert servers.server_for(["json"], servers.env) is plain
        # json.decoder is loaded by json: a script importing both loads exactly what the json server has
        assert servers.server_for(["json", "json.decoder"], servers.env) is plain
        # csv is not loaded by json's server: a fork of it would import csv inside the script's clock
        assert servers.server_for(["csv"], servers.env) is not plain
        assert servers.server_for(["json"], {**servers.env, "EXTRA": "1"}) is not plain
        # a server that imported more than the script does: csv would be loaded before the script's clock starts
        both = servers.server_for(["csv", "json"], servers.env)
        assert servers.server_for(["csv", "json"], servers.env) is both
        fresh = forkserver.ForkServers()
        try:
            first = fresh.server_for(["csv", "json"], fresh.env)
            assert fresh.server_for(["json"], fresh.env) is not first
        finally:
            fresh.close()


def test_prestart_starts_each_script_server_once(tmp_path: Path) -> None:
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("import json\nprint(json.dumps('first'))\n")
    second.write_text("import csv, json\nprint(json.dumps(csv.__name__))\n")
    with forkserver.ForkServers() as servers:
        servers.prestart([str(first)], [str(second)], [str(first)])
        started = [server for _, server in servers._servers]
        assert [server.modules for server in started] == [("json",), ("csv", "json")]
        assert servers.run([str(first)]).stdout == '"first"\n'
        assert servers.run([str(second)]).stdout == '"csv"\n'
        assert [server for _, server in servers._servers] == started


def test_an_import_after_the_clock_starts_stays_inside_it() -> None:
    # the server must not do an import the script makes inside its clock: the fork would skip it and the figure
    # would leave out time a fresh process spends
    source = (
        "import json, time\n"
        "def helper():\n    return time.perf_counter()\n"
        "start = time.perf_counter()\n"
        "import csv\n"
        "if __name__ == '__main__':\n"
        "    import email\n"
        "    begin = time.perf_counter()\n"
        "    import html\n"
    )
    assert forkserver.script_imports(source) == ["json", "time"]
    main_block = "import json, time\nif __name__ == '__main__':\n    import email\n    t0 = time.perf_counter()\n"
    assert forkserver.script_imports(main_block) == ["json", "time", "email"]


def test_non_daemon_threads_finish_before_the_exit_handlers() -> None:
    # python joins non-daemon threads at exit, then runs the exit handlers: the fork must not cut a thread short
    code = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('exit handler', flush=True))\n"
        "def late():\n    time.sleep(0.5)\n    print('thread', flush=True)\n"
        "threading.Thread(target=late).start()\n"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    with forkserver.ForkServers() as servers:
        forked = servers.run(["-c", code])
    assert fresh.stdout.splitlines() == ["thread", "exit handler"]
    assert forked.stdout == fresh.stdout


def test_a_run_waits_for_the_processes_its_child_left_running(tmp_path: Path) -> None:
    # `python SCRIPT` under subprocess.run(capture_output=True) returns only when every process holding its output
    # has ended: a worker left running by a script must not go on loading the machine after the run returns
    code = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1); print(\"grandchild\", flush=True)'])\n"
    )
    with forkserver.ForkServers() as servers:
        done = servers.run(["-c", code])
    assert done.stdout == "grandchild\n"


def test_closing_kills_a_running_child() -> None:
    import os
    import threading
    import time

    started: list[int] = []
    with forkserver.ForkServers() as servers:

        def cut_short() -> None:
            with contextlib.suppress(Exception):  # close() removes the output files under it
                servers.run(["-c", "import time; time.sleep(60)"], on_start=started.append)

        runner = threading.Thread(target=cut_short, daemon=True)
        runner.start()
        while not started:
            time.sleep(0.05)
    # an exception in the benchmark (Ctrl-C in a run) must not leave the child running (in its own process group,
    # it outlived the server)
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0], 0)


def test_a_timeout_kills_the_childs_whole_process_group(tmp_path: Path) -> None:
    import os
    import time

    marker = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(marker)!r}, 'w').write(str(worker.pid))\n"
        "time.sleep(300)\n"
    )
    begun = time.perf_counter()
    with forkserver.ForkServers() as servers, pytest.raises(subprocess.TimeoutExpired):
        servers.run(["-c", code], timeout=3)
    # killed at the timeout, not when the child ended on its own (a generous bound: 2 shared cores), and gone (not
    # even a zombie) when the run returns
    assert time.perf_counter() - begun < 120
    with pytest.raises(ProcessLookupError):
        os.kill(int(marker.read_text()), 0)


def test_a_server_whose_imports_start_threads_refuses_to_fork(tmp_path: Path) -> None:
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    env = {**forkserver.ForkServers().env, "PYTHONPATH": str(tmp_path)}
    with (
        forkserver.ForkServer(["starts_a_thread"], env=env) as server,
        pytest.raises(RuntimeError, match="started Python threads"),
    ):
        server.run(["-c", "pass"])


@pytest.mark.parametrize("lookup", ["import", "from"])
def test_a_non_daemon_thread_from_the_imports_is_an_error_naming_its_import_not_a_hang(
    tmp_path: Path, lookup: str
) -> None:
    # a thread that never ends: a server that exits normally joins it first, and the run would wait forever
    starts = "import threading\nthreading.Thread(target=threading.Event().wait, name='forever').start()\n"
    (tmp_path / "spins.py").write_text(
        starts
        if lookup == "import"
        else "def __getattr__(name):\n"
        "    import threading\n"
        "    threading.Thread(target=threading.Event().wait, name='forever').start()\n"
        "    return 1\n"
    )
    code = "import spins" if lookup == "import" else "from spins import Thing"
    modules = forkserver.script_imports(code)
    env = {**forkserver.ForkServers().env, "PYTHONPATH": str(tmp_path)}
    with forkserver.ForkServer(modules, env=env) as server:
        # without the fix this run never returns: the timer kills the server so that the test fails instead
        guard = threading.Timer(60, lambda: os.killpg(server.process.pid, signal.SIGKILL))
        guard.start()
        try:
            with pytest.raises(RuntimeError, match=rf"started Python threads.*'forever' \(from {modules[-1]}\)"):
                server.run(["-c", code])
        finally:
            guard.cancel()
