"""Shared fixtures: no network, tiny tokenizers trained in tmp, jsonl writers."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import orjson
import pytest

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Read by ray when it is imported, by whichever test module imports it first: with uv's run-time environment on,
# a local Ray cluster's workers run `uv run` in a copy of the working directory and re-point this environment's
# editable installs at that copy (deleted with the session): every later subprocess lost `tokenloom`.
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

from tokenloom.tokenize import train_byte_level_bpe  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # the tests' shared helpers: tokenize_helpers
from tokenize_helpers import BUCKETS, free_port, make_texts, output_digest, session_pids, tree_digest, write_texts  # noqa: E402


def write_jsonl(path: Path, records: Iterable[object], *, gz: bool = False) -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE of 300 ids (EOS id 0) trained on synthetic text."""
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    return train_byte_level_bpe(make_texts(200), out, vocab_size=300)


@pytest.fixture
def jsonl_dir(tmp_path: Path) -> Callable[..., Path]:
    """Write files of {"text": ...} records under tmp_path/in and return that dir."""

    def make(files: dict[str, list[object]], *, raw: dict[str, bytes] | None = None) -> Path:
        root = tmp_path / "in"
        root.mkdir(exist_ok=True)
        for name, records in files.items():
            write_jsonl(root / name, records, gz=name.endswith(".gz"))
        for name, data in (raw or {}).items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        return root

    return make


@pytest.fixture
def text_corpus(jsonl_dir: Callable[..., Path]) -> Callable[[int], Path]:
    """``text_corpus(n)``: tmp_path/in holding a.jsonl of ``make_texts(n)`` as {"text": ...} records."""
    return lambda n: jsonl_dir({"a.jsonl": [{"text": t} for t in make_texts(n)]})


@pytest.fixture(scope="module")
def ray_head_env() -> dict[str, str]:
    """Variables added to the Ray head's environment, and so its workers' (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def worker_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Ray workers' own cache directory (a remote module's ``ray_head_env`` sets it)."""
    return tmp_path_factory.mktemp("worker-cache")


@pytest.fixture(scope="module")
def s3_worker_env(seaweed, worker_cache: Path) -> dict[str, str]:
    """The workers reach the S3 server through the usual variables and cache in a directory the driver never uses."""
    return {**seaweed.shell_env(), "TOKENLOOM_CACHE_DIR": str(worker_cache)}


@pytest.fixture(scope="module")
def ray_head(ray_head_env: dict[str, str]) -> Iterator[str]:
    """``ray start --head --block`` in its own session; stopped (the whole session) when the module ends.

    A module that uses it imports ray first (``pytest.importorskip``), with ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``.
    """
    port = free_port()
    temp = tempfile.mkdtemp(prefix="tlray-")  # short: Ray's unix socket paths must stay under 108 bytes
    command = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    log = open(Path(temp) / "head.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, **ray_head_env}
    head = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start: {(Path(temp) / 'head.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        # `ray start --block` alone: it stops its raylet and GCS itself (a few seconds); signalled with the whole
        # group, it waits 30 s to drain a node whose processes are already gone
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        for pid in session_pids(head.pid):  # workers the raylet started in the head's session
            os.kill(pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    """A raw tree under tmp_path/raw: train/<bucket>/part-0.jsonl and train/<bucket>/more/part-1.jsonl."""
    root = tmp_path / "raw"
    for b, bucket in enumerate(BUCKETS):
        write_texts(root / "train" / bucket / "part-0.jsonl", make_texts(300, seed=10 + b))
        write_texts(root / "train" / bucket / "more" / "part-1.jsonl", make_texts(120, seed=20 + b))
    return root


@pytest.fixture(name="make_texts")
def make_texts_fixture() -> Callable[..., list[str]]:
    return make_texts


@pytest.fixture(name="output_digest")
def output_digest_fixture() -> Callable[[Path], dict[str, object]]:
    return output_digest


@pytest.fixture(name="tree_digest")
def tree_digest_fixture() -> Callable[[Path], dict[str, str]]:
    return tree_digest


CHAT_TEMPLATES = Path(__file__).parent / "chat_templates"
#: per test template: its special tokens, BOS and EOS
CHAT_TOKENS = {
    "chatml": (["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "generation_tags": (["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "drops_reasoning": (["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "header_bos": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    "next_role_marker": (["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"], "<s>", "</s>"),
    "turn_markers": (["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>"),
    "end_marker": (
        ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"],
        None,
        "<|endoftext|>",
    ),
}


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A Hugging Face tokenizer directory per test template: the shipped BPE plus the template's special tokens."""
    from tokenizers import AddedToken, Tokenizer

    from tokenloom.tokenize import default_tokenizer_path

    built: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in built:
            specials, bos, eos = CHAT_TOKENS[kind]
            directory = tmp_path_factory.mktemp(f"chat-{kind}")
            tokenizer = Tokenizer.from_file(str(Path(default_tokenizer_path()) / "tokenizer.json"))
            tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
            tokenizer.save(str(directory / "tokenizer.json"))
            config = {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "clean_up_tokenization_spaces": False,
                "eos_token": eos,
                "chat_template": (CHAT_TEMPLATES / f"{kind}.jinja").read_text(encoding="utf-8"),
            }
            if bos is not None:
                config["bos_token"] = bos
            (directory / "tokenizer_config.json").write_bytes(orjson.dumps(config))
            built[kind] = directory
        return built[kind]

    return make
