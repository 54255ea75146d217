"""A tokenize run into object storage: staged locally, each shard uploaded once committed, the manifest last.

    tokenize(--output-dir s3://b/ds)
      -> the URL's manifest: same run key: complete, nothing to do; other settings: refused unless --overwrite
         (which deletes that manifest first, so no reader ever sees it beside the new shards)
      -> a native run into CACHE/uploads/<URL>/<run key> (resumable, exactly as on disk)
         while a thread uploads the shards of every unit its done marker commits
      -> the rest of the shards, stale shard objects of an old dataset removed, then manifest.json
      -> the staging directory removed

A reader opening the URL before the manifest lands gets "no native dataset at URL". A rerun after a
kill resumes the staging run and skips every object already holding its shard's size and checksum.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import orjson

from tokenloom.formats import ConfigError, ResumeMismatchError, read_manifest
from tokenloom.formats.io import MANIFEST_NAME
from tokenloom.formats.io.urls import parse_url
from tokenloom.formats.remote.publish import RemoteTarget, native_files, staging_dir
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._diff import run_key_differences
from tokenloom.tokenize._plan import RunInputs
from tokenloom.tokenize._summary import ProgressCallback, TokenizeSummary
from tokenloom.tokenize._unit_files import is_unit_file, unit_stem
from tokenloom.tokenize._units import summary_of

__all__ = ["UploadPoller", "tokenize_to_url"]

log = logging.getLogger("tokenloom.tokenize")

#: how often the upload thread looks for newly committed units (seconds)
POLL_SECONDS = 0.2


def tokenize_to_url(
    config: TokenizeConfig,
    inputs: RunInputs,
    run_local: Callable[[TokenizeConfig], TokenizeSummary],
    on_progress: ProgressCallback | None = None,
) -> TokenizeSummary:
    """Run (or resume, or confirm) a native tokenize job whose output is ``config.output_url``."""
    if config.output_url is None:
        raise ConfigError("tokenize_to_url needs an object-store output_dir", field="output_dir")
    url = parse_url(config.output_url)
    target = RemoteTarget(url, config.storage_options)
    run_key = inputs.run_key(config)
    existing = target.existing()
    if MANIFEST_NAME in existing:
        manifest = target.read_manifest()
        recorded = manifest.metadata.get("tokenize", {}) if manifest else {}
        if not config.overwrite:
            if manifest is None or {k: recorded.get(k) for k in run_key} != run_key:
                raise ResumeMismatchError(
                    f"{url} holds a dataset written with other settings, tokenizer or inputs: "
                    + "; ".join(run_key_differences(recorded, run_key)),
                    path=str(url),
                    hint="Pass --overwrite to replace it, or choose another --output-dir",
                )
            summary = summary_of(manifest, Path(), 0.0)
            summary.output_dir = str(url)  # type: ignore[assignment]
            summary.already_complete = True
            return summary
        target.delete(MANIFEST_NAME)  # first: from here on no reader sees a dataset at the URL
    foreign = [name for name in existing if not (native_files(name) or is_unit_file(name))]
    if foreign and not config.overwrite:
        raise ConfigError(
            f"{url} holds objects that are not a tokenize output ({', '.join(foreign[:5])})",
            path=str(url),
            field="output_dir",
            hint="Choose an empty prefix, or pass --overwrite (it replaces the dataset, other objects stay)",
        )
    chunking = {"chunk_lines": config.chunk_lines, "chunk_bytes": config.chunk_bytes}
    staging = staging_dir(url, {**run_key, **chunking}, config.cache_dir)
    staging.parent.mkdir(parents=True, exist_ok=True)
    local = dataclasses.replace(config, output_dir=staging, overwrite=False, storage_options=None)
    uploads = _ShardUploads(target, staging)
    uploads.start()
    try:
        summary = run_local(local)
    finally:
        uploads.stop()
    manifest = read_manifest(staging)
    for entry in manifest.files:
        if entry.name not in uploads.done:
            target.upload(staging / entry.name, entry.name, entry.xxh3_128)
    target.remove_stale(
        [f.name for f in manifest.files],
        lambda name: (native_files(name) or is_unit_file(name)) and name != MANIFEST_NAME,
    )
    target.upload(staging / MANIFEST_NAME)  # last: now the dataset exists at the URL
    shutil.rmtree(staging, ignore_errors=True)
    log.info("%s: %d object(s) uploaded, %d already there", url, len(target.uploaded), len(target.skipped))
    summary.output_dir = str(url)  # type: ignore[assignment]
    return summary


class UploadPoller:
    """A thread that uploads what a run has committed, every POLL_SECONDS and once more when stopped.

    Subclasses say what is committed and how it goes up (:meth:`_upload_committed`, idempotent); a failure
    is kept in ``error`` for the caller, which uploads again (or raises it) on its own thread.
    """

    name = "tokenloom-uploads"

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stop.is_set()
                self._upload_committed()
                if stopping:
                    return
                self._stop.wait(POLL_SECONDS)
        except BaseException as exc:  # the caller's final pass uploads again and raises the named error
            self.error = exc
            log.warning("uploading committed files failed (retried after the run): %s", exc)

    def _upload_committed(self) -> None:
        raise NotImplementedError


class _ShardUploads(UploadPoller):
    """Uploads each unit's shards as soon as its done marker commits it (failures surface at the end)."""

    def __init__(self, target: RemoteTarget, staging: Path) -> None:
        super().__init__()
        self.target = target
        self.staging = staging
        self.done: set[str] = set()

    def _upload_committed(self) -> None:
        try:
            markers = sorted(self.staging.glob(".tokenloom-unit-*.done"))
            dones = [orjson.loads(marker.read_bytes()) for marker in markers]
        except (FileNotFoundError, orjson.JSONDecodeError):
            return
        for done in dones:
            for record in done["shards"]:
                stem = unit_stem(done["unit"], record["index"])
                for suffix, checksum in ((".idx", record["idx_xxh3_128"]), (".bin", record["bin_xxh3_128"])):
                    name = stem + suffix
                    if name not in self.done:
                        self.target.upload(self.staging / name, name, checksum)
                        self.done.add(name)
