"""The demo's post-training leg: stdlib conversations -> an sft store with verified masks -> packed SFT, resumed.

corpus (module.name -> docstring) -> conversations: a user asks what `module.name` does, the assistant answers
    with its docstring (one to three turns from one module; some with a system prompt, some as prompt/completion)
    -> ``tokenloom tokenize --train-type sft --chat-template <shipped>`` (2 workers)
    -> the mask oracle: each record's trained tokens decode to its answers, each with its end marker, nothing else
    -> ``tokenloom inspect OUT --records 3`` -> PackedSFTDataset (best-fit decreasing into SEQ_LEN bins)
    -> 2 ranks x 2 workers -> checkpoint -> 3 ranks x 2 workers -> the record oracle: the store records consumed
    are those of an uninterrupted run, each exactly once, each with the tokens and labels the store gives it.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
from tokenizers import Tokenizer

from tokenloom.datasets import PackedSFTDataset, SampleBatch
from tokenloom.demo._curriculum import run_command, run_rank
from tokenloom.formats import ResumeMismatchError, open_records
from tokenloom.formats.io import atomic_write_bytes
from tokenloom.tokenize import default_tokenizer_path
from tokenloom.tokenize.chat import SIDECAR_NAME, default_chat_template

__all__ = ["PostTrainReport", "build_conversations", "run_posttrain"]

SEQ_LEN = 1024  # packed sequence length, and tokenize's --seq-len: every written record fits a bin
BATCH = 4  # per rank
END_MARKER = "<|endoftext|>"  # what the shipped template emits after every turn (trained after an answer)
SYSTEM = "You explain the Python standard library, answering from its docstrings."


@dataclass
class PostTrainReport:
    conversations: int = 0
    multi_turn: int = 0
    with_system: int = 0
    prompt_completion: int = 0
    command: str = ""
    tokenize_exit: int | None = None
    tokenize_seconds: float = 0.0
    records: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    skipped_too_long: int = 0
    masks_checked: int = 0
    mask_errors: list[str] = field(default_factory=list)
    inspect_text: Path | None = None
    inspect_exit: int | None = None
    seq_len: int = SEQ_LEN
    packed: int = 0
    packing_efficiency: float = 0.0
    steps_before: int = 0
    steps_after: int = 0
    checkpoint: int = 0
    consumed: int = 0
    duplicates: int = 0
    missing: int = 0
    wrong_content: int = 0
    same_as_uninterrupted: bool = False
    exactly_once: bool = False

    @property
    def masks_ok(self) -> bool:
        return self.masks_checked > 0 and self.masks_checked == self.records and not self.mask_errors

    def failures(self) -> list[str]:
        if self.tokenize_exit != 0:
            return [f"post-training: {self.command} exited {self.tokenize_exit} (see {self.inspect_text})"]
        failed = []
        if not self.masks_ok:
            failed.append(
                f"post-training masks: {self.masks_checked} of {self.records} records checked; "
                + ("; ".join(self.mask_errors[:3]) or "none failed")
            )
        if self.inspect_exit != 0:
            failed.append(f"post-training: tokenloom inspect --records exited {self.inspect_exit}")
        if not self.exactly_once or not self.same_as_uninterrupted:
            failed.append(
                f"post-training resume: {self.duplicates} records duplicated, {self.missing} missing, "
                f"{self.wrong_content} with other tokens or labels than the store's, "
                f"{'the same' if self.same_as_uninterrupted else 'not the same'} records as an uninterrupted run"
            )
        return failed


# -- conversations from the corpus ----------------------------------------------------------
def _question(name: str) -> str:
    return f"What does `{name}` do?"


def build_conversations(corpus: Path) -> list[dict[str, Any]]:
    """Deterministic conversations from the corpus's docstrings, in corpus order.

    Consecutive docstrings of one top-level module make conversation n: 1 + n % 3 question/answer turns (fewer at
    a module's end), a system prompt first when n % 4 == 1, and a prompt/completion record instead of messages
    when n % 7 == 0 and it has one turn.
    """
    rows = [orjson.loads(line) for line in corpus.read_bytes().splitlines() if line]
    conversations: list[dict[str, Any]] = []
    turn_counts = (1, 2, 3)
    number = 0
    for _module, group in itertools.groupby(rows, key=lambda row: row["id"].split(".")[0]):
        docs = list(group)
        start = 0
        while start < len(docs):
            take = docs[start : start + turn_counts[number % 3]]
            start += len(take)
            if len(take) == 1 and number % 7 == 0:
                conversations.append({"prompt": _question(take[0]["id"]), "completion": take[0]["text"]})
            else:
                messages = [{"role": "system", "content": SYSTEM}] if number % 4 == 1 else []
                for doc in take:
                    messages.append({"role": "user", "content": _question(doc["id"])})
                    messages.append({"role": "assistant", "content": doc["text"]})
                conversations.append({"messages": messages})
            number += 1
    return conversations


def _turns(conversation: dict[str, Any]) -> tuple[str, list[str]]:
    """(the first question, the answers) of a conversation in either input form."""
    if "prompt" in conversation:
        return conversation["prompt"], [conversation["completion"]]
    messages = conversation["messages"]
    first = next(m["content"] for m in messages if m["role"] == "user")
    return first, [m["content"] for m in messages if m["role"] == "assistant"]


def check_masks(store_path: Path, conversations: Sequence[dict[str, Any]], report: PostTrainReport) -> None:
    """Every record's trained tokens decode to its conversation's answers, each closed by the end marker.

    Records are matched to conversations in order by their first question (a record skipped as too long leaves
    its conversation unmatched; the count must equal the one tokenize reports).
    """
    decoder = Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    store = open_records(store_path)
    report.masks_checked = 0
    source = 0
    for record in range(len(store)):
        arrays = store.record(record, ("sequence", "loss_mask"))
        sequence, mask = np.asarray(arrays["sequence"]), np.asarray(arrays["loss_mask"]).astype(bool)
        text = decoder.decode(sequence.tolist(), skip_special_tokens=False)
        while source < len(conversations) and _turns(conversations[source])[0] not in text:
            source += 1
        if source == len(conversations):
            report.mask_errors.append(f"record {record}: no conversation left whose question it holds")
            return
        _, answers = _turns(conversations[source])
        expected = "".join(answer.strip() + END_MARKER for answer in answers)
        trained = decoder.decode(sequence[mask].tolist(), skip_special_tokens=False)
        if trained != expected:
            report.mask_errors.append(f"record {record}: trained text {trained[:80]!r}, expected {expected[:80]!r}")
        elif mask.all():
            report.mask_errors.append(f"record {record}: every token trained")
        else:
            report.masks_checked += 1
        source += 1
    unmatched = len(conversations) - len(store)
    if unmatched != report.skipped_too_long:
        report.mask_errors.append(
            f"{unmatched} conversations have no record, tokenize skipped {report.skipped_too_long} as too long"
        )


# -- packed SFT, 2 ranks x 2 workers -> checkpoint -> 3 ranks ---------------------------------
class WithRecordIds(torch.utils.data.Dataset):
    """Packed SFT samples plus their index and the store records packed into each (-1 padded)."""

    def __init__(self, packed: PackedSFTDataset) -> None:
        self.packed = packed
        self.width = max(len(packed.conversations(i)) for i in range(len(packed)))

    def __len__(self) -> int:
        return len(self.packed)

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        batch = self.packed.__getitems__(indices)
        records = torch.full((len(indices), self.width), -1, dtype=torch.int64)
        for row, index in enumerate(indices):
            ids = self.packed.conversations(index)
            records[row, : len(ids)] = torch.as_tensor(ids)
        return SampleBatch({**batch.batched, "sample_id": torch.as_tensor(list(indices)), "record_ids": records})

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self.__getitems__([index]).batched.items()}


def _wrong_content(store: Any, batches: list[dict[str, torch.Tensor]]) -> int:
    """Packed segments whose input_ids or labels are not what the store's record gives (tokens; mask shifted)."""
    wrong = 0
    for batch in batches:
        for row in range(len(batch["sample_id"])):
            doc_ids, inputs, labels = batch["doc_ids"][row], batch["input_ids"][row], batch["labels"][row]
            for number, record in enumerate(r for r in batch["record_ids"][row].tolist() if r >= 0):
                where = torch.nonzero(doc_ids == number).flatten()
                if len(where) == 0:
                    wrong += 1
                    continue
                arrays = store.record(record, ("sequence", "loss_mask"))
                sequence = torch.as_tensor(np.asarray(arrays["sequence"], dtype=np.int64))
                mask = torch.as_tensor(np.asarray(arrays["loss_mask"]).astype(bool))
                expected = torch.where(mask[1:], sequence[1:], -100)  # the next token where it is trained
                start, end = int(where[0]), int(where[-1]) + 1
                if not (
                    end - start == len(sequence)
                    and torch.equal(inputs[start:end], sequence)
                    and torch.equal(labels[start : end - 1], expected)
                    and int(labels[end - 1]) == -100  # never across the conversation's end
                ):
                    wrong += 1
    return wrong


def _record_ids(batches: list[dict[str, torch.Tensor]]) -> list[int]:
    return [r for batch in batches for r in batch["record_ids"].flatten().tolist() if r >= 0]


def train_packed(store_path: Path, checkpoint: Path, report: PostTrainReport, *, seed: int,
                 log: Callable[[str], None]) -> None:  # fmt: skip
    packed = PackedSFTDataset(store_path, SEQ_LEN)
    dataset = WithRecordIds(packed)
    report.packed, report.packing_efficiency = len(packed), packed.packing_efficiency
    steps = max(1, len(dataset) // (2 * BATCH) // 2)  # half the epoch on 2 ranks
    log(f"   packed into {len(packed):,} sequences of {SEQ_LEN}; 2 ranks x 2 workers for {steps} steps, checkpoint")
    batches: list[dict[str, torch.Tensor]] = []
    states = []
    for rank in range(2):
        done, state = run_rank(dataset, world=2, rank=rank, batch_size=BATCH, workers=2, state=None,
                               max_steps=steps, on_batch=batches.append, seed=seed)  # fmt: skip
        states.append(state)
        report.steps_before = max(report.steps_before, done)
    if any(s != states[0] for s in states[1:]):
        raise ResumeMismatchError(f"ranks disagree on the data state: {states}")
    report.checkpoint = int(states[0]["consumed"])
    atomic_write_bytes(checkpoint, orjson.dumps({"sampler": states[0], "dataset": packed.state_dict()}))
    del dataset, packed

    log("   restart on 3 ranks x 2 workers from the checkpoint, to the end of the epoch")
    saved = orjson.loads(checkpoint.read_bytes())
    resumed = PackedSFTDataset(store_path, SEQ_LEN)
    resumed.load_state_dict(saved["dataset"])  # refuses another store or seq_len
    dataset = WithRecordIds(resumed)
    for rank in range(3):
        done, _ = run_rank(dataset, world=3, rank=rank, batch_size=BATCH, workers=2, state=saved["sampler"],
                           max_steps=None, on_batch=batches.append, seed=seed)  # fmt: skip
        report.steps_after = max(report.steps_after, done)

    reference: list[dict[str, torch.Tensor]] = []  # the same 2 ranks, never stopped (in-process loaders)
    for rank in range(2):
        run_rank(dataset, world=2, rank=rank, batch_size=BATCH, workers=0, state=None, max_steps=None,
                 on_batch=reference.append, seed=seed)  # fmt: skip
    consumed, uninterrupted = Counter(_record_ids(batches)), Counter(_record_ids(reference))
    records = len(resumed.store)
    report.consumed = sum(consumed.values())
    report.duplicates = sum(1 for count in consumed.values() if count > 1)
    report.missing = sum(1 for record in range(records) if record not in consumed)
    report.wrong_content = _wrong_content(resumed.store, batches)
    report.same_as_uninterrupted = consumed == uninterrupted
    report.exactly_once = (
        report.duplicates == 0 and report.missing == 0 and report.wrong_content == 0 and report.consumed == records
    )


def run_posttrain(workdir: Path, corpus: Path, *, seed: int, log: Callable[[str], None]) -> PostTrainReport:
    report = PostTrainReport()
    conversations = build_conversations(corpus)
    report.conversations = len(conversations)
    report.prompt_completion = sum("prompt" in c for c in conversations)
    report.multi_turn = sum(len(_turns(c)[1]) > 1 for c in conversations)
    report.with_system = sum(c.get("messages", [{}])[0].get("role") == "system" for c in conversations)
    chat = workdir / "chat"
    chat.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(chat / "conversations.jsonl", b"".join(orjson.dumps(c) + b"\n" for c in conversations))
    store = workdir / "sft"
    args = ["--input-dir", str(chat), "--output-dir", str(store), "--train-type", "sft"]
    args += ["--chat-template", str(default_chat_template()), "--seq-len", str(SEQ_LEN)]
    args += ["--num-workers", "2", "--overwrite", "--no-progress"]  # --overwrite: a rerun into --workdir
    report.command = (
        f"tokenloom tokenize --input-dir chat --output-dir sft --train-type sft --chat-template "
        f"{default_chat_template().name} --seq-len {SEQ_LEN} --num-workers 2"
    )
    report.inspect_text = workdir / "sft-inspect.txt"
    report.inspect_text.unlink(missing_ok=True)
    log(f"   {len(conversations):,} conversations -> {report.command}")
    t0 = time.perf_counter()
    report.tokenize_exit = run_command("tokenize", args, report.inspect_text)
    report.tokenize_seconds = time.perf_counter() - t0
    if report.tokenize_exit != 0:
        return report
    stats = orjson.loads((store / SIDECAR_NAME).read_bytes())["stats"]
    report.records, report.tokens, report.trained_tokens = stats["records"], stats["tokens"], stats["trained_tokens"]
    report.skipped_too_long = stats["skipped_too_long"]
    check_masks(store, conversations, report)
    report.inspect_exit = run_command("inspect", [str(store), "--records", "3"], report.inspect_text)
    train_packed(store, workdir / "sft-checkpoint.json", report, seed=seed, log=log)
    return report
