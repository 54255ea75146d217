"""The one error hierarchy every tokenloom package raises.

Every error is a :class:`DataError` (itself a :class:`ValueError`), so callers can
catch one type. Each carries the *where* (``path``, ``offset``, ``record``,
``field``) as attributes and renders a message of the shape::

    <what was found>, expected <what was expected> [in FILE at offset N, record R, field F]. <what to do>

Raise the most specific subclass; never ``assert`` on input.
"""

from __future__ import annotations

import os

__all__ = [
    "ChatTemplateError",
    "ChecksumError",
    "ConversationError",
    "ConfigError",
    "DataError",
    "FormatError",
    "IndexCorruptError",
    "MaskError",
    "MissingFileError",
    "MissingKeyError",
    "OutputLockedError",
    "RecordError",
    "ResourceLimitError",
    "ResumeMismatchError",
    "ShapeMismatchError",
    "StorageError",
    "TemplatePrefixError",
    "TokenRangeError",
    "TruncatedError",
    "UnsafeFormatError",
    "UnsafePathError",
]


class DataError(ValueError):
    """Base of every tokenloom error about data, files or configuration.

    Args:
        problem: what was found (and, where useful, what was expected).
        path: the file or directory concerned.
        offset: the byte offset in ``path``.
        record: the entry, line or sample number.
        field: the header field, key or option name.
        hint: what the user should do next.
    """

    default_hint = ""

    def __init__(
        self,
        problem: str,
        *,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        record: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.problem = problem
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset
        self.record = record
        self.field = field
        self.hint = hint if hint is not None else self.default_hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(f"file {self.path}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        message = self.problem
        if where:
            message += f" [{', '.join(where)}]"
        if self.hint:
            message += f". {self.hint}"
        return message

    def __reduce__(self):  # keep the attributes when crossing a process boundary
        return (
            _rebuild,
            (type(self), self.problem, self.path, self.offset, self.record, self.field, self.hint),
        )


def _rebuild(cls, problem, path, offset, record, field, hint):
    return cls(problem, path=path, offset=offset, record=record, field=field, hint=hint)


class FormatError(DataError):
    """The bytes are not the format they claim to be, or no reader recognises them."""

    default_hint = "Check the path and --format (`tokenloom convert --help` lists the formats)"


class TruncatedError(DataError):
    """A file ends before the data its header or index announces."""

    default_hint = "The file was cut short (an interrupted copy or write?); re-copy or re-create it"


class IndexCorruptError(DataError):
    """An index (offsets, sizes, document index) is inconsistent with itself or its data."""

    default_hint = "Re-create the index (for tokenloom data: rerun `tokenloom tokenize`)"


class ChecksumError(DataError):
    """A file's content or size differs from what the manifest recorded."""

    default_hint = "The file changed after it was written; restore it or re-create the dataset"


class TokenRangeError(DataError):
    """A token id is outside [0, vocab_size)."""

    default_hint = "The data and the tokenizer/vocab size do not match; check --vocab-size or re-tokenize"


class UnsafeFormatError(DataError):
    """Content that would run code or do something unsafe if read naively (e.g. pickles)."""

    default_hint = "tokenloom refuses to execute file contents; re-create the file with a safe writer"


class UnsafePathError(DataError):
    """A path that escapes the dataset root, or is a FIFO, device or other special file."""

    default_hint = "Point tokenloom at regular files inside the dataset directory"


class MissingFileError(DataError):
    """A file the layout needs is absent (e.g. an .idx without its .bin)."""

    default_hint = "Restore the missing file or re-create the dataset"


class MissingKeyError(DataError):
    """A key, group or field is absent from a keyed store or record."""

    default_hint = "Check the key names for this training type"


class ShapeMismatchError(DataError):
    """Arrays that must line up (e.g. chosen vs chosen_mask) have different shapes."""

    default_hint = "Re-create the store so that every key has the same segment lengths"


class ResourceLimitError(DataError):
    """A length field asks for more than the configured cap."""

    default_hint = "If the file is genuine, raise the limit explicitly"


class RecordError(DataError):
    """One input record (a jsonl line, a document) is malformed."""

    default_hint = "Fix the record, or pass --on-error skip to count and skip such records"


class ConversationError(RecordError):
    """A post-training record's fields are malformed (messages, roles, chosen/rejected, responses, rewards)."""

    default_hint = (
        "Fix the record (sft: messages [{role, content}, ...] or prompt/completion; dpo: prompt, chosen, "
        "rejected; grpo: prompt, responses, rewards), or pass --on-error skip to count and skip such records"
    )


class ChatTemplateError(RecordError):
    """A chat template raised on a record, or its turns cannot be found in its rendering."""

    default_hint = "Fix the template (--chat-template FILE), or pass --on-error skip to count and skip such records"


class TemplatePrefixError(ChatTemplateError):
    """A chat template renders a turn differently depending on what follows it, where the mask depends on it.

    (A template that drops earlier turns' reasoning, say: the trained text would not be the message.)
    """

    default_hint = (
        "Use a template that renders every turn the same whatever follows, or train only the turns it keeps "
        "(split the conversation), or pass --on-error skip to count and skip such records"
    )


class MaskError(RecordError):
    """A loss mask cannot be derived or verified: a token straddles a trained/masked boundary, no token
    or every token is trained, or the trained tokens do not decode to the trained text."""

    default_hint = (
        "Check the chat template and the tokenizer together (`tokenloom inspect OUT --records 3`), "
        "or pass --on-error skip to count and skip such records"
    )


class ConfigError(DataError):
    """An option or configuration value is invalid."""

    default_hint = "See --help for the valid values"


class ResumeMismatchError(DataError):
    """A saved state belongs to a different dataset, sampler or configuration."""

    default_hint = "Load the state into the object it was saved from, or start afresh"


class StorageError(DataError):
    """The operating system refused a read or write (disk full, read-only, permission, I/O error).

    ``errno`` holds the OS error number (``errno.ENOSPC``, ...), ``path`` the file concerned.
    Build one with :func:`tokenloom.formats.io.storage_error` so the hint matches the errno.
    """

    default_hint = "Check the path, its permissions and the free space of its file system"

    def __init__(self, problem: str, *, errno: int | None = None, **where) -> None:
        self.errno = errno
        super().__init__(problem, **where)

    def __reduce__(self):  # pyright: ignore[reportIncompatibleMethodOverride] - carries errno too
        return (
            _rebuild_storage,
            (self.problem, self.errno, self.path, self.offset, self.record, self.field, self.hint),
        )


def _rebuild_storage(problem, errno, path, offset, record, field, hint):
    return StorageError(problem, errno=errno, path=path, offset=offset, record=record, field=field, hint=hint)


class OutputLockedError(DataError):
    """Another process holds the writer lock of this output (tokenize or convert is already writing it)."""

    default_hint = (
        "Wait for the other run to finish, or write elsewhere; if it is gone (a crash on another host), "
        "delete the lock file named here"
    )
