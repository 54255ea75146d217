"""A RetryPolicy given to the streaming reader keeps every field (its timeouts reached obstore as the defaults)."""

from __future__ import annotations

from tokenloom.formats.io import parse_url
from tokenloom.formats.remote import RetryPolicy
from tokenloom.hf_streaming._sources import remote_access


def test_every_field_of_the_retry_policy_reaches_the_store_config():
    policy = RetryPolicy(backoff=0.5, max_backoff=2.0, timeout=40.0, budget=90.0, connect_timeout=3.0, read_timeout=7.0)
    config = remote_access({}, policy).store(parse_url("s3://bucket/prefix"))
    assert config.retries == policy
