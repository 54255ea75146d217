"""tokenloom.eval_broadcast: the eval set built once on one rank, received by every rank, evaluated exactly.

rank src: build() / cache  --header (status, rows, row_len, dtype, checksum, ...)-->  every rank
          rows in chunks of <= chunk_bytes, narrowest dtype     (failure: header + message -> EvalBuildError)
every rank: EvalSet -> .split(rank, world) -> EvalDataset (training masks) -> loss_sum, tokens
          -> token_weighted_mean(loss_sum, tokens): the same number on any world size

>>> evalset = broadcast_eval_set(HFEvalSource("json", data_files="val.jsonl", split="train",
...                              tokenizer="tok/"), seq_len=2048, cache_dir="/scratch/eval")
>>> dataset = EvalDataset(evalset.split(rank, world), pack_sequences=True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenloom.formats.io import lazy_exports

if TYPE_CHECKING:
    from tokenloom.eval_broadcast._broadcast import DEFAULT_CHUNK_BYTES, DEFAULT_TIMEOUT, broadcast_eval_set
    from tokenloom.eval_broadcast._cache import CacheWarning
    from tokenloom.eval_broadcast._evaluate import EvalDataset, token_weighted_mean
    from tokenloom.eval_broadcast._protocol import MAX_MESSAGE_BYTES, Header, Status
    from tokenloom.eval_broadcast._rows import EvalSet, EvalTokens, exact_eval_split
    from tokenloom.eval_broadcast._sources import HFEvalSource, PathEvalSource
    from tokenloom.eval_broadcast._tokenize import encode_documents
    from tokenloom.eval_broadcast.errors import EvalBroadcastError, EvalBuildError, EvalTransferError

#: Public name -> the module that defines it, imported on first use: ``import tokenloom.eval_broadcast`` (and every
#: ``tokenloom ... --help``) costs no torch until something that needs it is asked for.
_EXPORTS = {
    "DEFAULT_CHUNK_BYTES": "tokenloom.eval_broadcast._broadcast",
    "DEFAULT_TIMEOUT": "tokenloom.eval_broadcast._broadcast",
    "MAX_MESSAGE_BYTES": "tokenloom.eval_broadcast._protocol",
    "CacheWarning": "tokenloom.eval_broadcast._cache",
    "EvalBroadcastError": "tokenloom.eval_broadcast.errors",
    "EvalBuildError": "tokenloom.eval_broadcast.errors",
    "EvalDataset": "tokenloom.eval_broadcast._evaluate",
    "EvalSet": "tokenloom.eval_broadcast._rows",
    "EvalTokens": "tokenloom.eval_broadcast._rows",
    "EvalTransferError": "tokenloom.eval_broadcast.errors",
    "HFEvalSource": "tokenloom.eval_broadcast._sources",
    "Header": "tokenloom.eval_broadcast._protocol",
    "PathEvalSource": "tokenloom.eval_broadcast._sources",
    "Status": "tokenloom.eval_broadcast._protocol",
    "broadcast_eval_set": "tokenloom.eval_broadcast._broadcast",
    "encode_documents": "tokenloom.eval_broadcast._tokenize",
    "exact_eval_split": "tokenloom.eval_broadcast._rows",
    "token_weighted_mean": "tokenloom.eval_broadcast._evaluate",
}

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_TIMEOUT",
    "MAX_MESSAGE_BYTES",
    "CacheWarning",
    "EvalBroadcastError",
    "EvalBuildError",
    "EvalDataset",
    "EvalSet",
    "EvalTokens",
    "EvalTransferError",
    "HFEvalSource",
    "Header",
    "PathEvalSource",
    "Status",
    "broadcast_eval_set",
    "encode_documents",
    "exact_eval_split",
    "token_weighted_mean",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
