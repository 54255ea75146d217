"""OS failures as named errors, failed runs leave nothing, corrected reruns are accepted (issue #11)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from tokenloom.formats import ResumeMismatchError, StorageError, UnsafePathError, open_dataset
from tokenloom.tokenize import TokenizeConfig
from tokenloom.tokenize._commands import tokenize as tokenize_cmd
from tokenloom.tokenize._tokenize import tokenize


def _config(tokenizer: Path, inp: Path, out: Path, **kw) -> TokenizeConfig:
    return TokenizeConfig(input_dir=inp, output_dir=out, tokenizer=str(tokenizer), num_workers=0, **kw)


def _args(inp: Path, out: Path, tokenizer: Path, *extra: str) -> list[str]:
    return [
        "--input-dir", str(inp), "--output-dir", str(out), "--tokenizer", str(tokenizer),
        "--num-workers", "0", "--no-progress", *extra,
    ]  # fmt: skip


@pytest.fixture
def corpus(jsonl_dir: Callable[..., Path], make_texts: Callable[..., list[str]]) -> Path:
    return jsonl_dir({"a.jsonl": [{"text": t} for t in make_texts(200, max_words=200)]})


@pytest.fixture
def no_eos_tokenizer(tmp_path: Path, tiny_tokenizer: Path) -> Path:
    """The tiny tokenizer with its EOS token removed from the config."""
    path = tmp_path / "no-eos-tok"
    shutil.copytree(tiny_tokenizer, path)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = path / name
        if file.is_file():
            data = orjson.loads(file.read_bytes())
            data.pop("eos_token", None)
            file.write_bytes(orjson.dumps(data))
    return path


# -- simulated OS errors (run everywhere) -------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "needle"), [(errno.ENOSPC, "Free space"), (errno.EROFS, "writable"), (errno.EACCES, "permissions")]
)
def test_simulated_os_error_while_writing_is_a_storage_error(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, code: int, needle: str
) -> None:
    real_fsync = os.fsync

    def failing(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StorageError, match=needle) as info:
        tokenize(_config(tiny_tokenizer, corpus, tmp_path / "out"))
    assert info.value.errno == code
    assert info.value.path is not None and str(tmp_path / "out") in info.value.path


def test_cli_prints_one_line_for_a_storage_error_and_debug_shows_the_traceback(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenloom.formats.cli import main

    def failing(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", failing)
    args = ["tokenize", *_args(corpus, tmp_path / "out", tiny_tokenizer)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "StorageError: no space left on device (ENOSPC)" in result.output
    assert "Traceback" not in result.output
    debug = CliRunner().invoke(main, ["--debug", *args])
    assert isinstance(debug.exception, StorageError)  # raised, so click prints the traceback


# -- real failures: a full tmpfs, a read-only mount, a permission drop (root with mount/setpriv) --


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    mounted: list[Path] = []

    def mount(size: str, *, read_only: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the simulated test covers it")
        mounted.append(point)
        return point

    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting needs root; the simulated-OSError tests cover this case")
    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)


def test_full_disk_is_a_storage_error_and_a_rerun_elsewhere_works(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path, mount_tmpfs: Callable[..., Path]
) -> None:
    disk = mount_tmpfs("64k")
    big = corpus.parent / "big"
    big.mkdir()
    (big / "a.jsonl").write_bytes((corpus / "a.jsonl").read_bytes() * 20)
    result = CliRunner().invoke(tokenize_cmd, _args(big, disk / "out", tiny_tokenizer))
    assert result.exit_code == 1, result.output
    assert "StorageError" in result.output and "ENOSPC" in result.output and "MB free now" in result.output
    good = CliRunner().invoke(tokenize_cmd, _args(big, tmp_path / "out", tiny_tokenizer))
    assert good.exit_code == 0, good.output


def test_read_only_output_is_a_storage_error(
    tiny_tokenizer: Path, corpus: Path, mount_tmpfs: Callable[..., Path]
) -> None:
    ro = mount_tmpfs("64k", read_only=True)
    result = CliRunner().invoke(tokenize_cmd, _args(corpus, ro / "out", tiny_tokenizer))
    assert result.exit_code == 1, result.output
    assert "EROFS" in result.output and "writable --output-dir" in result.output


def _setpriv() -> list[str]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the permission override")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_unreadable_input_is_a_storage_error(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    prefix = _setpriv()
    (corpus / "a.jsonl").chmod(0)
    code = "from tokenloom.formats.cli.group import main; main()"
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code, "tokenize", *_args(corpus, tmp_path / "out", tiny_tokenizer)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 1, done.stderr
    assert "EACCES" in done.stderr and "a.jsonl" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- inputs that are not regular files are named, never skipped ----------------------------------


def test_fifo_and_symlink_loop_inputs_are_named(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    os.mkfifo(corpus / "pipe.jsonl")
    with pytest.raises(UnsafePathError, match=r"pipe\.jsonl.*FIFO"):
        tokenize(_config(tiny_tokenizer, corpus, tmp_path / "out"))
    (corpus / "pipe.jsonl").unlink()
    (corpus / "loop.jsonl").symlink_to(corpus / "loop.jsonl")
    with pytest.raises(StorageError, match=r"loop\.jsonl"):
        tokenize(_config(tiny_tokenizer, corpus, tmp_path / "out"))


# -- a failed run leaves nothing; a corrected rerun is accepted ----------------------------------


def test_missing_eos_leaves_nothing_and_the_advised_rerun_works(
    tmp_path: Path, no_eos_tokenizer: Path, corpus: Path
) -> None:
    out = tmp_path / "out"
    failed = CliRunner().invoke(tokenize_cmd, _args(corpus, out, no_eos_tokenizer))
    assert failed.exit_code == 1
    assert "--eos-id" in failed.output
    assert not out.exists()
    rerun = CliRunner().invoke(tokenize_cmd, _args(corpus, out, no_eos_tokenizer, "--eos-id", "0"))
    assert rerun.exit_code == 0, rerun.output
    assert open_dataset(out).eos_id == 0


def test_rerun_with_other_settings_is_accepted_when_no_shard_was_completed(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(Exception, match="eos_id"):
        tokenize(_config(tiny_tokenizer, corpus, out, eos_id=10**6))
    assert list(out.iterdir()) == []  # the pre-existing empty directory stays, empty
    summary = tokenize(_config(tiny_tokenizer, corpus, out, seq_len=32))
    assert summary.entries > 0


def test_resume_mismatch_lists_every_difference(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    tokenize(_config(tiny_tokenizer, corpus, out, seq_len=64))
    (corpus / "b.jsonl").write_text('{"text": "more"}\n')
    with pytest.raises(ResumeMismatchError) as info:
        tokenize(_config(tiny_tokenizer, corpus, out, seq_len=32, text_field="body"))
    message = str(info.value)
    assert "max_length 64 -> 32" in message
    assert "text_field 'text' -> 'body'" in message
    assert "b.jsonl" in message and "added" in message


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_corrupt_tokenizer_file_is_named_and_leaves_nothing(
    tmp_path: Path, tiny_tokenizer: Path, corpus: Path, name: str
) -> None:
    broken = tmp_path / "broken-tok"
    shutil.copytree(tiny_tokenizer, broken)
    (broken / name).write_bytes((broken / name).read_bytes()[:40])
    out = tmp_path / "out"
    result = CliRunner().invoke(tokenize_cmd, _args(corpus, out, broken))
    assert result.exit_code == 1, result.output
    assert f"{name} is not valid JSON" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_valid_json_that_is_no_tokenizer_is_a_config_error(tmp_path: Path, tiny_tokenizer: Path, corpus: Path) -> None:
    broken = tmp_path / "broken-tok"
    shutil.copytree(tiny_tokenizer, broken)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    result = CliRunner().invoke(tokenize_cmd, _args(corpus, tmp_path / "out", broken))
    assert result.exit_code == 1, result.output
    assert "cannot load this tokenizer.json" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
