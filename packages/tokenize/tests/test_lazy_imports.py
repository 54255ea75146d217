"""A plain ``tokenloom tokenize`` run imports only what it uses: no other format folder, no remote layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tokenloom.formats.keyed.records import RUN_PLAN_NAME
from tokenloom.tokenize._unit_files import PLAN_NAME

_RUN = """
import sys
from tokenloom.formats.cli.group import main
sys.argv = ["tokenloom", "tokenize", "--input-dir", sys.argv[1], "--output-dir", sys.argv[2], "--num-workers", "0"]
try:
    main()
except SystemExit:
    pass
print(" ".join(sorted(m for m in sys.modules if m.startswith("tokenloom."))))
"""


def test_plan_name_is_the_record_readers():
    """tokenize writes the plan under the name formats' record reader looks for (kept as two constants so that a
    text run need not import the keyed stores)."""
    assert PLAN_NAME == RUN_PLAN_NAME


def test_plain_run_imports_no_other_format_nor_remote(tmp_path: Path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello world"}\n{"text": "more"}\n')
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path / "in"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    modules = done.stdout.split("\n")[-2].split()
    assert "tokenloom.tokenize._commands" in modules
    assert (tmp_path / "out" / "manifest.json").is_file()
    for absent in ("formats.remote", "formats.keyed", "formats.megatron", "formats.flat", "formats.packed"):
        assert not any(m.startswith(f"tokenloom.{absent}") for m in modules), absent
    for absent in ("_publish", "_bucket", "_staged", "_unit_records", "_pack"):
        assert f"tokenloom.tokenize.{absent}" not in modules, absent
