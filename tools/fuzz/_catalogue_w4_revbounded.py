"""Catalogue rows from the review of #35 item 2: a valid zstd frame whose window is over the decoder's 128 MiB."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Outcome, Run, _tokenizer, case


def _long_window(path: Path) -> Path:
    """A whole .jsonl.zst made as by ``zstd --long=28``: its frame asks for a 256 MiB window."""
    import zstandard

    path.parent.mkdir(parents=True, exist_ok=True)
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=28, enable_ldm=True)
    with open(path, "wb") as raw:
        writer = zstandard.ZstdCompressor(compression_params=params).stream_writer(raw)
        writer.write(b'{"text": "hello"}\n' * 100)
        writer.flush(zstandard.FLUSH_FRAME)
    return path


def _says(*words: str, never: str = "copy or download it again"):
    def check(outcome: Outcome) -> str | None:
        text = outcome.stdout + outcome.stderr
        missing = [w for w in words if w not in text]
        if missing:
            return f"the error does not say {missing}"
        return f"the error says {never!r}" if never in text else None

    return check


@case("tokenize: a whole .jsonl.zst made with zstd --long=28 (a 256 MiB window) is named by its window",
      "bad input", "error", "RecordError")  # fmt: skip
def _(tmp: Path) -> Run:
    _long_window(tmp / "in" / "long.jsonl.zst")
    argv = ["tokenize", "--input-dir", str(tmp / "in"), "--output-dir", str(tmp / "out"),
            "--tokenizer", str(_tokenizer()), "--num-workers", "0", "--no-progress"]  # fmt: skip
    return Run(argv=argv, check=_says("needs a decoding window over 128 MiB", "--long=27"))
