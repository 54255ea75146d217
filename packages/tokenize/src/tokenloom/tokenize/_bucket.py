"""One unit-planned dataset at a bucket URL, staged on this node: its plan, node count, done markers, and at the
end its manifest (a record store: its units' stores merged here, then uploaded, manifest.json last); and its objects:

upload_unit: a committed unit's shards (or record store), then its done marker, an atomic create: the unit's
    commit at the URL (the node's upload thread, _publish.BucketPublisher, and each Ray task call it)
listing / fetch: the objects directly under the prefix; a small one (plan, marker) fetched whole
unit_store_objects / delete_unit_stores: --train-type units' record stores (unit_UUUUUU_0000.records/KEY)

See _publish for the whole run.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats import ConfigError, DataError, Manifest, ResumeMismatchError
from tokenloom.formats.io import MANIFEST_NAME, WRITING_MARKER, temp_base
from tokenloom.formats.io.manifest import file_checksum
from tokenloom.formats.keyed.bin_meta import META_NAME
from tokenloom.formats.keyed.records import POST_TRAINING_SIDECAR
from tokenloom.formats.remote import helper
from tokenloom.formats.remote.client import ObjectInfo
from tokenloom.formats.remote.publish import RemoteTarget, native_files
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._unit_files import (
    NODES_NAME,
    PLAN_NAME,
    UnitPlan,
    check_nodes,
    done_path,
    establish_plan,
    finished_path,
    is_node_record,
    is_unit_file,
    nodes_payload,
    read_done,
    uncommitted_error,
    unit_stem,
)
from tokenloom.tokenize._unit_records import (
    UNIT_META,
    is_record_store_file,
    merged,
    publish_records,
    records_complete,
    unit_store,
)
from tokenloom.tokenize._units import manifest_complete, write_unit_manifest

__all__ = ["BucketDataset", "upload_unit"]

log = logging.getLogger("tokenloom.tokenize")


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


class BucketDataset:
    """One unit-planned dataset at a URL and its staging directory on this node (plan, done markers, manifest)."""

    def __init__(
        self, target: RemoteTarget, staging: Path, plan: UnitPlan, first: int = 0, records: TokenizeConfig | None = None
    ) -> None:
        self.target = target
        self.staging = staging
        self.plan = plan
        self.first = first
        """Where its units start in the count a tree deals to nodes (0 for one dataset)."""
        self.records = records
        """--train-type: the run's config writing into ``staging`` (a record store); None: token shards."""
        self.manifest: Manifest | dict[str, Any] | None = None
        """What is published at the URL: the manifest, or a record store's post_training.json sidecar."""
        self.listed = listing(target)
        """The objects directly under the URL when this node started (markers, plan, shards, manifest)."""
        self.upload = functools.partial(upload_unit, target)
        """``upload(staging, unit)``: a unit staged elsewhere (a Ray task's machine) into this dataset."""

    def at_url(self, unit: int) -> bool:
        return done_path(self.staging, unit).name in self.listed

    def complete(self, *, overwrite_hint: bool = False) -> Manifest | dict[str, Any] | None:
        """What the URL published (its manifest; a record store: its sidecar), checked as a local output is
        (manifest_complete, records_complete) on a fetched copy: another run's is a mismatch named at the URL.
        A record store's unit objects that a killed publish left behind are deleted."""
        if MANIFEST_NAME not in self.listed:
            return None
        staged = self.staging / ".published"
        staged.mkdir(parents=True, exist_ok=True)
        for name in (PLAN_NAME, META_NAME, POST_TRAINING_SIDECAR, MANIFEST_NAME):
            if name in self.listed:
                fetch(self.target, self.listed[name], staged / name)
        try:
            published = (manifest_complete if self.records is None else records_complete)(staged, self.plan)
        except ResumeMismatchError as error:
            url = self.target.url
            raise ResumeMismatchError(
                f"{url} holds {'a record store' if self.records else 'a dataset'} written with other settings, "
                f"tokenizer, inputs or layout: {error.problem.split(': ', 1)[-1]}",
                path=str(url),
                hint=error.hint
                if overwrite_hint
                else "Choose another --output-dir, or delete the prefix and rerun every node",
            ) from None
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        if published is not None and self.records is not None:
            delete_unit_stores(self.target, done_markers=True)
        return published

    def check_foreign(self) -> None:
        """ConfigError when the URL holds objects no tokenize run wrote (before anything is put there)."""
        ours = is_record_store_file if self.records is not None else (lambda name: name == MANIFEST_NAME)
        foreign = sorted(name for name in self.listed if not (is_unit_file(name) or ours(name)))
        if foreign:
            raise ConfigError(
                f"{self.target.url} holds objects that are not a tokenize output: {', '.join(foreign[:5])}",
                path=str(self.target.url),
                field="output_dir",
                hint="Choose an empty prefix, or pass --overwrite (it replaces the dataset, other objects stay)",
            )

    def clear(self) -> None:
        """--overwrite (one process): the manifest first (no reader pairs it with new shards), then the rest of
        every tokenize output under the prefix; other objects stay. The staged copy is started afresh too."""
        if MANIFEST_NAME in self.listed:
            self.target.delete(MANIFEST_NAME)
        ours = is_record_store_file if self.records is not None else native_files
        for name in self.listed:
            if name != MANIFEST_NAME and (is_unit_file(name) or ours(name)):
                self.target.delete(name)
        delete_unit_stores(self.target)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.listed = listing(self.target)

    def establish_plan(self) -> None:
        """The URL's plan is this plan: fetched and compared, or created once (another node may race us)."""
        local_plan = self.staging / PLAN_NAME
        if PLAN_NAME in self.listed:  # even over a staged one: the prefix may have been emptied and reused
            fetch(self.target, self.listed[PLAN_NAME], local_plan)
        try:
            establish_plan(self.staging, self.plan)  # another recorded plan: a ResumeMismatchError naming it
        except ResumeMismatchError as error:  # named at the URL (the staged copy is this node's cache)
            raise _plan_mismatch(self.target, error.problem.split(": ", 1)[-1]) from None
        if PLAN_NAME in self.listed or helper.put_once(
            self.target.config, local_plan, PLAN_NAME, file_checksum(local_plan)
        ):
            return
        other = self.staging / f"{PLAN_NAME}.theirs"  # another node created it first: it must be the same plan
        if fetch(self.target, listing(self.target)[PLAN_NAME], other) != local_plan.read_bytes():
            theirs = orjson.loads(other.read_bytes()).get("run_key", {})
            raise _plan_mismatch(self.target, "; ".join(run_key_differences(theirs, self.plan.run_key)))
        other.unlink(missing_ok=True)

    def establish_nodes(self, nodes: int | None) -> int | None:
        """The run's node count at the URL: put once (the first node), or fetched and checked (a ConfigError
        naming both counts); None when nothing is recorded and ``nodes`` is None (--finalize alone)."""
        local = self.staging / NODES_NAME
        if NODES_NAME in self.listed:
            there = self.listed[NODES_NAME]
        elif nodes is None:
            return None
        else:
            local.write_bytes(nodes_payload(self.plan, nodes))
            if helper.put_once(self.target.config, local, NODES_NAME, file_checksum(local)):
                return nodes
            there = listing(self.target)[NODES_NAME]  # another node put it first: its count must be ours
        return check_nodes(fetch(self.target, there, local), nodes, self.target.url.url(NODES_NAME))

    def sync_markers(self, units: list[int]) -> None:
        """Staged done markers of ``units`` agree with the URL: a unit committed there is skipped here (fetched
        marker), and a staged marker whose shards were uploaded but whose URL marker is gone is encoded again."""
        for unit in units:
            marker = done_path(self.staging, unit)
            if marker.name in self.listed and not marker.exists():
                fetch(self.target, self.listed[marker.name], marker)
            elif marker.name in self.listed or not marker.exists():
                continue
            else:
                if not self._staged_whole(unit):
                    marker.unlink()  # the URL lost its marker, and the staged shards are gone: encode it again

    def _staged_whole(self, unit: int) -> bool:
        """A unit committed here still has its shards (or record store) staged beside its marker: uploadable."""
        if self.records is not None:
            return (unit_store(self.staging, unit) / UNIT_META).is_file()
        try:
            read_done(self.staging, unit, self.plan.digest)
        except DataError:
            return False
        return True

    def mark_finished(self, rank: int) -> None:
        """Node ``rank`` has committed its every unit at the URL (the last node knows it is last)."""
        marker = finished_path(self.staging, rank)
        marker.write_bytes(b"")
        self.target.upload(marker)

    def all_finished(self, nodes: int) -> bool:
        listed = listing(self.target)
        return all(finished_path(self.staging, rank).name in listed for rank in range(nodes))

    def missing(self) -> int:
        """Units not committed at the URL now."""
        return len(_missing(self.plan, listing(self.target)))

    def finish(
        self, tokenizer: str, *, required: bool, nodes: int | None = None, everyone: bool = False
    ) -> Manifest | dict[str, Any] | None:
        """The manifest (a record store: its sidecar), uploaded last once every unit is at the URL; None (or an error).

        ``nodes``: how the units were dealt, for the error's list of nodes to rerun. ``everyone``: every node
        has finished, so a unit still missing was taken by no node (said as such).
        """
        listed = listing(self.target)
        missing = _missing(self.plan, listed)
        units = len(self.plan.units)
        if missing and not required:
            log.info("%s: %d unit(s) not committed yet; the last node (or --finalize) writes the manifest",
                     self.target.url, len(missing))  # fmt: skip
            if self.records is not None:  # the last node fetches what it lacks: no second copy kept here
                for unit in range(units):
                    if done_path(self.staging, unit).name in listed:
                        shutil.rmtree(unit_store(self.staging, unit), ignore_errors=True)
            return None
        if missing:
            url = self.target.url
            raise uncommitted_error(
                self.plan,
                missing,
                path=str(url),
                recorded=nodes,
                everyone=everyone,
                first=self.first,
                where=f" at {url}",
            )
        if self.records is not None:
            return self._publish_records(tokenizer, listed)
        for unit in range(units):
            marker = done_path(self.staging, unit)
            if not marker.exists():
                fetch(self.target, listed[marker.name], marker)
        manifest = write_unit_manifest(self.staging, self.plan, tokenizer, {n: o.size for n, o in listed.items()})
        self.target.upload(self.staging / MANIFEST_NAME)  # last: now the dataset exists at the URL
        for name in listed:  # the dataset's objects do not depend on how many nodes wrote it
            if is_node_record(name):
                self.target.delete(name)
        log.info("%s: manifest uploaded (%d units)", self.target.url, units)
        return manifest

    def _publish_records(self, tokenizer: str, listed: dict[str, ObjectInfo]) -> dict[str, Any]:
        """Every unit's store staged here (fetched when another node committed it), merged by publish_records,
        then uploaded: data files, sidecar, meta.json, manifest.json last; then the unit objects deleted."""
        config = self.records
        assert config is not None  # noqa: S101  (only called for a record store)
        if not merged(self.staging):  # a killed publish merged already: its unit stores may be gone
            try:
                self._fetch_unit_stores(listed)
            except DataError:  # another node finalized at the same time and deleted the unit objects
                if MANIFEST_NAME not in (now := listing(self.target)):
                    raise
                self.listed = now
                return self.complete()  # pyright: ignore[reportReturnType]
        if not (self.staging / MANIFEST_NAME).is_file():  # unpublished until its manifest (publish_records)
            (self.staging / WRITING_MARKER).touch()
        sidecar = publish_records(self.staging, self.plan, config, tokenizer)
        last = (META_NAME, MANIFEST_NAME)
        names = sorted(p.name for p in self.staging.iterdir() if is_record_store_file(p.name) and p.name not in last)
        for name in [*names, *last]:  # manifest.json last: now the record store exists at the URL
            if (self.staging / name).is_file() and temp_base(name) == name:
                self.target.upload(self.staging / name)
        delete_unit_stores(self.target, done_markers=True)
        log.info("%s: record store uploaded (%d units)", self.target.url, len(self.plan.units))
        return sidecar

    def _fetch_unit_stores(self, listed: dict[str, ObjectInfo]) -> None:
        """Every unit's done marker and record store staged here: those other nodes committed are fetched."""
        stores = unit_store_objects(self.target)
        for unit in range(len(self.plan.units)):
            marker, store = done_path(self.staging, unit), unit_store(self.staging, unit)
            if not marker.exists():
                fetch(self.target, listed[marker.name], marker)
            if (store / UNIT_META).is_file():
                continue
            shutil.rmtree(store, ignore_errors=True)  # fetched whole again; its unit-meta.json last
            store.mkdir(parents=True)
            for obj in sorted(stores.get(store.name, []), key=lambda o: o.key.endswith(UNIT_META)):
                fetch(self.target, obj, store / obj.key.rsplit("/", 1)[-1])


def _missing(plan: UnitPlan, listed: dict[str, ObjectInfo]) -> list[int]:
    return [u for u in range(len(plan.units)) if done_path(Path(), u).name not in listed]


def _plan_mismatch(target: RemoteTarget, differences: str) -> ResumeMismatchError:
    return ResumeMismatchError(
        f"{target.url}'s unit plan was made with other settings, tokenizer or inputs: {differences}",
        path=target.url.url(PLAN_NAME),
        hint="Every node must run the same command on the same inputs: restore a changed input, or write into "
        "another --output-dir prefix (or delete this prefix and rerun every node) to start afresh",
    )
