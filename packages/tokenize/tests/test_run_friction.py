"""Issue #21 (tokenize): rates, the cache hint, the engine line, large vocabularies, odd file names, dead workers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer

from tokenloom.formats import ConfigError, RecordError, UnsafePathError, open_dataset
from tokenloom.tokenize import TokenizeConfig, _tokenizer, default_tokenizer_path, load_encoder, tokenize
from tokenloom.tokenize._commands import _summary_lines
from tokenloom.tokenize._progress import RunRateColumn, rate_text
from tokenloom.tokenize.engine import MAX_FAST_ADDED_TOKENS


def write_jsonl(path: Path, records: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def test_cache_hint_names_the_hf_command_that_huggingface_hub_installs() -> None:
    with pytest.raises(ConfigError) as info:
        _tokenizer.fingerprint("no-such-org/no-such-tokenizer")
    assert "hf download no-such-org/no-such-tokenizer" in str(info.value)
    assert "huggingface-cli" not in str(info.value)
    from importlib.metadata import entry_points

    scripts = {e.name for e in entry_points(group="console_scripts") if e.value.startswith("huggingface_hub")}
    assert "hf" in scripts


def test_default_tokenizer_path_is_a_loadable_directory() -> None:
    # the README's example loads it with transformers' AutoTokenizer (the README tests run that as written)
    tokenizer = Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    assert tokenizer.token_to_id("<|endoftext|>") == 0 and tokenizer.get_vocab_size() == 16384
    assert (default_tokenizer_path() / "tokenizer_config.json").is_file()
    assert "default_tokenizer_path()" in (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")


def test_engine_line_is_logged_once_per_process_and_tokenizer(
    tmp_path: Path, tiny_tokenizer: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": "one document"}, {"text": "another"}])
    caplog.set_level(logging.DEBUG, logger="tokenloom")
    for run in range(3):
        config = TokenizeConfig(
            input_dir=tmp_path / "in", output_dir=tmp_path / f"out{run}", tokenizer=str(tiny_tokenizer), num_workers=0
        )
        tokenize(config)
    lines = [r for r in caplog.records if r.getMessage().startswith("encoding engine")]
    assert len(lines) == 3
    assert [r.levelno for r in lines].count(logging.INFO) <= 1  # the first (unless an earlier test logged it)
    assert all(r.levelno == logging.DEBUG for r in lines[1:])


def _with_added_tokens(count: int) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(count)])
    return tokenizer


def test_many_added_tokens_fall_back_to_hf_with_the_reason_and_how_to_force() -> None:
    tokenizer = _with_added_tokens(MAX_FAST_ADDED_TOKENS)  # plus its EOS: one over the limit
    assert len(tokenizer.get_added_tokens_decoder()) == MAX_FAST_ADDED_TOKENS + 1
    encoder = load_encoder(tokenizer, "auto")
    assert encoder.name == "hf"
    assert f"{MAX_FAST_ADDED_TOKENS + 1:,} added tokens" in encoder.reason and "--engine fast" in encoder.reason
    assert encoder.encode_batch(["x <extra_7> y"]) == [
        [*encoder.encode_batch(["x "])[0], 16384 + 7, *encoder.encode_batch([" y"])[0]]
    ]


def test_few_added_tokens_still_get_the_fast_engine() -> None:
    assert load_encoder(_with_added_tokens(100), "auto").name == "fast"


def test_input_name_not_utf8_is_refused_before_anything_is_created(tmp_path: Path, tiny_tokenizer: Path) -> None:
    inputs = tmp_path / "in"
    write_jsonl(inputs / "good.jsonl", [{"text": "fine"}])
    (Path(os.fsdecode(bytes(inputs))) / os.fsdecode(b"caf\xe9.jsonl")).write_bytes(b'{"text": "caf"}\n')
    for format_ in ("native", "megatron"):
        out = tmp_path / f"out-{format_}"
        config = TokenizeConfig(
            input_dir=inputs, output_dir=out, tokenizer=str(tiny_tokenizer), num_workers=0, format=format_
        )
        with pytest.raises(UnsafePathError) as info:
            tokenize(config)
        message = str(info.value)
        message.encode("utf-8")  # printable: no surrogates
        assert "caf\\xe9.jsonl" in message and "not valid UTF-8" in message and "Rename" in message
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in"] or not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_failed_start_leaves_no_empty_output_directory(tmp_path: Path, tiny_tokenizer: Path) -> None:
    # a record that fails in the first chunk: the run completed nothing, so OUT must not remain
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": "ok"}, {"nope": 1}])
    out = tmp_path / "out"
    with pytest.raises(RecordError):
        tokenize(
            TokenizeConfig(input_dir=tmp_path / "in", output_dir=out, tokenizer=str(tiny_tokenizer), num_workers=0)
        )
    assert not out.exists()


def _docs(n: int) -> list[dict[str, object]]:
    return [{"text": f"document {i}: " + "alpha beta gamma delta " * (i % 17 + 1)} for i in range(n)]


def test_summary_rates_are_this_runs_amounts_over_this_runs_wall_time(tmp_path: Path, tiny_tokenizer: Path) -> None:
    write_jsonl(tmp_path / "in" / "a.jsonl", _docs(300))
    write_jsonl(tmp_path / "in" / "sub" / "b.jsonl", _docs(200))
    size = sum(p.stat().st_size for p in (tmp_path / "in").rglob("*.jsonl"))
    config = TokenizeConfig(
        input_dir=tmp_path / "in", output_dir=tmp_path / "out", tokenizer=str(tiny_tokenizer), num_workers=0
    )
    summary = tokenize(config)
    assert (
        summary.bytes_read == size and summary.run_tokens == summary.tokens == open_dataset(tmp_path / "out").num_tokens
    )
    assert summary.bytes_per_second * summary.seconds == pytest.approx(size)
    assert summary.tokens_per_second * summary.seconds == pytest.approx(summary.tokens)
    printed = "\n".join(_summary_lines(summary))
    assert f"{summary.tokens:,} tokens from {size:,} decompressed bytes ({size:,} input bytes as stored)" in printed
    assert f"{rate_text(size, summary.seconds)} decompressed" in printed  # plain jsonl: the same bytes


def test_a_resumed_run_counts_only_what_it_did(tmp_path: Path, tiny_tokenizer: Path) -> None:
    write_jsonl(tmp_path / "in" / "a.jsonl", _docs(3000))
    size = (tmp_path / "in" / "a.jsonl").stat().st_size
    config = TokenizeConfig(
        input_dir=tmp_path / "in",
        output_dir=tmp_path / "out",
        tokenizer=str(tiny_tokenizer),
        num_workers=0,
        chunk_lines=100,
        shard_size_tokens=20_000,
        unit_bytes=size // 6,
    )
    first = {"bytes": 0}

    def stop_after_two_units(documents: int, tokens: int, source_bytes: int) -> None:
        first["bytes"] += source_bytes
        if len(list((tmp_path / "out").glob(".tokenloom-unit-*.done"))) >= 2:
            raise KeyboardInterrupt  # a real interruption: the committed units stay

    with pytest.raises(KeyboardInterrupt):
        tokenize(config, on_progress=stop_after_two_units)
    summary = tokenize(config)
    assert summary.resumed_units >= 2
    manifest = orjson.loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert 0 < summary.run_tokens < summary.tokens == manifest["num_tokens"]
    assert 0 < summary.bytes_read < size and summary.bytes_read + first["bytes"] >= size
    assert summary.tokens_per_second * summary.seconds == pytest.approx(summary.run_tokens)


def test_the_bar_shows_the_summarys_rate() -> None:
    from rich.progress import Progress

    now = [100.0]
    with Progress(RunRateColumn(), get_time=lambda: now[0], disable=True) as progress:
        task = progress.add_task("t", total=10_000_000)
        now[0] += 4.0
        progress.update(task, advance=6_000_000)
        now[0] += 2.0  # an idle end (writing the manifest): the bar's rate falls like the summary's
        shown = RunRateColumn().render(progress.tasks[0]).plain
    assert shown == f"{rate_text(6_000_000, 6.0)} decompressed" == "1.0 MB/s decompressed"


def test_pack_summary_rate_is_the_files_bytes_over_its_seconds(tmp_path: Path, tiny_tokenizer: Path) -> None:
    from tokenloom.tokenize import pack

    source = tmp_path / "a.jsonl"
    write_jsonl(source, _docs(400))
    summary = pack(source, tokenizer=str(tiny_tokenizer), num_workers=0)
    assert summary.bytes_read == source.stat().st_size
    assert summary.bytes_per_second * summary.seconds == pytest.approx(source.stat().st_size)


def test_a_sigkilled_worker_is_a_named_error_and_the_run_resumes(
    tmp_path: Path, tiny_tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import signal

    import tokenloom.tokenize._executor as executor_module
    from tokenloom.tokenize import WorkerDiedError

    monkeypatch.setattr(executor_module, "THREAD_WORKERS_MAX", 0)  # worker processes (the fast engine runs threads)

    write_jsonl(tmp_path / "in" / "a.jsonl", _docs(3000))

    def config(out: str, workers: int) -> TokenizeConfig:
        return TokenizeConfig(
            input_dir=tmp_path / "in",
            output_dir=tmp_path / out,
            tokenizer=str(tiny_tokenizer),
            num_workers=workers,
            chunk_lines=100,
            shard_size_tokens=20_000,
            unit_bytes=(tmp_path / "in" / "a.jsonl").stat().st_size // 6,
        )

    killed: list[int] = []

    def kill_a_worker(documents: int, tokens: int, source_bytes: int) -> None:
        if not killed and len(list((tmp_path / "out").glob(".tokenloom-unit-*.done"))) >= 2:
            worker = multiprocessing.active_children()[0]  # a real pool worker, as the OOM killer would
            os.kill(worker.pid, signal.SIGKILL)  # type: ignore[arg-type]
            killed.append(worker.pid)  # type: ignore[arg-type]

    with pytest.raises(WorkerDiedError) as info:
        tokenize(config("out", 2), on_progress=kill_a_worker)
    message = str(info.value)
    assert f"worker pid {killed[0]} was killed by SIGKILL (likely out of memory" in message
    assert "a.jsonl" in message and "lines " in message and "fewer --num-workers" in message
    assert len(list((tmp_path / "out").glob(".tokenloom-unit-*.done"))) >= 2  # committed units stay: it resumes
    resumed = tokenize(config("out", 2))
    assert resumed.resumed_units >= 2
    tokenize(config("clean", 0))
    out_files = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("unit_"))
    clean_files = sorted(p.name for p in (tmp_path / "clean").iterdir() if p.name.startswith("unit_"))
    assert out_files == clean_files
    for name in out_files:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


_KILLED_RUN = """
import sys
import tokenloom.tokenize._executor
from tokenloom.tokenize import TokenizeConfig, tokenize
if __name__ == "__main__":
    tokenloom.tokenize._executor.THREAD_WORKERS_MAX = 0  # worker processes, which get the hand-off
    tokenize(TokenizeConfig(input_dir=sys.argv[1], output_dir=sys.argv[2], tokenizer=sys.argv[3], num_workers=1))
"""


def test_a_sigkilled_run_leaves_a_handoff_dir_that_the_next_run_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from tokenloom.tokenize._executor import HANDOFF_PREFIX

    write_jsonl(tmp_path / "in" / "a.jsonl", _docs(20_000))
    temp = tmp_path / "tmp"
    temp.mkdir()
    script = tmp_path / "run.py"
    script.write_text(_KILLED_RUN, encoding="utf-8")
    tokenizer = str(default_tokenizer_path())
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "in"), str(tmp_path / "out"), tokenizer],
        env={**os.environ, "TMPDIR": str(temp)},
    )
    try:
        deadline = time.monotonic() + 120
        # the directory is made before its tokenizer.json is written: wait for the file, not the directory
        while not list(temp.glob(f"{HANDOFF_PREFIX}{child.pid}-*/tokenizer.json")):
            assert child.poll() is None and time.monotonic() < deadline, "the run never wrote its hand-off"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=60)
    stale = list(temp.glob(f"{HANDOFF_PREFIX}{child.pid}-*"))
    assert len(stale) == 1 and (stale[0] / "tokenizer.json").exists()  # what SIGKILL leaves
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    tokenize(TokenizeConfig(input_dir=tmp_path / "in", output_dir=tmp_path / "out", tokenizer=tokenizer, num_workers=1))
    assert not stale[0].exists()  # removed by a run on threads (the fast engine) too
    # and this run removed its own (pymp-*: multiprocessing's directory for the fork server's socket,
    # kept while this process lives and removed at its exit)
    assert [path for path in temp.iterdir() if not path.name.startswith("pymp-")] == []


def test_a_handoff_dir_of_another_host_or_pid_namespace_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared temp dir (TMPDIR on a cluster file system for a Slurm array, a bind-mounted /tmp in
    containers): a pid that is not running here says nothing about a directory made elsewhere, whose
    run may be live and its workers not yet started. Only this host's and pid namespace's are judged."""
    import contextlib
    import subprocess
    import sys
    import tempfile

    from tokenloom.tokenize._executor import HANDOFF_PREFIX, handoff_dir, remove_stale_handoffs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    elsewhere = tmp_path / f"{HANDOFF_PREFIX}{dead.pid}-00000000-live"
    elsewhere.mkdir()
    (elsewhere / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with contextlib.ExitStack() as stack:
        mine = handoff_dir(stack)  # named as a run on this host and pid namespace names it
        ours_dead = tmp_path / mine.name.replace(f"{HANDOFF_PREFIX}{os.getpid()}-", f"{HANDOFF_PREFIX}{dead.pid}-")
        mine.rename(ours_dead)
    assert remove_stale_handoffs(tmp_path) == [ours_dead]  # a dead pid here: its run is gone
    assert (elsewhere / "tokenizer.json").exists()


def test_a_dead_worker_ends_the_wait_even_when_the_pool_never_breaks() -> None:
    """Under load a SIGKILLed worker once left the parent waiting forever on a pool that never reported
    it broken (a 14-minute hang here); the wait now checks the workers itself (#21 review, this session)."""
    import signal
    import time
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from tokenloom.tokenize._executor import _result, _shutdown, spawn_pool
    from tokenloom.tokenize._worker import ChunkResult

    def _alarm(_signum: int, _frame: object) -> None:
        raise AssertionError("the wait did not end: a dead worker went unnoticed")

    executor = spawn_pool(1)
    try:
        executor.submit(time.sleep, 0).result(timeout=120)  # the worker is up
        (worker,) = list(executor._processes.values())  # type: ignore[attr-defined]
        os.kill(worker.pid, signal.SIGKILL)  # type: ignore[arg-type]
        worker.join(timeout=30)
        never_done: Future[ChunkResult] = Future()  # what the parent waits on when the pool does not break
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(30)
        try:
            with pytest.raises(BrokenProcessPool):
                _result(never_done, executor)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    finally:
        _shutdown(executor)
