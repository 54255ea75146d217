"""Helpers the tokenize test modules share (imported by name: conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

WORDS = (  # noqa: SIM905 (a word list, not code)
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega the quick brown fox jumps over a lazy dog"
).split()


def make_texts(n: int, *, seed: int = 0, max_words: int = 60) -> list[str]:
    """Deterministic pseudo-random documents of 0..max_words words."""
    texts = []
    state = seed * 7919 + 17
    for i in range(n):
        state = (state * 1103515245 + 12345) % (1 << 31)
        count = state % (max_words + 1)
        words = []
        for _ in range(count):
            state = (state * 1103515245 + 12345) % (1 << 31)
            words.append(WORDS[state % len(WORDS)])
        texts.append(f"doc {i}: " + " ".join(words))
    return texts


def tree_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file in ``directory`` by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def output_digest(directory: Path) -> dict[str, object]:
    """tree_digest, with the run record (manifest.json / tokenize.json, done markers) compared without its engine.

    The engine (hf or fast) and why it was chosen are recorded; everything else must be the same bytes.
    """
    found: dict[str, object] = {}
    for name, digest in tree_digest(directory).items():
        if name in ("manifest.json", "tokenize.json"):
            record = orjson.loads((directory / name).read_bytes())
            (record.get("metadata", {}).get("tokenize") or record).pop("engine")
            record.pop("checksum", None)  # the manifest's checksum of itself
            found[name] = record
        elif name.endswith(".done"):  # a unit's done marker records its session's engine too
            done = orjson.loads((directory / name).read_bytes())
            done["facts"].pop("engine")
            found[name] = done
        else:
            found[name] = digest
    return found


#: the buckets of the raw tree fixture ``raw``
BUCKETS = ("code", "web")


def write_texts(path: Path, texts: list[str]) -> None:
    """A jsonl file of {"text": ...} records (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_config(corpus: Path, out: Path, tokenizer: Path, address: str, **extra: Any):
    """A Ray-executor TokenizeConfig of the cluster at ``address``, defaults otherwise."""
    from tokenloom.tokenize import ExecutorKind, TokenizeConfig

    return TokenizeConfig(
        input_dir=corpus,
        output_dir=out,
        tokenizer=str(tokenizer),
        executor=ExecutorKind.RAY,
        ray_address=address,
        **extra,
    )


def upload_prefix(seaweed: Any, local: Path, name: str) -> str:
    """Upload the folder to a fresh prefix ``name-<8 hex>`` of the S3 server's bucket: its URL."""
    key = f"{name}-{uuid.uuid4().hex[:8]}"
    seaweed.upload_tree(local, key)
    return f"s3://{seaweed.bucket}/{key}"


def numbered_parts(make_texts: Callable[..., list[str]], count: int, gz: int, first: int, step: int) -> dict:
    """``jsonl_dir`` files part-0.jsonl .. (part-<gz> gzipped), part i of ``make_texts(first + step * i, seed=i)``."""
    return {
        (f"part-{i}.jsonl.gz" if i == gz else f"part-{i}.jsonl"): [
            {"text": t} for t in make_texts(first + step * i, seed=i)
        ]
        for i in range(count)
    }


def assert_a_changed_input_is_named(two_nodes: Callable[..., Any], out: Path, changed: Path, data: bytes) -> None:
    """Node 0 of ``two_nodes(node_rank=...)`` runs; ``changed`` then holds ``data``: node 1's run is a
    ResumeMismatchError naming that input, at the plan, and nothing is published."""
    from tokenloom.formats import ResumeMismatchError
    from tokenloom.tokenize import tokenize
    from tokenloom.tokenize._unit_files import PLAN_NAME

    tokenize(two_nodes(node_rank=0))
    changed.write_bytes(data)
    match = rf"input {re.escape(changed.name)} changed \(mtime_ns, size\)"
    with pytest.raises(ResumeMismatchError, match=match) as caught:
        tokenize(two_nodes(node_rank=1))
    assert caught.value.path == str(out / PLAN_NAME)
    assert not (out / "manifest.json").exists()


def session_pids(session: int) -> list[int]:
    """The live (not zombie) processes of a session."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":  # fields[3]: session id
                pids.append(int(entry.name))
    return pids


def wait_group_gone(group: int, timeout: float = 10.0, poll: float = 0.02) -> bool:
    """Wait until no process of the group is left; False if one still is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(poll)
    return False


def kill_script_when(script: str, kwargs: dict[str, Any], ready: Callable[[], bool], timeout: float) -> int:
    """Run ``script`` with the JSON of ``kwargs`` in its own session, SIGKILL its whole group once ``ready()``.

    Returns the group id (the script's pid); fails the test if the script ends first or never gets ready.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, orjson.dumps(kwargs).decode()],
        env=env,
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it was killed: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the run, its workers and its object-store helper
    proc.wait(timeout=10)
    return proc.pid


def s3_cli_env(seaweed: Any, cache: Path) -> dict[str, str]:
    """The environment of a ``tokenloom`` CLI subprocess that writes to the S3 server, offline."""
    return {**os.environ, **seaweed.shell_env(), "TOKENLOOM_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}


def turns(*items: str) -> list[dict[str, str]]:
    """Chat messages from ``"role: content"`` strings (split at the first ``": "``)."""
    return [dict(zip(("role", "content"), item.split(": ", 1), strict=True)) for item in items]


def gpt_reference(docs: list[list[int]], seq_len: int, overlap: int, eod: int = 0) -> list[tuple[list[int], int]]:
    """GPT-Simple's loop, written out plainly: a window per start < n, eod where a window reaches the end."""
    out = []
    for doc in docs:
        if not doc:
            continue
        if len(doc) < seq_len:
            out.append(([*doc, eod], 0))
            continue
        stride = max(seq_len - overlap, seq_len // 2)
        start = 0
        for k in range(10_001):
            if start >= len(doc):
                break
            window = doc[start : start + seq_len]
            prefix = min(overlap, len(window)) if k > 0 and overlap > 0 else 0
            if start + seq_len >= len(doc):
                window = [*window, eod]
            out.append((window, prefix))
            start += stride
    return out


def same_dataset(local: Path, objects: dict[str, bytes]) -> None:
    """The objects of a bucket dataset equal a local run's files (the manifests compared without the engine
    name and their checksum)."""
    assert sorted(objects) == sorted(p.name for p in local.iterdir())
    for name, data in objects.items():
        if name == "manifest.json":
            ours, theirs = orjson.loads((local / name).read_bytes()), orjson.loads(data)
            for record in (ours, theirs):
                record["metadata"]["tokenize"].pop("engine")
                record.pop("checksum")
            assert ours == theirs
        else:
            assert data == (local / name).read_bytes(), name


#: A tokenize run to a bucket in a subprocess (kill tests): argv[1] is the JSON of TokenizeConfig's keywords plus
#: ``storage_options``.
REMOTE_TOKENIZE_SCRIPT = """
import json, sys
from tokenloom.formats import RemoteOptions
from tokenloom.tokenize import TokenizeConfig, tokenize
kwargs = json.loads(sys.argv[1])
remote = RemoteOptions.from_keywords(storage_options=kwargs.pop("storage_options"))
tokenize(TokenizeConfig(**kwargs, remote=remote))
"""
