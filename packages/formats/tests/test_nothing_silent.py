"""Nothing accepted silently (issue #11): unlisted shards, dtype strings numpy chokes on, deep-validation coverage."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from formats_helpers import refuse_opening

from tokenloom.formats import ConfigError, FormatError, convert_dataset, open_dataset
from tokenloom.formats.cli.commands import validate
from tokenloom.formats.flat.npy import npy_header
from tokenloom.formats.native import NativeWriter


@pytest.fixture
def native(tmp_path: Path) -> Path:
    path = tmp_path / "native"
    with NativeWriter(path, dtype="uint16", vocab_size=1000, eos_id=0, shard_size_tokens=10) as writer:
        for n in (3, 5, 8, 4):
            writer.add([*range(1, n), 0])
    return path


def test_unlisted_shard_is_a_warning_in_open_and_a_finding_in_validate(native: Path, caplog) -> None:
    shutil.copy(native / "shard_00000.bin", native / "shard_00007.bin")
    with caplog.at_level(logging.WARNING, logger="tokenloom.formats"):
        open_dataset(native)
    assert any("shard_00007.bin is not listed" in r.getMessage() for r in caplog.records)
    result = CliRunner().invoke(validate, [str(native)])
    assert "warning    shard_00007.bin is not listed in manifest.json" in result.output


@pytest.mark.parametrize("descr", [",u2", "(", "u2 u2"])
def test_npy_header_dtype_numpy_cannot_parse_is_a_format_error(tmp_path: Path, descr: str) -> None:
    root = tmp_path / "flat"
    root.mkdir()
    header = npy_header(np.dtype("<u2"), 4).replace(b"'<u2'", repr(descr).encode())
    (root / "shard_00000.npy").write_bytes(header + np.arange(4, dtype="<u2").tobytes())
    with pytest.raises(FormatError, match="descr|header"):
        open_dataset(root, format="flat")


def test_dtype_option_numpy_cannot_parse_is_a_clean_error(native: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        convert_dataset(native, tmp_path / "out", to="flat", dtype=",u2")
    result = CliRunner().invoke(validate, [str(native), "--dtype", ",u2"])
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_deep_validation_says_what_it_could_not_check(native: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "mega" / "data"
    convert_dataset(native, prefix, to="megatron")
    prefix.with_name("data.tokenloom.json").unlink()  # as another tool writes it: no vocab size or EOS id
    plain = CliRunner().invoke(validate, [str(prefix), "--deep"])
    assert plain.exit_code == 0
    assert "token range not checked" in plain.output and "pass --vocab-size N" in plain.output
    assert "EOS placement not checked" in plain.output
    good = CliRunner().invoke(validate, [str(prefix), "--deep", "--vocab-size", "1000", "--eos-id", "0"])
    assert good.exit_code == 0, good.output
    assert "every id < 1,000 (--vocab-size)" in good.output and "ends with 0 (--eos-id)" in good.output
    small = CliRunner().invoke(validate, [str(prefix), "--deep", "--vocab-size", "5"])
    assert small.exit_code == 1 and "TokenRangeError" in small.output
    wrong_eos = CliRunner().invoke(validate, [str(prefix), "--deep", "--eos-id", "3"])
    assert wrong_eos.exit_code == 1 and "EOS id 3" in wrong_eos.output
    native_deep = CliRunner().invoke(validate, [str(native), "--deep"])
    assert "every id < 1,000 (recorded vocab size)" in native_deep.output


def test_fast_validate_fails_on_a_shard_it_cannot_read(native: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_opening(monkeypatch, "shard_00001.bin")
    result = CliRunner().invoke(validate, [str(native)])
    assert result.exit_code == 1
    assert "StorageError" in result.output and "shard_00001.bin" in result.output


def test_reader_option_that_does_not_apply_to_the_detected_format_is_a_config_error(native: Path) -> None:
    with pytest.raises(ConfigError, match="vocab_size do not apply to format 'native'"):
        open_dataset(native, vocab_size=10)  # found by the fuzzer: a TypeError escaped before
