from __future__ import annotations

import gzip
import json
import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the _hfs_* helpers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = (  # noqa: SIM905 (a word list, not code)
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega stream token shard worker rank resume exact elastic"
).split()


#: the end of a child script that reads ``ds`` to its end (or its RecordError) and prints the peak RSS growth
READ_AND_PRINT_GROWTH = (
    "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "try:\n"
    "    list(ds)\n"
    "except RecordError as exc:\n"
    "    print('ERR', str(exc).splitlines()[0])\n"
    "print('GROWTH_MIB', (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
)


def make_text(rng: random.Random, index: int) -> str:
    return f"doc{index} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))


def train_tokenizer(directory: Path, *, with_eos: bool = True) -> Path:
    """A small byte-level BPE saved as a fast tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>"] if with_eos else []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    rng = random.Random(0)
    tokenizer.train_from_iterator([make_text(rng, i) for i in range(500)], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if with_eos:
        config["eos_token"] = "<|endoftext|>"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "bpe")


def write_corpus(
    root: Path, *, docs_per_file=(60, 45, 50), gz_docs=40, parquet_groups=(20, 20, 15), seed=0
) -> list[str]:
    """Plain jsonl files, one jsonl.gz and one parquet file with several row groups; returns the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    counter = 0
    files = []
    for i, count in enumerate(docs_per_file):
        path = root / f"part{i}.jsonl"
        with open(path, "w") as f:
            for _ in range(count):
                f.write(json.dumps({"text": make_text(rng, counter), "id": counter}) + "\n")
                counter += 1
        files.append(str(path))
    if gz_docs:
        path = root / "part_gz.jsonl.gz"
        with gzip.open(path, "wt") as f:
            for _ in range(gz_docs):
                f.write(json.dumps({"text": make_text(rng, counter)}) + "\n")
                counter += 1
        files.append(str(path))
    if parquet_groups:
        path = root / "part_pq.parquet"
        writer = None
        for size in parquet_groups:
            table = pa.table({"text": [make_text(rng, counter + k) for k in range(size)]})
            counter += size
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
        assert writer is not None
        writer.close()
        files.append(str(path))
    return files


@pytest.fixture
def corpus(tmp_path) -> list[str]:
    return write_corpus(tmp_path / "data")


@pytest.fixture(scope="session")
def packed_reference(tmp_path_factory, tokenizer_dir) -> list[dict]:
    """The uninterrupted local run (2 ranks x 2 workers, packed) that the SIGKILL tests compare against, run once.

    ``corpus`` writes the same bytes in every test and doc_index does not depend on the path, so one run serves
    the local and the remote test alike."""
    from _hfs_oracle import read_log
    from test_resume import dataset_kwargs, run_driver

    root = tmp_path_factory.mktemp("reference")
    files = write_corpus(root / "data")
    kwargs = dataset_kwargs(files, tokenizer_dir, pack_sequences=True)
    config = {"dataset": kwargs, "world_size": 2, "num_workers": 2, "batch_size": 3, "state_dir": str(root / "state")}
    return read_log(run_driver(root, "reference", config))
