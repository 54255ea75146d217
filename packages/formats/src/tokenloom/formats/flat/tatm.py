"""tatm's ``metadata.{json,yaml,yml}``: the ``tokenized_info`` part a flat reader needs.

tatm (the Kempner Institute's data tool) describes a tokenized directory with a
metadata file whose ``tokenized_info`` mapping names the shard ``file_prefix``,
``file_extension``, ``dtype``, ``vocab_size`` and ``tokenizer``; its reader globs
``{file_prefix}*.{file_extension}`` and sorts. tatm writes the YAML with
``yaml.dump`` (block style), so instead of depending on PyYAML this module reads
that subset: top-level ``key: value`` lines and one indented block under
``tokenized_info`` whose values are plain, single- or double-quoted scalars.
Anything outside the subset inside ``tokenized_info`` (flow mappings, tags,
anchors, values continued over several lines) is a FormatError that says to pass
``dtype=`` and ``file_pattern=`` instead; other top-level keys are skipped unread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats.errors import FormatError, ResourceLimitError

__all__ = ["METADATA_NAMES", "TatmInfo", "find_tatm_metadata", "read_tatm_metadata"]

#: tatm looks for these in this order.
METADATA_NAMES = ("metadata.json", "metadata.yaml", "metadata.yml")
MAX_METADATA_BYTES = 1 << 20
_INT = re.compile(r"[-+]?[0-9]+")
_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):(?:\s+(.*))?$")
_HINT = "Pass dtype=... and file_pattern=... (--dtype) to open the shards without the metadata"


@dataclass(frozen=True, slots=True)
class TatmInfo:
    """The token-file description from a tatm metadata file."""

    source: Path
    file_prefix: str
    file_extension: str = "bin"
    dtype: str | None = None
    vocab_size: int | None = None
    tokenizer: str | None = None

    @property
    def file_pattern(self) -> str:
        """tatm's glob, relative to the dataset directory (the prefix's directory part is dropped)."""
        return f"{Path(self.file_prefix).name}*.{self.file_extension}"


def find_tatm_metadata(root: Path) -> Path | None:
    """The metadata file tatm would read in ``root``, if any."""
    for name in METADATA_NAMES:
        if (root / name).is_file():
            return root / name
    return None


def read_tatm_metadata(path: Path) -> TatmInfo | None:
    """``tokenized_info`` from ``path``, or None when the metadata describes untokenized data."""
    size = path.stat().st_size
    if size > MAX_METADATA_BYTES:
        raise ResourceLimitError(
            f"metadata file of {size} bytes, more than the {MAX_METADATA_BYTES}-byte cap", path=path
        )
    raw = path.read_bytes()
    if path.suffix == ".json":
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise FormatError(f"metadata is not valid JSON ({exc})", path=path, hint=_HINT) from None
        if not isinstance(payload, dict):
            raise FormatError("metadata is not a JSON object", path=path, hint=_HINT)
        info = payload.get("tokenized_info")
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("metadata is not UTF-8 text", path=path, hint=_HINT) from None
        info = _yaml_tokenized_info(text, path)
    if info is None:
        return None
    if not isinstance(info, dict):
        raise FormatError("tokenized_info is not a mapping", path=path, field="tokenized_info", hint=_HINT)
    return _info(info, path)


def _info(info: dict[str, Any], path: Path) -> TatmInfo:
    def text(key: str, default: str | None) -> str | None:
        value = info.get(key, default)
        if value is not None and not isinstance(value, str):
            raise FormatError(f"tokenized_info.{key} is {value!r}, expected text", path=path, field=key, hint=_HINT)
        return value

    prefix = text("file_prefix", None)
    if not prefix:
        raise FormatError("tokenized_info has no file_prefix", path=path, field="file_prefix", hint=_HINT)
    extension = text("file_extension", "bin") or "bin"
    if "/" in extension or "*" in extension or "?" in extension or "[" in extension:
        raise FormatError(f"file_extension {extension!r} is not a plain suffix", path=path, field="file_extension")
    if any(ch in Path(prefix).name for ch in "*?["):
        raise FormatError(f"file_prefix {prefix!r} contains glob characters", path=path, field="file_prefix")
    vocab = info.get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        raise FormatError(
            f"tokenized_info.vocab_size is {vocab!r}, expected a positive int", path=path, field="vocab_size"
        )
    return TatmInfo(
        source=path,
        file_prefix=prefix,
        file_extension=extension,
        dtype=text("dtype", None),
        vocab_size=vocab,
        tokenizer=text("tokenizer", None),
    )


def _yaml_tokenized_info(text: str, path: Path) -> dict[str, Any] | None:
    """The ``tokenized_info`` block of a block-style YAML document (see the module docstring)."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        match = _KEY.match(line)
        if match is None or match.group(1) != "tokenized_info":
            continue
        value = _strip_comment(match.group(2) or "")
        if value in ("null", "~"):
            return None
        if value:
            raise FormatError(
                f"tokenized_info is written inline ({value[:40]!r}), which tokenloom's YAML subset does not read",
                path=path,
                record=number + 1,
                field="tokenized_info",
                hint=_HINT,
            )
        return _block(lines[number + 1 :], number + 2, path)
    return None


def _block(lines: list[str], first_line: int, path: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    indent: int | None = None
    for offset, line in enumerate(lines):
        number = first_line + offset
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        depth = len(line) - len(line.lstrip(" "))
        if depth == 0:
            break  # the next top-level key
        if indent is None:
            indent = depth
        match = _KEY.match(line[depth:])
        if depth != indent or match is None:
            raise FormatError(
                "tokenized_info holds a nested or continued value, which tokenloom's YAML subset does not read",
                path=path,
                record=number,
                field="tokenized_info",
                hint=_HINT,
            )
        result[match.group(1)] = _scalar(match.group(2) or "", path=path, line=number, key=match.group(1))
    return result


def _strip_comment(value: str) -> str:
    if value.startswith(("'", '"')):
        return value.strip()
    return value.split(" #", 1)[0].strip()


def _scalar(raw: str, *, path: Path, line: int, key: str) -> Any:
    value = _strip_comment(raw)
    if value.startswith("'"):
        if len(value) < 2 or not value.endswith("'"):
            raise FormatError("unterminated quoted value", path=path, record=line, field=key, hint=_HINT)
        return value[1:-1].replace("''", "'")
    if value.startswith('"'):
        try:
            decoded = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise FormatError(
                "double-quoted value uses YAML escapes", path=path, record=line, field=key, hint=_HINT
            ) from None
        return decoded
    if value[:1] in ("!", "&", "*", "{", "[", "|", ">"):
        raise FormatError(
            f"value {value[:40]!r} uses YAML beyond tokenloom's subset (tags, anchors, flow or block scalars)",
            path=path,
            record=line,
            field=key,
            hint=_HINT,
        )
    if value in ("", "null", "~"):
        return None
    if _INT.fullmatch(value):
        return int(value)
    return value
