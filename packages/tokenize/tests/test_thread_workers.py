"""Threads of one process encode with the fast engine: the same bytes as worker processes and as one process."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import tokenloom.tokenize._executor as executor_module
from tokenloom.tokenize import TokenizeConfig, default_tokenizer_path, tokenize
from tokenloom.tokenize._executor import start_encoding
from tokenloom.tokenize._transform import transform_for
from tokenloom.tokenize._worker import EncodeOptions
from tokenloom.tokenize.engine import EngineMismatchError
from tokenloom.tokenize.inputs import discover_inputs, read_chunks

OPTIONS: dict[str, Any] = {"eos_id": None, "text_field": "text", "verify_fraction": 0.001, "max_line_bytes": 1 << 20}


def _real_corpus(root: Path) -> Path:
    """This package's own source files and docs (text no test wrote), plus non-ASCII and empty documents."""
    package = Path(executor_module.__file__).parent
    texts = [path.read_text(encoding="utf-8") for path in sorted(package.glob("*.py"))]
    texts += ["", "\u00e9\u6f22\u5b57 \U0001f642 <|endoftext|> inside", "x" * 5000]
    root.mkdir(parents=True)
    half = len(texts) // 2
    for name, part in (("a.jsonl", texts[:half]), ("b/c.jsonl", texts[half:] * 3)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in part))
    return root


def _run(corpus: Path, out: Path, **options: Any) -> None:
    config = TokenizeConfig(
        input_dir=corpus, output_dir=out, tokenizer=str(default_tokenizer_path()), chunk_lines=7, **options
    )
    tokenize(config)


def test_threads_processes_and_one_process_write_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output_digest: Callable[[Path], dict[str, object]]
) -> None:
    corpus = _real_corpus(tmp_path / "in")
    kinds: list[str] = []
    real_pool = executor_module.thread_pool

    def seen_pool(num_workers: int) -> Any:
        kinds.append("threads")
        return real_pool(num_workers)

    monkeypatch.setattr(executor_module, "thread_pool", seen_pool)
    for windowing in ({}, {"seq_len": 64, "overlap_size": 16}):
        outputs = {}
        _run(corpus, tmp_path / "threads", num_workers=2, shard_size_tokens=5000, overwrite=True, **windowing)
        outputs["threads"] = output_digest(tmp_path / "threads")
        assert kinds == ["threads"]
        with monkeypatch.context() as patched:
            patched.setattr(executor_module, "THREAD_WORKERS_MAX", 0)  # the same run on worker processes
            _run(corpus, tmp_path / "processes", num_workers=2, shard_size_tokens=5000, overwrite=True, **windowing)
        outputs["processes"] = output_digest(tmp_path / "processes")
        _run(corpus, tmp_path / "one", num_workers=0, shard_size_tokens=5000, overwrite=True, **windowing)
        outputs["one"] = output_digest(tmp_path / "one")
        assert kinds == ["threads"]
        kinds.clear()
        assert outputs["threads"] == outputs["processes"] == outputs["one"]
        assert sum(name.endswith(".bin") for name in outputs["threads"]) > 3
        for out in ("threads", "processes", "one"):  # every run recorded the fast engine
            manifest = orjson.loads((tmp_path / out / "manifest.json").read_bytes())
            assert manifest["metadata"]["tokenize"]["engine"]["name"] == "fast"


def test_the_engine_decides_the_kind_of_worker(tmp_path: Path) -> None:
    """fast: a thread pool of this process with the one encoder; hf (asked for): worker processes."""
    corpus = _real_corpus(tmp_path / "in")
    files = discover_inputs(corpus)
    tokenizer = str(default_tokenizer_path())

    def chunks() -> Any:
        return read_chunks(files, chunk_lines=5, chunk_bytes=1 << 20, max_line_bytes=1 << 20)

    with start_encoding(tokenizer, files, EncodeOptions(num_workers=2, engine="auto", **OPTIONS)) as threads:
        assert isinstance(threads.executor, ThreadPoolExecutor) and threads.encoder is not None
        assert threads.engine.name == "fast" and threads.settings.engine == "fast"
        fast = [result.tokens for result in transform_for(threads.settings, tokenizer, threads).encode(chunks())]
    with start_encoding(tokenizer, files, EncodeOptions(num_workers=2, engine="hf", **OPTIONS)) as processes:
        assert isinstance(processes.executor, ProcessPoolExecutor) and processes.encoder is None
        assert processes.engine.name == "hf"
        hf = [result.tokens for result in transform_for(processes.settings, tokenizer, processes).encode(chunks())]
    assert len(fast) == len(hf) > 5 and all(np.array_equal(a, b) for a, b in zip(fast, hf, strict=True))


def test_auto_falling_back_to_hf_runs_worker_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _real_corpus(tmp_path / "in")
    files = discover_inputs(corpus)

    def refused(backend: Any) -> Any:
        raise ValueError("unsupported component: planted by the test")

    monkeypatch.setattr(executor_module, "build_fast", refused)  # fastokens, built early on a thread, fails
    with start_encoding(
        str(default_tokenizer_path()), files, EncodeOptions(num_workers=2, engine="auto", **OPTIONS)
    ) as encoding:
        assert encoding.engine.name == "hf" and "planted by the test" in encoding.engine.reason
        assert isinstance(encoding.executor, ProcessPoolExecutor) and encoding.encoder is None


def test_a_mismatch_found_on_a_thread_stops_the_run_with_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error raised while a thread encodes reaches the caller as it would from a worker process."""
    corpus = _real_corpus(tmp_path / "in")
    files = discover_inputs(corpus)
    with start_encoding(
        str(default_tokenizer_path()), files, EncodeOptions(num_workers=2, engine="fast", **OPTIONS)
    ) as encoding:
        assert encoding.encoder is not None

        def broken(texts: list[str]) -> Any:
            raise EngineMismatchError("the fast engine and hf encode document 2 differently (planted)", record=2)

        monkeypatch.setattr(encoding.encoder, "encode_flat", broken)
        chunks = read_chunks(files, chunk_lines=5, chunk_bytes=1 << 20, max_line_bytes=1 << 20)
        with pytest.raises(EngineMismatchError, match="planted") as err:
            list(transform_for(encoding.settings, encoding.settings.tokenizer, encoding).encode(chunks))
    assert err.value.record == 3 and err.value.path == str(files[0].path)  # line 3 of the first chunk


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("layout", ["native", "units", "val-split"])
def test_every_run_encodes_with_the_one_encoder_it_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_workers: int, layout: str
) -> None:
    """Threads and num_workers=0 never build a second encoder per chunk (a worker process's own path)."""
    import tokenloom.tokenize._worker as worker_module

    corpus = _real_corpus(tmp_path / "in")

    def no_second_encoder(*args: Any) -> Any:
        raise AssertionError("a chunk was encoded without the run's encoder")

    monkeypatch.setattr(worker_module, "_cached_encoder", no_second_encoder)
    options: dict[str, Any] = {"native": {}, "units": {"num_nodes": 1}, "val-split": {"val_fraction": 0.3}}[layout]
    _run(corpus, tmp_path / "out", num_workers=num_workers, **options)
    name = "val/manifest.json" if layout == "val-split" else "manifest.json"
    assert orjson.loads((tmp_path / "out" / name).read_bytes())["metadata"]["tokenize"]["engine"]["name"] == "fast"


_THREADS_SCRIPT = """
import json, os, sys
from tokenloom.tokenize import TokenizeConfig, default_tokenizer_path, tokenize
from tokenloom.tokenize import engine
seen = set()
real = engine.FastEncoder.encode_flat
def spy(self, texts):  # what fastokens sees while it encodes
    seen.add(os.environ.get("FASTOKENS_BPE_THREADS"))
    return real(self, texts)
engine.FastEncoder.encode_flat = spy
tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=str(default_tokenizer_path()),
                        num_workers=int(sys.argv[3]), engine="fast"))
print(json.dumps({"env": sorted(seen, key=str)}))
"""


@pytest.mark.parametrize(
    ("workers", "preset", "env"),
    [(2, None, "1"), (1, None, None), (2, "3", "3")],
)
def test_encoding_threads_do_not_start_fastokens_threads_of_their_own(
    tmp_path: Path, workers: int, preset: str | None, env: str | None
) -> None:
    """With two encoding threads fastokens runs each encode on the calling thread (FASTOKENS_BPE_THREADS=1,
    read at its first encode); one encoding thread keeps fastokens' default, and a value the user set is kept."""
    import os
    import subprocess
    import sys

    corpus = _real_corpus(tmp_path / "in")
    environ = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    if preset is not None:
        environ["FASTOKENS_BPE_THREADS"] = preset
    done = subprocess.run(
        [sys.executable, "-c", _THREADS_SCRIPT, str(corpus), str(tmp_path / "out"), str(workers)],
        capture_output=True, text=True, timeout=300, env=environ, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert seen["env"] == [env]


_TWO_RUNS = """
import os, sys
from tokenloom.tokenize import TokenizeConfig, default_tokenizer_path, tokenize
seen = []
for n, workers in enumerate((2, 1)):
    tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2] + str(n),
                            tokenizer=str(default_tokenizer_path()), num_workers=workers, engine="fast"))
    seen.append(str(os.environ.get("FASTOKENS_BPE_THREADS")))
print(" ".join(seen))
"""


def test_a_threaded_run_leaves_the_process_environment_as_it_found_it(tmp_path: Path) -> None:
    """The setting is the run's, not the process's: gone after it, so a later 1-worker run (or any other
    fastokens user, or a child process) keeps fastokens' default."""
    import os
    import subprocess
    import sys

    corpus = _real_corpus(tmp_path / "in")
    environ = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _TWO_RUNS, str(corpus), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env=environ, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["None", "None"]
