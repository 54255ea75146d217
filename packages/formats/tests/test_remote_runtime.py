"""In-process obstore calls vs the helper process: a fork after the runtime ran must never hang.

Each scenario runs in a fresh interpreter (the test process itself ran obstore for the fixtures) that
forks real children with multiprocessing's ``fork`` method; a child that hangs fails the test by timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

_PRELUDE = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    from pathlib import Path
    from tokenloom.formats.io import parse_url
    from tokenloom.formats.remote import _runtime, helper
    from tokenloom.formats.remote.client import StoreConfig

    ARGS = json.loads(sys.argv[1])
    CONFIG = StoreConfig(parse_url(ARGS["url"]), ARGS["options"])
    FORK = multiprocessing.get_context("fork")

    def tokio_threads():
        names = [Path(f"/proc/self/task/{t}/comm").read_text() for t in os.listdir("/proc/self/task")]
        return sum(name.startswith("tokio-") for name in names)

    def read(tag):
        obj = helper.head(CONFIG, ARGS["name"])
        target = Path(ARGS["tmp"]) / f"{tag}-{os.getpid()}"
        helper.fetch_into(CONFIG, obj, 4096, 12288, target)
        assert target.read_bytes() == bytes.fromhex(ARGS["middle"]), tag
        if helper.in_process():  # the bytes without a hand-over file
            assert helper.read_range(CONFIG, obj, 4096, 12288) == bytes.fromhex(ARGS["middle"]), tag
        else:
            try:
                helper.read_range(CONFIG, obj, 4096, 12288)
            except RuntimeError:
                pass
            else:
                raise AssertionError(f"{tag}: read_range ran outside an in-process reader")
        return {"in_process": _runtime.in_process(), "owner_is_me": _runtime.runtime_owner() == os.getpid()}

    def run_child(target, *args):
        queue = FORK.Queue()
        child = FORK.Process(target=target, args=(queue, *args))
        child.start()
        child.join(60)
        if child.is_alive():
            child.kill()
            return "hung"
        return queue.get(timeout=5) if child.exitcode == 0 else f"exit {child.exitcode}"

    def reader(queue, tag):
        queue.put(read(tag))
    """
)


def _run(seaweed, tmp_path, body: str) -> dict:
    name = f"rt-{uuid.uuid4().hex[:8]}.bin"
    data = os.urandom(16384)
    seaweed.put(name, data)
    args = {
        "url": f"s3://{seaweed.bucket}",
        "options": seaweed.storage_options(),
        "name": name,
        "tmp": str(tmp_path),
        "middle": data[4096:12288].hex(),
    }
    script = tmp_path / "scenario.py"  # a file, not -c: spawned children import it as their main module
    script.write_text(_PRELUDE + textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(args)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_top_level_process_uses_the_helper_and_its_forked_workers_call_obstore_in_process(seaweed, tmp_path):
    found = _run(
        seaweed,
        tmp_path,
        """
        parent = read("parent")
        threads = tokio_threads()  # the runtime never started here: forks may use it
        children = [run_child(reader, f"child{i}") for i in range(2)]
        print(json.dumps({"parent": parent, "threads": threads, "children": children}))
        """,
    )
    assert found["parent"] == {"in_process": False, "owner_is_me": False}
    assert found["threads"] == 0
    assert found["children"] == [{"in_process": True, "owner_is_me": True}] * 2


def test_a_child_forked_after_in_process_calls_goes_through_the_helper(seaweed, tmp_path):
    found = _run(
        seaweed,
        tmp_path,
        """
        def worker(queue):
            mine = read("worker")  # in process: the runtime now runs in this address space
            queue.put({"worker": mine, "grandchild": run_child(reader, "grandchild"), "again": read("again")})

        print(json.dumps(run_child(worker)))
        """,
    )
    assert found["worker"] == {"in_process": True, "owner_is_me": True}
    assert found["grandchild"] == {"in_process": False, "owner_is_me": False}  # it would hang in process
    assert found["again"] == {"in_process": True, "owner_is_me": True}


def test_a_runtime_started_by_other_code_keeps_forked_children_on_the_helper(seaweed, tmp_path):
    found = _run(
        seaweed,
        tmp_path,
        """
        import obstore
        from tokenloom.formats.remote.client import _store
        obstore.head(_store(CONFIG), ARGS["name"])  # not through tokenloom's helper module: not tracked by pid
        print(json.dumps({"child": run_child(reader, "child"), "owner_is_me": _runtime.runtime_owner() == os.getpid()}))
        """,
    )
    assert found["child"] == {"in_process": False, "owner_is_me": False}  # the fork saw its tokio threads
    assert found["owner_is_me"] is True


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_call_obstore_in_process(seaweed, tmp_path, method):
    found = _run(
        seaweed,
        tmp_path,
        f"""
        if __name__ == "__main__":
            read("parent")
            context = multiprocessing.get_context({method!r})
            with context.Pool(1) as pool:
                print(json.dumps(pool.apply_async(read, ("pooled",)).get(timeout=120)))
        """,
    )
    assert found == {"in_process": True, "owner_is_me": True}


def test_the_helper_loads_only_what_serving_needs(seaweed, tmp_path):
    """A top-level process with one Python thread forks its helper (no interpreter start, no imports: most of a
    warm open's time went there); with another Python thread running (a fork would copy the locks it holds) the
    helper is a fresh interpreter that skips the package __init__s above helper.py (every format, numpy). Both
    serve head and fetch."""
    found = _run(
        seaweed,
        tmp_path,
        """
        import threading
        parent = read("parent")  # head and fetch through this thread's helper: forked
        forked = isinstance(helper._LOCAL.helper.process, helper._Forked)
        alive = helper._LOCAL.helper.process.poll() is None
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        helper._LOCAL.helper = None  # the next call starts a helper again, now beside a second thread
        second = read("second")
        process = helper._LOCAL.helper.process
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        stop.set()
        other.join()
        print(json.dumps({"parent": parent, "forked": forked, "alive": alive, "second": second,
                          "exec": not isinstance(process, helper._Forked), "numpy": "_multiarray_umath" in maps}))
        """,
    )
    outside = {"in_process": False, "owner_is_me": False}
    assert found == {"parent": outside, "forked": True, "alive": True, "second": outside, "exec": True, "numpy": False}
