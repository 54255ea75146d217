"""Every difference between two tokenize run keys, in words (for ResumeMismatchError)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenloom.formats import ResumeMismatchError

__all__ = ["check_run_key", "run_key_differences"]


def _inputs(entries: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(entries, list):
        return {}
    return {str(e.get("relative", e.get("path", i))): e for i, e in enumerate(entries) if isinstance(e, dict)}


def run_key_differences(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``["max_length 64 -> 32", "input b.jsonl added", ...]``: each setting, the tokenizer and each input."""
    out: list[str] = []
    old_settings, new_settings = dict(recorded.get("settings") or {}), dict(wanted.get("settings") or {})
    for key in sorted(old_settings.keys() | new_settings.keys()):
        if old_settings.get(key) != new_settings.get(key):
            out.append(f"{key} {old_settings.get(key)!r} -> {new_settings.get(key)!r}")
    for key in ("chunking", "unit_bytes"):
        if key in wanted and recorded.get(key) != wanted.get(key):
            out.append(f"{key} {recorded.get(key)!r} -> {wanted.get(key)!r}")
    if recorded.get("tokenizer_fingerprint") != wanted.get("tokenizer_fingerprint"):
        out.append(
            f"tokenizer fingerprint {str(recorded.get('tokenizer_fingerprint'))[:19]}... -> "
            f"{str(wanted.get('tokenizer_fingerprint'))[:19]}..."
        )
    old_inputs, new_inputs = _inputs(recorded.get("inputs")), _inputs(wanted.get("inputs"))
    for name in sorted(old_inputs.keys() | new_inputs.keys()):
        if name not in old_inputs:
            out.append(f"input {name} added")
        elif name not in new_inputs:
            out.append(f"input {name} removed")
        elif old_inputs[name] != new_inputs[name]:
            changed = sorted(
                k
                for k in old_inputs[name].keys() | new_inputs[name].keys()
                if old_inputs[name].get(k) != new_inputs[name].get(k)
            )
            out.append(f"input {name} changed ({', '.join(changed)})")
    return out or ["the recorded run key could not be compared"]


def check_run_key(recorded: dict[str, Any], wanted: dict[str, Any], path: Any, *, also: Sequence[str] = ()) -> None:
    """A published output's recorded run key must hold ``wanted``: else a ResumeMismatchError naming each
    difference (``also``: differences the key does not show, such as an earlier layout)."""
    if {key: recorded.get(key) for key in wanted} == wanted:
        return
    raise ResumeMismatchError(
        "the output directory holds a dataset written with other settings, tokenizer, inputs or layout: "
        + "; ".join(run_key_differences(recorded, wanted) + list(also)),
        path=path,
        hint="Pass --overwrite to replace it, or choose another --output-dir",
    )
