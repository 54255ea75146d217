"""One rank of the 3-rank gloo test: a finite pass through FiniteStepper, results to rank{N}.json."""

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from tokenloom.hf_streaming import FiniteStepper, StreamingHuggingFaceDataset

config = json.loads(Path(sys.argv[1]).read_text())
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
ds = StreamingHuggingFaceDataset(
    "json",
    "train",
    "text",
    16,
    config["tokenizer"],
    data_files=config["files"],
    seed=1,
    shuffle_buffer_size=8,
    with_provenance=True,
)
loader = StatefulDataLoader(ds, batch_size=4, num_workers=1, timeout=60)
stepper = FiniteStepper(
    loader, seq_len=16, eos_id=ds.eos_id, keys=("input_ids", "labels", "doc_index", "label_doc_index")
)
real = 0
ignored = True
docs: dict[int, list[int]] = {}
for batch, is_real in stepper:
    loss_tokens = torch.tensor([(batch["labels"] != -100).sum().item()])
    dist.all_reduce(loss_tokens)  # the training step's own collective: a hang here would fail the test by timeout
    if not is_real:
        ignored = ignored and bool((batch["labels"] == -100).all())
        continue
    real += 1
    for inputs, labels, ids, label_ids in zip(
        batch["input_ids"], batch["labels"], batch["doc_index"], batch["label_doc_index"], strict=True
    ):
        for token, doc in zip([*inputs.tolist(), int(labels[-1])], [*ids.tolist(), int(label_ids[-1])], strict=True):
            if doc >= 0:
                docs.setdefault(doc, []).append(token)
result = {
    "steps": stepper.steps,
    "padded": stepper.padded,
    "real": real,
    "padding_labels_ignored": ignored,
    "docs": docs,
}
Path(config["out"], f"rank{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
