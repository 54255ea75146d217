"""The benchmarks' fork server (tools/bench/_forkserver.py) runs a child as ``python SCRIPT ARGS`` would."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
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
    assert forkserver.script_imports(source) == ["json", "os.path", "email"]


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
