"""A committed unit's way into object storage, shared by a node's upload thread (_remote_units) and a Ray task (_ray).

the unit staged in a local directory (UnitWriter: shards, then its done marker)
  -> its shards uploaded (skipped when the object already holds the same checksum)
  -> its done marker created at the URL (If-None-Match: the unit's commit there; never overwritten)
  -> its staged shards removed (the staged marker stays, so a rerun on this machine skips the unit)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from tokenloom.formats.io.manifest import file_checksum
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.publish import RemoteTarget
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._unit_files import done_path, unit_stem

__all__ = ["local_config", "upload_unit"]


def local_config(config: TokenizeConfig, staging: Path) -> TokenizeConfig:
    """The run's config writing into the local ``staging`` directory (the URL's copy on this machine)."""
    return dataclasses.replace(config, output_dir=staging, overwrite=False, storage_options=None)


def upload_unit(target: RemoteTarget, staging: Path, unit: int) -> None:
    """A committed unit's shards, then its done marker (the unit's commit at the URL); then its staged shards go."""
    marker = done_path(staging, unit)
    records = orjson.loads(marker.read_bytes())["shards"]
    stems = [unit_stem(unit, int(record["index"])) for record in records]
    for stem, record in zip(stems, records, strict=True):
        target.upload(staging / f"{stem}.idx", checksum=str(record["idx_xxh3_128"]))
        target.upload(staging / f"{stem}.bin", checksum=str(record["bin_xxh3_128"]))
    helper.put_once(target.config, marker, marker.name, file_checksum(marker))
    for stem in stems:  # in the bucket now: the local marker alone tells a rerun here to skip the unit
        for suffix in (".bin", ".idx"):
            (staging / f"{stem}{suffix}").unlink(missing_ok=True)
