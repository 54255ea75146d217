"""tokenloom.tokenize: pre-tokenize jsonl into token shards, in parallel and crash-safely.

    inputs by suffix, read by their InputReader (jsonl, .gz, .zst, parquet, Arrow: :mod:`.inputs`)
        -> chunks of lines or rows (parent) -> parse + encode_batch + window (threads with fastokens, else processes)
        -> entries in input order -> unit_UUUUUU_KKKK.bin/.idx, each unit committed on its own -> manifest.json

Example::

    from tokenloom.tokenize import TokenizeConfig, tokenize

    summary = tokenize(TokenizeConfig(input_dir="raw", output_dir="tokens", seq_len=2048, overlap_size=128))
    print(summary.tokens, summary.skipped)

The same from the shell: ``tokenloom tokenize --input-dir raw --output-dir tokens --seq-len 2048``.
``format="megatron" | "flat" | "packed"`` tokenizes into a native staging dataset
(``OUT.native-staging``, resumable) and converts it into OUT at its finalize.
Text is encoded by :func:`load_encoder` (:mod:`tokenloom.tokenize.engine`): fastokens when it
is proven to give the same ids as Hugging Face ``tokenizers``, else ``tokenizers`` itself.
Every run is unit-planned (:mod:`._units`); one process is node 0 of 1. ``num_nodes=N, node_rank=R``
(or ``executor="ray"``) shares the units: each is committed on its own by whichever process encodes
it, and the last to finish writes the manifest; the output is the same bytes for any N, worker count
or interruption.
Without ``tokenizer`` the shipped byte-level BPE (trained on the standard
library's docstrings, :mod:`tokenloom.tokenize.corpus`) is used.
"""

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports

if TYPE_CHECKING:
    from tokenloom.tokenize._config import ExecutorKind, Layout, OnError, TokenizeConfig, supported_formats
    from tokenloom.tokenize._executor import WorkerDiedError
    from tokenloom.tokenize._pack import PackSummary, default_pack_path, pack
    from tokenloom.tokenize._staged import RECORD_NAME, output_path, staging_dir
    from tokenloom.tokenize._summary import TokenizeSummary
    from tokenloom.tokenize._tokenize import tokenize
    from tokenloom.tokenize._tokenizer import default_tokenizer_path, fingerprint
    from tokenloom.tokenize.corpus import CorpusInfo, build_stdlib_corpus
    from tokenloom.tokenize.engine import Encoder, Engine, EngineMismatchError, load_encoder
    from tokenloom.tokenize.inputs import IssueKind, discover_inputs
    from tokenloom.tokenize.jsonl_index import JsonlIndex, build_index, index_path
    from tokenloom.tokenize.train import EOS_TOKEN, train_byte_level_bpe
    from tokenloom.tokenize.windowing import Entries, Windowing, validate_window, window_documents

#: Public name -> the module that defines it, imported on first use: the ``tokenloom tokenize`` command (and
#: ``import tokenloom.tokenize``) loads only the modules its run needs.
_EXPORTS = {
    name: f"tokenloom.tokenize.{module}"
    for module, names in {
        "_config": ("ExecutorKind", "Layout", "OnError", "TokenizeConfig", "supported_formats"),
        "_executor": ("WorkerDiedError",),
        "_pack": ("PackSummary", "default_pack_path", "pack"),
        "_staged": ("RECORD_NAME", "output_path", "staging_dir"),
        "_summary": ("TokenizeSummary",),
        "_tokenize": ("tokenize",),
        "_tokenizer": ("default_tokenizer_path", "fingerprint"),
        "corpus": ("CorpusInfo", "build_stdlib_corpus"),
        "engine": ("Encoder", "Engine", "EngineMismatchError", "load_encoder"),
        "inputs": ("IssueKind", "discover_inputs"),
        "jsonl_index": ("JsonlIndex", "build_index", "index_path"),
        "train": ("EOS_TOKEN", "train_byte_level_bpe"),
        "windowing": ("Entries", "Windowing", "validate_window", "window_documents"),
    }.items()
    for name in names
}

__all__ = [
    "EOS_TOKEN",
    "RECORD_NAME",
    "CorpusInfo",
    "Encoder",
    "Engine",
    "EngineMismatchError",
    "Entries",
    "ExecutorKind",
    "Layout",
    "IssueKind",
    "JsonlIndex",
    "OnError",
    "PackSummary",
    "TokenizeConfig",
    "TokenizeSummary",
    "Windowing",
    "WorkerDiedError",
    "build_index",
    "build_stdlib_corpus",
    "default_pack_path",
    "default_tokenizer_path",
    "discover_inputs",
    "fingerprint",
    "index_path",
    "load_encoder",
    "output_path",
    "pack",
    "staging_dir",
    "supported_formats",
    "tokenize",
    "train_byte_level_bpe",
    "validate_window",
    "window_documents",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
