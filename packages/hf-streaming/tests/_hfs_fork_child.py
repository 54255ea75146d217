"""Use the tokenizer in the parent (its thread pool running), then fork 4 DataLoader workers."""

import sys

import torch
from tokenizers import Tokenizer

from tokenloom.hf_streaming import StreamingHuggingFaceDataset

tokenizer_dir, files = sys.argv[1], sys.argv[2:]
parent = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
parent.encode_batch(["alpha beta gamma " * 50] * 2000)  # starts the Rust thread pool before the fork
ds = StreamingHuggingFaceDataset("json", "train", "text", 16, tokenizer_dir, data_files=files, shuffle_buffer_size=8)
expected = sum(1 for _ in ds)
loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=4, multiprocessing_context="fork", timeout=60)
got = sum(len(batch["input_ids"]) for batch in loader)
print("SAMPLES", expected, got)
