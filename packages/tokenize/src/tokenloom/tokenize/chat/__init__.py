"""Post-training data: conversations, preference pairs and reward groups -> tokens and proven loss masks.

    record (sft messages | prompt/completion, dpo prompt/chosen/rejected, grpo prompt/responses/rewards)
        -> ChatTokenizer.render (the chat template) -> encode with offsets
        -> derive_mask (each trained turn's characters, plus its end marker) -> verify_mask
        -> ChatEncoder.encode -> store arrays -> write_post_training (a record store)

    >>> from tokenloom.tokenize.chat import ChatEncoder, write_post_training
    >>> encoder = ChatEncoder("my-tokenizer-dir", train_type="sft", seq_len=4096)
    >>> arrays = encoder.encode({"messages": [{"role": "user", "content": "hi"},
    ...                                       {"role": "assistant", "content": "hello"}]})
    >>> write_post_training(records, "out/sft", "sft", tokenizer="my-tokenizer-dir")

``--astrai-config pipeline.json``: :class:`AstraiEncoder` gives what AstrAI's own ``Pipeline`` writes for
its sft and pretrain configs (its per-message rendering, role masks, cuts and position ids; see :mod:`._astrai`).

The mask rules (what is trained, what the end marker is) are in :mod:`._masks`' docstring.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from tokenloom.tokenize.chat._astrai import AstraiEncoder, AstraiStats, AstraiTokenizer, records_from_astrai_config
from tokenloom.tokenize.chat._astrai_config import AstraiConfig, AstraiSection, PositionIds
from tokenloom.tokenize.chat._encode import ChatEncoder, PostTrainingStats, TrainType, Truncate
from tokenloom.tokenize.chat._masks import MaskedTokens, TrainedSpan, derive_mask
from tokenloom.tokenize.chat._records import ROLES, Conversation, dpo_pair, grpo_group, sft_conversation
from tokenloom.tokenize.chat._template import ChatTokenizer, RecordPlace
from tokenloom.tokenize.chat._verify import runs, verify_mask
from tokenloom.tokenize.chat._write import SIDECAR_NAME, write_post_training

__all__ = [
    "ROLES",
    "SIDECAR_NAME",
    "AstraiConfig",
    "AstraiEncoder",
    "AstraiSection",
    "AstraiStats",
    "AstraiTokenizer",
    "ChatEncoder",
    "ChatTokenizer",
    "Conversation",
    "MaskedTokens",
    "PositionIds",
    "PostTrainingStats",
    "RecordPlace",
    "TrainType",
    "TrainedSpan",
    "Truncate",
    "default_chat_template",
    "derive_mask",
    "dpo_pair",
    "grpo_group",
    "records_from_astrai_config",
    "runs",
    "sft_conversation",
    "verify_mask",
    "write_post_training",
]


def default_chat_template() -> Path:
    """The chat template tokenloom ships for its own BPE (``<|endoftext|>`` ends each turn)."""
    return Path(str(files("tokenloom.tokenize") / "assets" / "chat" / "tokenloom-chat.jinja"))
