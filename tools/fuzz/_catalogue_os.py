"""Catalogue rows: OS failures (EROFS, ENOSPC on real tmpfs mounts as root, else simulated; EACCES)."""

from __future__ import annotations

import contextlib
import errno
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import _catalogue_base as base
from _catalogue_base import (
    CASES,
    Case,
    Run,
    _big_corpus,
    _big_native,
    _chmod_in,
    _cli,
    _mkdir,
    _mount,
    _no_dac,
    _tokenizer,
    copy,
)


def _simulated(code: int, command: list[str], where: str) -> list[str]:
    """``command`` with an OSError(code) raised by the first write below ``where`` (when a mount is impossible)."""
    shim = (
        "import builtins, errno, os, sys\n"
        f"where, code = {str(where)!r}, {code}\n"
        "real_open = os.open\n"
        "def fake(path, flags, *a, **k):\n"
        "    if str(os.fspath(path)).startswith(where) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):\n"
        "        raise OSError(code, os.strerror(code), os.fspath(path))\n"
        "    return real_open(path, flags, *a, **k)\n"
        "os.open = fake\n"
        "real_mkdir = os.mkdir\n"
        "def fake_mkdir(path, *a, **k):\n"
        "    if str(os.fspath(path)).startswith(where):\n"
        "        raise OSError(code, os.strerror(code), os.fspath(path))\n"
        "    return real_mkdir(path, *a, **k)\n"
        "os.mkdir = fake_mkdir\n"
        "from tokenloom.formats.cli.group import main\n"
        f"sys.argv = ['tokenloom', *{command[3:]!r}]\n"
        "main(prog_name='tokenloom')\n"
    )
    return [sys.executable, "-c", shim]


def _os_case(name: str, code: int, make: Callable[[Path, Path], list[str]], *errors: str) -> None:
    """A command whose output (or input) hits ``code``: a real mount/capability drop, else simulated."""

    def setup(tmp: Path) -> Run:
        mounted = base.MOUNT_OK
        point = tmp / "mnt"
        cleanup = None
        if code in (errno.EROFS, errno.ENOSPC) and mounted:
            cleanup = _mount(point, "size=64k,ro" if code == errno.EROFS else "size=16k")
            if code == errno.ENOSPC:
                (point / "ballast").write_bytes(b"\0" * 12 * 1024)
        else:
            point.mkdir()
        command = make(tmp, point)
        if code in (errno.EROFS, errno.ENOSPC) and not mounted:
            command = _simulated(code, command, str(point))
        sources = [p for p in tmp.iterdir() if p.name != "mnt"]
        return Run(process=command, sources=sources, cleanup=cleanup)

    CASES.append(Case(name, "OS failures", setup, "error", tuple(errors)))


def register_os_cases() -> None:
    tok = str(_tokenizer())
    for code, label in ((errno.EROFS, "read-only output (EROFS)"), (errno.ENOSPC, "full disk (ENOSPC)")):
        _os_case(
            f"tokenize onto a {label}",
            code,
            lambda tmp, mnt: _cli(
                "tokenize",
                "--input-dir",
                str(_big_corpus(tmp)),
                "--output-dir",
                str(mnt / "out"),
                "--tokenizer",
                tok,
                "--num-workers",
                "0",
                "--no-progress",
            ),
            "StorageError",
        )
        _os_case(
            f"convert onto a {label}",
            code,
            lambda tmp, mnt: _cli(
                "convert", str(_big_native(tmp)), str(mnt / "out"), "--to", "native", "--no-progress"
            ),
            "StorageError",
        )
        _os_case(
            f"convert --to megatron onto a {label}",
            code,
            lambda tmp, mnt: _cli(
                "convert", str(_big_native(tmp)), str(mnt / "out" / "data"), "--to", "megatron", "--no-progress"
            ),
            "StorageError",
        )
        _os_case(
            f"pack onto a {label}",
            code,
            lambda tmp, mnt: _cli(
                "pack",
                str(_big_corpus(tmp) / "a.jsonl"),
                "--output",
                str(mnt / "a.pbin"),
                "--tokenizer",
                tok,
                "--num-workers",
                "0",
                "--no-progress",
            ),
            "StorageError",
        )
        _os_case(
            f"index onto a {label}",
            code,
            lambda tmp, mnt: _index_on_mount(tmp, mnt),
            "StorageError",
        )

    def unreadable(kind: str, make: Callable[[Path], list[str]], *errors: str) -> None:
        def setup(tmp: Path) -> Run:
            command = make(tmp)
            sources = list(tmp.iterdir())
            return Run(process=_no_dac(command), sources=sources)

        CASES.append(Case(f"{kind} (EACCES)", "OS failures", setup, "error", tuple(errors or ("StorageError",))))

    def chmod0(path: Path) -> Path:
        path.chmod(0)
        return path

    unreadable(
        "tokenize an unreadable input file",
        lambda tmp: _cli(
            "tokenize",
            "--input-dir",
            str(_chmod_in(copy("corpus", tmp), "a.jsonl")),
            "--output-dir",
            str(tmp / "out"),
            "--tokenizer",
            tok,
            "--num-workers",
            "0",
            "--no-progress",
        ),
    )
    unreadable(
        "convert an unreadable shard",
        lambda tmp: _cli(
            "convert",
            str(_chmod_in(copy("native", tmp), "shard_00000.bin")),
            str(tmp / "out"),
            "--to",
            "native",
            "--no-progress",
        ),
    )
    unreadable(
        "validate (fast) an unreadable shard",
        lambda tmp: _cli("validate", str(_chmod_in(copy("native", tmp), "shard_00000.bin"))),
    )
    unreadable(
        "inspect an unreadable manifest",
        lambda tmp: _cli("inspect", str(_chmod_in(copy("native", tmp), "manifest.json"))),
    )
    unreadable(
        "open_dataset + read an unreadable shard (Python)",
        lambda tmp: [
            sys.executable,
            "-c",
            _PY_READ.format(path=str(_chmod_in(copy("native", tmp), "shard_00000.bin"))),
        ],
    )
    unreadable(
        "tokenize into an output directory without write permission",
        lambda tmp: _cli(
            "tokenize",
            "--input-dir",
            str(copy("corpus", tmp)),
            "--output-dir",
            str(chmod0(_mkdir(tmp / "locked")) / "out"),
            "--tokenizer",
            tok,
            "--num-workers",
            "0",
            "--no-progress",
        ),
    )
    unreadable(
        "convert into an output directory without write permission",
        lambda tmp: _cli(
            "convert",
            str(copy("native", tmp)),
            str(chmod0(_mkdir(tmp / "locked")) / "out"),
            "--to",
            "native",
            "--no-progress",
        ),
    )
    unreadable(
        "PackedDocumentDataset over an unreadable shard (Python)",
        lambda tmp: [
            sys.executable,
            "-c",
            _PY_PACKED.format(path=str(_chmod_in(copy("native", tmp), "shard_00000.bin"))),
        ],
    )


_PY_READ = """
from tokenloom.formats import DataError, open_dataset
try:
    ds = open_dataset({path!r})
    sum(int(ds[i].sum()) for i in range(len(ds)))
except DataError as exc:
    raise SystemExit(f"Error: {{type(exc).__name__}}: {{exc}}")
"""
_PY_PACKED = """
from tokenloom.formats import DataError
from tokenloom.datasets import PackedDocumentDataset
try:
    ds = PackedDocumentDataset({path!r}, 8)
    [ds[i] for i in range(len(ds))]
except DataError as exc:
    raise SystemExit(f"Error: {{type(exc).__name__}}: {{exc}}")
"""


def _index_on_mount(tmp: Path, mnt: Path) -> list[str]:
    """The jsonl lives on the mount (the index is written beside it): copied before the mount turns read-only."""
    corpus = copy("corpus", tmp)
    return _cli("index", str(_onto(corpus / "a.jsonl", mnt)))


def _onto(file: Path, mnt: Path) -> Path:
    """For EROFS/ENOSPC of ``index``: a read-only mount cannot receive the file, so it is bind-free: remount."""
    if not base.MOUNT_OK:
        target = mnt / file.name
        shutil.copy(file, target)
        return target
    # the mount is there already (read-only or almost full): remount writable, copy, restore the options
    options = subprocess.run(["findmnt", "-no", "OPTIONS", str(mnt)], capture_output=True, text=True).stdout
    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True, capture_output=True)
    (mnt / "ballast").unlink(missing_ok=True)
    shutil.copy(file, mnt / file.name)
    if "ro" in options.split(","):
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)
    else:
        with contextlib.suppress(OSError), open(mnt / "ballast", "wb") as ballast:
            while True:  # to the last byte
                ballast.write(b"\0" * 512)
                ballast.flush()
    return mnt / file.name
