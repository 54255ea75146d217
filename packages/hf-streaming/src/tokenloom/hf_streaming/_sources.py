"""Remote inputs at the dataset level: access options, a remote dataset path, and the ETags in a state."""

from __future__ import annotations

import os
from typing import Any

from tokenloom.formats import ConfigError, RemoteOptions, ResumeMismatchError
from tokenloom.formats.io import require
from tokenloom.hf_streaming._remote import expand_remote
from tokenloom.hf_streaming._units import data_suffixes

__all__ = ["check_objects", "load_hf_dataset", "remote_access", "remote_dataset_files"]


def remote_access(
    storage_options: dict[str, Any] | None, retries: Any, remote: RemoteOptions | None = None
) -> RemoteOptions:
    """The store options and retry policy as one frozen, picklable value (the keywords over ``remote``; a bad
    ``retries``, a bool too, is refused by RemoteOptions)."""
    if remote is not None and not isinstance(remote, RemoteOptions):
        raise ConfigError(f"remote is a {type(remote).__name__}, expected a RemoteOptions", field="remote")
    return RemoteOptions.from_keywords(storage_options=storage_options, retries=retries, remote=remote)


def remote_dataset_files(url: str, access: RemoteOptions) -> list[str]:
    """A remote dataset path as data files: a file as is, a glob expanded, a prefix listed (known suffixes)."""
    if any(ch in url for ch in "*?["):
        return expand_remote(url, access)
    if url.lower().endswith(data_suffixes()):
        return [url]
    return expand_remote(url, access, suffixes=data_suffixes())


def check_objects(saved: Any, current: list[list[Any]]) -> None:
    """A ResumeMismatchError naming the URL when an object's ETag differs from the one in the state."""
    if saved is None:
        return
    if not isinstance(saved, list) or not all(
        isinstance(o, list) and len(o) == 3 and isinstance(o[0], int) and all(isinstance(v, str) for v in o[1:])
        for o in saved
    ):
        raise ResumeMismatchError(
            "the state's objects are not a list of [source, url, etag]",
            field="objects",
            hint="The state is damaged or was not written by tokenloom: restore it from the checkpoint",
        )
    now = {index: (url, etag) for index, url, etag in current}
    for index, url, etag in saved:
        found = now.get(index)
        if found is None or found[0] != url:
            raise ResumeMismatchError(
                f"the state was saved with {url} as source {index}, now it is {found[0] if found else 'a local file'}",
                path=url,
                field="objects",
                hint="Resume with the data files the state was saved with, or start afresh",
            )
        if found[1] != etag:
            raise ResumeMismatchError(
                f"{url} changed since the state was saved (ETag {etag!r} then, {found[1]!r} now)",
                path=url,
                field="objects",
                hint="Restore the object the run started with, or start afresh: a saved position in other bytes "
                "would skip or repeat documents",
            )


def load_hf_dataset(dataset_name: Any, config: str | None, split: str, load_kwargs: dict[str, Any]) -> Any:
    """A Hugging Face IterableDataset: given, converted from a Dataset, or loaded with streaming=True."""
    hf_datasets = require(
        "datasets", distribution="tokenloom-datasets", extra="hf", purpose="StreamingHuggingFaceDataset"
    )
    if isinstance(dataset_name, hf_datasets.IterableDataset):
        return dataset_name
    if isinstance(dataset_name, hf_datasets.Dataset):
        return dataset_name.to_iterable_dataset(num_shards=max(1, min(64, len(dataset_name))))
    if not isinstance(dataset_name, str):
        raise ConfigError(
            f"dataset_name is a {type(dataset_name).__name__}, expected a name or a datasets.IterableDataset",
            field="dataset_name",
        )
    try:
        return hf_datasets.load_dataset(dataset_name, config, split=split, streaming=True, **load_kwargs)
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        raise ConfigError(
            f"load_dataset({dataset_name!r}, {config!r}, split={split!r}) failed: {type(exc).__name__}: {exc}",
            field="dataset_name",
            hint=(
                "The hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): use local data_files= or unset it"
                if offline
                else "Check the name, config, split and data_files"
            ),
        ) from None
