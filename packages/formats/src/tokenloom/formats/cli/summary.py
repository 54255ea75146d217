"""What ``tokenloom validate`` and ``inspect`` report about a dataset: pure functions of a TokenDataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats._dataset import TokenDataset
from tokenloom.formats._registry import available_formats

__all__ = ["PERCENTILES", "config_snippet", "describe", "length_percentiles", "samples_for_seq_len"]

PERCENTILES = (50, 90, 99)


def samples_for_seq_len(dataset: TokenDataset, seq_len: int) -> int:
    """Fixed windows of ``seq_len + 1`` tokens (inputs plus the shifted label), counted per shard."""
    return int((dataset.shard_num_tokens // (seq_len + 1)).sum())


def length_percentiles(lengths: np.ndarray) -> dict[str, float]:
    """min, p50, p90, p99, max and mean of the entry lengths (all 0 for no entries)."""
    if len(lengths) == 0:
        return {"min": 0, **{f"p{p}": 0 for p in PERCENTILES}, "max": 0, "mean": 0.0}
    values = np.percentile(lengths, PERCENTILES)
    return {
        "min": int(lengths.min()),
        **{f"p{p}": round(float(v), 2) for p, v in zip(PERCENTILES, values, strict=True)},
        "max": int(lengths.max()),
        "mean": round(float(lengths.mean()), 2),
    }


def _where(dataset: TokenDataset) -> str:
    """The dataset's absolute path, or its URL (never the store's credentials or endpoint)."""
    if "remote" in dataset.metadata:
        return str(dataset.metadata["remote"]["url"])
    return str(dataset.root.resolve())


def describe(dataset: TokenDataset) -> dict[str, Any]:
    """Plain-JSON facts about ``dataset`` (counts, dtype, ids, where its files are)."""
    facts: dict[str, Any] = {
        "format": dataset.format,
        "path": _where(dataset),
        "shards": dataset.num_shards,
        "entries": len(dataset),
        "tokens": dataset.num_tokens,
        "dtype": dataset.dtype.name,
        "vocab_size": dataset.vocab_size,
        "eos_id": dataset.eos_id,
        "fingerprint": dataset.fingerprint,
    }
    # entries are what readers index (windows of long documents count once each); documents are the
    # source documents, known when tokenize recorded them (None: unknown, e.g. data from another tool)
    recorded = dataset.metadata.get("tokenize")
    documents = recorded.get("documents") if isinstance(recorded, dict) else None
    facts["documents"] = documents if isinstance(documents, int) else None
    for key in ("file_pattern", "split", "prefixes"):
        if key in dataset.metadata:
            facts[key] = dataset.metadata[key]
    return facts


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_snippet(dataset: TokenDataset, seq_len: int) -> str:
    """Python that reads ``dataset`` as windows of ``seq_len`` tokens, runnable as printed.

    The consumer is named in the first line: ``tokenloom.datasets.MemoryMappedDataset``
    over ``tokenloom.formats.open_dataset`` (the arguments that reopen exactly this
    dataset). When the dataset is a bucket (``ROOT/train/<bucket>``), a curriculum
    ``data:`` block for ROOT follows, with only keys the curriculum config accepts.
    """
    facts = describe(dataset)
    samples = samples_for_seq_len(dataset, seq_len)
    arguments = [repr(facts["path"]), f"format={facts['format']!r}", f"dtype={facts['dtype']!r}"]
    lines = [
        f"# Python, read by tokenloom-datasets (pip install tokenloom-datasets): fixed windows of seq_len {seq_len}",
        "from tokenloom.datasets import MemoryMappedDataset",
        "from tokenloom.formats import open_dataset",
        "",
        f"tokens = open_dataset({', '.join(arguments)})",
        f"windows = MemoryMappedDataset(tokens, seq_len={seq_len})",
        f"# len(windows) == {samples}: sum over shards of tokens // (seq_len + 1); "
        f"vocab_size {_yaml_scalar(facts['vocab_size'])}, eos_id {_yaml_scalar(facts['eos_id'])}",
    ]
    root = Path(facts["path"])
    spec = available_formats().get(dataset.format)
    bucket = spec is not None and spec.owns_directory and root.parent.name == "train"
    if bucket and "remote" not in dataset.metadata:  # a directory dataset in train/<bucket>: curriculum reads it
        data_root = root.parent.parent
        lines += [
            "",
            f"# curriculum config, read by tokenloom-curriculum (bucket {root.name!r} of {data_root}); "
            "check it with `tokenloom validate --curriculum FILE`",
            "data:",
            f"  path: {_yaml_scalar(str(data_root))}",
            "  format: pretokenized",
            f"  seq_len: {seq_len}",
            "  packing: false",
        ]
    return "\n".join(lines)
