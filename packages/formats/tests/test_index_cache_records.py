"""Index-cache records (the empty ``KEY.ok`` markers): keys stable across versions, markers made once.

Records written by an earlier tokenloom must still be found: a key is a pure function of the sources'
versions and what was checked, computed here the way the first release of the cache did.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import xxhash

from tokenloom.formats.io import index_map


@pytest.fixture(autouse=True)
def settled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(index_map.INDEX_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(index_map, "_SETTLE_NS", 0)


def first_release_key(sources: list[Path], what: str) -> str:
    """The key as the index cache computed it before keys were hashed in one call (one update per source)."""
    digest = xxhash.xxh3_128(f"index-v1\0{what}\0".encode("utf-8", "surrogateescape"))
    for info in [os.stat(source) for source in sources]:
        fields = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        digest.update("\0".join(map(str, fields)).encode() + b"\n")
    return digest.hexdigest()


@pytest.mark.parametrize("what", ["native offsets and overlaps checked", "xxh3_128 00ff", "caf\u00e9 \udcff", ""])
@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_record_written_by_the_first_release_is_found(tmp_path: Path, what: str, count: int) -> None:
    sources = []
    for k in range(count):
        sources.append(tmp_path / f"source{k}")
        sources[-1].write_bytes(b"x" * k)
    assert index_map._key(sources, what) == first_release_key(sources, what)
    cache = index_map.index_cache_dir()
    cache.mkdir(parents=True)
    (cache / f"{first_release_key(sources, what)}.ok").touch()
    assert index_map.checked_before(sources, what)
    assert index_map.checked_before([str(s) for s in sources], what, [os.stat(s) for s in sources])


def test_a_changed_source_is_another_version(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"abc")
    index_map.remember_checked([source], "check")
    assert index_map.checked_before([source], "check")
    time.sleep(0.01)
    source.write_bytes(b"abd")  # same size, later mtime
    assert not index_map.checked_before([source], "check")
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"abc")
    os.replace(replacement, source)  # same bytes, another inode
    assert not index_map.checked_before([source], "check")


def test_a_marker_made_already_is_kept_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"abc")
    with caplog.at_level(logging.DEBUG, logger="tokenloom.formats"):
        index_map.remember_checked([source], "check")
        index_map.remember_checked([source], "check")  # another process got there first
    assert index_map.checked_before([source], "check")
    assert "not writable" not in caplog.text


def test_a_marker_path_taken_by_a_directory_is_no_record(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"abc")
    marker = index_map.index_cache_dir() / f"{index_map._key([source], 'check')}.ok"
    marker.mkdir(parents=True)
    index_map.remember_checked([source], "check")
    assert not index_map.checked_before([source], "check")


@pytest.mark.parametrize("broken", ["dangling link", "file"])
def test_a_cache_directory_that_cannot_be_made_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    # mkdir raises FileExistsError for a dangling link or a file in the way: that is no record made already
    blocked = tmp_path / "blocked"
    if broken == "file":
        blocked.write_bytes(b"")
        cache = blocked
    else:
        blocked.symlink_to(tmp_path / "nowhere")
        cache = blocked / "sub"
    monkeypatch.setenv(index_map.INDEX_CACHE_ENV, str(cache))
    source = tmp_path / "source"
    source.write_bytes(b"abc")
    with caplog.at_level(logging.DEBUG, logger="tokenloom.formats"):
        index_map.remember_checked([source], "check")
    assert not index_map.checked_before([source], "check")
    assert "is not writable" in caplog.text


def test_two_records_at_once_both_succeed(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.write_bytes(b"abc")
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                index_map.remember_checked([source], "check")
            finally:
                os._exit(0 if index_map.checked_before([source], "check") else 1)
        pids.append(pid)
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids] == [0, 0, 0, 0]
