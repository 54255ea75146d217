"""Wrong input to the remote layer is the named error with the right hint: dot segments in a URL, a full cache disk."""

from __future__ import annotations

import errno
import uuid
from pathlib import Path

import numpy as np
import pytest
from formats_helpers import mounted_tmpfs, open_cached

from tokenloom.formats import RemoteOptions, open_dataset, open_writer
from tokenloom.formats.errors import ConfigError, StorageError
from tokenloom.formats.io import parse_url


@pytest.mark.parametrize(
    ("url", "segment"),
    [
        ("s3://bucket/a/../ds", ".."),
        ("s3://bucket/./ds", "."),
        ("https://host/data/../x.bin", ".."),
        ("gs://b/..", ".."),
    ],
)
def test_a_url_with_dot_segments_is_a_config_error_that_says_so(url, segment):
    with pytest.raises(ConfigError, match=f"has a '{segment}' segment") as caught:
        parse_url(url)
    assert "free space" not in str(caught.value) and "without '.' and '..' segments" in str(caught.value)


def test_open_dataset_refuses_dot_segments_before_any_request(tmp_path):
    with pytest.raises(ConfigError, match="has a '..' segment"):
        open_dataset("s3://bucket/tokens/../other", remote=RemoteOptions.from_keywords(block_cache_dir=tmp_path / "c"))


def test_names_with_dots_inside_are_fine():
    assert parse_url("s3://bucket/v1.2/..data/x..y").prefix == "v1.2/..data/x..y"


def test_a_block_that_cannot_be_written_names_the_cache_directory(tmp_path):
    """Raised where the block is written (in process, or by a helper): the cache's one naming of its directory."""
    from tokenloom.formats.remote._cachedir import cache_dir_error

    root = tmp_path / "cache"
    root.mkdir()
    path = root / "ab" / "b4096-000001.123-ab.tmp"
    error = cache_dir_error(root, OSError(errno.ENOSPC, "No space left on device", str(path)))
    assert error is not None and getattr(error, "errno", None) == errno.ENOSPC and error.path == str(root)
    assert str(error).startswith(f"the cache directory {root} is full (ENOSPC")
    assert error.hint is not None and "TOKENLOOM_CACHE_DIR" in error.hint and "--output-dir" not in error.hint


@pytest.fixture
def small_disk(tmp_path: Path):
    yield from mounted_tmpfs(tmp_path / "small", "size=96k")


def test_a_full_cache_disk_names_the_directory(seaweed, tmp_path, small_disk):
    local = tmp_path / "local"
    rng = np.random.default_rng(5)
    with open_writer(local, format="native", dtype="uint16", vocab_size=50_000, eos_id=0) as writer:
        for _ in range(1000):
            writer.add(np.append(rng.integers(1, 50_000, size=300, dtype=np.uint16), np.uint16(0)))
    url = seaweed.upload_dir(local, f"ds-{uuid.uuid4().hex[:8]}")
    with pytest.raises(StorageError) as caught:
        ds = open_cached(url, seaweed.storage_options(), small_disk, 4096)
        for i in range(len(ds)):
            np.asarray(ds[i]).sum()
    error = caught.value
    assert error.errno == errno.ENOSPC, error
    assert error.path is not None and Path(error.path).is_relative_to(small_disk)
    assert str(small_disk) in error.problem  # the message names the directory (the cache's own check or the helper's)
    assert "block_cache_dir=" in (error.hint or "") and "TOKENLOOM_CACHE_LIMIT" in (error.hint or "")


@pytest.mark.parametrize(
    ("distribution", "folder"),
    [
        ("tokenloom-formats", "packages/formats"),
        ("tokenloom-hf-streaming", "packages/hf-streaming"),
        ("tokenloom", "."),
    ],
)
def test_the_missing_extra_hint_says_how_to_install_from_a_checkout(distribution, folder):
    from tokenloom.formats.io.optional import require

    with pytest.raises(ImportError) as caught:
        require("tokenloom_no_such_module", distribution=distribution, extra="remote", purpose="reading s3://")
    message = str(caught.value)
    assert f'pip install "{distribution}[remote]"' in message
    assert f'uv pip install -e "{folder}[remote]"' in message and "uv sync --all-packages --all-extras" in message
    root = Path(__file__).resolve().parents[3]
    assert (root / folder / "pyproject.toml").is_file()  # the folder the hint names exists in this checkout
