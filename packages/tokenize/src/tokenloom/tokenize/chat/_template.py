"""A tokenizer with its chat template: render a conversation, encode the rendering with character offsets.

Tokens are exactly ``tokenizer(apply_chat_template(messages, tokenize=False), add_special_tokens=False)``,
which is what ``apply_chat_template(messages, tokenize=True)`` returns: what the model sees at inference.
Every Jinja failure becomes a :class:`ChatTemplateError` naming the record (file and line when known).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats.errors import ChatTemplateError, ConfigError

__all__ = ["NOWHERE", "ChatTokenizer", "RecordPlace"]


@dataclass(frozen=True, slots=True)
class RecordPlace:
    """Where a record came from: its file and line (or row), for error messages."""

    path: str | None = None
    line: int | None = None

    def where(self) -> dict[str, Any]:
        return {"path": self.path, "record": self.line}


#: A record whose origin is unknown.
NOWHERE = RecordPlace()


class ChatTokenizer:
    """A Hugging Face tokenizer plus the chat template used to render conversations.

    Args:
        tokenizer: a tokenizer directory (tokenizer.json + tokenizer_config.json, optionally with
            ``chat_template``), a name the Hugging Face cache holds, or a loaded transformers tokenizer.
        chat_template: a Jinja template file (or the template text) replacing the tokenizer's own.
    """

    def __init__(
        self, tokenizer: Any, *, chat_template: str | os.PathLike[str] | None = None, engine: str = "auto"
    ) -> None:
        if isinstance(tokenizer, (str, os.PathLike)):
            from tokenloom.tokenize._tokenizer import LoadedTokenizer

            tokenizer = LoadedTokenizer(os.fspath(tokenizer), hide_torch=True).transformers
        self.hf = tokenizer
        name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        template: Any
        if chat_template is not None:
            template = _read_template(chat_template)
            self.template_source = os.fspath(chat_template) if _is_file(chat_template) else "<text>"
        else:
            template = getattr(tokenizer, "chat_template", None)
            self.template_source = f"{name}/tokenizer_config.json"
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
        if not isinstance(template, str) or not template.strip():
            raise ConfigError(
                f"the tokenizer {name} has no chat template and none was given",
                field="chat_template",
                hint="Pass --chat-template FILE.jinja (chat_template= in Python), or use a tokenizer whose "
                "tokenizer_config.json holds a chat_template",
            )
        self.template: str = template
        self.layouts: dict[bytes, Any] = {}  # chat._layout's, by conversation shape
        self.special_ids = frozenset(int(i) for i in tokenizer.all_special_ids) | frozenset(
            int(i) for i, token in tokenizer.added_tokens_decoder.items() if getattr(token, "special", False)
        )
        self.vocab_size = len(tokenizer)
        self.is_special = np.zeros(max([self.vocab_size, *(i + 1 for i in self.special_ids)]), dtype=bool)
        self.is_special[list(self.special_ids)] = True
        # the Rust tokenizer transformers configured (what its fast path calls), None for a slow tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        self._fast: Any = None
        self._direct: Any = None
        self._probe_texts: list[str] = []  # the probe conversations' renderings, for the fast engine's proof
        self._direct = self._direct_renderer()
        self.engine = "hf"
        self.engine_reason = "asked for" if engine == "hf" else "a slow tokenizer"
        if engine != "hf" and self._backend is not None:
            self._fast_engine(engine)

    def _fast_engine(self, engine: str) -> None:
        """fastokens for the renderings when proven equal (chat/_fast.py); engine "fast": an error otherwise."""
        from tokenloom.tokenize.chat._fast import FastChatEncoding, byte_offsets_hold
        from tokenloom.tokenize.engine import EngineMismatchError

        why = byte_offsets_hold(self._backend)
        if why is None:
            try:
                self._fast = FastChatEncoding(self._backend, self._probe_texts)
            except (ConfigError, EngineMismatchError) as exc:
                why = exc.problem
        if self._fast is not None:
            self.engine, self.engine_reason = "fast", self._fast.reason
            return
        self.engine_reason = f"the fast engine is not used for chat: {why}"
        if engine == "fast":
            raise ConfigError(self.engine_reason, field="engine", hint="Use engine auto (falls back to hf) or hf")

    @staticmethod
    def _probe_conversations() -> list[tuple[list[dict[str, Any]], bool]]:
        """Probe conversations (each role, odd whitespace, unicode, a reasoning field), with and without the
        generation prompt."""
        contents = ["You are helpful.", "x  y\n\n z", " 数据 😀 café\t", "", "  lead", "trail  "]
        probes = []
        for roles in (("system", "user", "assistant"), ("user", "assistant", "tool", "assistant")):
            messages = [{"role": r, "content": contents[i % len(contents)]} for i, r in enumerate(roles)]
            probes += [(messages, False), (messages, True)]
        reasoning = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"}]
        return [*probes, (reasoning, False)]

    def _direct_renderer(self) -> Any:
        """``apply_chat_template``'s rendering without its per-call work: transformers' compiled template (its
        sandboxed environment, extensions and globals) given what apply_chat_template gives it (plain copies of the
        messages and tools, reasoning aliases, the special tokens). None where transformers lacks these or where
        the two render any probe conversation differently. Keeps the probe renderings in ``_probe_texts``."""
        direct: Any = None
        try:
            from transformers.utils import chat_template_utils as utils

            compiled = utils._compile_jinja_template(self.template)
            plain, alias = utils._plain_template_data, utils._alias_reasoning_fields
            specials = plain(dict(self.hf.special_tokens_map))

            def _render(messages: list[dict[str, Any]], tools: list[Any] | None, generation: bool) -> str:
                data = alias(plain(messages))
                return compiled.render(
                    messages=data, tools=plain(tools), documents=None, add_generation_prompt=generation, **specials
                )

            direct = _render
        except Exception:  # a template that does not compile fails on its first render, as before
            pass
        for messages, generation in self._probe_conversations():
            try:
                text = self.render(messages, add_generation_prompt=generation)
            except ChatTemplateError:
                continue
            self._probe_texts.append(text)
            try:
                direct = direct if direct is not None and direct(messages, None, generation) == text else None
            except Exception:
                direct = None
        return direct

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None = None,
        add_generation_prompt: bool = False,
        place: RecordPlace = NOWHERE,
        turn: int | None = None,
    ) -> str:
        """The template's rendering of ``messages`` (a ChatTemplateError carrying the record if it raises)."""
        try:
            if self._direct is not None and messages and all(isinstance(t, dict) for t in tools or ()):
                text = self._direct(messages, tools, add_generation_prompt)
            else:
                text = self.hf.apply_chat_template(
                    messages,
                    tools=tools,
                    chat_template=self.template,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                )
        except Exception as exc:  # whatever the template's expressions raise (1 // 0, str.encode('x')) is its error
            if isinstance(exc, ChatTemplateError):
                raise
            at = f" rendering the first {turn} messages" if turn is not None else ""
            raise ChatTemplateError(
                f"the chat template ({self.template_source}) raised {type(exc).__name__}: {exc}{at}",
                field="messages",
                **place.where(),
            ) from None
        if not isinstance(text, str):
            raise ChatTemplateError(
                f"the chat template rendered {type(text).__name__}, expected text", field="messages", **place.where()
            )
        return text

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int64) and their character spans ``(n, 2)`` in ``text``; no special tokens added."""
        if self._fast is not None:
            return self._fast.encode(text)
        if self._backend is not None:
            encoded = self._backend.encode(text, add_special_tokens=False)
            ids = np.asarray(encoded.ids, dtype=np.int64)
            return ids, np.asarray(encoded.offsets, dtype=np.int64).reshape(-1, 2)
        encoding = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(encoding["input_ids"], dtype=np.int64)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return ids, offsets

    def run_bytes(self, ids: np.ndarray, runs: list[tuple[int, int]]) -> list[bytes] | None:
        """Per run ``ids[begin:end]``, the bytes whose UTF-8 reading is its decode, where the decoder is proven to be
        just that (the fast engine's byte-level tokenizers: :mod:`._fast`); None elsewhere."""
        return None if self._fast is None else self._fast.run_bytes(ids, runs)

    def decode(self, ids: np.ndarray) -> str:
        if self._backend is not None:
            return self._backend.decode(np.asarray(ids).tolist(), skip_special_tokens=False)
        return self.hf.decode(np.asarray(ids).tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _is_file(value: str | os.PathLike[str]) -> bool:
    if isinstance(value, os.PathLike):
        return True
    return "\n" not in value and "{" not in value and len(value) < 4096 and Path(value).is_file()


def _read_template(value: str | os.PathLike[str]) -> str:
    if not _is_file(value):
        if isinstance(value, str) and ("{%" in value or "{{" in value):
            return value
        raise ConfigError(f"chat template {os.fspath(value)!r} is not a file", field="chat_template")
    path = Path(value)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the chat template ({exc})", path=path, field="chat_template") from None
