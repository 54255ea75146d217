"""The command line over every format the flow produces.

Tokenize a small corpus with the shipped tokenizer (2 workers, windowed), convert
it to every other token format, and run `tokenloom validate --deep` and
`tokenloom inspect --json` on each; all agree on the tokens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from tokenloom.formats import open_dataset
from tokenloom.tokenize import build_stdlib_corpus

TIMEOUT = 300
FORMATS = ["megatron", "flat", "packed"]


def tokenloom(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "tokenloom.formats", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flow")
    build_stdlib_corpus(root / "corpus", modules=["json", "csv", "textwrap", "argparse"])
    result = tokenloom(
        "tokenize",
        "--input-dir",
        str(root / "corpus"),
        "--output-dir",
        str(root / "native"),
        "--seq-len",
        "256",
        "--overlap-size",
        "32",
        "--num-workers",
        "2",
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    paths = {"native": root / "native"}
    for name in FORMATS:
        target = root / name / "data" if name == "megatron" else root / name
        if name == "packed":
            target = root / "packed.pbin"
        result = tokenloom(
            "convert", str(root / "native"), str(target), "--to", name, "--drop-overlap-prefix", "--no-progress"
        )
        assert result.returncode == 0, result.stderr
        paths[name] = target
    return paths


@pytest.mark.parametrize("name", ["native", *FORMATS])
def test_validate_deep_passes_on_every_format(flow: dict[str, Path], name: str) -> None:
    result = tokenloom("validate", str(flow[name]), "--deep", "--seq-len", "128")
    assert result.returncode == 0, result.stdout + result.stderr
    assert name in result.stdout


@pytest.mark.parametrize("name", ["native", *FORMATS])
def test_inspect_json_agrees_with_the_native_tokens(flow: dict[str, Path], name: str) -> None:
    result = tokenloom("inspect", str(flow[name]), "--json")
    assert result.returncode == 0, result.stderr
    report = orjson.loads(result.stdout)
    native = open_dataset(flow["native"])
    assert report["tokens"] == native.num_tokens
    converted = open_dataset(flow[name])
    assert np.array_equal(converted.tokens(0, converted.num_tokens), native.tokens(0, native.num_tokens))
    if name != "flat":
        assert [converted[i].tolist() for i in range(len(converted))] == [
            native[i].tolist() for i in range(len(native))
        ]


def test_validate_fails_with_exit_1_on_a_damaged_dataset(flow: dict[str, Path], tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(flow["native"], damaged)
    idx = next(damaged.glob("*.idx"))
    raw = bytearray(idx.read_bytes())
    raw[20] ^= 0xFF
    idx.write_bytes(bytes(raw))
    result = tokenloom("validate", str(damaged))
    assert result.returncode == 1
    assert "ChecksumError" in result.stdout + result.stderr or "checksum" in (result.stdout + result.stderr).lower()
