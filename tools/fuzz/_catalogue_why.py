"""Catalogue rows from the issue's "Why" list.

Data loss, the writer lock, caches, missing extras, silent cases, the newcomer's trap, friction.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _catalogue_base as base
from _catalogue_base import (
    VALID,
    Outcome,
    Run,
    _captured_log,
    _cli,
    _docs,
    _mount,
    _no_dac,
    _rows,
    _tokenizer,
    case,
    copy,
    first,
    flip,
    truncate,
)
from click.testing import CliRunner

from tokenloom.formats import open_writer
from tokenloom.formats.cli.group import main as tokenloom_main

# -- the "Why" list ----------------------------------------------------------------------------


def _unchanged_and_absent(target: Path) -> Callable[[Outcome], str | None]:
    def check(_outcome: Outcome) -> str | None:
        return f"{target} was created" if target.exists() else None

    return check


@case("convert SRC SRC --to native --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["convert", str(src), str(src), "--to", "native", "--overwrite", "--no-progress"], sources=[src])


@case("convert SRC SRC --to flat --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(argv=["convert", str(src), str(src), "--to", "flat", "--overwrite", "--no-progress"], sources=[src])


@case("convert megatron prefix onto itself --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    argv = ["convert", str(src / "data"), str(src / "data"), "--to", "megatron", "--overwrite", "--no-progress"]
    return Run(argv=argv, sources=[src])


@case(
    "convert SRC SRC/inside --overwrite (target inside source)", "data loss", "error", "ConfigError", "UnsafePathError"
)
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(
        argv=["convert", str(src), str(src / "in"), "--to", "native", "--overwrite", "--no-progress"], sources=[src]
    )


@case("convert SRC PARENT --overwrite (target contains source)", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    (tmp / "parent").mkdir()
    src = copy("native", tmp / "parent")
    argv = ["convert", str(src), str(tmp / "parent"), "--to", "native", "--overwrite", "--no-progress"]
    return Run(argv=argv, sources=[src])


@case("convert SRC LINK-TO-SRC --overwrite (symlink)", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    (tmp / "link").symlink_to(src)
    return Run(
        argv=["convert", str(src), str(tmp / "link"), "--to", "native", "--overwrite", "--no-progress"], sources=[src]
    )


@case("convert onto a directory of user files --overwrite", "data loss", "error", "ConfigError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    (tmp / "mine").mkdir()
    (tmp / "mine" / "thesis.tex").write_text("precious")
    argv = ["convert", str(src), str(tmp / "mine"), "--to", "native", "--overwrite", "--no-progress"]
    return Run(argv=argv, sources=[src, tmp / "mine"])


@case("convert onto a tokenloom dataset --overwrite replaces it", "data loss", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    shutil.copytree(VALID / "flat", tmp / "old")
    argv = ["convert", str(src), str(tmp / "old"), "--to", "native", "--overwrite", "--no-progress"]

    def check(_o: Outcome) -> str | None:
        from tokenloom.formats import open_dataset

        a, b = open_dataset(src, validate="deep"), open_dataset(tmp / "old", validate="deep")
        same = [a[i].tolist() for i in range(len(a))] == [b[i].tolist() for i in range(len(b))]
        return None if same and b.format == "native" else "the replaced dataset differs from the source"

    return Run(argv=argv, sources=[src], check=check)


@case("tokenize --input-dir D --output-dir D --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    argv = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(corpus),
        "--overwrite",
        "--num-workers",
        "0",
        "--no-progress",
    ]
    return Run(argv=argv, sources=[corpus])


@case(
    "tokenize --output-dir = the tokenizer directory --overwrite",
    "data loss",
    "error",
    "ConfigError",
    "UnsafePathError",
)
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tok = tmp / "tok"
    shutil.copytree(_tokenizer(), tok)
    argv = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tok),
        "--tokenizer",
        str(tok),
        "--overwrite",
        "--num-workers",
        "0",
        "--no-progress",
    ]
    return Run(argv=argv, sources=[corpus, tok])


@case("tokenize --output-dir PARENT-of-input --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    (tmp / "work").mkdir()
    corpus = copy("corpus", tmp / "work")
    argv = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "work"),
        "--overwrite",
        "--num-workers",
        "0",
        "--no-progress",
    ]
    return Run(argv=argv, sources=[corpus])


@case("tokenize onto a directory of user files --overwrite", "data loss", "error", "ConfigError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("precious")
    argv = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "mine"),
        "--overwrite",
        "--num-workers",
        "0",
        "--no-progress",
    ]
    return Run(argv=argv, sources=[corpus, tmp / "mine"])


@case("pack INPUT --output INPUT --overwrite", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    target = corpus / "a.jsonl"
    return Run(argv=["pack", str(target), "--output", str(target), "--overwrite", "--no-progress"], sources=[corpus])


@case("eval-cache --cache-dir = the dataset --path", "data loss", "error", "ConfigError", "UnsafePathError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(
        argv=["eval-cache", "--path", str(src), "--seq-len", "8", "--cache-dir", str(src), "--no-progress"],
        sources=[src],
    )


# OS failures: real mounts / dropped capabilities in a real process where possible


# -- writer lock, caches, missing extra, silent cases, the newcomer's trap, friction ---------------------


def _hold_lock(out: Path) -> subprocess.Popen[bytes]:
    """Another process holding the writer lock of ``out`` (killed by the case's cleanup)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom tokenloom.formats.io import output_lock\n"
            f"with output_lock({str(out)!r}, what='first run'):\n    print('held', flush=True)\n    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    if holder.stdout is None or holder.stdout.readline().strip() != b"held":
        holder.kill()
        raise RuntimeError("the lock holder did not start")
    return holder


@case("two tokenize runs into one output: the second names the holder", "concurrency", "error", "OutputLockedError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    out = tmp / "out"
    holder = _hold_lock(out)
    command = _cli(
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(out),
        "--tokenizer",
        str(_tokenizer()),
        "--num-workers",
        "0",
        "--no-progress",
    )

    def check(outcome: Outcome) -> str | None:
        return None if str(holder.pid) in outcome.stderr else "the error does not name the holder's pid"

    return Run(process=command, sources=[corpus], check=check, cleanup=holder.kill)


@case("two convert runs into one output: the second names the holder", "concurrency", "error", "OutputLockedError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    out = tmp / "out"
    holder = _hold_lock(out)
    command = _cli("convert", str(src), str(out), "--to", "native", "--no-progress")
    return Run(process=command, sources=[src], cleanup=holder.kill)


@case("a stale lock (dead pid) is taken over with a warning", "concurrency", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    out = tmp / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = {
        "pid": int(dead.stdout),
        "host": socket.gethostname(),
        "started": "2020-01-01T00:00:00Z",
        "process_start": 1,
        "command": "killed",
    }
    (tmp / "out.tokenloom-lock").write_text(json.dumps(lock))

    def check(outcome: Outcome) -> str | None:
        return None if "stale" in outcome.stderr.lower() else "no warning about the stale lock"

    return Run(argv=["convert", str(src), str(out), "--to", "native", "--no-progress"], sources=[src], check=check)


def _plan_dataset(tmp: Path) -> tuple[Any, Path]:
    from tokenloom.datasets import PackedDocumentDataset

    src = copy("native", tmp)
    return (lambda: PackedDocumentDataset(src, 16, plan_cache_dir=tmp / "plans")), src


@case("truncated packing-plan cache is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    make, src = _plan_dataset(tmp)
    expected = _rows(make())
    plan = next((tmp / "plans").rglob("token_start.npy"))
    truncate(plan)

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(make())
        return rows, log.getvalue()

    def check(outcome: Outcome) -> str | None:
        rows, log = outcome.value
        if rows != expected:
            return "samples differ after the rebuild"
        return None if "damaged" in log else "the damage was not logged"

    return Run(call=call, sources=[src], check=check)


@case("byte flip in the packing-plan cache is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    make, src = _plan_dataset(tmp)
    expected = _rows(make())
    flip(next((tmp / "plans").rglob("length.npy")), at=-1)

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(make())
        return rows, log.getvalue()

    return Run(
        call=call,
        sources=[src],
        check=lambda o: (
            None if o.value[0] == expected and "damaged" in o.value[1] else "not detected or samples differ"
        ),
    )


@case("plan cache directory read-only: in-memory plan with a warning", "caches", "ok")
def _(tmp: Path) -> Run:
    _make, src = _plan_dataset(tmp)
    (tmp / "plans").mkdir()
    command = [
        sys.executable,
        "-c",
        "import logging, sys\nlogging.basicConfig(level=logging.WARNING)\n"
        "from tokenloom.datasets import PackedDocumentDataset\n"
        f"ds = PackedDocumentDataset({str(src)!r}, 16, plan_cache_dir={str(tmp / 'plans')!r})\n"
        "assert ds.plan_in_memory\nprint(len(ds), [ds[i]['input_ids'].tolist() for i in range(len(ds))])\n",
    ]
    expected = _rows(__import__("tokenloom.datasets", fromlist=["x"]).PackedDocumentDataset(src, 16))
    if base.MOUNT_OK:
        cleanup = _mount(tmp / "plans", "size=64k,ro")
    else:
        (tmp / "plans").chmod(0o555)
        command, cleanup = _no_dac(command), None

    def check(outcome: Outcome) -> str | None:
        if str(expected) not in outcome.stdout:
            return "samples differ from a plan built in memory"
        return None if "memory" in outcome.stderr else "no warning about the in-memory fallback"

    return Run(process=command, sources=[src], check=check, cleanup=cleanup)


@case("HF cache: byte flip in the middle of a cache shard is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import HuggingFaceDataset

    corpus = copy("corpus", tmp)
    kwargs = {"data_files": str(corpus / "a.jsonl"), "seq_len": 8, "tokenizer": str(_tokenizer())}
    first_ds = HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs)
    expected = _rows(first_ds)
    shard = next(first_ds.cache_path.glob("*.bin"))
    flip(shard)

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs))
        return rows, log.getvalue()

    return Run(
        call=call,
        sources=[corpus],
        check=lambda o: (
            None
            if o.value[0] == expected and "damaged" in o.value[1]
            else f"not detected or samples differ (log: {o.value[1].strip()[:120]!r})"
        ),
    )


@case("HF cache: truncated cache shard is detected and rebuilt", "caches", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.datasets import HuggingFaceDataset

    corpus = copy("corpus", tmp)
    kwargs = {"data_files": str(corpus / "a.jsonl"), "seq_len": 8, "tokenizer": str(_tokenizer())}
    first_ds = HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs)
    expected = _rows(first_ds)
    truncate(next(first_ds.cache_path.glob("*.bin")))

    def call() -> Any:
        with _captured_log("tokenloom.datasets") as log:
            rows = _rows(HuggingFaceDataset("json", cache_dir=tmp / "c", **kwargs))
        return rows, log.getvalue()

    return Run(
        call=call,
        sources=[corpus],
        check=lambda o: (
            None if o.value[0] == expected and "damaged" in o.value[1] else "not detected or samples differ"
        ),
    )


@case("convert --to h5 with the h5 extra missing", "missing extra", "extra")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    argv = ["convert", str(src), str(tmp / "x.h5"), "--to", "h5", "--no-progress"]
    return Run(process=_cli_without("h5py", argv), sources=[src])


@case("inspect --plot with matplotlib missing", "missing extra", "extra")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(process=_cli_without("matplotlib", ["inspect", str(src), "--plot", str(tmp / "p.png")]), sources=[src])


def _cli_without(module: str, argv: list[str]) -> list[str]:
    """``tokenloom ARGV`` in a process where importing ``module`` fails, as when its extra is not installed."""
    shim = (
        f"import sys\nsys.modules[{module!r}] = None\nfrom tokenloom.formats.cli.group import main\n"
        f"sys.argv = ['tokenloom', *{argv!r}]\nmain(prog_name='tokenloom')\n"
    )
    return [sys.executable, "-c", shim]


@case("validate: extra shard file beside a manifest is a warning", "silent", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    shutil.copy(first(src, "*.bin"), src / "shard_00099.bin")
    return Run(
        argv=["validate", str(src)],
        sources=[src],
        check=lambda o: None if "warning" in o.stdout and "shard_00099.bin" in o.stdout else "no warning",
    )


@case("open_dataset: extra shard file beside a manifest is logged", "silent", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset

    src = copy("native", tmp)
    shutil.copy(first(src, "*.bin"), src / "shard_00099.bin")

    def call() -> str:
        with _captured_log("tokenloom.formats") as log:
            open_dataset(src)
        return log.getvalue()

    return Run(call=call, sources=[src], check=lambda o: None if "shard_00099.bin" in o.value else "not logged")


@case("sampler state from another dataset of the same length", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    a = copy("native", tmp)
    b = tmp / "b"
    with open_writer(b, format="native", dtype="uint16", vocab_size=256, eos_id=0) as w:
        for doc in _docs():
            w.add(doc[::-1].copy())
    state = ResumableDistributedSampler(open_dataset(a), 1, 0).state_dict()
    other = ResumableDistributedSampler(open_dataset(b), 1, 0)
    return Run(call=lambda: other.load_state_dict(state), sources=[a, b])


@case("sampler state with epoch 10**30", "silent", "error", "ConfigError", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    sampler = ResumableDistributedSampler(100, 1, 0)
    state = sampler.state_dict()
    state["epoch"] = 10**30
    return Run(call=lambda: sampler.load_state_dict(state))


@case("sampler set_epoch(-1)", "silent", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.sampler import ResumableDistributedSampler

    return Run(call=lambda: ResumableDistributedSampler(100, 1, 0).set_epoch(-1))


@case("validate --deep megatron says what it could not check", "silent", "ok")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    (src / "data.tokenloom.json").unlink()  # a Megatron dataset from Megatron itself: no tokenloom sidecar
    return Run(
        argv=["validate", str(src), "--deep"],
        sources=[src],
        check=lambda o: None if "token range not checked" in o.stdout else "claims a full check",
    )


@case("validate --deep megatron --vocab-size 100 finds ids >= 100", "silent", "error", "TokenRangeError")
def _(tmp: Path) -> Run:
    src = copy("megatron", tmp)
    return Run(argv=["validate", str(src), "--deep", "--vocab-size", "100"], sources=[src])


@case("JsonlIndex: file rewritten with the same size and mtime is re-indexed", "silent", "ok")
def _(tmp: Path) -> Run:
    from tokenloom.tokenize.jsonl_index import JsonlIndex

    path = tmp / "a.jsonl"
    path.write_text('{"text": "aaaa"}\n{"text": "b"}\n')
    JsonlIndex(path)
    stat = path.stat()
    path.write_text('{"text": "a"}\n{"text": "bbbb"}\n')
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    def call() -> list[bytes]:
        index = JsonlIndex(path)
        return [bytes(index.raw(i)) for i in range(len(index))]

    return Run(call=call, check=lambda o: None if o.value[1].strip() == b'{"text": "bbbb"}' else f"stale: {o.value}")


@case("tokenize without EOS, then the advised rerun with --eos-id", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tokenizer = tmp / "tok"
    shutil.copytree(_tokenizer(), tokenizer)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = tokenizer / name
        if file.is_file():
            data = json.loads(file.read_text())
            data.pop("eos_token", None)
            file.write_text(json.dumps(data))
    args = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "out"),
        "--tokenizer",
        str(tokenizer),
        "--num-workers",
        "0",
        "--no-progress",
    ]
    failed = CliRunner().invoke(tokenloom_main, args)

    def check(outcome: Outcome) -> str | None:
        if failed.exit_code != 1 or "--eos-id" not in failed.output:
            return f"first run: exit {failed.exit_code}, {failed.output.strip()[:100]}"
        return None

    return Run(argv=[*args, "--eos-id", "0"], sources=[corpus], check=check)


@case("tokenize with a bad --eos-id, then a corrected rerun", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    args = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "out"),
        "--num-workers",
        "0",
        "--no-progress",
    ]
    failed = CliRunner().invoke(tokenloom_main, [*args, "--eos-id", "99999999"])
    return Run(
        argv=args,
        sources=[corpus],
        check=lambda o: None if failed.exit_code == 1 else f"first run exit {failed.exit_code}",
    )


@case("tokenize with a corrupt tokenizer leaves nothing, then a rerun", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tokenizer = tmp / "tok"
    shutil.copytree(_tokenizer(), tokenizer)
    good = (tokenizer / "tokenizer.json").read_bytes()
    (tokenizer / "tokenizer.json").write_text("{")
    args = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "out"),
        "--tokenizer",
        str(tokenizer),
        "--num-workers",
        "0",
        "--no-progress",
    ]
    failed = CliRunner().invoke(tokenloom_main, args)
    left = sorted(p.name for p in (tmp / "out").iterdir()) if (tmp / "out").exists() else []
    (tokenizer / "tokenizer.json").write_bytes(good)
    return Run(
        argv=args,
        sources=[corpus],
        check=lambda o: None if failed.exit_code == 1 and not left else f"first run left {left}",
    )


@case("tokenize with an unreadable-record input, fixed, then a rerun", "newcomer", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    good = (corpus / "a.jsonl").read_bytes()
    (corpus / "a.jsonl").write_bytes(good + b"{broken\n")
    args = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "out"),
        "--num-workers",
        "0",
        "--no-progress",
    ]
    failed = CliRunner().invoke(tokenloom_main, args)
    (corpus / "a.jsonl").write_bytes(good)
    return Run(
        argv=args,
        sources=[corpus],
        check=lambda o: None if failed.exit_code == 1 else f"first run exit {failed.exit_code}",
    )


@case("pack onto an existing file: the error names --overwrite", "friction", "error", "ConfigError")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    (tmp / "out.pbin").write_bytes(b"x")

    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        return None if "pass --overwrite" in text else "wording is not the CLI flag"

    return Run(
        argv=["pack", str(corpus / "a.jsonl"), "--output", str(tmp / "out.pbin"), "--no-progress"],
        sources=[corpus, tmp / "out.pbin"],
        check=check,
    )


@case("tokenize --help shows the --seq-len default", "friction", "ok")
def _(tmp: Path) -> Run:
    return Run(
        argv=["tokenize", "--help"],
        check=lambda o: None if "default" in o.stdout.split("--seq-len")[1][:300] else "no default shown",
    )


@case("inspect --plot labels entries on a log axis", "friction", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(
        argv=["inspect", str(src), "--plot", str(tmp / "p.png")],
        sources=[src],
        check=lambda o: None if (tmp / "p.png").stat().st_size > 1000 else "no plot",
    )


@case("validate prints entries and documents separately", "friction", "ok")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    return Run(
        argv=["validate", str(src)],
        sources=[src],
        check=lambda o: None if "entries" in o.stdout and "documents" in o.stdout else "counts unnamed",
    )


@case("tokenize without tokenizer_config.json says why start-up is slower", "friction", "ok")
def _(tmp: Path) -> Run:
    corpus = copy("corpus", tmp)
    tokenizer = tmp / "tok"
    tokenizer.mkdir()
    shutil.copy(_tokenizer() / "tokenizer.json", tokenizer / "tokenizer.json")
    args = [
        "tokenize",
        "--input-dir",
        str(corpus),
        "--output-dir",
        str(tmp / "out"),
        "--tokenizer",
        str(tokenizer),
        "--num-workers",
        "0",
        "--no-progress",
        "--eos-id",
        "0",
    ]
    return Run(
        argv=args,
        sources=[corpus],
        check=lambda o: None if "tokenizer" in o.stderr.lower() else "no start-up line names the path taken",
    )
