"""inspect --records on a store whose recorded tokenizer is unreadable here, and a sidecar with partial stats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
from click.testing import CliRunner

from tokenloom.formats import RecordStoreWriter
from tokenloom.formats.cli.commands import inspect


def test_broken_recorded_tokenizer_shows_ids_and_a_broken_given_one_is_a_clean_error(tmp_path: Path) -> None:
    with RecordStoreWriter(tmp_path / "sft", train_type="sft", dtype="uint16") as writer:
        writer.add_record({"sequence": [7, 8, 9], "loss_mask": np.array([0, 1, 1], dtype=np.uint8)})
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{not json")
    sidecar = {"tokenizer": str(tmp_path / "tok"), "stats": {"records": 1, "tokens": 3}}
    (tmp_path / "sft" / "post_training.json").write_bytes(orjson.dumps(sidecar))
    result = CliRunner().invoke(inspect, [str(tmp_path / "sft"), "--records", "2"])
    assert result.exit_code == 0, repr(result.exception)
    assert "7 \u27e68 9\u27e7" in result.output and "token ids (no tokenizer" in result.output
    given = CliRunner().invoke(inspect, [str(tmp_path / "sft"), "--records", "2", "--tokenizer", str(tmp_path / "tok")])
    assert given.exit_code != 0 and "Traceback" not in given.output
    assert "ConfigError" in given.output
    try:
        import tokenizers  # noqa: F401
    except ImportError:  # tokenloom-formats alone: the named error says what is missing
        assert "needs the tokenizers package" in given.output
    else:
        assert "cannot read the tokenizer" in given.output
