"""Catalogue rows for wave 3's correctness issue (#21): the evalsampler items that are an input or a fault."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from _catalogue_base import Outcome, Run, _tokenizer, case, copy


@case("sampler state with its data_fingerprint removed", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    a = copy("native", tmp)
    state = ResumableDistributedSampler(open_dataset(a), 1, 0).state_dict()
    del state["data_fingerprint"]
    other = ResumableDistributedSampler(open_dataset(a), 1, 0)
    return Run(call=lambda: other.load_state_dict(state), sources=[a])


@case("sampler state with data_fingerprint null", "silent", "error", "ResumeMismatchError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import open_dataset
    from tokenloom.sampler import ResumableDistributedSampler

    a = copy("native", tmp)
    state = {**ResumableDistributedSampler(open_dataset(a), 1, 0).state_dict(), "data_fingerprint": None}
    other = ResumableDistributedSampler(open_dataset(a), 1, 0)
    return Run(call=lambda: other.load_state_dict(state), sources=[a])


_STOPPING_BUILDER = """
import os, signal, sys
import numpy as np
from tokenloom.eval_broadcast import broadcast_eval_set

def stop(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "add_batch":
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGSTOP)

sys.setprofile(stop)
broadcast_eval_set(lambda: np.arange(100_000) % 1000, seq_len=99, cache_dir=sys.argv[1], cache_key="k")
"""


@case("eval-cache build SIGKILLed mid-write: the next call removes its scratch", "leftovers", "ok")
def _(tmp: Path) -> Run:
    import numpy as np

    from tokenloom.eval_broadcast import broadcast_eval_set

    cache = tmp / "cache"
    builder = subprocess.Popen([sys.executable, "-c", _STOPPING_BUILDER, str(cache)])
    deadline = time.monotonic() + 60
    while Path(f"/proc/{builder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if builder.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    builder.send_signal(signal.SIGKILL)
    builder.wait(30)
    left = sorted(p.name for p in cache.iterdir() if p.name.startswith("."))

    def call() -> list[str]:
        broadcast_eval_set(lambda: np.arange(100_000) % 1000, seq_len=99, cache_dir=cache, cache_key="k")
        return sorted(p.name for p in cache.iterdir() if p.name.startswith("."))

    def check(outcome: Outcome) -> str | None:
        if not left:
            return "the killed build left no scratch directory (the kill came too late to test anything)"
        return None if outcome.value == [] else f"scratch directories left: {outcome.value}"

    return Run(call=call, check=check)


@case("eval HF source: empty texts under compat='kempnerforge' are skipped like the seed", "silent", "ok")
def _(tmp: Path) -> Run:
    import numpy as np
    from transformers import AutoTokenizer

    from tokenloom.eval_broadcast import HFEvalSource, broadcast_eval_set

    texts = ["alpha beta", "", "gamma", "", "delta alpha beta gamma"] * 40
    data = tmp / "val.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = AutoTokenizer.from_pretrained(_tokenizer())
    buffer: list[int] = []
    for text in texts:  # KempnerForge's eager construction: texts with no tokens are skipped
        ids = tok.encode(text, add_special_tokens=False)
        if ids:
            buffer += [*ids, tok.eos_token_id]
    want = np.array(buffer[: len(buffer) // 8 * 8]).reshape(-1, 8)
    source = HFEvalSource(
        "json", data_files=str(data), split="train", tokenizer=str(_tokenizer()), compat="kempnerforge"
    )

    def check(outcome: Outcome) -> str | None:
        got = outcome.value
        return None if got.shape == want.shape and (got == want).all() else "rows differ from KempnerForge's"

    return Run(
        call=lambda: broadcast_eval_set(source, seq_len=7, drop_remainder=True).numpy().astype(np.int64),
        check=check,
        sources=[data],
    )
