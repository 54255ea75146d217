"""The cache directory against a real S3 server: a file, a symlink loop, a read-only or full directory are named
errors naming it; and mapped blocks hold no file descriptor (an epoch over 4,000 blocks under ``ulimit -n 256``)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import mounted_tmpfs, open_cached

from tokenloom.formats import open_dataset, open_writer
from tokenloom.formats.errors import ConfigError, StorageError
from tokenloom.formats.remote import cache as cache_module

BLOCK = 4096


def _write_native(root: Path, *, docs: int, length: int) -> Path:
    rng = np.random.default_rng(11)
    with open_writer(root, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as w:
        for _ in range(docs):
            w.add(np.append(rng.integers(1, 50_000, size=length, dtype=np.uint16), np.uint16(0)))
    return root


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return _write_native(tmp_path_factory.mktemp("paths") / "ds", docs=300, length=1000)  # 600 KB: 147 blocks


@pytest.fixture
def url(seaweed, small) -> str:
    return seaweed.upload_dir(small, f"ds-{uuid.uuid4().hex[:8]}")


def _read_all(url: str, seaweed, cache: Path) -> int:
    ds = open_cached(url, seaweed.storage_options(), cache, BLOCK)
    return sum(int(np.asarray(ds[i]).astype(np.int64).sum()) for i in range(len(ds)))


def _read_all_failing(url: str, seaweed, cache: Path, monkeypatch, fetch_into) -> StorageError:
    """The StorageError of reading every block when each block's fetch into the cache is ``fetch_into``."""
    monkeypatch.setattr(cache_module, "fetch_into", fetch_into)
    with pytest.raises(StorageError) as caught:
        _read_all(url, seaweed, cache)
    return caught.value


# -- a file or a loop where the directory should be -------------------------------------------------


@pytest.mark.parametrize("below", ["", "sub/cache"])
def test_a_cache_dir_that_is_a_file_is_a_config_error_naming_it(seaweed, url, tmp_path, below):
    """Before: NotADirectoryError from a stat in cache._complete()."""
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    cache = file / below if below else file
    with pytest.raises(ConfigError) as caught:
        _read_all(url, seaweed, cache)
    message = str(caught.value)
    assert caught.value.field == "block_cache_dir" and caught.value.path == str(cache)
    assert f"the cache directory {cache} cannot be used: {file} is a file, not a directory" in message
    assert "TOKENLOOM_CACHE_DIR" in message


def test_a_file_inside_the_cache_dir_is_named(seaweed, url, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "v1").write_text("x")  # someone's file where the cache keeps its folders
    with pytest.raises(ConfigError, match=f"{cache / 'v1'} is a file, not a directory"):
        _read_all(url, seaweed, cache)


def test_a_cache_dir_on_a_symlink_loop_is_a_config_error_naming_it(seaweed, url, tmp_path):
    """Before: OSError [Errno 40] (ELOOP) from cache._complete()."""
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    for cache in (loop, loop / "cache"):
        with pytest.raises(ConfigError) as caught:
            _read_all(url, seaweed, cache)
        assert f"the cache directory {cache} cannot be used: {loop} is a symlink loop" in str(caught.value)
        assert f"Point the link {loop} at a real directory" in str(caught.value)


def test_a_cache_dir_that_is_a_dangling_symlink_is_a_config_error_naming_it(seaweed, url, tmp_path):
    """Before: a StorageError "file exists (EEXIST)" with a hint about permissions and free space."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    for cache in (link, link / "cache"):
        with pytest.raises(ConfigError) as caught:
            _read_all(url, seaweed, cache)
        message = str(caught.value)
        assert f"the cache directory {cache} cannot be used: {link} is a symlink to {tmp_path / 'nowhere'}" in message
        assert "Create the directory it points to" in message


# -- a directory this process may not write ---------------------------------------------------------

_READ = textwrap.dedent(
    """
    import sys, json, numpy as np
    from tokenloom.formats import RemoteOptions, open_dataset
    from tokenloom.formats.errors import DataError
    try:
        options = json.loads(sys.argv[2])
        remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=sys.argv[3], block_size=4096)
        ds = open_dataset(sys.argv[1], remote=remote)
        print(sum(int(np.asarray(ds[i]).astype(np.int64).sum()) for i in range(len(ds))))
    except DataError as error:
        print(type(error).__name__, getattr(error, "errno", None), str(error).replace(chr(10), " "))
        raise SystemExit(3)
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_read_only_cache_dir_is_a_storage_error_naming_it(seaweed, url, tmp_path):
    """Real permissions: root without its file-permission override (setpriv) reads into a 0555 directory."""
    cache = tmp_path / "read-only"
    cache.mkdir(mode=0o555)
    cache.chmod(0o555)
    args = [url, json.dumps(seaweed.storage_options()), str(cache)]
    command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", _READ, *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, (run.stdout, run.stderr[-2000:])
    assert run.stdout.startswith(f"StorageError {errno.EACCES} the cache directory {cache} is not writable"), run.stdout
    assert "Traceback" not in run.stderr


def test_a_cache_dir_refusing_writes_is_named_simulated(seaweed, url, tmp_path, monkeypatch):
    def refuse(config, obj, start, end, path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    cache = tmp_path / "cache"
    error = _read_all_failing(url, seaweed, cache, monkeypatch, refuse)
    assert error.errno == errno.EACCES and error.path == str(cache)
    assert f"the cache directory {cache} is not writable by this process (EACCES)" in str(error)
    assert f"ls -ld {cache}" in str(error)


# -- a full disk -----------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (root only; CI may not allow mounts: the simulated test below covers that)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield from mounted_tmpfs(tmp_path / "tiny", "size=256k")


def test_a_full_cache_disk_is_a_storage_error_naming_the_directory(seaweed, url, tiny_disk):
    """Before: "the object-store client failed: OSError: [Errno 28] ..." naming a temp file, with no hint."""
    cache = tiny_disk / "cache"
    with pytest.raises(StorageError) as caught:
        _read_all(url, seaweed, cache)  # 600 KB of blocks into 256 KiB
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC and caught.value.path == str(cache), message
    assert f"the cache directory {cache} is full (ENOSPC, " in message and "MB free" in message
    assert "TOKENLOOM_CACHE_LIMIT" in message and "TOKENLOOM_CACHE_DIR" in message


@pytest.mark.parametrize("form", ["oserror", "helper-text"])
def test_a_full_cache_disk_is_named_simulated(seaweed, url, tmp_path, monkeypatch, form):
    """The block is written where the GET runs: raised there (in process) or reported as text (a helper)."""

    def full(config, obj, start, end, path):
        if form == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        raise StorageError(f"the object-store client failed: OSError: [Errno 28] No space left on device: '{path}'")

    cache = tmp_path / "cache"
    error = _read_all_failing(url, seaweed, cache, monkeypatch, full)
    assert error.errno == errno.ENOSPC and error.path == str(cache)
    assert f"the cache directory {cache} is full (ENOSPC" in str(error)


# -- open files --------------------------------------------------------------------------------------

_UNDER_ULIMIT = textwrap.dedent(
    """
    import resource, sys, json, numpy as np
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from tokenloom.formats import RemoteOptions, open_dataset
    options = json.loads(sys.argv[2])
    remote = RemoteOptions.from_keywords(storage_options=options, block_cache_dir=sys.argv[3], block_size=4096)
    ds = open_dataset(sys.argv[1], remote=remote)
    print(sum(int(np.asarray(ds[i]).astype(np.int64).sum()) for i in range(len(ds))))
    """
)


def test_an_epoch_over_4000_blocks_passes_under_ulimit_256(seaweed, tmp_path):
    """Without a cache limit every block stays mapped; before, each map kept a dup of its fd: EMFILE at ~250."""
    local = _write_native(tmp_path / "big", docs=4100, length=2000)  # 16.4 MB of tokens: 4,005 blocks of 4 KiB
    blocks = sum(-(-p.stat().st_size // BLOCK) for p in local.glob("*.bin"))
    assert blocks >= 4000
    url = seaweed.upload_dir(local, f"big-{uuid.uuid4().hex[:8]}")
    expected = open_dataset(local)
    total = sum(int(expected[i].astype(np.int64).sum()) for i in range(len(expected)))
    cache = tmp_path / "cache"
    args = [url, json.dumps(seaweed.storage_options()), str(cache)]
    run = subprocess.run([sys.executable, "-c", _UNDER_ULIMIT, *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == str(total)
    cached = [p for p in cache.rglob(f"b{BLOCK}-*") if "." not in p.name]
    assert len(cached) >= 4000  # every block went through the cache and its map


def test_a_dangling_symlink_inside_the_cache_dir_is_named(seaweed, url, tmp_path):
    """A link where the cache keeps its folders (``v1`` moved to a scratch disk that is gone). Before: a
    StorageError "file exists (EEXIST) while filling the remote-data cache" naming the link, with the generic
    hint about permissions and free space: the link is the path that failed, and only its parents were looked at."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "v1").symlink_to(tmp_path / "scratch-gone")
    with pytest.raises(ConfigError) as caught:
        _read_all(url, seaweed, cache)
    message = str(caught.value)
    assert caught.value.field == "block_cache_dir" and caught.value.path == str(cache)
    assert f"{cache / 'v1'} is a symlink to {tmp_path / 'scratch-gone'}, which does not exist" in message
