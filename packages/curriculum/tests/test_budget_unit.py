"""budget_unit: input_tokens (default) vs loss_tokens (GPT-Simple's count), phase lengths from the definition."""

from __future__ import annotations

import numpy as np
import pytest
from curriculum_helpers import EOS, write_bucket, write_yaml

from tokenloom.curriculum import BudgetUnit, CurriculumConfig, CurriculumDataset, Phase
from tokenloom.formats import ConfigError, ResumeMismatchError


def eos_documents(count: int, length: int, offset: int = 0) -> np.ndarray:
    """``count`` documents of ``length`` tokens, each ending in EOS."""
    tokens = (np.arange(count * length, dtype=np.int64) + offset) % 60000
    tokens[length - 1 :: length] = EOS
    return tokens


def corpus(root, lengths: dict[str, int], tokens: int = 4000):
    """Buckets of ``tokens`` tokens in documents of the given lengths (each ending in EOS)."""
    for split, total in (("train", tokens), ("val", 64)):
        for number, (name, length) in enumerate(lengths.items()):
            write_bucket(root / split / name, eos_documents(total // length, length, number * 7), doc_length=length)
    return root


def gpt_simple_loss_tokens(input_ids: np.ndarray, n: int, prefix: np.ndarray | None = None) -> int:
    """GPT-Simple's (labels != -100).sum() for one sample of n non-padding tokens, from its definition:
    labels = input_ids; padding, the first token after each EOD and overlap-prefix tokens set to -100."""
    labels = input_ids.astype(np.int64)
    labels[n:] = -100
    post = np.flatnonzero(input_ids[:n] == EOS) + 1
    labels[post[post < n]] = -100
    if prefix is not None:
        labels[prefix] = -100
    return int((labels != -100).sum())


def gpt_simple_phase_ends(per_sample: list[int], durations: list[int]) -> list[int]:
    """GPT-Simple's loop (one sample per step): a phase ends at the first step where its own count reaches
    its duration_tokens, then the count restarts at zero; the last phase never ends (max_steps does)."""
    ends, phase, consumed = [], 0, 0
    for position, tokens in enumerate(per_sample):
        if phase == len(durations) - 1:
            break
        consumed += tokens
        if consumed >= durations[phase]:
            ends.append(position + 1)
            phase, consumed = phase + 1, 0
    return ends


@pytest.mark.parametrize("packing", [True, False])
def test_loss_tokens_reproduces_gpt_simples_phase_lengths(tmp_path, packing):
    # packing: sequences of 16 tokens = 2 documents of 8 (bucket a) or 4 of 4 (bucket b);
    # fixed windows: 15 input tokens of a 16-token window, same documents
    max_length = 16 if packing else 15
    root = corpus(tmp_path / "data", {"a": 8, "b": 4})
    durations = [1000, 1500, 700]
    phases = (
        Phase(duration_tokens=durations[0], mix={"a": 1, "b": 1}),
        Phase(duration_tokens=durations[1], mix={"a": 0.3, "b": 0.7}),
        Phase(duration_tokens=durations[2], mix={"a": 1}),
    )
    ends = {}
    for unit in BudgetUnit:
        config = CurriculumConfig(path=root, seq_len=max_length, packing=packing, curriculum=phases, budget_unit=unit)
        ds = CurriculumDataset(config, seed=3)
        batch = ds.__getitems__(list(range(len(ds)))).batched
        inputs = ds.budget_tokens(np.arange(len(ds)), BudgetUnit.INPUT_TOKENS)
        per_sample = [gpt_simple_loss_tokens(batch["input_ids"][i].numpy(), int(inputs[i])) for i in range(len(ds))]
        assert ds.budget_tokens(np.arange(len(ds))).tolist() == (
            per_sample if unit is BudgetUnit.LOSS_TOKENS else inputs.tolist()
        )
        assert set(per_sample) == ({15, 13} if packing else {14, 12})  # every sample loses tokens after EOS
        ends[unit] = [end for _, end in ds.schedule.phase_bounds]
        if unit is BudgetUnit.LOSS_TOKENS:
            assert ends[unit][:-1] == gpt_simple_phase_ends(per_sample, durations)
            assert ds.plan()["budget_unit"] == "loss_tokens"
            assert [p["target_tokens"] for p in ds.plan()["phases"]] == durations
    assert ends[BudgetUnit.INPUT_TOKENS][0] < ends[BudgetUnit.LOSS_TOKENS][0]  # the unit matters


def test_loss_tokens_count_overlap_prefixes_as_gpt_simple_masks_them(tmp_path):
    from tokenloom.formats import open_writer

    rng = np.random.default_rng(5)
    for split in ("train", "val"):
        with open_writer(tmp_path / split / "w", dtype="uint16", eos_id=EOS, vocab_size=65536) as writer:
            for _ in range(60):
                doc = rng.integers(0, 60000, size=int(rng.integers(3, 30)))
                prefix = int(rng.integers(0, 3)) if len(doc) > 4 else 0
                if rng.random() < 0.7:
                    doc[-1] = EOS
                if rng.random() < 0.2:
                    doc[int(rng.integers(0, len(doc)))] = EOS  # an EOS inside
                writer.add(doc, overlap_prefix=prefix) if prefix else writer.add(doc)
    for packing in (True, False):
        config = CurriculumConfig(path=tmp_path, seq_len=12, packing=packing, budget_unit="loss_tokens")
        ds = CurriculumDataset(config, seed=1, shuffle=False)
        bucket = ds.bucket_dataset("w")
        data = bucket.dataset
        starts = np.concatenate([[0], np.cumsum(data.doc_lengths)[:-1]])
        in_prefix = np.zeros(int(data.num_tokens), dtype=bool)
        for start, length in zip(starts, data.overlap_prefix, strict=True):
            in_prefix[int(start) : int(start) + int(length)] = True
        assert in_prefix.any()
        expected = []
        for i in range(len(bucket)):
            if packing:
                plan = bucket.plan
                items = range(int(plan.bin_offsets[i]), int(plan.bin_offsets[i + 1]))
                global_positions = np.concatenate(
                    [np.arange(int(plan.token_start[j]), int(plan.token_start[j]) + int(plan.length[j])) for j in items]
                )
                prefix = np.concatenate([np.arange(int(plan.length[j])) < int(plan.prefix[j]) for j in items])
            else:
                global_positions = bucket.window_start(i) + np.arange(12)
                prefix = in_prefix[global_positions]
            content = np.asarray(data.tokens(int(global_positions.min()), int(global_positions.max()) + 1))
            content = content[global_positions - global_positions.min()]
            expected.append(gpt_simple_loss_tokens(content, len(content), np.flatnonzero(prefix)))
        assert len(ds) == len(bucket)  # one phase reading the bucket once, in storage order (shuffle=False)
        assert ds.locate(np.arange(len(ds)))[2].tolist() == list(range(len(ds)))
        assert ds.budget_tokens(np.arange(len(ds))).tolist() == expected


def test_the_unit_is_part_of_the_state(tmp_path):
    root = corpus(tmp_path / "data", {"a": 8, "b": 4})
    phases = (Phase(duration_tokens=1000, mix={"a": 1, "b": 1}),)
    loss = CurriculumDataset(
        CurriculumConfig(path=root, seq_len=16, curriculum=phases, budget_unit="loss_tokens"), seed=3
    )
    plain = CurriculumDataset(CurriculumConfig(path=root, seq_len=16, curriculum=phases), seed=3)
    with pytest.raises(ResumeMismatchError, match="budget_unit: saved 'loss_tokens', this dataset 'input_tokens'"):
        plain.load_state_dict(loss.state_dict(consumed=4))
    with pytest.raises(ResumeMismatchError, match="budget_unit"):
        loss.load_state_dict(plain.state_dict(consumed=4))
    old = plain.state_dict(consumed=4)
    del old["budget_unit"]  # a state saved before the option existed: input_tokens
    plain.load_state_dict(old)
    with pytest.raises(ResumeMismatchError):
        loss.load_state_dict(old)


def test_budget_unit_in_yaml_and_a_bad_value(tmp_path):
    root = corpus(tmp_path / "data", {"a": 8})
    good = write_yaml(tmp_path / "g.yaml", {"data": {"path": str(root), "budget_unit": "loss_tokens"}})
    assert CurriculumConfig.from_file(good).unit is BudgetUnit.LOSS_TOKENS
    bad = write_yaml(tmp_path / "b.yaml", {"data": {"path": str(root), "budget_unit": "tokens"}})
    with pytest.raises(ConfigError, match="budget_unit is 'tokens', expected one of input_tokens, loss_tokens"):
        CurriculumConfig.from_file(bad)


def test_plan_and_validate_print_the_unit(tmp_path):
    from importlib.metadata import entry_points

    import click
    from click.testing import CliRunner

    main = click.Group(
        "tokenloom",
        commands={
            ep.name: ep.load()
            for ep in entry_points(group="tokenloom.commands")
            if ep.name in {"curriculum", "validate"}
        },
    )
    root = corpus(tmp_path / "data", {"a": 8})
    for unit in ("loss_tokens", None):
        extra = {"budget_unit": unit} if unit else {}
        config = write_yaml(tmp_path / "c.yaml", {"data": {"path": str(root), "max_length": 16, **extra}})
        for command in (["curriculum", "plan"], ["validate", "--curriculum"]):
            result = CliRunner().invoke(main, [*command, str(config)], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            assert f"budget unit: {unit or 'input_tokens'}:" in result.output
