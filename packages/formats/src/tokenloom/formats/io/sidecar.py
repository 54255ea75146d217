"""What Megatron and packed files have no field for: EOS id, vocab size, tokenizer fingerprint.

Megatron's ``.idx`` and Modalities' ``.pbin`` record neither the EOS id, the vocab
size nor the tokenizer, so tokenloom's writers put them in a small JSON file beside
the data, and the readers read it back:

    PREFIX.idx + PREFIX.bin   ->  PREFIX.tokenloom.json      (megatron)
    NAME.pbin                 ->  NAME.pbin.tokenloom.json   (packed)

    {"tokenloom_sidecar": 1, "describes": "data.idx", "bytes": 1234,
     "edges_xxh3": "...", "vocab_size": 16384, "eos_id": 0, "tokenizer_fingerprint": "..."}

``bytes`` and ``edges_xxh3`` (xxh3-64 of the described file's first and last MiB)
bind it to one version of the described file (the ``.idx``, or the ``.pbin``,
whose index sits at its end): a sidecar left beside other data is a FormatError,
never other data's ids. Other tools ignore the file; a dataset without one reads
as before (unknown EOS id and vocab size). It is written before the file it
describes is published, so a published ``.idx`` / ``.pbin`` has its sidecar.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import orjson
import xxhash

from tokenloom.formats.errors import ConfigError, FormatError
from tokenloom.formats.io.atomic import atomic_write_bytes
from tokenloom.formats.io.manifest import check_vocab_and_eos
from tokenloom.formats.io.paths import as_path, safe_stat
from tokenloom.formats.io.source import current_source

__all__ = [
    "SIDECAR_SUFFIX",
    "Sidecar",
    "merge_sidecar",
    "read_sidecar",
    "remove_sidecar",
    "sidecar_of",
    "write_sidecar",
]

SIDECAR_SUFFIX = ".tokenloom.json"
SIDECAR_VERSION = 1
_EDGE = 1 << 20
_MAX_BYTES = 64 << 10
_FIELDS = ("vocab_size", "eos_id", "tokenizer_fingerprint")

Sidecar = dict[str, Any]  # vocab_size, eos_id, tokenizer_fingerprint (each may be None)


def _edges(path: Path, size: int) -> str:
    with current_source().open(path) as handle:
        digest = xxhash.xxh3_64(handle.read(_EDGE))
        if size > _EDGE:
            handle.seek(max(_EDGE, size - _EDGE))
            digest.update(handle.read(_EDGE))
    return digest.hexdigest()


def _edges_of_bytes(data: bytes) -> str:
    digest = xxhash.xxh3_64(data[:_EDGE])
    if len(data) > _EDGE:
        digest.update(data[max(_EDGE, len(data) - _EDGE) :])
    return digest.hexdigest()


def write_sidecar(sidecar: Path, described: Path | bytes, *, name: str, values: Sidecar) -> bool:
    """Write ``sidecar`` for ``described`` (the complete file, maybe still temporary, or its bytes), published
    as ``name``. Nothing is written (and an old sidecar is removed) when every value is None.
    """
    if all(values.get(key) is None for key in _FIELDS):
        remove_sidecar(sidecar)
        return False
    if isinstance(described, bytes):
        size, edges = len(described), _edges_of_bytes(described)
    else:
        size = described.stat().st_size
        edges = _edges(described, size)
    payload = {
        "tokenloom_sidecar": SIDECAR_VERSION,
        "describes": os.fsencode(name).decode("utf-8", "backslashreplace"),  # a non-UTF-8 name: \xNN
        "bytes": size,
        "edges_xxh3": edges,
        **{key: values.get(key) for key in _FIELDS},
    }
    atomic_write_bytes(sidecar, orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    return True


def remove_sidecar(sidecar: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        sidecar.unlink()


def read_sidecar(sidecar: Path, described: Path, root: Path) -> Sidecar | None:
    """The values of ``sidecar`` if it exists, after checking that it describes ``described`` as it is now."""
    if not sidecar.exists() and not sidecar.is_symlink():
        return None
    info = safe_stat(root, sidecar)  # a FIFO, device or link outside the root is an UnsafePathError
    hint = f"Delete {sidecar.name} (the data then has no recorded EOS id / vocab size) or re-create the dataset"
    if info.st_size > _MAX_BYTES:
        raise FormatError(f"sidecar has {info.st_size} bytes, expected a small JSON object", path=sidecar, hint=hint)
    try:
        payload = orjson.loads(sidecar.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"sidecar is not valid JSON ({exc})", path=sidecar, hint=hint) from None
    if not isinstance(payload, dict) or payload.get("tokenloom_sidecar") != SIDECAR_VERSION:
        raise FormatError(
            f"not a tokenloom sidecar of version {SIDECAR_VERSION}", path=sidecar, field="tokenloom_sidecar", hint=hint
        )
    for key, kind in (("vocab_size", int), ("eos_id", int), ("tokenizer_fingerprint", str)):
        value = payload.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise FormatError(
                f"sidecar field {key!r} is {type(value).__name__}, expected {kind.__name__}",
                path=sidecar,
                field=key,
                hint=hint,
            )
    size = described.stat().st_size
    if payload.get("bytes") != size or payload.get("edges_xxh3") != _edges(described, size):
        raise FormatError(
            f"sidecar describes another version of {described.name} (recorded {payload.get('bytes')} bytes, "
            f"the file has {size} or different content)",
            path=sidecar,
            field="edges_xxh3",
            hint=hint,
        )
    check_vocab_and_eos(payload.get("vocab_size"), payload.get("eos_id"), path=sidecar, what="sidecar")
    return {key: payload.get(key) for key in _FIELDS}


def settle(name: str, recorded: int | None, given: int | None, *, where: str, path: Path, hint: str) -> int | None:
    """The recorded value, or ``given`` where nothing is recorded; both present and different is a ConfigError."""
    if given is not None and recorded is not None and given != recorded:
        raise ConfigError(f"{name} {given} was given, {where} records {recorded}", path=path, field=name, hint=hint)
    return recorded if recorded is not None else given


def merge_sidecar(
    found: Sidecar | None, *, vocab_size: int | None, eos_id: int | None, path: Path
) -> tuple[int | None, int | None, str | None]:
    """(vocab_size, eos_id, tokenizer_fingerprint): explicit arguments fill what the sidecar lacks.

    An argument that contradicts the sidecar is a ConfigError naming both values.
    """
    found = found or {}

    def hint(key: str) -> str:
        return f"Leave {key} out to use the recorded value, or delete {path.name} if it is wrong"

    return (
        settle(
            "vocab_size", found.get("vocab_size"), vocab_size, where="the sidecar", path=path, hint=hint("vocab_size")
        ),
        settle("eos_id", found.get("eos_id"), eos_id, where="the sidecar", path=path, hint=hint("eos_id")),
        found.get("tokenizer_fingerprint"),
    )


def sidecar_of(path: str | os.PathLike[str]) -> Path:
    """``PREFIX.tokenloom.json`` for a Megatron prefix, ``NAME.pbin.tokenloom.json`` for a .pbin."""
    path = as_path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)
