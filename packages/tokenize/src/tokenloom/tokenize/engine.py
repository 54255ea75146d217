"""Encoding engines: Hugging Face ``tokenizers`` (hf) or fastokens (fast), proven identical before use.

    load_encoder(tokenizer, engine="auto", probe_texts=sample_of_the_input)
        hf    tokenizers' ``encode_batch_fast`` (a slow tokenizer: its transformers ``__call__``), as always
        fast  fastokens' ``encode_batch_flat`` over the same serialized tokenizer; used only if fastokens
              loads it AND both engines give the same ids for every probe text (PROBE_TEXTS, the
              tokenizer's added tokens inside text, and ``probe_texts``)
        auto  fast when that holds, else hf; ``encoder.reason`` says why
    encoder.encode_flat(texts) -> (ids: uint32[total], offsets: int64[len(texts) + 1])
        fast: every text whose content key (:func:`_content_keys`) falls in the ``verify_fraction`` (default
        1/1000), and every text holding an added token's text (where the engines are known to part), is re-encoded
        with hf and compared (once: a text this encoder re-checked already is not encoded again); any
        difference raises EngineMismatchError

Every place in tokenloom that turns text into ids (tokenize's workers, datasets'
HuggingFaceDataset cache, hf-streaming, eval-broadcast) calls :func:`load_encoder`,
so the same text gives the same ids everywhere. Both engines encode with
``add_special_tokens=False``; special tokens written in the text are matched as
tokens (as transformers does by default); truncation and padding stored in a
``tokenizer.json`` are switched off (as transformers' ``__call__`` does when not asked
for them), so a document is never cut.

Example::

    from tokenloom.tokenize.engine import load_encoder

    encoder = load_encoder("my-tokenizer-dir", engine="auto", probe_texts=texts[:200])
    print(encoder.name, encoder.reason)          # fast, fastokens 0.3.5 loads ... and matched hf on ...
    ids, offsets = encoder.encode_flat(texts)    # document i: ids[offsets[i]:offsets[i + 1]]
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import os
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from tokenloom.formats import ConfigError, DataError
from tokenloom.tokenize._tokenizer import batch_ids
from tokenloom.tokenize.windowing import member

__all__ = [
    "DEFAULT_VERIFY_FRACTION",
    "PROBE_TEXTS",
    "Encoder",
    "Engine",
    "EngineMismatchError",
    "announce_engine",
    "load_encoder",
    "probe_set",
]

#: Fraction of documents re-encoded with hf during a fast run (deterministic, by content hash).
DEFAULT_VERIFY_FRACTION = 0.001
#: The reason recorded when hf was asked for.
HF_REQUESTED = "engine hf requested"
#: Why a slow tokenizer always runs on hf.
SLOW_TOKENIZER = "a slow (Python) tokenizer has no Rust backend for fastokens to load"
#: Added tokens whose in-text forms join the probe set (all of them for common tokenizers).
MAX_ADDED_TOKEN_PROBES = 512
#: Above this many added tokens, auto uses hf without trying fastokens: loading and probing the fast
#: engine grows faster than linearly with them (measured: 40k 1.5 s, 160k 5 s, 1M 186 s, 3M over 29 min
#: and 2.3 GB, where hf takes 10 s for 1M). engine="fast" still tries it.
MAX_FAST_ADDED_TOKENS = 100_000

FlatIds = tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]


class Engine(StrEnum):
    """Which engine encodes text."""

    AUTO = "auto"
    """fast when fastokens loads the tokenizer and passes the identity probe, else hf."""
    HF = "hf"
    """Hugging Face ``tokenizers`` (the reference)."""
    FAST = "fast"
    """fastokens; an error if it cannot load the tokenizer or differs from hf on a probe."""


class EngineMismatchError(DataError):
    """The fast engine gave other ids than the hf engine for some text."""

    default_hint = (
        "The fast engine cannot be trusted with this tokenizer; rerun with --engine hf (engine='hf'), "
        "which resumes where this run stopped"
    )


# Unicode and layout edge cases where BPE front-ends (normalizers, pre-tokenizer regexes,
# byte fallback, added-token matching) are most likely to disagree.
PROBE_TEXTS: tuple[str, ...] = (
    "",
    " ",
    "a",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "I'm sure they've said we'll go; don't you think it's John's?  THEY'RE LOUD",
    # combining marks, precomposed vs decomposed
    "e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u0352\u0353\u0354 \u00e9 vs e\u0301 \u0130stanbul \u1e9e",
    "Zalgo: H\u0335\u0321\u0322e\u0336\u0327\u031b \u0338c\u0337o\u0334m\u0335e\u0338s",
    # emoji, skin tones, ZWJ sequences, flags, variation selectors
    "\U0001f642 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 "
    "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5 \u2764\ufe0f \u263a\ufe0e",
    "\U0001f600" * 300,
    # CJK, no spaces
    "\u6f22\u5b57\u304b\u306a\u30ab\u30ca\ud55c\uad6d\uc5b4 \u4e2d"
    "\u6587\uff0c\u6807\u70b9\u3002\u300c\u5f15\u7528\u300d",
    "\u4eba\u5de5\u77e5\u80fd\u306f\u8a00\u8a9e\u30e2\u30c7\u30eb\u3092\u4f7f\u3046" * 40,
    # right-to-left and mixed direction
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u0645\u0631"
    "\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "abc \u05e9\u05dc\u05d5\u05dd 123 \u0645\u0631\u062d\u0628\u0627 def \u202b\u202e reversed \u202c",
    # other scripts
    "\u03b1\u03b2\u03b3 \u041f\u0440\u0438\u0432\u0435\u0442 \u0928\u092e"
    "\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 "
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u1200\u1208\u1218",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 \U00020000\U0002a6d6 \U0001f100",
    # compatibility forms (NFKC changes them)
    "\uff21\uff22\uff23\uff11\uff12\uff13 \ufb01 \ufb02 \ufb00 "
    "\u2460 x\u00b2 \u00bd \u2126 \u212b \u3000full\u3000width",
    # control and invisible characters
    "\x00\x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f\x85 end",
    "a\u2028b\u2029c \u200b\u200c\u200d\u2060\ufeff d \ufffd \ue000 \uffff \u00ad soft",
    # very long words and runs
    "a" * 10_000,
    "ab" * 3_000,
    "supercalifragilisticexpialidocious" * 100,
    "1234567890" * 200,
    "=" * 500 + "\n" + "-" * 500,
    # whitespace runs
    " " * 200,
    "\t" * 50,
    "\n" * 50,
    "\r\n" * 20,
    " \t \n \r\n  x  \n\n\n  y\t\t z   ",
    "   leading spaces",
    "trailing spaces   ",
    "\u00a0non\u00a0breaking\u2009thin\u3000ideographic",
    # code, numbers, punctuation
    "def f(x):\n    return x ** 2  # ok\n\n\tif x <= y and y >= z or not w: pass\n",
    "x<y && y>=z || !w; a->b; c::d; e...f; https://example.com/a?b=c&d=e#f",
    "3.14159 -42 +7 1e10 0x1F 1,234,567.89 2024-01-31T12:00:00Z 99%",
    "\"quoted\" 'single' `tick` \u201ccurly\u201d \u2018curly\u2019 \u00abguillemets\u00bb \u2014 \u2013 \u2026",
    "\u2211\u222b\u221a\u221e \u2264\u2265\u2260 \u2190\u2192 \u00b0C \u20ac\u00a3\u00a5 \u00a9\u00ae\u2122",
    "MiXeD CaSe WORDS and lowercase and UPPERCASE \u00c9COLE \u00dcBER stra\u00dfe",
)


def probe_set(added_tokens: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """PROBE_TEXTS, every added token inside text in the ways matching can go wrong, then ``extra``."""
    texts = list(PROBE_TEXTS)
    for token in list(added_tokens)[:MAX_ADDED_TOKEN_PROBES]:
        texts += [token, f"x{token}y", f"text {token} more text", f" {token}  and", f"{token}{token}\n{token}"]
    texts += [t for t in extra if isinstance(t, str)]
    return texts


def _flatten(lists: list[list[int]]) -> FlatIds:
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter((i for ids in lists for i in ids), dtype=np.uint32, count=int(offsets[-1]))
    return ids, offsets


class Encoder:
    """Encodes batches of texts into one flat uint32 id array plus offsets.

    Built by :func:`load_encoder`; ``name`` is ``"hf"`` or ``"fast"`` and ``reason``
    says why this engine was chosen.
    """

    name: str = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def encode_flat(self, texts: Sequence[str]) -> FlatIds:
        """(ids, offsets): text i is ``ids[offsets[i]:offsets[i + 1]]``; offsets has len(texts) + 1 entries."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        ids, offsets = self.encode_flat(texts)
        return [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(texts))]

    def record(self) -> dict[str, Any]:
        """What to write into a dataset's record: the engine, why, and the library versions."""
        return {"name": self.name, "reason": self.reason, **_versions(self.name)}


class HfEncoder(Encoder):
    """The reference: Hugging Face ``tokenizers`` (or a slow transformers tokenizer's ``__call__``)."""

    name = "hf"

    def __init__(self, encode_lists: Callable[[list[str]], list[list[int]]], reason: str) -> None:
        super().__init__(reason)
        self.encode_lists = encode_lists

    def encode_flat(self, texts: Sequence[str]) -> FlatIds:
        return _flatten(self.encode_lists(list(texts)))


class FastEncoder(Encoder):
    """fastokens' bulk API, with a deterministic sample of texts re-checked against hf."""

    name = "fast"

    def __init__(
        self,
        fast: Any,
        reference: HfEncoder,
        reason: str,
        verify_fraction: float,
        added_tokens: Sequence[str] = (),
    ) -> None:
        super().__init__(reason)
        self.fast = fast
        self.reference = reference
        self.verify_fraction = verify_fraction
        self._threshold = min(int(verify_fraction * 2.0**64), 2**64)
        # added-token matching is where the engines are known to part (lstrip/rstrip/adjacent
        # added tokens): with any checking on, every text that contains one is re-checked
        tokens = sorted({t for t in added_tokens if t}, key=len, reverse=True)
        self._added_tokens = tuple(tokens) if len(tokens) <= 4 else ()
        self._added_pattern = re.compile("|".join(map(re.escape, tokens))) if len(tokens) > 4 else None
        self.verified_documents = 0
        self._verified: set[bytes] = set()
        """128-bit digests of the whole texts already re-checked (and equal): the same text is not encoded twice."""

    def encode_flat(self, texts: Sequence[str]) -> FlatIds:
        batch = texts if isinstance(texts, list) else list(texts)
        try:
            ids_bytes, offset_bytes = self.fast.encode_batch_flat(batch)
        except Exception as exc:  # e.g. a regex match limit: hf is the reference, never guess
            raise EngineMismatchError(
                f"the fast engine failed on a batch of {len(batch)} texts that hf encodes ({type(exc).__name__}: {exc})"
            ) from exc
        ids = np.frombuffer(ids_bytes, dtype=np.uint32)
        offsets = np.frombuffer(offset_bytes, dtype=np.uint64).astype(np.int64)
        if self._threshold:
            self.verify(batch, ids, offsets)
        return ids, offsets

    def selected(self, texts: Sequence[str]) -> list[int]:
        """Indices of the texts this encoder re-checks: those whose content key (:func:`_content_keys`) is below
        the threshold, and (with any checking on) those that contain an added token's text."""
        if not self._threshold:
            return []
        positions = range(len(texts))  # the loops below run in C (map), not a Python frame per text
        chosen = set(itertools.compress(positions, map(self._threshold.__gt__, _content_keys(texts))))
        # one search over the batch's texts joined (no per-text call) rules out the common case: no added token
        joined = "\n".join(texts) if self._added_tokens or self._added_pattern is not None else ""
        for token in self._added_tokens:
            if token in joined:
                chosen.update(itertools.compress(positions, map(str.__contains__, texts, itertools.repeat(token))))
        if self._added_pattern is not None and self._added_pattern.search(joined) is not None:
            search = self._added_pattern.search
            chosen.update(i for i, text in enumerate(texts) if search(text) is not None)
        return sorted(chosen)

    def verify(self, texts: Sequence[str], ids: npt.NDArray[np.uint32], offsets: npt.NDArray[np.int64]) -> None:
        """Re-encode the selected texts with hf; EngineMismatchError (record = batch index) on a difference."""
        chosen = self.selected(texts)
        if not chosen:
            return
        digests = [_whole_digest(texts[i]) for i in chosen]  # a few per thousand texts: hashed whole
        fresh = [k for k, digest in enumerate(digests) if digest not in self._verified]
        chosen = [chosen[k] for k in fresh]
        if chosen:
            expected = self.reference.encode_lists([texts[i] for i in chosen])
            _compare(texts, ids, offsets, chosen, expected, "during the run")
            self.verified_documents += len(chosen)
            if len(self._verified) < MAX_VERIFIED_DIGESTS:
                self._verified.update(digests[k] for k in fresh)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "verify_fraction": self.verify_fraction}


#: A text longer than this is keyed by its length and its first and last SAMPLE_KEY_CHARS // 2 characters:
#: the key of every whole text held the GIL for a tenth of a threaded run (most bytes are in long texts).
SAMPLE_KEY_CHARS = 1024
#: Texts a fast encoder remembers as re-checked (16 bytes each): a text seen again (a duplicate, a boilerplate
#: header file, the next epoch) is not re-encoded with hf; past this many, new ones are checked but not remembered.
MAX_VERIFIED_DIGESTS = 1 << 16


def _content_keys(texts: Sequence[str]) -> list[int]:
    """The 64-bit key of each text that decides whether it is re-checked: a hash of its content, whatever its
    position, all keys in one ``map`` (no Python frame per text).

    A text of up to SAMPLE_KEY_CHARS characters is hashed whole; a longer one by its first and last
    SAMPLE_KEY_CHARS // 2 characters with its length as the seed (texts that share a header, as source
    files share a license, are still chosen apart).
    """
    clipped = list(texts)
    sizes = list(map(len, clipped))
    seeds = [0] * len(clipped)
    half = SAMPLE_KEY_CHARS // 2
    for i in itertools.compress(range(len(sizes)), map(SAMPLE_KEY_CHARS.__lt__, sizes)):
        text = clipped[i]
        clipped[i], seeds[i] = text[:half] + text[-half:], sizes[i]
    encoded = map(operator.methodcaller("encode", "utf-8", "surrogatepass"), clipped)
    return list(map(xxhash.xxh3_64_intdigest, encoded, seeds))


def _whole_digest(text: str) -> bytes:
    """A text's 128-bit digest (all of it): what :attr:`FastEncoder._verified` remembers."""
    return xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass"))


def _versions(name: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("tokenizers", "fastokens") if name == "fast" else ("tokenizers",):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    return found


def _compare(
    texts: Sequence[str],
    ids: npt.NDArray[np.uint32],
    offsets: npt.NDArray[np.int64],
    chosen: Sequence[int],
    expected: list[list[int]],
    when: str,
) -> None:
    """EngineMismatchError (record = the text's index) at the first chosen text whose ids differ."""
    for index, want in zip(chosen, expected, strict=True):
        got = ids[offsets[index] : offsets[index + 1]].tolist()
        if got == want:
            continue
        text = texts[index]
        position = next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
        )
        raise EngineMismatchError(
            f"the fast engine and hf encode document {index} differently {when}, first at token {position}: "
            f"fast {got[position : position + 8]} vs hf {want[position : position + 8]} "
            f"({len(got)} vs {len(want)} tokens; text {text[:80]!r}{'...' if len(text) > 80 else ''})",
            record=index,
        )


# -- resolving what the caller passed -------------------------------------------------------


def _plain_backend(backend: Any) -> Any:
    """``backend``, or a copy with truncation and padding off (never cut or pad a document)."""
    from tokenizers import Tokenizer

    if backend.truncation is None and backend.padding is None:
        return backend
    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def _resolve(tokenizer: Any) -> tuple[Any | None, Callable[[list[str]], list[list[int]]]]:
    """(a ``tokenizers.Tokenizer`` or None for a slow tokenizer, the hf list encoder)."""
    if isinstance(tokenizer, str | os.PathLike):
        from tokenloom.tokenize._tokenizer import LoadedTokenizer, describe_plain

        plain = describe_plain(os.fspath(tokenizer))
        if plain is not None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(plain[1])
        else:
            loaded = LoadedTokenizer(os.fspath(tokenizer))
            tokenizer = loaded.backend if loaded.backend is not None else loaded.transformers
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if type(tokenizer).__module__.startswith("tokenizers") and hasattr(tokenizer, "encode_batch"):
        backend = tokenizer  # a tokenizers.Tokenizer itself
    if backend is not None:
        backend = _plain_backend(backend)
        return backend, batch_ids(backend)
    if callable(tokenizer):  # a slow transformers tokenizer
        slow: Any = tokenizer
        return None, lambda texts: slow(texts, add_special_tokens=False)["input_ids"]
    raise ConfigError(
        f"cannot encode with a {type(tokenizer).__name__}",
        field="tokenizer",
        hint="Pass a tokenizer directory, a tokenizers.Tokenizer or a transformers tokenizer",
    )


def _added_tokens(backend: Any) -> list[str]:
    decoder = backend.get_added_tokens_decoder()
    return [decoder[index].content for index in sorted(decoder)]


def build_fast(serialized: str) -> Any:
    """fastokens over a serialized tokenizer, truncation and padding off (ValueError/ImportError: why it cannot).

    It releases the GIL while it builds (a few tenths of a second for a 16k vocabulary), so a caller
    may run it on a thread and pass the result to :func:`load_encoder` (``fast_engine``).
    """
    import fastokens

    fast = fastokens.Tokenizer.from_json_str(serialized)
    fast.no_truncation()
    fast.no_padding()
    return fast


def _load_fast(backend: Any) -> Any:
    return build_fast(backend.to_str())


def load_encoder(
    tokenizer: Any,
    engine: Engine | str = Engine.AUTO,
    probe_texts: Sequence[str] = (),
    *,
    verify_fraction: float = DEFAULT_VERIFY_FRACTION,
    fast_engine: Callable[[], Any] | None = None,
) -> Encoder:
    """The encoder for ``tokenizer`` with the requested engine; see the module docstring.

    Args:
        tokenizer: a tokenizer directory (or locally cached name), a ``tokenizers.Tokenizer`` or a
            transformers tokenizer.
        engine: auto, hf or fast.
        probe_texts: texts of the actual input, compared on top of the fixed probe set.
        verify_fraction: fraction of texts the fast encoder re-checks against hf while it runs (0: none).
        fast_engine: returns the fastokens tokenizer :func:`build_fast` made of this tokenizer's serialized
            backend (started earlier on a thread); its errors count as fastokens failing to load it.

    Raises:
        ConfigError: engine="fast" and fastokens cannot load the tokenizer (the message names the
            unsupported component), or is not installed, or the tokenizer is a slow one.
        EngineMismatchError: engine="fast" and a probe text encodes differently.
    """
    engine = member(Engine, engine, "engine")
    if not 0.0 <= verify_fraction <= 1.0:
        raise ConfigError(f"verify_fraction is {verify_fraction}, expected 0 <= it <= 1", field="verify_fraction")
    backend, encode_lists = _resolve(tokenizer)
    if engine is Engine.HF:
        return HfEncoder(encode_lists, HF_REQUESTED)
    if backend is None:
        return refuse_fast(engine, SLOW_TOKENIZER, encode_lists)
    added = len(backend.get_added_tokens_decoder())
    if engine is Engine.AUTO and added > MAX_FAST_ADDED_TOKENS:
        return HfEncoder(
            encode_lists,
            f"the tokenizer has {added:,} added tokens, over {MAX_FAST_ADDED_TOKENS:,}: the fast engine's start-up "
            "grows faster than linearly with them (minutes from about 1M); pass --engine fast (engine='fast') "
            "to use it anyway",
        )
    try:
        fast = _load_fast(backend) if fast_engine is None else fast_engine()
    except ImportError as exc:
        return refuse_fast(engine, f"fastokens is not installed ({exc})", encode_lists)
    except Exception as exc:  # fastokens reports the unsupported component in a ValueError
        return refuse_fast(engine, f"fastokens cannot load the tokenizer: {exc}", encode_lists)
    reference = HfEncoder(encode_lists, "reference")
    probes = probe_set(_added_tokens(backend), probe_texts)
    first_input = len(probes) - len([t for t in probe_texts if isinstance(t, str)])
    try:
        _probe(fast, reference, probes, first_input)
    except EngineMismatchError as exc:
        if engine is Engine.FAST:
            raise
        return HfEncoder(encode_lists, f"fastokens differs from hf before the run: {exc.problem}")
    reason = (
        f"fastokens loads the tokenizer and matched hf on all {len(probes)} probe texts "
        f"({len(probes) - first_input} from the input)"
    )
    return FastEncoder(fast, reference, reason, verify_fraction, _added_tokens(backend))


_ANNOUNCED: set[tuple[str, str, str]] = set()


def announce_engine(logger: logging.Logger, name: str, reason: str, *, tokenizer: str = "") -> bool:
    """Log the engine choice at INFO the first time per (logger, tokenizer, engine) in this process, then at DEBUG.

    Why: a process that tokenizes many datasets with one tokenizer (the demo's curriculum
    buckets, a sweep) would otherwise print the same line for each. Returns True when logged at INFO.
    """
    key = (logger.name, tokenizer, name)
    first = key not in _ANNOUNCED
    _ANNOUNCED.add(key)
    logger.log(logging.INFO if first else logging.DEBUG, "encoding engine: %s (%s)", name, reason)
    return first


def _probe(fast: Any, reference: HfEncoder, probes: list[str], first_input: int) -> None:
    """EngineMismatchError naming the first probe text the engines encode differently."""
    try:
        ids_bytes, offset_bytes = fast.encode_batch_flat(probes)
    except Exception as exc:
        raise EngineMismatchError(
            f"the fast engine fails on the probe set ({type(exc).__name__}: {exc})", field="engine"
        ) from exc
    ids = np.frombuffer(ids_bytes, dtype=np.uint32)
    offsets = np.frombuffer(offset_bytes, dtype=np.uint64).astype(np.int64)
    try:
        _compare(probes, ids, offsets, range(len(probes)), reference.encode_lists(probes), "before the run")
    except EngineMismatchError as exc:
        index = exc.record if exc.record is not None else 0
        where = f"input sample text {index - first_input}" if index >= first_input else f"probe text {index}"
        raise EngineMismatchError(f"{exc.problem} ({where})", field="engine") from None


def refuse_fast(
    engine: Engine, reason: str, encode_lists: Callable[[list[str]], list[list[int]]] | None = None
) -> Encoder:
    """engine fast: ConfigError with ``reason``; auto: the hf encoder, with ``reason``."""
    if engine is Engine.FAST:
        raise ConfigError(
            f"engine fast is unavailable: {reason}",
            field="engine",
            hint="Use --engine auto (falls back to hf) or --engine hf",
        )
    return HfEncoder(encode_lists or _unavailable, reason)


def _unavailable(texts: list[str]) -> list[list[int]]:
    raise RuntimeError("this encoder only records a choice; encode with the one built in the worker")
