"""The objects of a unit-planned run at a bucket URL: listed, fetched, uploaded unit by unit, deleted.

upload_unit: a committed unit's shards (or record store), then its done marker, an atomic create: the unit's
    commit at the URL (the node's upload thread, _publish.BucketPublisher, and each Ray task call it)
listing / fetch: the objects directly under the prefix; a small one (plan, marker) fetched whole
unit_store_objects / delete_unit_stores: --train-type units' record stores (unit_UUUUUU_0000.records/KEY)
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from tokenloom.formats import DataError
from tokenloom.formats.io.manifest import file_checksum
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.publish import RemoteTarget
from tokenloom.tokenize._unit_files import PLAN_NAME, done_path, is_unit_file, unit_stem
from tokenloom.tokenize._unit_records import UNIT_META, unit_store

__all__ = ["delete_unit_stores", "fetch", "listing", "unit_store_objects", "upload_unit"]


def upload_unit(target: RemoteTarget, staging: Path, unit: int) -> None:
    """A committed unit's shards, then its done marker (the unit's commit at the URL); then its staged shards go.

    The one way a unit reaches a bucket: a node's upload thread and a Ray task (on its own machine) call it.
    """
    marker = done_path(staging, unit)
    payload = orjson.loads(marker.read_bytes())
    if "shards" not in payload:  # a record unit: its store, kept staged (the last node merges the stores)
        store = unit_store(staging, unit)
        for path in sorted(store.iterdir(), key=lambda p: p.name == UNIT_META):
            target.upload(path, f"{store.name}/{path.name}")
        helper.put_once(target.config, marker, marker.name, file_checksum(marker))
        return
    records = payload["shards"]
    stems = [unit_stem(unit, int(record["index"])) for record in records]
    for stem, record in zip(stems, records, strict=True):
        target.upload(staging / f"{stem}.idx", checksum=str(record["idx_xxh3_128"]))
        target.upload(staging / f"{stem}.bin", checksum=str(record["bin_xxh3_128"]))
    helper.put_once(target.config, marker, marker.name, file_checksum(marker))
    for stem in stems:  # in the bucket now: the local marker alone tells a rerun here to skip the unit
        for suffix in (".bin", ".idx"):
            (staging / f"{stem}{suffix}").unlink(missing_ok=True)


def listing(target: RemoteTarget) -> dict[str, ObjectInfo]:
    """The objects directly under the output prefix, by name (a missing bucket is a named error)."""
    base = f"{target.url.prefix}/" if target.url.prefix else ""
    try:
        objects = helper.list_objects(target.config)
    except DataError:
        helper.check_bucket(target.config)
        raise
    found = {}
    for obj in objects:
        name = obj.key[len(base) :]
        if "/" not in name:
            found[name] = obj
    return found


def fetch(target: RemoteTarget, obj: ObjectInfo, path: Path) -> bytes:
    """A small object (plan, done marker) fetched whole into ``path`` (replaced atomically); its bytes."""
    tmp = path.with_name(f".{path.name}.fetch-{time.monotonic_ns()}.tmp")
    try:
        helper.fetch_into(target.config, obj, 0, obj.size, tmp)
        data = tmp.read_bytes()
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return data


def unit_store_objects(target: RemoteTarget) -> dict[str, list[ObjectInfo]]:
    """The objects of unit record stores under the URL (``unit_UUUUUU_0000.records/KEY``), by store name."""
    base = f"{target.url.prefix}/" if target.url.prefix else ""
    stores: dict[str, list[ObjectInfo]] = {}
    for obj in helper.list_objects(target.config):
        folder, _, rest = obj.key[len(base) :].partition("/")
        if rest and "/" not in rest and is_unit_file(folder):
            stores.setdefault(folder, []).append(obj)
    return stores


def delete_unit_stores(target: RemoteTarget, *, done_markers: bool = False) -> None:
    """The unit record stores at the URL (and, once published, the done markers and node records)."""
    base = f"{target.url.prefix}/" if target.url.prefix else ""
    for objects in unit_store_objects(target).values():
        for obj in objects:
            target.delete(obj.key[len(base) :])
    if done_markers:
        for name in listing(target):
            if name != PLAN_NAME and is_unit_file(name):
                target.delete(name)
