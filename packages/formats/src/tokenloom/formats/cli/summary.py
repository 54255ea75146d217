"""What ``tokenloom validate`` and ``inspect`` report about a dataset: pure functions of a TokenDataset."""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenloom.formats._dataset import TokenDataset

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


def describe(dataset: TokenDataset) -> dict[str, Any]:
    """Plain-JSON facts about ``dataset`` (counts, dtype, ids, where its files are)."""
    facts: dict[str, Any] = {
        "format": dataset.format,
        "path": str(dataset.root.resolve()),
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
    """A YAML block that points training at ``dataset`` with windows of ``seq_len`` tokens."""
    facts = describe(dataset)
    lines = [
        "data:",
        f"  path: {_yaml_scalar(facts['path'])}",
        f"  format: {facts['format']}",
    ]
    if "file_pattern" in facts:
        lines.append(f"  file_pattern: {_yaml_scalar(facts['file_pattern'])}")
    if "prefixes" in facts:
        lines.append("  prefixes: [" + ", ".join(_yaml_scalar(p) for p in facts["prefixes"]) + "]")
    lines += [
        f"  dtype: {facts['dtype']}",
        f"  vocab_size: {_yaml_scalar(facts['vocab_size'])}",
        f"  eos_id: {_yaml_scalar(facts['eos_id'])}",
        f"  seq_len: {seq_len}",
        f"  num_samples: {samples_for_seq_len(dataset, seq_len)}  # sum over shards of tokens // (seq_len + 1)",
    ]
    return "\n".join(lines)
