"""Hand-built buckets in tmp_path, written with tokenloom's own native writer (GPT-Simple's layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from tokenloom.formats import open_writer

SEQ_LEN = 16
WINDOW = SEQ_LEN + 1
EOS = 65535


def write_bucket(directory: Path, tokens: np.ndarray, *, doc_length: int = 50, dtype: str = "uint16") -> None:
    """One shard holding ``tokens`` cut into documents of ``doc_length`` (the last one shorter)."""
    with open_writer(directory, dtype=dtype, eos_id=EOS, vocab_size=65536) as writer:
        for start in range(0, len(tokens), doc_length):
            writer.add(tokens[start : start + doc_length])


def make_corpus(root: Path, samples: dict[str, int], *, val_samples: int = 4, doc_length: int = 50) -> Path:
    """PATH/train/<bucket> and PATH/val/<bucket>: bucket b's token k is k % 60000 (sample i starts at i * 17)."""
    for split, sizes in (("train", samples), ("val", dict.fromkeys(samples, val_samples))):
        for name, count in sizes.items():
            tokens = np.arange(count * WINDOW, dtype=np.int64) % 60000
            write_bucket(root / split / name, tokens, doc_length=doc_length)
    return root


def write_train_val(root: Path, samples: dict[str, int], tokens, *, doc_length: int) -> Path:
    """PATH/train/<bucket> of ``tokens(count)`` for each bucket's count, then PATH/val/<bucket> of ``tokens(4)``."""
    for split, sizes in (("train", samples), ("val", dict.fromkeys(samples, 4))):
        for name, count in sizes.items():
            write_bucket(root / split / name, tokens(count), doc_length=doc_length)
    return root


def plain_config(path: object, curriculum: list[dict], **data: object) -> dict:
    """A curriculum YAML's content: ``data`` of unpacked SEQ_LEN samples from ``path``, plus the ``data`` keys."""
    return {"data": {"path": str(path), "max_length": SEQ_LEN, "packing": False, "curriculum": curriculum, **data}}


def tokenloom_group():
    """The ``tokenloom`` command as installed, with its curriculum and validate subcommands from the entry points."""
    from importlib.metadata import entry_points

    import click

    return click.Group(
        "tokenloom",
        commands={
            ep.name: ep.load()
            for ep in entry_points(group="tokenloom.commands")
            if ep.name in {"curriculum", "validate"}
        },
    )


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
