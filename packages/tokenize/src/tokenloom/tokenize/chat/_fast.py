"""Rendered conversations encoded on tokenize's fast engine (fastokens), where it is proven equal to ``tokenizers``.

fastokens gives ids but no character offsets, and the masks need offsets. For a byte-level BPE (no
normalizer, ``ByteLevel`` pre-tokenizer without an added prefix space, ``ByteLevel`` decoder, no
post-processor that trims offsets) a token's bytes are its vocabulary string, one character per byte
(an added token: its content's UTF-8); the tokens' bytes add up to the text's, so each token's byte span
is a running sum, mapped to characters as ``tokenizers`` does (a token holding part of a character covers
that character). Added tokens that strip the whitespace beside them (``lstrip`` / ``rstrip``) break the sum:
such a tokenizer encodes with ``tokenizers``. Checked equal to ``tokenizers``' offsets in the tests.

The engine is used only when :func:`tokenloom.tokenize.engine.load_encoder` proves it on its probe set plus
renderings of probe conversations through the record's own template; while it runs, a deterministic
``verify_fraction`` of the renderings (by content hash) is encoded by ``tokenizers`` too and compared
(EngineMismatchError on a difference). Any other tokenizer encodes with ``tokenizers`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import xxhash

from tokenloom.tokenize.engine import DEFAULT_VERIFY_FRACTION, EngineMismatchError, load_encoder

__all__ = ["FastChatEncoding", "byte_offsets_hold"]


def byte_offsets_hold(backend: Any) -> str | None:
    """None when a token's bytes are its vocabulary string (see the module docstring), else why not."""
    spec = orjson.loads(backend.to_str())
    if spec.get("normalizer") is not None:
        return "the tokenizer has a normalizer"
    pre, decoder, post = spec.get("pre_tokenizer") or {}, spec.get("decoder") or {}, spec.get("post_processor")
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space"):
        return "the pre-tokenizer is not ByteLevel without a prefix space"
    if decoder.get("type") != "ByteLevel":
        return "the decoder is not ByteLevel"
    if (spec.get("model") or {}).get("type") != "BPE":
        return "the model is not BPE"
    if post is not None and post.get("type") != "TemplateProcessing" and post.get("trim_offsets", True):
        return f"the post-processor ({post.get('type')}) trims offsets"
    stripping = [t["content"] for t in spec.get("added_tokens") or [] if t.get("lstrip") or t.get("rstrip")]
    if stripping:
        return f"added tokens that take in the whitespace beside them ({stripping[:3]}) hold more than their text"
    return None


class FastChatEncoding:
    """ids and character offsets of a rendered text through fastokens (see the module docstring)."""

    def __init__(self, backend: Any, probe_texts: Sequence[str], verify_fraction: float = DEFAULT_VERIFY_FRACTION):
        encoder = load_encoder(backend, "fast", probe_texts)  # ConfigError / EngineMismatchError: not proven
        self.fast = encoder.fast  # type: ignore[attr-defined]
        self.backend = backend
        self.reason = encoder.reason
        self._threshold = min(int(verify_fraction * 2.0**64), 2**64 - 1)
        vocab = backend.get_vocab(with_added_tokens=True)
        added = {token.content for token in backend.get_added_tokens_decoder().values()}
        self._bytes = np.zeros(max(vocab.values(), default=0) + 1, dtype=np.int64)
        for token, index in vocab.items():
            self._bytes[index] = len(token.encode("utf-8")) if token in added else len(token)
        self.verified = 0
        self._token_bytes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def run_bytes(self, ids: np.ndarray, runs: list[tuple[int, int]]) -> list[bytes]:
        """The bytes the ``ByteLevel`` decoder makes of each run ``ids[begin:end]`` before reading them as UTF-8:
        each token string's characters mapped back to their bytes, or its UTF-8 where a character is outside the
        byte alphabet (what ``tokenizers`` does, added tokens included). The table is made on first use."""
        if self._token_bytes is None:
            alphabet = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
            chars = {chr(b): b for b in alphabet}
            chars.update({chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in alphabet)})
            table = [b""] * len(self._bytes)
            for token, index in self.backend.get_vocab(with_added_tokens=True).items():
                inside = all(c in chars for c in token)
                table[index] = bytes(chars[c] for c in token) if inside else token.encode("utf-8")
            lengths = np.fromiter(map(len, table), dtype=np.int64, count=len(table))
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            self._token_bytes = (np.frombuffer(b"".join(table), dtype=np.uint8), starts, lengths)
        flat, starts, lengths = self._token_bytes
        sizes = lengths[ids]
        ends = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(sizes, out=ends[1:])
        data = flat[np.arange(ends[-1]) + np.repeat(starts[ids] - ends[:-1], sizes)].tobytes()
        at = ends.tolist()
        return [data[at[begin] : at[end]] for begin, end in runs]

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        ids_bytes, _ = self.fast.encode_batch_flat([text])
        ids = np.frombuffer(ids_bytes, dtype=np.uint32).astype(np.int64)
        if self._threshold and xxhash.xxh64_intdigest(text.encode("utf-8", "surrogatepass")) < self._threshold:
            expected = self.backend.encode(text, add_special_tokens=False).ids
            if ids.tolist() != expected:
                raise EngineMismatchError(
                    f"the fast engine's ids differ from tokenizers' for a rendered conversation of {len(text)} "
                    "characters (found by the running sample check)",
                    field="engine",
                    hint="Report it with the record; run with the hf engine meanwhile",
                )
            self.verified += 1
        return ids, self.offsets(text, ids)

    def offsets(self, text: str, ids: np.ndarray) -> np.ndarray:
        """``(n, 2)`` character spans of the tokens ``ids`` of ``text``."""
        sizes = self._bytes[ids]
        ends = np.cumsum(sizes)
        starts = ends - sizes
        data = None if text.isascii() else np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        total = len(text) if data is None else len(data)
        if len(ids) and ends[-1] != total:
            raise EngineMismatchError(
                f"the tokens hold {int(ends[-1])} bytes, the text {total}: their offsets cannot be summed from their "
                "bytes",
                field="engine",
            )
        if data is None:
            return np.stack([starts, ends], axis=1)
        # char_of[k + 1]: the character of byte k (-1 before the first, the text's length after the last)
        char_of = np.empty(total + 2, dtype=np.int64)
        char_of[0], char_of[-1] = -1, len(text)
        np.cumsum((data & 0xC0) != 0x80, out=char_of[1:-1])
        char_of[1:-1] -= 1
        return np.stack([char_of[starts + 1], char_of[ends] + 1], axis=1)  # a token covers its bytes' characters
