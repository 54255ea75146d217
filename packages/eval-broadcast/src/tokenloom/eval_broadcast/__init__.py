"""tokenloom.eval_broadcast: the eval set built once on one rank, received by every rank, evaluated exactly.

rank src: build() / cache  --header (status, rows, row_len, dtype, checksum, ...)-->  every rank
          rows in chunks of <= chunk_bytes, narrowest dtype     (failure: header + message -> EvalBuildError)
every rank: EvalSet -> .split(rank, world) -> EvalDataset (training masks) -> loss_sum, tokens
          -> token_weighted_mean(loss_sum, tokens): the same number on any world size

>>> evalset = broadcast_eval_set(HFEvalSource("json", data_files="val.jsonl", split="train",
...                              tokenizer="tok/"), seq_len=2048, cache_dir="/scratch/eval")
>>> dataset = EvalDataset(evalset.split(rank, world), pack_sequences=True)
"""

from tokenloom.eval_broadcast._broadcast import DEFAULT_CHUNK_BYTES, DEFAULT_TIMEOUT, broadcast_eval_set
from tokenloom.eval_broadcast._cache import CacheWarning
from tokenloom.eval_broadcast._evaluate import EvalDataset, token_weighted_mean
from tokenloom.eval_broadcast._protocol import MAX_MESSAGE_BYTES, Header, Status
from tokenloom.eval_broadcast._rows import EvalSet, EvalTokens, exact_eval_split
from tokenloom.eval_broadcast._sources import HFEvalSource, PathEvalSource
from tokenloom.eval_broadcast._tokenize import encode_documents
from tokenloom.eval_broadcast.errors import EvalBroadcastError, EvalBuildError, EvalTransferError

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
