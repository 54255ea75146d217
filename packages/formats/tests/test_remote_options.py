"""RemoteOptions: the one value a dataset in object storage carries (built from the user's keywords once)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tokenloom.formats import ConfigError, RemoteOptions, open_dataset
from tokenloom.formats.io import parse_url
from tokenloom.formats.remote import RetryPolicy


def test_the_keywords_become_one_value_that_gives_obstore_the_same_settings():
    given = {"endpoint": "http://127.0.0.1:8333", "access_key_id": "AK", "secret_access_key": "S3CRET", "region": "x"}
    remote = RemoteOptions.from_keywords(storage_options=given, block_cache_dir="c", cache_limit="20GB", retries=3)
    assert remote.endpoint == "http://127.0.0.1:8333"
    assert remote.credentials == {"access_key_id": "AK", "secret_access_key": "S3CRET"}
    assert remote.store_options == {"region": "x"}
    assert remote.block_cache_dir == Path("c") and remote.cache_limit == 20_000_000_000
    assert remote.retries == RetryPolicy(max_retries=3)
    assert remote.storage_options == given
    config = remote.store(parse_url("s3://bucket/ds"))
    assert config.storage_options == given and config.retries == remote.retries
    assert pickle.loads(pickle.dumps(remote)) == remote


def test_a_keyword_wins_over_the_value_it_is_given_with():
    base = RemoteOptions(endpoint="http://a:1", cache_limit=1 << 30, block_size=1 << 20)
    changed = RemoteOptions.from_keywords(block_cache_dir="/tmp/x", remote=base)
    assert changed.endpoint == "http://a:1" and changed.block_size == 1 << 20 and changed.cache_limit == 1 << 30
    assert changed.block_cache_dir == Path("/tmp/x")
    assert RemoteOptions.from_keywords(remote=base) is base


def test_repr_never_shows_a_credential():
    remote = RemoteOptions.from_keywords(storage_options={"secret_access_key": "S3CRET-VALUE", "token": "T0KEN-X"})
    assert "S3CRET-VALUE" not in repr(remote) and "T0KEN-X" not in repr(remote)
    assert "secret_access_key" in repr(remote)


@pytest.mark.parametrize(
    ("keywords", "field"),
    [
        ({"storage_options": ["endpoint"]}, "storage_options"),
        ({"block_size": 1000}, "block_size"),
        ({"cache_limit": "lots"}, "cache_limit"),
        ({"retries": "three"}, "retries"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_its_field(keywords, field):
    with pytest.raises(ConfigError) as caught:
        RemoteOptions.from_keywords(**keywords)
    assert caught.value.field == field


def test_the_repr_masks_secrets_nested_in_store_options():
    """Review: an Authorization header inside client_options.default_headers was printed in clear."""
    options = RemoteOptions(
        store_options={"client_options": {"default_headers": {"Authorization": "Bearer s3cr3t", "X-Trace": "on"}}}
    )
    shown = repr(options)
    assert "s3cr3t" not in shown and "***" in shown and "X-Trace" in shown


@pytest.mark.parametrize("keyword", ["storage_options", "block_cache_dir", "cache_limit", "block_size"])
def test_a_loose_store_keyword_is_named_and_points_at_remote(keyword, tmp_path):
    """open_dataset takes a URL's settings as one RemoteOptions; a loose store or cache keyword says so, before any
    request."""
    with pytest.raises(ConfigError, match=f"{keyword} is not a keyword of open_dataset") as caught:
        open_dataset("s3://bucket/ds", **{keyword: tmp_path})
    assert caught.value.field == keyword and "remote=RemoteOptions(" in str(caught.value)


def test_remote_none_opens_a_local_path_and_a_value_there_is_refused(tmp_path):
    """A caller passes its remote setting on whatever the path: None opens a local dataset (the open bench's local
    rows failed with 'remote does not apply'); a RemoteOptions for a local path is still a named error."""
    import numpy as np

    from tokenloom.formats import open_writer

    with open_writer(tmp_path / "ds", format="native", dtype="uint16", vocab_size=10, eos_id=0) as writer:
        writer.add(np.array([1, 2, 0], dtype=np.uint16))
    assert open_dataset(tmp_path / "ds", remote=None)[0].tolist() == [1, 2, 0]
    with pytest.raises(ConfigError, match="remote"):
        open_dataset(tmp_path / "ds", remote=RemoteOptions())


@pytest.mark.parametrize("value", [{"storage_options": {}}, {}, "s3", 3, RemoteOptions])
def test_a_remote_that_is_not_remote_options_is_named(value):
    """remote= given a settings dict (the old storage_options spelling) or anything else that is not a RemoteOptions
    is a ConfigError naming remote= and the from_keywords spelling, before any request (was an AttributeError)."""
    with pytest.raises(ConfigError, match="remote=") as caught:
        open_dataset("s3://bucket/ds", remote=value)
    assert caught.value.field == "remote" and "RemoteOptions.from_keywords(" in str(caught.value)


def test_an_unknown_keyword_for_a_url_is_refused_before_any_request():
    """open_dataset(URL, ...) refuses a keyword no format's reader takes up front, listing the accepted ones (it was
    found only after the listing and the index fetches, or not at all for a format that took **options)."""
    with pytest.raises(ConfigError, match="vocab_sise is not a keyword of open_dataset") as caught:
        open_dataset("s3://no-such-bucket-anywhere/ds", vocab_sise=10)
    assert caught.value.field == "vocab_sise" and "vocab_size" in str(caught.value) and "remote" in str(caught.value)


def test_a_loaders_keyword_for_a_url_points_at_the_datasets_not_at_remote_options():
    """seq_len is a loader's setting, not a store's: the error says where it goes (the hint used to send it to
    RemoteOptions, which has no such field)."""
    with pytest.raises(ConfigError, match="seq_len is not a keyword of open_dataset") as caught:
        open_dataset("s3://no-such-bucket-anywhere/ds", seq_len=5)
    said = str(caught.value)
    assert caught.value.field == "seq_len" and "MemoryMappedDataset(path, seq_len=...)" in said
    assert "store and cache settings" not in said and "vocab_size" in said
