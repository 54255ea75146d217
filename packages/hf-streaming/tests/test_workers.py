"""Real processes: fork safety with 4 workers, and a finite stream on 3 gloo ranks ending together."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _hfs_oracle import compare, expected_documents

HERE = Path(__file__).parent


def test_tokenizer_used_in_parent_then_four_forked_workers(corpus, tokenizer_dir):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}  # the setting under which a fork can deadlock
    proc = subprocess.run(
        [sys.executable, str(HERE / "_hfs_fork_child.py"), str(tokenizer_dir), *corpus],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SAMPLES"))
    _, expected, got = line.split()
    # four workers split the shards: one pass each, with at most one padded tail per worker
    assert int(expected) > 50
    assert int(expected) <= int(got) <= int(expected) + 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_finite_stream_on_three_gloo_ranks_ends_on_the_same_step(tmp_path, corpus, tokenizer_dir):
    port = _free_port()
    config = {"files": corpus, "tokenizer": str(tokenizer_dir), "out": str(tmp_path)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    procs = []
    for rank in range(3):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "3"}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "_hfs_gloo_worker.py"), str(tmp_path / "config.json")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    steps = {r["steps"] for r in results}
    assert len(steps) == 1, results
    assert len({r["real"] for r in results}) > 1, "ranks had equal work: padding was not exercised"
    assert all(r["real"] + r["padded"] == r["steps"] for r in results)
    assert all(r["padding_labels_ignored"] for r in results)
    docs: dict[int, list[int]] = {}
    for r in results:
        for key, tokens in r["docs"].items():
            docs.setdefault(int(key), []).extend(tokens)
    assert compare(expected_documents(corpus, tokenizer_dir, eos_id=0), docs) == []


def test_a_stateful_dataloader_run_shows_no_set_vital_warning(corpus, tokenizer_dir):
    """torchdata calls torch.set_vital (gone from torch): the user must not see its warning on every run."""
    code = (
        "import warnings, sys\n"
        "warnings.simplefilter('default')\n"
        "from tokenloom.hf_streaming import StreamingHuggingFaceDataset\n"
        "from torchdata.stateful_dataloader import StatefulDataLoader\n"
        f"ds = StreamingHuggingFaceDataset('json', 'train', 'text', 16, {str(tokenizer_dir)!r}, "
        f"data_files={corpus[:3]!r})\n"
        "for workers in (0, 2):\n"
        "    loader = StatefulDataLoader(ds, batch_size=4, num_workers=workers)\n"
        "    batches = sum(1 for _ in loader)\n"
        "    loader.state_dict()\n"
        "    print('BATCHES', workers, batches)\n"
        "warnings.warn('other UserWarnings still show')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("BATCHES") == 2
    assert "set_vital" not in proc.stderr, proc.stderr
    assert "other UserWarnings still show" in proc.stderr


def test_the_engine_line_comes_from_one_worker_only(corpus, tokenizer_dir):
    """With 2 DataLoader workers the encoding engine is announced once, by worker 0, not by every worker (#21)."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(processName)s %(message)s')\n"
        "from torch.utils.data import DataLoader\n"
        "from tokenloom.hf_streaming import StreamingHuggingFaceDataset\n"
        f"ds = StreamingHuggingFaceDataset('json', 'train', 'text', 16, {str(tokenizer_dir)!r}, "
        f"data_files={corpus[:3]!r})\n"
        "print('BATCHES', sum(1 for _ in DataLoader(ds, batch_size=4, num_workers=2)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BATCHES" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "encoding engine" in line]
    assert len(lines) == 1, lines


def test_workers_run_fastokens_on_their_share_of_the_cores(corpus, tokenizer_dir, tmp_path):
    """Each of N DataLoader workers encodes on cores // N fastokens threads (at least 1) unless the user chose;
    the parent's environment is left alone and the stream is the same."""
    code = (
        "import os, sys\n"
        "from torch.utils.data import DataLoader\n"
        "from tokenloom.hf_streaming import StreamingHuggingFaceDataset, engine_encoder\n"
        "out = sys.argv[1]\n"
        "def encoder(spec):\n"
        "    with open(os.path.join(out, str(os.getpid())), 'w') as f:\n"
        "        f.write(os.environ.get('FASTOKENS_BPE_THREADS', 'unset'))\n"
        "    return engine_encoder(spec)\n"
        f"ds = StreamingHuggingFaceDataset('json', 'train', 'text', 16, {str(tokenizer_dir)!r}, "
        f"data_files={corpus!r}, encoder=encoder)\n"
        "loader = DataLoader(ds, batch_size=4, num_workers=2)\n"
        "rows = sorted(tuple(r.tolist()) for b in loader for r in b['input_ids'])\n"
        "print('ROWS', hash(tuple(rows)), len(rows))\n"
        "print('PARENT', os.environ.get('FASTOKENS_BPE_THREADS', 'unset'))\n"
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    seen = {}
    for preset in (None, "3"):
        out = tmp_path / str(preset)
        out.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
        env["PYTHONHASHSEED"] = "0"
        if preset is not None:
            env["FASTOKENS_BPE_THREADS"] = preset
        proc = subprocess.run(
            [sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=240, env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        workers = sorted(p.read_text() for p in out.iterdir())
        assert workers == [preset or str(max(1, cores // 2))] * 2
        assert f"PARENT {preset or 'unset'}" in proc.stdout
        seen[preset] = next(line for line in proc.stdout.splitlines() if line.startswith("ROWS"))
    assert seen[None] == seen["3"]


def test_worker_threads_divide_the_cores_by_the_ranks_sharing_the_node(monkeypatch):
    """torchrun's ranks on one node share its cores (LOCAL_WORLD_SIZE) unless each rank is pinned to its own."""
    from tokenloom.hf_streaming import _encode

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(_encode, "_cgroup_cpus", lambda: None, raising=False)  # no cpuset to read: the machine's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert _encode._threads_per_worker(2) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _encode._threads_per_worker(2) == 2
    assert _encode._threads_per_worker(8) == 1  # at least one
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert _encode._threads_per_worker(2) == 8
    # a rank pinned to 4 of the 16 cores: those 4 are its share already
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _encode._threads_per_worker(2) == 2

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    for value in ("0", "-3", "1" * 30):  # 0 and negative count as 1; a huge node still gives each worker a thread
        monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
        assert _encode._threads_per_worker(2) == (1 if value.startswith("1") else 8)


def test_ranks_in_a_container_or_slurm_job_cpuset_share_it(monkeypatch):
    """A Slurm job or a container narrower than the machine is every rank's mask: its cores are divided by the
    ranks (4 ranks x 2 workers in a 16-CPU job on a 64-core node ran 8 threads each, 64 on 16 cores)."""
    from tokenloom.hf_streaming import _encode

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(_encode, "_cgroup_cpus", lambda: 16, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _encode._threads_per_worker(2) == 2
    # a rank pinned to 4 of the job's 16 CPUs: those 4 are its own share
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert _encode._threads_per_worker(2) == 2


@pytest.mark.parametrize(
    ("cgroup", "files", "expected"),
    [
        ("0::/slurm/job_7/step_0\n", {"sys/fs/cgroup/slurm/job_7/cpuset.cpus.effective": "0-7,16-23\n"}, 16),
        ("0::/a/b\n", {"sys/fs/cgroup/cpuset.cpus.effective": "0-63\n"}, 64),  # the nearest ancestor's
        (
            "5:cpu,cpuacct:/\n3:cpuset:/docker/x\n0::/\n",
            {"sys/fs/cgroup/cpuset/docker/x/cpuset.effective_cpus": "3"},
            1,
        ),
        ("0::/\n", {}, None),  # no cpuset controller
        ("0::/\n", {"sys/fs/cgroup/cpuset.cpus.effective": "\n"}, None),  # empty
        ("0::/\n", {"sys/fs/cgroup/cpuset.cpus.effective": "garbage"}, None),
        (None, {}, None),  # no /proc/self/cgroup
    ],
)
def test_cgroup_cpus_reads_the_cpuset_of_the_process_cgroup(tmp_path, cgroup, files, expected):
    from tokenloom.hf_streaming._encode import _cgroup_cpus

    if cgroup is not None:
        (tmp_path / "proc/self").mkdir(parents=True)
        (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_cpus(tmp_path) == expected
